//! A `hixl serve` target run as a child process, as the demo, the benchmark and the
//! two-process tests use it.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use crate::util::{CliError, CliResult};

/// A running target process.
pub struct Target {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    /// Its engine address.
    pub engine: String,
    /// Its plain-TCP baseline address, if started with one.
    pub baseline: Option<String>,
    /// Its process id.
    pub pid: u32,
    /// Its READY line, as printed.
    pub ready: String,
}

impl Target {
    /// Starts `exe serve --listen 127.0.0.1:0 --mem MEM --stdin-control` plus `extra` args, and
    /// waits for its READY line.
    ///
    /// # Errors
    /// When the process cannot start or does not become ready in 30 s.
    pub fn spawn(exe: &Path, mem: u64, extra: &[&str]) -> CliResult<Target> {
        let mem = mem.to_string();
        let mut args = vec![
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--stdin-control",
            "--mem",
            &mem,
        ];
        args.extend_from_slice(extra);
        Self::spawn_with(exe, &args)
    }

    /// Starts `exe args...` (a command that prints `READY engine=...` and exits when its
    /// standard input closes) and waits for its READY line.
    ///
    /// # Errors
    /// As [`Target::spawn`].
    pub fn spawn_with(exe: &Path, args: &[&str]) -> CliResult<Target> {
        let mut child = Command::new(exe)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| CliError(format!("cannot start target {}: {e}", exe.display())))?;
        let stdin = child.stdin.take();
        let out = child
            .stdout
            .take()
            .ok_or_else(|| CliError("target has no stdout".into()))?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let pid = child.id();
        let mut t = Target {
            child,
            stdin,
            lines: rx,
            engine: String::new(),
            baseline: None,
            pid,
            ready: String::new(),
        };
        let ready = t.wait_line("READY", Duration::from_secs(30))?;
        for kv in ready.split_whitespace() {
            if let Some(v) = kv.strip_prefix("engine=") {
                t.engine = v.to_string();
            }
            if let Some(v) = kv.strip_prefix("baseline=") {
                t.baseline = Some(v.to_string());
            }
        }
        t.ready = ready.clone();
        if t.engine.is_empty() {
            return Err(CliError(format!(
                "target printed no engine address: {ready}"
            )));
        }
        Ok(t)
    }

    /// Waits for the next stdout line starting with `prefix`, skipping others.
    ///
    /// # Errors
    /// On timeout or when the target exits first.
    pub fn wait_line(&mut self, prefix: &str, timeout: Duration) -> CliResult<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.starts_with(prefix) => return Ok(l),
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => {
                    return Err(CliError(format!(
                        "target printed no {prefix} line within {timeout:?}"
                    )))
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let st = self.child.try_wait().ok().flatten();
                    let st = st.map_or("still running".to_owned(), |s| s.to_string());
                    return Err(CliError(format!(
                        "the target exited before printing {prefix} ({st}; its own error is above)"
                    )));
                }
            }
        }
    }

    /// Writes one line to the target's standard input, for targets that take commands there.
    ///
    /// # Errors
    /// When the target's standard input is closed or the write fails.
    pub fn send_line(&mut self, line: &str) -> CliResult {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| CliError("the target's standard input is closed".into()))?;
        writeln!(stdin, "{line}")?;
        stdin.flush()?;
        Ok(())
    }

    /// Hands over the rest of the target's standard output, a line per item, to a caller
    /// that reads it itself (a thread routing lines to several waiters, say). After this,
    /// [`Target::wait_line`] reports the target as exited.
    pub fn take_lines(&mut self) -> Receiver<String> {
        let (_closed, none) = mpsc::channel();
        std::mem::replace(&mut self.lines, none)
    }

    /// The `key=value` field `key` of the READY line.
    pub fn ready_field(&self, key: &str) -> Option<&str> {
        self.ready
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
    }

    /// Kills the process at once (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends the target signal `sig` (e.g. `libc::SIGTERM`) and waits up to `timeout` for it
    /// to exit; its exit status, or `None` if it is still running.
    pub fn signal(&mut self, sig: i32, timeout: Duration) -> Option<std::process::ExitStatus> {
        let pid = i32::try_from(self.pid).ok()?;
        // SAFETY: a plain signal to our own child, which has not been waited for (so its pid
        // is not reused).
        unsafe { libc::kill(pid, sig) };
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Some(st);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Peak resident memory of the target, in bytes.
    pub fn peak_rss(&self) -> Option<u64> {
        crate::util::peak_rss(self.pid)
    }

    /// Asks the target to exit (closes its stdin) and waits up to 5 s, then kills it.
    pub fn stop(mut self) {
        self.stdin.take();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill();
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
