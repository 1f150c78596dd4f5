//! The target process: this test binary re-run in the `target_role` role inside namespace A,
//! and what the initiator does with it.

use std::io::BufRead;
use std::path::Path;
use std::time::Duration;

use hixl::{Access, Engine, HostBuffer};
use hixl_cli::child::Target;

use crate::patterns::pattern;
use crate::{IP_A, REMOTE_BG, ROLE_VAR};

pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// The target process (ignored as a test: it is a role, run by `spawn_target`).
pub(crate) fn target_role() {
    if std::env::var(ROLE_VAR).as_deref() != Ok("target") {
        return;
    }
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} is not set"));
    let mem: usize = var("HIXL_FAULTS_MEM").parse().unwrap();
    let ip = var("HIXL_FAULTS_IP");
    runtime().block_on(async move {
        let e = Engine::builder(ip).ephemeral_port().build().await.unwrap();
        let mut buf = HostBuffer::zeroed(mem).unwrap();
        buf.as_mut_slice()
            .copy_from_slice(&pattern(REMOTE_BG, 0, mem));
        let region = e.register_with(buf, Access::REMOTE_RW, Some("kv")).unwrap();
        // libtest may have printed "test target_role ... " without a newline.
        println!(
            "\nREADY engine={} pid={}",
            e.local_engine(),
            std::process::id()
        );
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
            if let Some(path) = line.strip_prefix("DUMP ") {
                let mut v = vec![0u8; mem];
                region.read_at(0, &mut v).unwrap();
                std::fs::write(path, &v).unwrap();
                println!("DUMPED {path}");
            }
        }
        e.shutdown(Duration::from_millis(200)).await;
    });
}

/// The command line of a target with a `mem`-byte region named `kv`.
pub(crate) fn target_cmd(mem: u64) -> Vec<String> {
    let exe = std::env::current_exe().unwrap();
    let mut cmd: Vec<String> = vec![
        "env".into(),
        format!("{ROLE_VAR}=target"),
        format!("HIXL_FAULTS_MEM={mem}"),
        format!("HIXL_FAULTS_IP={IP_A}"),
        exe.to_str().unwrap().into(),
    ];
    cmd.extend(
        [
            "target_role",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ]
        .map(String::from),
    );
    cmd
}

/// Starts a target in namespace `ns` (`ip netns exec` also gives it its own mount namespace).
pub(crate) fn spawn_target(ns: &str, mem: u64) -> Target {
    let mut args = vec!["netns", "exec", ns];
    let cmd = target_cmd(mem);
    args.extend(cmd.iter().map(String::as_str));
    Target::spawn_with(Path::new("ip"), &args).unwrap()
}

/// The target's whole region, dumped by the target itself (no network involved).
pub(crate) fn dump(target: &mut Target, mem: u64) -> Vec<u8> {
    let path = std::env::temp_dir().join(format!(
        "hixl-faults-{}-{}.bin",
        std::process::id(),
        target.pid
    ));
    target
        .send_line(&format!("DUMP {}", path.display()))
        .unwrap();
    target.wait_line("DUMPED", Duration::from_secs(20)).unwrap();
    let v = std::fs::read(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    assert_eq!(v.len() as u64, mem, "dump size");
    v
}
