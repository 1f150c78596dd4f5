//! The two network namespaces of a test, joined by a veth pair: setting them up, entering
//! them, and deleting them whatever happens; and the skipping of tests that cannot have them.

use std::future::Future;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::Command;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

use crate::role::runtime;
use crate::{DEADLINE, DEV_A, DEV_B, REQUIRE_VAR};

/// Prints to the real stderr (libtest captures only the print macros), so skip notices and
/// the figures of each test show in every run.
pub(crate) fn say(s: &str) {
    let _ = writeln!(std::io::stderr(), "{s}");
}

pub(crate) fn require() -> bool {
    std::env::var(REQUIRE_VAR).as_deref() == Ok("1")
}

/// Skips the test with a clear notice, or fails it when namespaces are required.
pub(crate) fn skip<T>(test: &str, why: &str) -> Option<T> {
    assert!(
        !require(),
        "{test}: {why} (and {REQUIRE_VAR}=1 requires these tests to run)"
    );
    say(&format!(
        "SKIPPED faults::{test}: {why} (needs root, iproute2 and nftables; set {REQUIRE_VAR}=1 to make this a failure)"
    ));
    None
}

pub(crate) fn run(prog: &str, args: &[&str]) -> Result<String, String> {
    let o = Command::new(prog)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {prog}: {e}"))?;
    if o.status.success() {
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    } else {
        Err(format!(
            "`{prog} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        ))
    }
}

/// The two namespaces of one test.
#[derive(Clone, Debug)]
pub(crate) struct Net {
    pub(crate) a: String,
    pub(crate) b: String,
}

impl Net {
    /// Runs `args` inside namespace `ns`.
    pub(crate) fn exec(ns: &str, args: &[&str]) -> Result<String, String> {
        let mut all = vec!["netns", "exec", ns];
        all.extend_from_slice(args);
        run("ip", &all)
    }

    /// Drops everything on the veth in namespace A, both directions.
    pub(crate) fn cut(&self) {
        Net::exec(
            &self.a,
            &[
                "nft",
                &format!(
                    "add table inet hxf; \
                     add chain inet hxf in {{ type filter hook input priority 0; }}; \
                     add chain inet hxf out {{ type filter hook output priority 0; }}; \
                     add rule inet hxf in iifname \"{DEV_A}\" counter drop; \
                     add rule inet hxf out oifname \"{DEV_A}\" counter drop"
                ),
            ],
        )
        .unwrap();
    }

    /// Drops 10% of the packets arriving on each veth end, chosen at random.
    pub(crate) fn lossy(&self) {
        for (ns, dev) in [(&self.a, DEV_A), (&self.b, DEV_B)] {
            Net::exec(
                ns,
                &[
                    "nft",
                    &format!(
                        "add table inet hxf; \
                         add chain inet hxf in {{ type filter hook input priority 0; }}; \
                         add rule inet hxf in iifname \"{dev}\" numgen random mod 10 0 counter drop"
                    ),
                ],
            )
            .unwrap();
        }
    }

    /// Packets the nft rules dropped so far in `ns`.
    pub(crate) fn dropped(ns: &str) -> u64 {
        let out = Net::exec(ns, &["nft", "list", "table", "inet", "hxf"]).unwrap_or_default();
        out.lines()
            .filter_map(|l| {
                let mut w = l.split_whitespace().skip_while(|&w| w != "packets");
                w.next()?;
                w.next()?.parse::<u64>().ok()
            })
            .sum()
    }

    /// Removes the nft rules (both namespaces; a missing table is fine).
    pub(crate) fn heal_nft(&self) {
        for ns in [&self.a, &self.b] {
            let _ = Net::exec(ns, &["nft", "delete", "table", "inet", "hxf"]);
        }
    }

    /// Limits each veth end's egress to `rate` with a token bucket.
    pub(crate) fn rate_limit(&self, rate: &str) {
        for (ns, dev) in [(&self.a, DEV_A), (&self.b, DEV_B)] {
            let args = [
                "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", "32kb",
                "latency", "100ms",
            ];
            Net::exec(ns, &args).unwrap();
        }
    }

    pub(crate) fn heal_tc(&self) {
        for (ns, dev) in [(&self.a, DEV_A), (&self.b, DEV_B)] {
            let _ = Net::exec(ns, &["tc", "qdisc", "del", "dev", dev, "root"]);
        }
    }
}

/// Owns the namespaces: deleting them (which also deletes the veth pair) when dropped, on
/// success, failure or a hang.
pub(crate) struct NetGuard {
    pub(crate) net: Net,
}

impl Drop for NetGuard {
    fn drop(&mut self) {
        for ns in [&self.net.a, &self.net.b] {
            if !ns.is_empty() {
                let _ = run("ip", &["netns", "del", ns]);
            }
        }
    }
}

impl NetGuard {
    /// Creates namespaces A and B, joined by a veth pair with 192.0.2.1 and 192.0.2.2.
    pub(crate) fn create(test: &str, tag: &str, tools: &[&str]) -> Option<NetGuard> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return skip(test, "not running as root");
        }
        for t in tools {
            if Command::new(t).arg("-V").output().is_err() {
                return skip(test, &format!("`{t}` is not installed"));
            }
        }
        reap_stale_namespaces();
        let pid = std::process::id();
        let net = Net {
            a: format!("hxf-{pid}-{tag}-a"),
            b: format!("hxf-{pid}-{tag}-b"),
        };
        if let Err(e) = run("ip", &["netns", "add", &net.a]) {
            return skip(test, &format!("cannot create a network namespace: {e}"));
        }
        let mut g = NetGuard {
            net: Net {
                a: net.a.clone(),
                b: String::new(),
            },
        };
        if let Err(e) = run("ip", &["netns", "add", &net.b]) {
            return skip(test, &format!("cannot create a network namespace: {e}"));
        }
        g.net.b = net.b.clone();
        let (a, b) = (net.a.as_str(), net.b.as_str());
        let steps: [(&str, Vec<&str>); 7] = [
            (
                "",
                vec![
                    "link", "add", DEV_A, "netns", a, "type", "veth", "peer", "name", DEV_B,
                    "netns", b,
                ],
            ),
            (a, vec!["addr", "add", "192.0.2.1/24", "dev", DEV_A]),
            (b, vec!["addr", "add", "192.0.2.2/24", "dev", DEV_B]),
            (a, vec!["link", "set", DEV_A, "up"]),
            (b, vec!["link", "set", DEV_B, "up"]),
            (a, vec!["link", "set", "lo", "up"]),
            (b, vec!["link", "set", "lo", "up"]),
        ];
        for (ns, args) in steps {
            let mut all: Vec<&str> = Vec::new();
            if !ns.is_empty() {
                all.extend(["-n", ns]);
            }
            all.extend(args);
            if let Err(e) = run("ip", &all) {
                return skip(test, &format!("cannot wire the namespaces: {e}"));
            }
        }
        Some(g)
    }
}

/// Deletes namespaces left by earlier runs of this binary that were killed before their
/// guards ran (names carry the pid of the run that made them).
pub(crate) fn reap_stale_namespaces() {
    let Ok(dir) = std::fs::read_dir("/var/run/netns") else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("hxf-")
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = run("ip", &["netns", "del", &name]);
        }
    }
}

/// Enters network namespace `ns` on the calling thread (threads it starts inherit it).
pub(crate) fn enter_netns(ns: &str) -> std::io::Result<()> {
    let f = std::fs::File::open(format!("/var/run/netns/{ns}"))?;
    // SAFETY: `f` is an open namespace file; setns only switches this thread's network
    // namespace and touches no memory of ours.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Runs `body` on a thread inside namespace B, with its own runtime, and fails the test if it
/// has not finished by `DEADLINE`. The guard (held by the caller) cleans up either way.
pub(crate) fn in_namespace_b<F, Fut>(g: &NetGuard, body: F)
where
    F: FnOnce(Net) -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    let net = g.net.clone();
    let (tx, rx) = mpsc::channel();
    let h = std::thread::spawn(move || {
        enter_netns(&net.b).unwrap();
        let rt = runtime();
        rt.block_on(body(net));
        rt.shutdown_timeout(Duration::from_secs(2));
        let _ = tx.send(());
    });
    match rx.recv_timeout(DEADLINE) {
        Ok(()) => h.join().unwrap(),
        Err(RecvTimeoutError::Disconnected) => {
            if let Err(p) = h.join() {
                std::panic::resume_unwind(p);
            }
        }
        Err(RecvTimeoutError::Timeout) => {
            panic!("the test did not finish within {DEADLINE:?}: something hangs")
        }
    }
}
