//! Two hosts of the rig (`tools/hosts.sh`: network namespaces with their own addresses,
//! joined through a bridge, never through `lo`): a target served on host 1's address, reached
//! from host 2 over tcp through the link, whose rate cap the transfers then keep to.
//! Needs root, iproute2 and nftables; skipped without them unless HIXL_REQUIRE_NETNS=1.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

mod rig;

use rig::{Killed, Rig};

fn json_of(mut c: Command) -> serde_json::Value {
    let out = c.stdin(Stdio::null()).output().expect("run hixl");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // `bench comm --json` prints a line per case; the last one is enough here.
    let last = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or("");
    serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[test]
fn a_target_on_another_host_is_reached_over_the_link_and_keeps_to_its_rate() {
    // 200 Mbit/s each way: 0.025 GB/s.
    let Some(rig) = Rig::up("t", 2, &["rate", "200mbit"]) else {
        return;
    };
    let mut serve = Killed(
        rig.hixl(
            "h1",
            &[
                "serve",
                "--listen",
                "192.0.2.1:0",
                "--mem",
                "4M",
                "--stdin-control",
            ],
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn serve in h1"),
    );
    let mut r = BufReader::new(serve.0.stdout.take().expect("stdout"));
    let mut line = String::new();
    while !line.starts_with("READY") {
        line.clear();
        assert!(r.read_line(&mut line).expect("read") > 0, "serve ended");
    }
    let engine = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("engine="))
        .expect("engine= in READY")
        .to_string();
    assert!(engine.starts_with("192.0.2.1:"), "{line}");

    // Host 2 has no route to it but the link: the path is tcp (the fabric is for one host).
    let info = json_of(rig.hixl("h2", &["info", "--peer", &engine, "--json"]));
    let path = info["peer"]["transport"].as_str().unwrap_or_default();
    assert!(path.starts_with("tcp"), "{info}");

    let bench = json_of(rig.hixl(
        "h2",
        &[
            "bench",
            "comm",
            "--target",
            &engine,
            "--op",
            "write",
            "--blocks",
            "256K",
            "--total",
            "1M",
            "--duration",
            "0.5",
            "--no-baseline",
            "--json",
        ],
    ));
    let gbps = bench["gbps"].as_f64().unwrap_or(f64::NAN);
    eprintln!("h2 -> h1 over {path}: {gbps:.4} GB/s through a 0.025 GB/s link");
    // Through the capped link, never faster than twice its rate (lo would give GB/s).
    assert!(gbps > 0.0 && gbps < 0.05, "{bench}");
}
