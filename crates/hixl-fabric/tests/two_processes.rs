//! Two real processes: the test binary re-executes itself as a child (selected by an env var)
//! to receive fabric buffers over SCM_RIGHTS, to be the target of cross-memory attach, and to
//! show the permission and namespace checks.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

use hixl_core::{CompletionSource, Token};
use hixl_fabric::{
    cma_probe, cma_read, cma_write, recv_fds, send_fds, CopyEngine, CopyKind, CopyOp, FabricPool,
    HostIdentity, PeerMapping,
};

const ROLE: &str = "HIXL_FABRIC_TEST_ROLE";
const TAG: &str = "HIXL-CHILD ";

/// In a child: Some(role). The child also arms a deadline so that a broken parent/child
/// exchange fails the test instead of hanging it.
fn role() -> Option<String> {
    let role = std::env::var(ROLE).ok()?;
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(60));
        eprintln!("child deadline passed; exiting");
        std::process::exit(3);
    });
    Some(role)
}

/// Re-runs this test binary as a child that runs only `test`, in role mode.
fn spawn(test: &str, env: &[(&str, String)]) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(ROLE, "child")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The child's next tagged line on stdout (libtest prints its own lines around ours).
fn tagged_line(out: &mut BufReader<ChildStdout>) -> String {
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "child exited without reporting"
        );
        // libtest may have printed "test name ... " on the same line.
        if let Some(i) = line.find(TAG) {
            return line[i + TAG.len()..].trim_end().to_string();
        }
    }
}

fn say(msg: impl std::fmt::Display) {
    println!("{TAG}{msg}");
    std::io::stdout().flush().unwrap();
}

fn field(line: &str, key: &str) -> String {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key} in {line:?}"))
        .to_string()
}

/// Accepts the child's connection, failing instead of hanging if the child dies first.
fn accept(listener: &UnixListener, child: &mut Child) -> UnixStream {
    listener.set_nonblocking(true).unwrap();
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false).unwrap();
                return s;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if let Some(status) = child.try_wait().unwrap() {
                    panic!("child exited ({status}) before connecting");
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("accept: {e}"),
        }
    }
}

fn hex(s: &str) -> u64 {
    u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap()
}

/// Runs copy ops to completion through the reactor protocol; panics on any failure.
fn run_ops(eng: &CopyEngine, ops: Vec<CopyOp>) {
    let n = ops.len();
    // SAFETY: every caller keeps the ranges alive until this function returns, which is after
    // all completions are drained.
    unsafe { eng.submit(ops) }.map_err(|(e, _)| e).unwrap();
    let mut out = Vec::new();
    while out.len() < n {
        if eng.drain(&mut out) > 0 {
            continue;
        }
        eng.arm();
        if eng.drain(&mut out) > 0 {
            eng.disarm();
            continue;
        }
        let mut p = libc::pollfd {
            fd: eng.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; the timeout only guards against a hang.
        let ready = unsafe { libc::poll(&mut p, 1, 20_000) };
        assert_eq!(ready, 1, "copy engine stalled");
    }
    for (t, r) in out {
        if let Err(e) = r {
            panic!("op {t:?} failed: {e}");
        }
    }
}

fn pattern(i: usize, seed: u8) -> u8 {
    (i as u8).wrapping_mul(7).wrapping_add(seed)
}

// ---------------------------------------------------------------------------------------------

#[test]
fn fabric_buffers_exported_to_a_child_process() {
    if role().is_some() {
        return fd_child();
    }
    let pool = FabricPool::new(64 << 20, Some(46 << 40)).unwrap();
    let a = pool.alloc((1 << 20) + 123).unwrap();
    let b = pool.alloc(300_000).unwrap();
    assert!(!a.translated() && !b.translated());
    let path = std::env::temp_dir().join(format!("hixl-fabric-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).unwrap();
    let mut child = spawn(
        "fabric_buffers_exported_to_a_child_process",
        &[("HIXL_FABRIC_SOCK", path.display().to_string())],
    );
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut sock = accept(&listener, &mut child);
    let _ = std::fs::remove_file(&path);
    // lenA, addrA, lenB, addrB; the child maps B at A's address, which it cannot have.
    let mut msg = Vec::new();
    for v in [a.len(), a.addr(), b.len(), a.addr()] {
        msg.extend_from_slice(&v.to_le_bytes());
    }
    assert_eq!(send_fds(&sock, &msg, &[a.fd(), b.fd()]).unwrap(), msg.len());
    let report = tagged_line(&mut out);
    let mut done = [0u8; 1];
    sock.read_exact(&mut done).unwrap();
    assert!(child.wait().unwrap().success());

    // A landed at the same address in the child (unified VA); B was translated.
    assert_eq!(field(&report, "a_translated"), "false", "{report}");
    assert_eq!(hex(&field(&report, "a_addr")), a.addr(), "{report}");
    assert_eq!(field(&report, "b_translated"), "true", "{report}");
    assert_eq!(field(&report, "same_host"), "true", "{report}");
    // SAFETY: both buffers are live; the child has exited, so nobody writes them.
    let (sa, sb) = unsafe {
        (
            std::slice::from_raw_parts(a.as_ptr(), a.len() as usize),
            std::slice::from_raw_parts(b.as_ptr(), b.len() as usize),
        )
    };
    assert!(
        sa.iter().enumerate().all(|(i, &x)| x == pattern(i, 1)),
        "A written by the child"
    );
    assert!(
        sb[..1000].iter().all(|&x| x == 0),
        "B below the written range is untouched"
    );
    assert!(
        sb[1000..]
            .iter()
            .enumerate()
            .all(|(i, &x)| x == pattern(i, 2)),
        "B written"
    );
}

fn fd_child() {
    let me = HostIdentity::current().unwrap();
    let path = std::env::var("HIXL_FABRIC_SOCK").unwrap();
    let mut sock = UnixStream::connect(path).unwrap();
    let mut msg = [0u8; 32];
    let (n, mut fds) = recv_fds(&sock, &mut msg, 4).unwrap();
    sock.read_exact(&mut msg[n..]).unwrap();
    assert_eq!(fds.len(), 2);
    let v = |i: usize| u64::from_le_bytes(msg[i * 8..i * 8 + 8].try_into().unwrap());
    let (len_a, addr_a, len_b, want_b) = (v(0), v(1), v(2), v(3));
    let fd_b = fds.pop().unwrap();
    let fd_a = fds.pop().unwrap();
    let ma = PeerMapping::map(fd_a, len_a, Some(addr_a)).unwrap();
    let mb = PeerMapping::map(fd_b, len_b, Some(want_b)).unwrap();
    // Write both through the copy engine: A at the parent's own addresses, B via translation.
    let src_a: Vec<u8> = (0..len_a as usize).map(|i| pattern(i, 1)).collect();
    let src_b: Vec<u8> = (0..(len_b - 1000) as usize)
        .map(|i| pattern(i, 2))
        .collect();
    let dst_b = mb
        .translate(want_b + 1000, want_b, src_b.len() as u64)
        .unwrap();
    let eng = CopyEngine::new(4, Duration::ZERO).unwrap();
    // Unified VA: the parent's address is usable as is (translate is the identity then).
    let dst_a = ma.translate(addr_a, addr_a, len_a).unwrap();
    let whole_a = CopyKind::Memcpy {
        src: src_a.as_ptr() as u64,
        dst: dst_a,
        len: len_a,
    };
    let mut ops: Vec<CopyOp> = whole_a
        .split(64 << 10)
        .into_iter()
        .map(|kind| CopyOp::new(Token(1), kind))
        .collect();
    ops.push(CopyOp::new(
        Token(2),
        CopyKind::Memcpy {
            src: src_b.as_ptr() as u64,
            dst: dst_b,
            len: src_b.len() as u64,
        },
    ));
    run_ops(&eng, ops);
    let parent = HostIdentity {
        pid: 0,
        uid: 0,
        ..me.clone()
    };
    say(format_args!(
        "a_translated={} a_addr={:#x} b_translated={} same_host={}",
        ma.translated(),
        ma.addr(),
        mb.translated(),
        me.same_host(&parent)
    ));
    sock.write_all(b"k").unwrap();
}

// ---------------------------------------------------------------------------------------------

#[test]
fn cross_memory_attach_into_a_child_process() {
    if role().is_some() {
        return cma_child();
    }
    let mut child = spawn("cross_memory_attach_into_a_child_process", &[]);
    let pid = child.id() as i32;
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let line = tagged_line(&mut out);
    let (addr, len) = (
        hex(&field(&line, "addr")),
        field(&line, "len").parse::<u64>().unwrap(),
    );
    cma_probe(pid, addr).unwrap();

    // Direct calls.
    let mut got = vec![0u8; len as usize];
    // SAFETY: `got` is live and writable for len bytes.
    unsafe { cma_read(pid, got.as_mut_ptr() as u64, addr, len) }.unwrap();
    assert!(got.iter().enumerate().all(|(i, &x)| x == pattern(i, 5)));
    let head: Vec<u8> = (0..4096).map(|i| pattern(i, 9)).collect();
    // SAFETY: `head` is live and readable.
    unsafe { cma_write(pid, head.as_ptr() as u64, addr, 4096) }.unwrap();

    // Through the copy engine, split across streams: write the rest, read everything back.
    let eng = CopyEngine::new(4, Duration::ZERO).unwrap();
    let tail: Vec<u8> = (4096..len as usize).map(|i| pattern(i, 9)).collect();
    let w = CopyKind::CmaWrite {
        pid,
        local: tail.as_ptr() as u64,
        remote: addr + 4096,
        len: len - 4096,
    };
    run_ops(
        &eng,
        w.split(256 << 10)
            .into_iter()
            .map(|kind| CopyOp::new(Token(1), kind))
            .collect(),
    );
    let mut back = vec![0u8; len as usize];
    let r = CopyKind::CmaRead {
        pid,
        local: back.as_mut_ptr() as u64,
        remote: addr,
        len,
    };
    run_ops(
        &eng,
        r.split(256 << 10)
            .into_iter()
            .map(|kind| CopyOp::new(Token(2), kind))
            .collect(),
    );
    assert!(back.iter().enumerate().all(|(i, &x)| x == pattern(i, 9)));

    // The child checks its own memory.
    child.stdin.as_mut().unwrap().write_all(b"check\n").unwrap();
    assert_eq!(tagged_line(&mut out), "ok");
    assert!(child.wait().unwrap().success());
}

fn cma_child() {
    let buf: Vec<u8> = (0..3 << 20).map(|i| pattern(i, 5)).collect();
    say(format_args!(
        "addr={:#x} len={}",
        buf.as_ptr() as u64,
        buf.len()
    ));
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "check");
    // The parent wrote this memory behind the compiler's back.
    let now: Vec<u8> = (0..buf.len())
        .map(|i| {
            // SAFETY: reads inside the live buffer; volatile so the reads are not folded into the
            // values stored before the parent's cross-memory writes.
            unsafe { buf.as_ptr().add(i).read_volatile() }
        })
        .collect();
    let ok = now.iter().enumerate().all(|(i, &x)| x == pattern(i, 9));
    say(if ok { "ok" } else { "bad" });
}

// ---------------------------------------------------------------------------------------------

/// CMA is refused to a process of another uid without CAP_SYS_PTRACE. As root (as in CI) the
/// parent can attach to anything, so the child drops to uid/gid 65534 and probes the parent;
/// as a non-root user the parent probes pid 1 if another uid owns it. Where neither is
/// possible (no CAP_SETUID in a container, or pid 1 is ours), the test says so and passes.
#[test]
fn cma_permission_failure_is_explained() {
    if role().is_some() {
        return eperm_child();
    }
    let target = [1u8; 64];
    // SAFETY: getuid cannot fail.
    if unsafe { libc::getuid() } != 0 {
        let pid1_uid = std::fs::read_to_string("/proc/1/status")
            .ok()
            .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(str::to_owned));
        // SAFETY: getuid cannot fail.
        let mine = unsafe { libc::getuid() }.to_string();
        match pid1_uid {
            Some(l) if l.split_whitespace().nth(1) != Some(mine.as_str()) => {
                let e = cma_probe(1, 0x1000).unwrap_err();
                assert!(e.contains("EPERM") && e.contains("CAP_SYS_PTRACE"), "{e}");
            }
            _ => eprintln!("skipped: not root, and pid 1 runs as our uid"),
        }
        return;
    }
    let mut child = spawn(
        "cma_permission_failure_is_explained",
        &[
            ("HIXL_FABRIC_PARENT", std::process::id().to_string()),
            ("HIXL_FABRIC_ADDR", format!("{:#x}", target.as_ptr() as u64)),
        ],
    );
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let line = tagged_line(&mut out);
    assert!(child.wait().unwrap().success());
    if let Some(why) = line.strip_prefix("skip ") {
        eprintln!("skipped: the child could not drop privileges ({why})");
        return;
    }
    let msg = line
        .strip_prefix("err ")
        .unwrap_or_else(|| panic!("probe should fail: {line}"));
    assert!(
        msg.contains("EPERM") && msg.contains("CAP_SYS_PTRACE"),
        "{msg}"
    );
    assert!(msg.contains(&std::process::id().to_string()), "{msg}");
}

fn eperm_child() {
    let parent: i32 = std::env::var("HIXL_FABRIC_PARENT")
        .unwrap()
        .parse()
        .unwrap();
    let addr = hex(&std::env::var("HIXL_FABRIC_ADDR").unwrap());
    // SAFETY: plain credential syscalls; on failure we report and change nothing else.
    let dropped = unsafe {
        libc::setgroups(0, std::ptr::null()) == 0
            && libc::setgid(65534) == 0
            && libc::setuid(65534) == 0
    };
    if !dropped {
        say(format_args!("skip {}", std::io::Error::last_os_error()));
        return;
    }
    match cma_probe(parent, addr) {
        Ok(()) => say("ok"),
        Err(e) => say(format_args!("err {e}")),
    }
}

// ---------------------------------------------------------------------------------------------

/// A process in another mount namespace is not on the "same host" for the fabric backend, even
/// with the same boot id. Needs CAP_SYS_ADMIN for unshare; skipped (and said) without it.
#[test]
fn another_mount_namespace_is_another_host() {
    if role().is_some() {
        // SAFETY: unshare(CLONE_NEWNS) only changes this child's namespace membership.
        if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
            say(format_args!("skip {}", std::io::Error::last_os_error()));
            return;
        }
        let id = HostIdentity::current().unwrap();
        say(format_args!("boot_id={} mnt_ns={}", id.boot_id, id.mnt_ns));
        return;
    }
    let me = HostIdentity::current().unwrap();
    let mut child = spawn("another_mount_namespace_is_another_host", &[]);
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let line = tagged_line(&mut out);
    assert!(child.wait().unwrap().success());
    if let Some(why) = line.strip_prefix("skip ") {
        eprintln!("skipped: unshare(CLONE_NEWNS) not permitted ({why})");
        return;
    }
    let other = HostIdentity {
        boot_id: field(&line, "boot_id"),
        mnt_ns: field(&line, "mnt_ns").parse().unwrap(),
        pid: child.id() as i32,
        uid: me.uid,
    };
    assert_eq!(other.boot_id, me.boot_id);
    assert_ne!(other.mnt_ns, me.mnt_ns);
    assert!(!me.same_host(&other));
}
