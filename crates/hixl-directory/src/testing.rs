//! Real etcd for tests and benchmarks: members started on free loopback ports in a temp
//! dir, killed and restarted at will. Tests skip when `etcd` is not installed, unless
//! `HIXL_REQUIRE_ETCD=1` (as CI sets), which makes a missing etcd a failure.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One etcd member's process and ports.
#[derive(Debug)]
struct Member {
    name: String,
    client: u16,
    peer: u16,
    child: Option<Child>,
}

/// An etcd cluster of one or more members on loopback, removed with its data when dropped.
#[derive(Debug)]
pub struct Etcd {
    dir: PathBuf,
    members: Vec<Member>,
    /// More flags for every member (e.g. `--auth-token-ttl=2`).
    extra: Vec<String>,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// Whether `etcd` runs here; panics if it does not and `HIXL_REQUIRE_ETCD=1`.
pub fn available() -> bool {
    let ok = Command::new("etcd")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok && std::env::var("HIXL_REQUIRE_ETCD").is_ok_and(|v| v == "1") {
        panic!("HIXL_REQUIRE_ETCD=1 but `etcd` is not installed (Debian: etcd-server)");
    }
    if !ok {
        eprintln!("skipping: `etcd` is not installed (Debian: etcd-server)");
    }
    ok
}

impl Etcd {
    /// Starts a cluster of `n` members and waits until it serves.
    pub fn start(n: usize) -> Etcd {
        Etcd::start_with(n, &[])
    }

    /// [`Etcd::start`] with more flags for every member.
    pub fn start_with(n: usize, extra: &[&str]) -> Etcd {
        let dir =
            std::env::temp_dir().join(format!("hixl-etcd-{}-{}", std::process::id(), free_port()));
        std::fs::create_dir_all(&dir).expect("etcd temp dir");
        let members: Vec<Member> = (0..n)
            .map(|i| Member {
                name: format!("m{i}"),
                client: free_port(),
                peer: free_port(),
                child: None,
            })
            .collect();
        let extra = extra.iter().map(|s| (*s).to_owned()).collect();
        let mut e = Etcd {
            dir,
            members,
            extra,
        };
        for i in 0..n {
            e.spawn(i);
        }
        e.wait_ready();
        e
    }

    fn spawn(&mut self, i: usize) {
        let cluster: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer))
            .collect();
        let m = &mut self.members[i];
        let data = self.dir.join(&m.name);
        let log = std::fs::File::create(self.dir.join(format!("{}.log", m.name))).ok();
        let child = Command::new("etcd")
            .args(["--name", &m.name, "--data-dir"])
            .arg(&data)
            .arg(format!(
                "--listen-client-urls=http://127.0.0.1:{}",
                m.client
            ))
            .arg(format!(
                "--advertise-client-urls=http://127.0.0.1:{}",
                m.client
            ))
            .arg(format!("--listen-peer-urls=http://127.0.0.1:{}", m.peer))
            .arg(format!(
                "--initial-advertise-peer-urls=http://127.0.0.1:{}",
                m.peer
            ))
            .arg(format!("--initial-cluster={}", cluster.join(",")))
            .args(["--initial-cluster-state", "new", "--log-level", "warn"])
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(log.map_or(Stdio::null(), Stdio::from))
            .spawn()
            .expect("spawning etcd");
        m.child = Some(child);
    }

    /// `etcd://127.0.0.1:a,127.0.0.1:b,...` of every member.
    pub fn url(&self) -> String {
        let eps: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client))
            .collect();
        format!("etcd://{}", eps.join(","))
    }

    /// Kills member `i` (SIGKILL) and waits for it to exit.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Freezes member `i` (SIGSTOP), as a stuck disk or a long GC pause does: its sockets stay
    /// open and it answers nothing.
    pub fn freeze(&self, i: usize) {
        self.signal(i, libc::SIGSTOP);
    }

    /// Lets a frozen member `i` run again (SIGCONT).
    pub fn thaw(&self, i: usize) {
        self.signal(i, libc::SIGCONT);
    }

    /// Sends `sig` to member `i` (directly: no `kill` command need be installed).
    fn signal(&self, i: usize, sig: libc::c_int) {
        if let Some(c) = &self.members[i].child {
            let pid = libc::pid_t::try_from(c.id()).expect("a pid fits pid_t");
            // SAFETY: kill(2) takes plain integers; `pid` is this handle's own child, not
            // yet waited for, so the id names no other process.
            let rc = unsafe { libc::kill(pid, sig) };
            assert_eq!(
                rc,
                0,
                "signal {sig} to etcd member {i}: {}",
                std::io::Error::last_os_error()
            );
        }
    }

    /// Starts member `i` again on its ports and data, and waits until the cluster serves.
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.spawn(i);
        self.wait_ready();
    }

    /// Waits until every running member answers `/health` with a leader (up to 20 s).
    pub fn wait_ready(&self) {
        let t0 = Instant::now();
        for m in self.members.iter().filter(|m| m.child.is_some()) {
            while !healthy(m.client) {
                assert!(
                    t0.elapsed() < Duration::from_secs(20),
                    "etcd member {} did not become healthy in 20 s (log in {})",
                    m.name,
                    self.dir.display()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// `GET /health` answers `"health":"true"` (the member has a leader).
fn healthy(port: u16) -> bool {
    http_get(&format!("127.0.0.1:{port}"), "/health")
        .is_some_and(|body| body.contains("\"health\":\"true\""))
}

/// The whole answer (head and body) of `GET path` on etcd's client port `host` (`ip:port`),
/// or `None` when it cannot be reached; etcd serves `/health` and `/metrics` there.
pub fn http_get(host: &str, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(host).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n").ok()?;
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    Some(body)
}

impl Drop for Etcd {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
