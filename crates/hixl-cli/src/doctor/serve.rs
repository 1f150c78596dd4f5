//! `hixl doctor --serve`: the peer end of a doctor's checks. An engine with a registered
//! region the probe writes into, exported under a name that carries the side endpoint's
//! address; the side endpoint on the engine's IP. Runs until SIGINT or SIGTERM.

use std::io::Write;
use std::net::TcpListener;
use std::time::Duration;

use hixl::{Access, HostBuffer};

use super::side;
use crate::util::CliResult;

/// What the serve mode runs with.
pub struct ServeArgs<'a> {
    /// The engine's `ip:port` (port 0: a free one).
    pub listen: &'a str,
    /// Bytes the probe may write.
    pub mem: u64,
    /// Publish under this name (with `directory`).
    pub name: Option<&'a str>,
    /// The etcd directory.
    pub directory: Option<&'a str>,
    /// Engine options.
    pub options: &'a [(String, String)],
}

fn say(line: String) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Serves until stopped.
///
/// # Errors
/// When the engine, the region or the side endpoint cannot be set up.
pub async fn run(a: ServeArgs<'_>) -> CliResult {
    let mut stop = crate::stop::Stop::install()?;
    let Some(ip) = super::netif::ip_of(a.listen).or_else(|| {
        a.listen
            .strip_suffix(":0")
            .and_then(|h| h.trim_matches(['[', ']']).parse().ok())
    }) else {
        return Err(hixl_cli::fail!(
            "--listen {}: doctor --serve listens on ip:port (port 0 picks a free one)",
            a.listen
        ));
    };
    let mut b = crate::serve::builder_for(a.listen);
    for (k, v) in a.options {
        b = b.option(k, v);
    }
    if let Some(d) = a.directory {
        b = b.option("hixl.Directory", d);
    }
    if let Some(n) = a.name {
        b = b.option("hixl.Name", n);
    }
    let l = TcpListener::bind((ip, 0))?;
    let side_addr = l.local_addr()?;
    let engine = b.build().await?;
    let region = engine.register_with(
        HostBuffer::zeroed(a.mem as usize)?,
        Access::REMOTE_RW,
        Some(&format!("{}{side_addr}", side::REGION_PREFIX)),
    )?;
    let advertised = engine.local_engine().to_string();
    let max = a.mem as usize;
    std::thread::spawn(move || side::serve(l, advertised, max));
    let published = match engine.directory().and_then(|d| d.publication()) {
        Some(p) => format!(" name={}", p.entry.name),
        None => String::new(),
    };
    say(format!(
        "LISTENING engine={} side={side_addr} region={}{published} pid={}",
        engine.local_engine(),
        region.len(),
        std::process::id()
    ));
    let sig = stop.recv().await;
    say(format!("STOPPING on {sig}"));
    engine.shutdown(Duration::from_secs(1)).await;
    Ok(())
}
