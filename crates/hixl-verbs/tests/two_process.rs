//! Verbs between two processes: this test binary re-executes itself as the target (the test
//! `target_process` with HIXL_VERBS_ROLE=target), which registers a region and a QP and
//! announces `HIXL EP <endpoint hex>` and `HIXL MR <addr> <len> <rkey>` on stdout; the
//! initiator answers `EP <hex>` on its stdin, then drives RDMA WRITE/READ and asks the target
//! for checksums (`SUM`, `FILL <seed>`). Skipped unless HIXL_VERBS_DEVICE names a device.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use common::{assert_all_ok, checksum, filled, tok, Side, DEVICE_VAR};
use hixl_verbs::{QpConfig, QpEndpoint, QpState, QueuePair, RemoteMemory, VerbsError, WorkRequest};

const ROLE_VAR: &str = "HIXL_VERBS_ROLE";
const T: Duration = Duration::from_secs(60);
const REGION: usize = 4 << 20;

/// The target side, run only by `Target::spawn` (ignored otherwise: it is a role, not a test).
#[test]
#[ignore = "the target role of the two-process tests; Target::spawn runs it"]
fn target_process() {
    if std::env::var(ROLE_VAR).as_deref() != Ok("target") {
        return;
    }
    let Some(dev) = common::device("target_process") else {
        return;
    };
    let side = Side::open(&dev, 2048);
    let mut buf = side.buffer(REGION);
    let mut qp = side.qp(QpConfig::default());
    let r = buf.remote();
    println!("HIXL EP {}", qp.endpoint().to_hex());
    println!("HIXL MR {} {} {}", r.addr, r.len, r.rkey);
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let mut words = line.split_whitespace();
        match (words.next(), words.next()) {
            (Some("EP"), Some(hex)) => match QpEndpoint::from_hex(hex) {
                Ok(ep) => {
                    qp.connect(&ep).expect("target connect");
                    println!("HIXL READY");
                }
                Err(e) => println!("HIXL ERR {e}"),
            },
            (Some("SUM"), _) => println!("HIXL SUM {}", checksum(&buf.to_vec())),
            (Some("FILL"), Some(seed)) => {
                buf.write_at(0, &filled(buf.len(), seed.parse().unwrap_or(0)))
                    .unwrap();
                println!("HIXL SUM {}", checksum(&buf.to_vec()));
            }
            _ => println!("HIXL ERR unknown command {line:?}"),
        }
    }
}

/// A target process and the pipes to it. Killed when dropped.
struct Target {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    ep: QpEndpoint,
    mem: RemoteMemory,
}

impl Target {
    fn spawn(dev: &str) -> Target {
        let exe = std::env::current_exe().expect("current exe");
        let mut child = Command::new(exe)
            .args([
                "target_process",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(ROLE_VAR, "target")
            .env(DEVICE_VAR, dev)
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
            ep: placeholder(),
            mem: RemoteMemory {
                addr: 0,
                len: 0,
                rkey: 0,
            },
        };
        t.ep = QpEndpoint::from_hex(&t.expect_line("EP")).expect("target endpoint");
        let mr = t.expect_line("MR");
        let f: Vec<u64> = mr
            .split_whitespace()
            .map(|w| w.parse().expect("MR field"))
            .collect();
        assert_eq!(f.len(), 3, "MR line {mr:?}");
        t.mem = RemoteMemory {
            addr: f[0],
            len: f[1],
            rkey: u32::try_from(f[2]).expect("rkey"),
        };
        t
    }

    /// The rest of the next `HIXL <word> ...` line from the target.
    fn expect_line(&mut self, word: &str) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.stdout.read_line(&mut line).expect("read from target");
            assert!(n > 0, "target exited before sending {word}");
            // libtest may print "test target_process ... " before the first line.
            if let Some(rest) = line.trim_end().split_once("HIXL ").map(|(_, r)| r) {
                let (w, rest) = rest.split_once(' ').unwrap_or((rest, ""));
                assert_eq!(w, word, "target said {line:?}");
                return rest.to_owned();
            }
        }
    }

    fn send(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").expect("write to target");
        self.stdin.flush().expect("flush");
    }

    fn connect(&mut self, qp: &mut QueuePair) {
        qp.connect(&self.ep).expect("initiator connect");
        self.send(&format!("EP {}", qp.endpoint().to_hex()));
        self.expect_line("READY");
    }

    fn sum(&mut self, cmd: &str) -> u64 {
        self.send(cmd);
        self.expect_line("SUM").parse().expect("checksum")
    }
}

fn placeholder() -> QpEndpoint {
    QpEndpoint {
        qpn: 0,
        psn: 0,
        gid: [0; 16],
        lid: 0,
        gid_index: 0,
        mtu: hixl_verbs::Mtu::M1024,
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn block_ops(
    buf: &hixl_verbs::RegisteredBuffer,
    mem: RemoteMemory,
    block: usize,
    read: bool,
) -> Vec<WorkRequest> {
    (0..REGION / block)
        .map(|i| {
            let (off, len) = ((i * block) as u64, block as u64);
            let local = buf.local(off, len).expect("inside");
            let remote = mem.at(off, len).expect("inside the target's region");
            if read {
                WorkRequest::read(tok(i as u64), local, remote)
            } else {
                WorkRequest::write(tok(i as u64), local, remote)
            }
        })
        .collect()
}

#[test]
fn write_and_read_across_processes() {
    let dev = require_device!("write_and_read_across_processes");
    let mut target = Target::spawn(&dev);
    let me = Side::open(&dev, 2048);
    let mut qp = me.qp(QpConfig::default());
    target.connect(&mut qp);
    let mut src = me.buffer(REGION);
    let mut back = me.buffer(REGION);
    for (round, block) in [16usize << 10, 128 << 10, 2 << 20].into_iter().enumerate() {
        let seed = 100 + round as u64;
        src.write_at(0, &filled(src.len(), seed)).unwrap();
        let ops = block_ops(&src, target.mem, block, false);
        // SAFETY: src and the target's region stay registered until the completions are drained.
        unsafe { qp.post_chain(&ops) }.expect("post writes");
        let mut out = Vec::new();
        me.cq.wait_for(&mut out, ops.len(), T);
        assert_all_ok(&out, 0..ops.len() as u64);
        assert_eq!(
            target.sum("SUM"),
            checksum(&src.to_vec()),
            "{block}-byte writes landed"
        );
        let theirs = target.sum(&format!("FILL {}", seed + 50));
        back.fill(0);
        let ops = block_ops(&back, target.mem, block, true);
        // SAFETY: as above; back is not read until the completions are drained.
        unsafe { qp.post_chain(&ops) }.expect("post reads");
        out.clear();
        me.cq.wait_for(&mut out, ops.len(), T);
        assert_all_ok(&out, 0..ops.len() as u64);
        assert_eq!(checksum(&back.to_vec()), theirs, "{block}-byte reads");
        println!(
            "{block}-byte blocks: {} writes and reads verified across processes",
            ops.len()
        );
    }
}

#[test]
fn killed_target_fails_initiator_ops_without_hanging() {
    let dev = require_device!("killed_target_fails_initiator_ops_without_hanging");
    let mut target = Target::spawn(&dev);
    let me = Side::open(&dev, 2048);
    // ~16.8 ms ACK timeout, 2 retries: a dead peer is detected in well under a second.
    let cfg = QpConfig {
        timeout: 12,
        retry_cnt: 2,
        max_send_wr: 256,
        ..QpConfig::default()
    };
    let mut qp = me.qp(cfg);
    qp.set_peer_name("target");
    target.connect(&mut qp);
    let src = me.buffer(REGION);
    let chain = |first: u64| -> Vec<WorkRequest> {
        (0..16u64)
            .map(|i| {
                let off = i * (256 << 10);
                let remote = target.mem.at(off, 256 << 10).expect("inside");
                WorkRequest::write(
                    tok(first + i),
                    src.local(off, 256 << 10).expect("inside"),
                    remote,
                )
            })
            .collect()
    };
    // A healthy round first.
    let ops = chain(0);
    // SAFETY: src outlives the drained completions; the target's region is its business.
    unsafe { qp.post_chain(&ops) }.expect("post");
    let mut out = Vec::new();
    me.cq.wait_for(&mut out, ops.len(), T);
    assert_all_ok(&out, 0..16);
    out.clear();

    // Kill it with a chain in flight, then keep posting until the failure surfaces.
    let mut posted = 0u64;
    let ops = chain(1000);
    // SAFETY: as above.
    unsafe { qp.post_chain(&ops) }.expect("post");
    posted += 16;
    target.child.kill().expect("kill target");
    target.child.wait().expect("reap target");
    let killed = Instant::now();
    let mut next = 2000;
    while killed.elapsed() < Duration::from_secs(30) && !out.iter().any(|(_, r)| r.is_err()) {
        me.cq.wait_for(&mut out, 1, Duration::from_millis(200));
        if qp.outstanding() == 0 {
            let ops = chain(next);
            next += 1000;
            // SAFETY: as above.
            match unsafe { qp.post_chain(&ops) } {
                Ok(_) => posted += 16,
                Err(VerbsError::SendQueueFull { .. }) => {}
                Err(e) => panic!("post: {e}"),
            }
        }
    }
    let detected = killed.elapsed();
    // Everything posted is reported, none hangs.
    while (out.len() as u64) < posted && killed.elapsed() < Duration::from_secs(60) {
        let missing = posted as usize - out.len();
        me.cq.wait_for(&mut out, missing, Duration::from_secs(1));
    }
    assert_eq!(
        out.len() as u64,
        posted,
        "every posted op reported after the kill"
    );
    let errors: Vec<String> = out
        .iter()
        .filter_map(|(_, r)| r.as_ref().err().map(|e| e.to_string()))
        .collect();
    assert!(!errors.is_empty(), "ops to a dead target must fail");
    println!(
        "target killed: first error after {detected:?}: {}",
        errors[0]
    );
    assert!(
        errors[0].contains("transport retry counter exceeded") && errors[0].contains("target"),
        "expected a retry-exceeded error naming the peer, got {:?}",
        errors[0]
    );
    assert!(
        detected < Duration::from_secs(10),
        "detected in {detected:?}"
    );
    assert_eq!(qp.state().expect("query qp"), QpState::Error);
}
