//! `hixl info`: version, and which transports this machine can use and why.

use crate::util::CliResult;

fn rdma_devices() -> Vec<String> {
    std::fs::read_dir("/sys/class/infiniband")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// Prints the report.
pub fn run() -> CliResult {
    println!("hixl {}", env!("CARGO_PKG_VERSION"));
    println!("wire protocol version {}", hixl::wire::VERSION);
    println!("transports:");
    println!("  tcp     available: any peer reachable over IP (one-sided READ/WRITE served by the target's engine)");
    println!("  fabric  not in this build: the same-host shared-memory backend is not implemented yet; same-host peers use tcp over loopback");
    let devs = rdma_devices();
    if devs.is_empty() {
        println!("  verbs   not available: no RDMA device on this machine (/sys/class/infiniband is empty or missing), and the verbs backend is not in this build");
    } else {
        println!(
            "  verbs   not in this build: RDMA devices present ({}), but the verbs backend is not implemented yet",
            devs.join(", ")
        );
    }
    println!("memory kinds: host (device memory needs a device runtime; none in this build)");
    Ok(())
}
