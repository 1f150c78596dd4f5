//! Bad input to the `hixl` command is refused with a message naming the value and what was
//! expected, and nothing starts.

use std::process::{Command, Stdio};

fn hixl(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_hixl"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn bad_listen_mem_and_peer_values_are_named() {
    for (args, says) in [
        (
            &["serve", "--listen", "127.0.0.1", "--stdin-control"][..],
            "--listen 127.0.0.1: a target listens on ip:port",
        ),
        (
            &["serve", "--listen", "[::1]", "--stdin-control"][..],
            "--listen [::1]: a target listens on ip:port",
        ),
        (
            &[
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--mem",
                "0",
                "--stdin-control",
            ][..],
            "--mem 0: the region to serve needs at least one byte",
        ),
        (
            &["info", "--peer", "localhost:99999"][..],
            "\"localhost:99999\": port 99999 is out of range (0-65535)",
        ),
    ] {
        let (ok, text) = hixl(args);
        assert!(!ok, "{args:?} succeeded: {text}");
        assert!(text.contains(says), "{args:?}: {text}");
        assert!(!text.contains("READY"), "{args:?} started: {text}");
    }
}

/// Reads `child`'s stdout until a line starting with `prefix`, and returns it.
fn line_starting(child: &mut std::process::Child, prefix: &str) -> String {
    use std::io::BufRead;
    let out = child.stdout.as_mut().expect("piped stdout");
    let mut r = std::io::BufReader::new(out);
    let mut l = String::new();
    loop {
        l.clear();
        let n = r.read_line(&mut l).expect("read a line");
        assert!(n > 0, "the child ended before a line starting {prefix:?}");
        if let Some(i) = l.find(prefix) {
            return l[i..].trim().to_string();
        }
    }
}

struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn info_against_an_http_server_names_it() {
    // hixl's own metrics port (waits for a request, then answers HTTP).
    let mut serve = Killed(
        Command::new(env!("CARGO_BIN_EXE_hixl"))
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--metrics",
                "127.0.0.1:0",
            ])
            .args(["--stdin-control"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn hixl serve"),
    );
    let m = line_starting(&mut serve.0, "METRICS http://");
    let addr = m
        .trim_start_matches("METRICS http://")
        .trim_end_matches("/metrics")
        .to_string();
    let (ok, text) = hixl(&["info", "--peer", &addr]);
    assert!(!ok, "{text}");
    assert!(
        text.contains(&format!("{addr} is an HTTP server")),
        "{addr}: {text}"
    );

    // Python's http.server, where python3 is installed.
    let Ok(py) = Command::new("python3")
        .args(["-u", "-m", "http.server", "0", "--bind", "127.0.0.1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
    else {
        eprintln!("no python3: the http.server case is skipped");
        return;
    };
    let mut py = Killed(py);
    let l = line_starting(&mut py.0, "Serving HTTP on");
    // "Serving HTTP on 127.0.0.1 port 40123 (http://127.0.0.1:40123/) ..."
    let port = l
        .split_whitespace()
        .nth(5)
        .expect("a port in the banner")
        .to_string();
    let addr = format!("127.0.0.1:{port}");
    let (ok, text) = hixl(&["info", "--peer", &addr]);
    assert!(!ok, "{text}");
    assert!(
        text.contains(&format!("{addr} is an HTTP server")) && text.contains("HTTP/1.0 "),
        "{addr}: {text}"
    );
}

#[test]
fn demo_and_info_print_json() {
    let (ok, text) = hixl(&["info", "--json"]);
    assert!(ok, "{text}");
    let v: serde_json::Value = serde_json::from_str(text.trim()).expect("info --json is JSON");
    assert_eq!(v["transports"]["tcp"]["available"], true, "{v}");

    let out = Command::new(env!("CARGO_BIN_EXE_hixl"))
        .args(["demo", "--tokens", "16", "--warm", "2", "--json"])
        .stdin(Stdio::null())
        .output()
        .expect("run demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).expect("demo --json is JSON");
    assert_eq!(v["verified"], true, "{v}");
    let t = v["transports"].as_array().expect("transports");
    assert_eq!(t.len(), 2, "{v}");
    for r in t {
        for op in ["write", "read"] {
            assert_eq!(r[op]["warm_calls"], 2, "{v}");
            assert!(r[op]["warm_gbps"].as_f64().is_some_and(|g| g > 0.0), "{v}");
            assert!(r[op]["cold_ms"].as_f64().is_some_and(|g| g > 0.0), "{v}");
        }
    }
}
