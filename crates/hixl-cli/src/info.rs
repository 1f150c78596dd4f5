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
async fn verbs_report() {
    let engine = hixl::Engine::builder("127.0.0.1")
        .option("hixl.Transport", "verbs")
        .build()
        .await;
    match engine.as_ref().map(|e| e.verbs_status()) {
        Ok(Ok(dev)) => println!(
            "  verbs   available: RDMA WRITE/READ over {dev} (one-sided, no CPU on the target) to peers on other hosts that have an active device too; same-host peers take the fabric"
        ),
        Ok(Err(why)) => println!("  verbs   not available: {why}"),
        Err(e) => println!("  verbs   not available: {e}"),
    }
    match hixl::verbs::query_devices() {
        Ok(devs) => {
            for d in devs {
                println!(
                    "  device {}: firmware {:?}, max_qp_wr {}, max_cqe {}, max_mr_size {}",
                    d.name, d.fw_ver, d.max_qp_wr, d.max_cqe, d.max_mr_size
                );
                for p in &d.ports {
                    println!(
                        "    port {}: {}, {}, active mtu {}, max message {} bytes, lid {}",
                        p.port,
                        p.state,
                        p.link_layer,
                        p.active_mtu
                            .map(|m| m.to_string())
                            .unwrap_or_else(|| "unknown".into()),
                        p.max_msg_size,
                        p.lid
                    );
                    for g in &p.gids {
                        println!("      {g}");
                    }
                }
            }
        }
        Err(e) => println!("  devices: {e}"),
    }
}

#[cfg(not(feature = "verbs"))]
async fn verbs_report() {
    let devs = rdma_devices();
    if devs.is_empty() {
        println!("  verbs   not available: no RDMA device on this machine (/sys/class/infiniband is empty or missing), and this build has no verbs backend (build hixl-cli with --features verbs)");
    } else {
        println!(
            "  verbs   not in this build: RDMA devices present ({}); build hixl-cli with --features verbs (needs libibverbs-dev) to use them",
            devs.join(", ")
        );
    }
}

fn ptrace_scope() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()
        .map(|s| s.trim().to_string())
}

/// Prints the report.
pub async fn run(a: Args) -> CliResult {
    println!("hixl {}", env!("CARGO_PKG_VERSION"));
    println!("wire protocol version {}", hixl::wire::VERSION);
    println!("transports:");
    println!("  tcp     available: any peer reachable over IP (one-sided READ/WRITE served by the target's engine)");
    // Try io_uring for real: an engine asking for it probes the kernel.
    let uring = hixl::Engine::builder("127.0.0.1")
        .option("hixl.TcpIo", "uring")
        .build()
        .await;
    match uring.as_ref().map(|e| e.tcp_io()) {
        Ok((hixl::options::TcpIo::Uring, _)) => println!(
            "  tcp io  epoll (default) and io_uring (hixl.TcpIo=uring: one ring per data connection) both available"
        ),
        Ok((_, why)) => println!(
            "  tcp io  epoll only: io_uring not available ({}); hixl.TcpIo=uring falls back to epoll",
            why.unwrap_or("unknown reason")
        ),
        Err(e) => println!("  tcp io  epoll; io_uring not probed: {e}"),
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
        Ok(()) => println!(
            "  fabric  available: peers on this host (same boot id and mount namespace) map each other's pool memory (sealed memfds) and reach other host memory with process_vm_readv/writev (needs the same uid or CAP_SYS_PTRACE; Yama ptrace_scope {})",
            ptrace_scope().unwrap_or_else(|| "not present".into())
        ),
        Err(e) => println!("  fabric  not available: {e}"),
    }
    verbs_report().await;
    println!("memory kinds: host (device memory needs a device runtime; none in this build)");
    if let Some(p) = a.peer {
        let mut b = hixl::Engine::builder("127.0.0.1");
        if let Some(d) = &a.directory {
            b = b.option("hixl.Directory", d);
        }
        for (k, v) in &a.options {
            if !k.starts_with("hixl.Directory") {
                return Err(hixl_cli::fail!(
                    "--option {k}: only hixl.Directory* keys apply to `hixl info`"
                ));
            }
            b = b.option(k, v);
        }
        let e = b.build().await?;
        let peer = e.connect(&p, Duration::from_secs(5)).await?;
        println!("peer {p}: {}", peer.transport());
        for r in peer.rails() {
            println!("  {r}");
        }
        e.shutdown(Duration::from_millis(200)).await;
    }
    Ok(())
}
