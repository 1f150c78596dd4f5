//! The target process of the two-process tests: its role (run by re-executing this binary)
//! and the handle that spawns and drives it.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use futures::StreamExt;
use hixl_async::HostBuffer;

use crate::setup::{checksum, device, engine, pattern, region_bytes};
use crate::{DEVICE_VAR, KV, KV_VAR, ROLE_VAR, T};

/// The target role of the two-process tests (run by `Target::spawn`).
pub(crate) fn target_role() {
    if std::env::var(ROLE_VAR).as_deref() != Ok("target") {
        return;
    }
    let Some(dev) = device("target_role") else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async move {
        let e = engine(&dev).await;
        let kv_len = std::env::var(KV_VAR)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(KV);
        let mut buf = HostBuffer::zeroed(kv_len).expect("buffer");
        pattern(1, 0, buf.as_mut_slice());
        let kv = e
            .register_with(buf, hixl_core::Access::REMOTE_RW, Some("kv"))
            .expect("register kv");
        println!("HIXL ADDR {}", e.local_engine());
        println!("HIXL KV {} {}", kv.addr(), kv.len());
        let mut notes = e.notifications();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        while let Some(line) = rx.recv().await {
            let w: Vec<&str> = line.split_whitespace().collect();
            match w.as_slice() {
                ["SUM", off, len] => {
                    let (off, len): (u64, usize) =
                        (off.parse().unwrap_or(0), len.parse().unwrap_or(0));
                    println!("HIXL SUM {}", checksum(&region_bytes(&kv, off, len)));
                }
                ["NOTIFY", off, len] => {
                    let (off, len): (u64, usize) =
                        (off.parse().unwrap_or(0), len.parse().unwrap_or(0));
                    let n = tokio::time::timeout(T, notes.next()).await;
                    // Read the memory right when the notify is seen: the data must be there.
                    let sum = checksum(&region_bytes(&kv, off, len));
                    match n {
                        Ok(Some(n)) => {
                            println!("HIXL NOTE {} {sum}", String::from_utf8_lossy(&n.name))
                        }
                        _ => println!("HIXL NOTE none 0"),
                    }
                }
                _ => println!("HIXL ERR {line:?}"),
            }
        }
    });
}

pub(crate) struct Target {
    pub(crate) child: Child,
    pub(crate) stdin: ChildStdin,
    pub(crate) stdout: BufReader<ChildStdout>,
    pub(crate) addr: String,
    pub(crate) kv: (u64, u64),
}

impl Target {
    pub(crate) fn spawn(dev: &str) -> Target {
        Target::spawn_with(dev, KV)
    }

    /// A target on `dev` (a device list makes it a multi-rail target) whose `kv` region has
    /// `kv` bytes.
    pub(crate) fn spawn_with(dev: &str, kv: usize) -> Target {
        let exe = std::env::current_exe().expect("current exe");
        let mut child = Command::new(exe)
            .args([
                "target_role",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(ROLE_VAR, "target")
            .env(DEVICE_VAR, dev)
            .env(KV_VAR, kv.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn target");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut t = Target {
            child,
            stdin,
            stdout,
            addr: String::new(),
            kv: (0, 0),
        };
        t.addr = t.expect_line("ADDR");
        let kv: Vec<u64> = t
            .expect_line("KV")
            .split_whitespace()
            .map(|w| w.parse().expect("KV field"))
            .collect();
        t.kv = (kv[0], kv[1]);
        t
    }

    pub(crate) fn expect_line(&mut self, word: &str) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.stdout.read_line(&mut line).expect("read from target");
            assert!(n > 0, "target exited before sending {word}");
            if let Some((_, rest)) = line.trim_end().split_once("HIXL ") {
                let (w, rest) = rest.split_once(' ').unwrap_or((rest, ""));
                assert_eq!(w, word, "target said {line:?}");
                return rest.to_string();
            }
        }
    }

    pub(crate) fn ask(&mut self, cmd: &str, word: &str) -> String {
        writeln!(self.stdin, "{cmd}").expect("write to target");
        self.stdin.flush().expect("flush");
        self.expect_line(word)
    }

    pub(crate) fn sum(&mut self, off: u64, len: u64) -> u64 {
        self.ask(&format!("SUM {off} {len}"), "SUM")
            .parse()
            .expect("checksum")
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
