//! The rig of `tools/hosts.sh` for the command's tests: hosts that are network namespaces with
//! their own addresses on a bridge, removed when the `Rig` is dropped; and a child process
//! killed when dropped. Needs root and iproute2; `Rig::up` skips (None) without them unless
//! HIXL_REQUIRE_NETNS=1.

use std::path::PathBuf;
use std::process::{Child, Command};

fn hosts_sh() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tools/hosts.sh")
}

/// A rig of hosts h1..hN, removed when dropped.
pub struct Rig {
    prefix: String,
}

impl Rig {
    /// `n` hosts with `shape` on each link; the rig is `hx{tag}{pid}`, one per test binary
    /// and process (short: an interface name `hx{tag}{pid}-h1` has at most 15 bytes).
    pub fn up(tag: &str, n: u32, shape: &[&str]) -> Option<Rig> {
        let rig = Rig {
            prefix: format!("hx{tag}{}", std::process::id()),
        };
        let mut args = vec!["up".to_string(), n.to_string()];
        args.extend(shape.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = rig.sh(&args).output().expect("run tools/hosts.sh");
        if out.status.success() {
            return Some(rig);
        }
        let why = String::from_utf8_lossy(&out.stderr).trim().to_string();
        assert!(
            std::env::var("HIXL_REQUIRE_NETNS").as_deref() != Ok("1"),
            "tools/hosts.sh up: {why} (and HIXL_REQUIRE_NETNS=1 requires this test to run)"
        );
        eprintln!("SKIPPED: tools/hosts.sh up: {why} (needs root, iproute2, nftables)");
        None
    }

    /// `tools/hosts.sh ARGS` for this rig.
    pub fn sh(&self, args: &[&str]) -> Command {
        let mut c = Command::new(hosts_sh());
        c.env("HIXL_HOSTS_PREFIX", &self.prefix).args(args);
        c
    }

    /// `tools/hosts.sh ARGS`, which must succeed.
    #[allow(dead_code)] // not every test binary changes the rig after `up`
    pub fn ok(&self, args: &[&str]) {
        let out = self.sh(args).output().expect("hosts.sh");
        assert!(
            out.status.success(),
            "hosts.sh {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `hixl ARGS` in `host`.
    pub fn hixl(&self, host: &str, args: &[&str]) -> Command {
        let mut c = self.sh(&["exec", host, env!("CARGO_BIN_EXE_hixl")]);
        c.args(args);
        c
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        let _ = self.sh(&["down"]).status();
    }
}

/// A child process, killed when dropped.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
