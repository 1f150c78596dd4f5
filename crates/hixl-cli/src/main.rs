//! The `hixl` command: a loopback demo, a target server, a directory listing, benchmarks, a soak and machine info.

mod bench;
mod demo;
mod dirbench;
mod doctor;
mod info;
mod kv;
mod links;
mod peers;
mod progress;
mod serve;
mod soak;
mod stop;

use hixl_cli::util;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "hixl",
    version,
    about = "One-sided zero-copy transfers (HIXL for Rust)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start a target and an initiator on loopback, move a KV-cache-sized payload both ways,
    /// verify it, show a notify arriving, print GB/s.
    Demo(demo::Args),
    /// Run a target: register memory and serve peers until stopped.
    Serve(serve::Args),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(bench::Bench),
    /// Version, and which transports this machine can use and why.
    Info(info::Args),
    /// The live engines of a directory: names, incarnations, addresses, transports.
    Peers(peers::Args),
    /// A preflight of the path to a peer (run `hixl doctor --serve` on the peer's host):
    /// transport and why, advertised addresses, MTUs, hixl against raw TCP; names what is
    /// wrong. Exit status 3 when something is.
    Doctor(doctor::Args),
    /// Mixed workload (sizes, READ/WRITE, batches, notifies, drops, tiny timeouts, disconnects)
    /// against a target process over tcp and fabric for a set time; every byte verified, every
    /// op accounted for, memory of both processes watched. Exits non-zero on any violation.
    Soak(soak::Args),
    /// The peer cluster of `hixl bench kv` (an LLM-DataDist instance with a model's caches).
    #[command(hide = true)]
    KvServe(kv::ServeArgs),
    /// The target process of `hixl soak`.
    #[command(hide = true)]
    SoakServe(soak::ServeArgs),
}

fn main() {
    // HIXL_LOG, else RUST_LOG (tracing_subscriber's filter syntax), else warnings; colour only
    // on a terminal.
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_env("HIXL_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    // HIXL_WORKERS sets the runtime's worker threads (default 2).
    let workers = std::env::var("HIXL_WORKERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &usize| (1..=64).contains(&n))
        .unwrap_or(2);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("hixl: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    let r = rt.block_on(async move {
        match cli.cmd {
            Cmd::Doctor(a) => doctor::run(a).await,
            Cmd::Demo(a) => demo::run(a).await.map(|()| 0),
            Cmd::Serve(a) => serve::run(a).await.map(|()| 0),
            Cmd::Bench(b) => bench::run(b).await.map(|()| 0),
            Cmd::Info(a) => info::run(a).await.map(|()| 0),
            Cmd::Peers(a) => peers::run(a).await.map(|()| 0),
            Cmd::KvServe(a) => kv::serve(a).await.map(|()| 0),
            Cmd::Soak(a) => soak::run(a).await.map(|()| 0),
            Cmd::SoakServe(a) => soak::serve(a).await.map(|()| 0),
        }
    });
    match r {
        Ok(0) => {}
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("hixl: {e}");
            std::process::exit(1);
        }
    }
}
