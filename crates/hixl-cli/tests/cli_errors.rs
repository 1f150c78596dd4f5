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
