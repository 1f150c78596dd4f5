//! `hixl doctor --serve`: the peer end of a doctor's checks (`hixl_doctor::serve`), with its
//! `LISTENING` line, until SIGINT or SIGTERM.

use std::io::Write;
use std::time::Duration;

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
    let Some(ip) = hixl_doctor::serve::listen_ip(a.listen) else {
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
    let s = hixl_doctor::serve::start(b, ip, a.mem).await?;
    let published = match s.engine.directory().and_then(|d| d.publication()) {
        Some(p) => format!(" name={}", p.entry.name),
        None => String::new(),
    };
    say(format!(
        "LISTENING engine={} side={} region={}{published} pid={}",
        s.engine.local_engine(),
        s.side,
        s.region.len(),
        std::process::id()
    ));
    let sig = stop.recv().await;
    say(format!("STOPPING on {sig}"));
    s.engine.shutdown(Duration::from_secs(1)).await;
    Ok(())
}
