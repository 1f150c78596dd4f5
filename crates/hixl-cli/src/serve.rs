//! `hixl serve`: a target that registers memory and serves peers, printing what it receives.

use std::io::{Read, Write};
use std::net::TcpListener;

use futures::StreamExt;
use hixl::{Access, Engine, HostBuffer};

use crate::util::{checksum, parse_kv, parse_size, CliResult};

/// Arguments of `hixl serve`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Engine address to listen on (`ip:port`; port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:26000")]
    pub listen: String,
    /// Bytes of host memory to register (e.g. 256M).
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    pub mem: u64,
    /// Name under which the region is exported to peers.
    #[arg(long, default_value = "kv")]
    pub region: String,
    /// Publish this engine under NAME in the directory (`--directory`), so peers connect by
    /// name (`hixl.Name`).
    #[arg(long, value_name = "NAME", requires = "directory")]
    pub name: Option<String>,
    /// The etcd directory, `etcd://host:port[,host:port...]` (`hixl.Directory`).
    #[arg(long, value_name = "URL")]
    pub directory: Option<String>,
    /// Take the region from the engine's fabric pool (sealed shared memory that same-host
    /// peers map) instead of the heap.
    #[arg(long)]
    pub pool: bool,
    /// Also serve a plain-TCP baseline (for `hixl bench comm`).
    #[arg(long)]
    pub baseline: bool,
    /// Exit when standard input closes (for a parent process that owns this target).
    #[arg(long)]
    pub stdin_control: bool,
    /// Serve the engine's telemetry as Prometheus text at `http://IP:PORT/metrics` (port 0
    /// picks one; the line `METRICS http://...` says which): the initiators connected, and
    /// the transfers this engine posts, per peer, transport and operation.
    #[arg(long, value_name = "IP:PORT")]
    pub metrics: Option<String>,
    /// An engine option `KEY=VALUE` (HIXL keys such as `BufferPool=0:0`); repeatable.
    #[arg(long = "option", value_parser = parse_kv)]
    pub options: Vec<(String, String)>,
}

/// Splits `ip:0` into a builder that picks a free port.
pub fn builder_for(listen: &str) -> hixl::EngineBuilder {
    match listen.strip_suffix(":0") {
        Some(ip) => {
            Engine::builder(ip.trim_start_matches('[').trim_end_matches(']')).ephemeral_port()
        }
        None => Engine::builder(listen),
    }
}

fn say(line: String) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Runs the target until stopped (SIGINT, SIGTERM, or standard input closing with
/// `--stdin-control`), then withdraws its directory entry and shuts the engine down.
pub async fn run(a: Args) -> CliResult {
    // Caught before anything is published or READY printed: a signal at any moment from here
    // on goes through the shutdown below.
    let mut stop = crate::stop::Stop::install()?;
    if a.name.as_deref() == Some("") {
        return Err(hixl_cli::fail!(
            "--name \"\": an engine name cannot be empty (omit --name to serve unpublished)"
        ));
    }
    let has_port = a
        .listen
        .rsplit_once(':')
        .is_some_and(|(_, p)| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    if !has_port {
        return Err(hixl_cli::fail!(
            "--listen {}: a target listens on ip:port (port 0 picks a free one); an address without a port would serve nobody",
            a.listen
        ));
    }
    if a.mem == 0 {
        return Err(hixl_cli::fail!(
            "--mem 0: the region to serve needs at least one byte (e.g. --mem 256M)"
        ));
    }
    let mut b = builder_for(&a.listen);
    for (k, v) in &a.options {
        b = b.option(k, v);
    }
    if let Some(d) = &a.directory {
        b = b.option("hixl.Directory", d);
    }
    if let Some(n) = &a.name {
        b = b.option("hixl.Name", n);
    }
    let engine = b.build().await?;
    let region = if a.pool {
        engine.register_pooled(a.mem, Access::REMOTE_RW, Some(&a.region))?
    } else {
        engine.register_with(
            HostBuffer::zeroed(a.mem as usize)?,
            Access::REMOTE_RW,
            Some(&a.region),
        )?
    };
    let baseline = if a.baseline {
        let l = TcpListener::bind("127.0.0.1:0")?;
        let addr = l.local_addr()?;
        std::thread::spawn(move || baseline_server(l));
        format!(" baseline={addr}")
    } else {
        String::new()
    };
    let metrics = match &a.metrics {
        Some(addr) => Some(engine.serve_metrics(addr).await?),
        None => None,
    };
    let published = match engine.directory().and_then(|d| d.publication()) {
        Some(p) => format!(" name={} incarnation={}", p.entry.name, p.entry.incarnation),
        None => String::new(),
    };
    say(format!(
        "READY engine={} region={:#x}:{} pid={}{baseline}{published}",
        engine.local_engine(),
        region.addr(),
        region.len(),
        std::process::id()
    ));
    if let Some(m) = &metrics {
        say(format!("METRICS http://{}/metrics", m.local_addr()));
    }
    let (quit_tx, mut quit) = tokio::sync::mpsc::channel::<()>(1);
    if a.stdin_control {
        std::thread::spawn(move || {
            let mut sink = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut sink);
            let _ = quit_tx.blocking_send(());
        });
    }
    let mut notes = engine.notifications();
    loop {
        tokio::select! {
            n = notes.next() => {
                let Some(n) = n else { break };
                let name = String::from_utf8_lossy(&n.name).to_string();
                let msg = String::from_utf8_lossy(&n.msg).to_string();
                say(format!("NOTIFY from={} name={name} msg={msg}", n.from));
                if name == "hixl.verify" {
                    say(verify(&region, &msg));
                }
                if name == "hixl.deregister" {
                    // Returns once every same-host peer stopped touching the region.
                    match engine.deregister(&region).await {
                        Ok(_) => say("DEREGISTERED ok".into()),
                        Err(e) => say(format!("DEREGISTERED error {e}")),
                    }
                }
            }
            _ = quit.recv() => break,
            sig = stop.recv() => {
                say(format!("STOPPING on {sig}"));
                break;
            }
        }
    }
    engine.shutdown(std::time::Duration::from_secs(1)).await;
    Ok(())
}

/// Handles `hixl.verify` with msg `OFFSET LEN CHECKSUM`: checks the region's bytes.
fn verify(region: &hixl::Region, msg: &str) -> String {
    let f: Vec<u64> = msg
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    let [off, len, want] = f[..] else {
        return format!("VERIFY bad-request msg={msg:?}");
    };
    let mut buf = vec![0u8; len as usize];
    if let Err(e) = region.read_at(off, &mut buf) {
        return format!("VERIFY bad-request {e}");
    }
    let got = checksum(&buf);
    let verdict = if got == want { "ok" } else { "mismatch" };
    format!("VERIFY {verdict} offset={off} len={len} expected={want:#x} got={got:#x}")
}

/// Plain TCP baseline: per connection, a 17-byte header (op `W`/`R`, bytes per call, block),
/// then for each call either sink the bytes and ack one byte, or on a one-byte request send
/// the bytes in block-sized writes.
fn baseline_server(l: TcpListener) {
    for s in l.incoming().flatten() {
        std::thread::spawn(move || {
            let _ = hixl_doctor::side::baseline_conn(s, 4 << 30);
        });
    }
}
