//! `hixl info`: version, which transports this machine can use and why, and with `--peer`
//! which transport hixl picks for a given peer and why.

use std::time::Duration;

use crate::util::CliResult;

/// Arguments of `hixl info`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Also connect to this engine (`ip:port`, or a name with `--directory`) and say which
    /// transport serves it and why.
    #[arg(long)]
    pub peer: Option<String>,
    /// The etcd directory (`etcd://host:port[,host:port...]`) that `--peer NAME` is looked up
    /// in (`hixl.Directory`).
    #[arg(long, value_name = "URL", requires = "peer")]
    pub directory: Option<String>,
    /// A directory option `KEY=VALUE` (`hixl.DirectoryPrefix`, `hixl.DirectoryUser`,
    /// `hixl.DirectoryPassword`); repeatable.
    #[arg(long = "option", value_parser = crate::util::parse_kv, requires = "directory")]
    pub options: Vec<(String, String)>,
    /// One JSON object on stdout instead of the text.
    #[arg(long)]
    pub json: bool,
}

/// The report, as text lines and as one JSON object.
struct Report {
    lines: Vec<String>,
    transports: serde_json::Map<String, serde_json::Value>,
    devices: Vec<serde_json::Value>,
}

impl Report {
    /// A transport's (or an I/O path's) line: `name`, whether it is available, and the detail.
    fn transport(&mut self, name: &str, available: bool, detail: String) {
        let width = if name.len() < 7 { 7 } else { name.len() };
        self.lines.push(format!("  {name:<width$} {detail}"));
        self.transports.insert(
            name.replace(' ', "_"),
            serde_json::json!({ "available": available, "detail": detail }),
        );
    }
}

#[cfg_attr(feature = "verbs", allow(dead_code))]
fn rdma_devices() -> Vec<String> {
    std::fs::read_dir("/sys/class/infiniband")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// The verbs line: whether an engine can use RDMA here and why not, then every device with its
/// ports and GIDs.
#[cfg(feature = "verbs")]
async fn verbs_report(r: &mut Report) {
    let engine = hixl::Engine::builder("127.0.0.1")
        .option("hixl.Transport", "verbs")
        .build()
        .await;
    match engine.as_ref().map(|e| e.verbs_status()) {
        Ok(Ok(dev)) => r.transport(
            "verbs",
            true,
            format!("available: RDMA WRITE/READ over {dev} (one-sided, no CPU on the target) to peers on other hosts that have an active device too; same-host peers take the fabric"),
        ),
        Ok(Err(why)) => r.transport("verbs", false, format!("not available: {why}")),
        Err(e) => r.transport("verbs", false, format!("not available: {e}")),
    }
    match hixl::verbs::query_devices() {
        Ok(devs) => {
            for d in devs {
                r.lines.push(format!(
                    "  device {}: firmware {:?}, max_qp_wr {}, max_cqe {}, max_mr_size {}",
                    d.name, d.fw_ver, d.max_qp_wr, d.max_cqe, d.max_mr_size
                ));
                let mut ports = Vec::new();
                for p in &d.ports {
                    let mtu = p
                        .active_mtu
                        .map(|m| m.to_string())
                        .unwrap_or_else(|| "unknown".into());
                    r.lines.push(format!(
                        "    port {}: {}, {}, active mtu {mtu}, max message {} bytes, lid {}",
                        p.port, p.state, p.link_layer, p.max_msg_size, p.lid
                    ));
                    let gids: Vec<String> = p.gids.iter().map(|g| g.to_string()).collect();
                    for g in &gids {
                        r.lines.push(format!("      {g}"));
                    }
                    ports.push(serde_json::json!({
                        "port": p.port,
                        "state": p.state.to_string(),
                        "link_layer": p.link_layer.to_string(),
                        "active_mtu": mtu,
                        "max_msg_size": p.max_msg_size,
                        "lid": p.lid,
                        "gids": gids,
                    }));
                }
                r.devices.push(serde_json::json!({
                    "name": d.name,
                    "firmware": format!("{:?}", d.fw_ver),
                    "max_qp_wr": d.max_qp_wr,
                    "max_cqe": d.max_cqe,
                    "max_mr_size": d.max_mr_size,
                    "ports": ports,
                }));
            }
        }
        Err(e) => r.lines.push(format!("  devices: {e}")),
    }
}

#[cfg(not(feature = "verbs"))]
async fn verbs_report(r: &mut Report) {
    let devs = rdma_devices();
    if devs.is_empty() {
        r.transport("verbs", false, "not available: no RDMA device on this machine (/sys/class/infiniband is empty or missing), and this build has no verbs backend (build hixl-cli with --features verbs)".into());
    } else {
        r.transport("verbs", false, format!(
            "not in this build: RDMA devices present ({}); build hixl-cli with --features verbs (needs libibverbs-dev) to use them",
            devs.join(", ")
        ));
        r.devices = devs
            .into_iter()
            .map(|d| serde_json::json!({ "name": d }))
            .collect();
    }
}

fn ptrace_scope() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()
        .map(|s| s.trim().to_string())
}

/// The engine that reaches a `--peer`: at `local`, with the directory (`hixl.Directory`) that
/// a peer's name is looked up in and `options`.
pub fn peer_builder(
    local: &str,
    directory: Option<&str>,
    options: &[(String, String)],
) -> hixl::EngineBuilder {
    let mut b = hixl::Engine::builder(local);
    if let Some(d) = directory {
        b = b.option("hixl.Directory", d);
    }
    for (k, v) in options {
        b = b.option(k, v);
    }
    b
}

/// Which transport serves a connected peer and why, and its rails (verbs only): what
/// `hixl info --peer` and `hixl doctor` report of a path.
pub struct PeerPath {
    /// The transport, with why it was picked.
    pub transport: String,
    /// The link's rails.
    pub rails: Vec<hixl::RailInfo>,
}

impl PeerPath {
    /// The path to `peer` now.
    pub fn of(peer: &hixl::Peer) -> PeerPath {
        PeerPath {
            transport: peer.transport().to_string(),
            rails: peer.rails(),
        }
    }

    /// As text: `peer NAME: transport`, then a line per rail.
    pub fn lines(&self, name: &str) -> Vec<String> {
        let mut l = vec![format!("peer {name}: {}", self.transport)];
        l.extend(self.rails.iter().map(|x| format!("  {x}")));
        l
    }

    /// As JSON: `{peer, transport, rails}`.
    pub fn json(&self, name: &str) -> serde_json::Value {
        let rails: Vec<String> = self.rails.iter().map(|r| r.to_string()).collect();
        serde_json::json!({ "peer": name, "transport": self.transport, "rails": rails })
    }
}

/// Prints the report.
pub async fn run(a: Args) -> CliResult {
    let mut r = Report {
        lines: vec![
            format!("hixl {}", env!("CARGO_PKG_VERSION")),
            format!("wire protocol version {}", hixl::wire::VERSION),
            "transports:".into(),
        ],
        transports: serde_json::Map::new(),
        devices: Vec::new(),
    };
    r.transport("tcp", true, "available: any peer reachable over IP (one-sided READ/WRITE served by the target's engine)".into());
    // Try io_uring for real: an engine asking for it probes the kernel.
    let uring = hixl::Engine::builder("127.0.0.1")
        .option("hixl.TcpIo", "uring")
        .build()
        .await;
    match uring.as_ref().map(|e| e.tcp_io()) {
        Ok((hixl::options::TcpIo::Uring, _)) => r.transport(
            "tcp io",
            true,
            "epoll (default) and io_uring (hixl.TcpIo=uring: one ring per data connection) both available".into(),
        ),
        Ok((_, why)) => r.transport(
            "tcp io",
            false,
            format!(
                "epoll only: io_uring not available ({}); hixl.TcpIo=uring falls back to epoll",
                why.unwrap_or("unknown reason")
            ),
        ),
        Err(e) => r.transport("tcp io", false, format!("epoll; io_uring not probed: {e}")),
    }
    // Try the fabric backend for real: a pool buffer (sealed memfd) and the copy engine.
    let fabric = hixl::Engine::builder("127.0.0.1")
        .option("hixl.Transport", "fabric")
        .build()
        .await
        .and_then(|e| {
            e.register_pooled(4096, hixl::Access::LOCAL, None)?;
            Ok(())
        });
    match fabric {
        Ok(()) => r.transport("fabric", true, format!(
            "available: peers on this host (same boot id and mount namespace) map each other's pool memory (sealed memfds) and reach other host memory with process_vm_readv/writev (needs the same uid or CAP_SYS_PTRACE; Yama ptrace_scope {})",
            ptrace_scope().unwrap_or_else(|| "not present".into())
        )),
        Err(e) => r.transport("fabric", false, format!("not available: {e}")),
    }
    verbs_report(&mut r).await;
    r.lines.push(
        "memory kinds: host (device memory needs a device runtime; none in this build)".into(),
    );
    let mut peer_json = serde_json::Value::Null;
    if let Some(p) = a.peer {
        if let Some((k, _)) = a
            .options
            .iter()
            .find(|(k, _)| !k.starts_with("hixl.Directory"))
        {
            return Err(hixl_cli::fail!(
                "--option {k}: only hixl.Directory* keys apply to `hixl info`"
            ));
        }
        let e = peer_builder("127.0.0.1", a.directory.as_deref(), &a.options)
            .build()
            .await?;
        let peer = e.connect(&p, Duration::from_secs(5)).await?;
        let path = PeerPath::of(&peer);
        r.lines.extend(path.lines(&p));
        peer_json = path.json(&p);
        e.shutdown(Duration::from_millis(200)).await;
    }
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "version": env!("CARGO_PKG_VERSION"),
                "wire_version": hixl::wire::VERSION,
                "transports": r.transports,
                "devices": r.devices,
                "memory_kinds": ["host"],
                "peer": peer_json,
            })
        );
    } else {
        for l in &r.lines {
            println!("{l}");
        }
    }
    Ok(())
}
