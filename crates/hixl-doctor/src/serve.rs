//! The peer end of a doctor's checks (`hixl doctor --serve`): an engine with a registered
//! region the probe writes into, exported under a name that carries the side endpoint's
//! address, and the side endpoint on the engine's IP.

use std::net::{IpAddr, SocketAddr, TcpListener};

use hixl_async::{Engine, EngineBuilder, HostBuffer, Region};
use hixl_core::{Access, Error, Result};

use crate::{netif, probe, side};

/// A running peer end.
pub struct Served {
    /// The engine doctors connect to.
    pub engine: Engine,
    /// The region the probe writes into.
    pub region: Region,
    /// The side endpoint's address.
    pub side: SocketAddr,
}

/// The IP a serving end listens on, from `ip:port` (or `ip:0`, `[v6]:0`).
pub fn listen_ip(listen: &str) -> Option<IpAddr> {
    netif::ip_of(listen).or_else(|| {
        listen
            .strip_suffix(":0")
            .and_then(|h| h.trim_matches(['[', ']']).parse().ok())
    })
}

/// Starts the engine `b` (listening on `ip`), registers `mem` bytes for the probe and serves
/// the side endpoint on `ip` (a thread, for the rest of the process).
///
/// # Errors
/// `mem` under [`probe::SMALL`], or the engine, the region or the side endpoint cannot be set
/// up.
pub async fn start(b: EngineBuilder, ip: IpAddr, mem: u64) -> Result<Served> {
    if mem < probe::SMALL {
        return Err(Error::InvalidParam {
            what: format!(
                "the doctor's region must be at least {} bytes, got {mem}",
                probe::SMALL
            ),
        });
    }
    let l = TcpListener::bind((ip, 0))
        .map_err(|e| Error::io(format!("binding the side endpoint on {ip}"), e))?;
    let side_addr = l
        .local_addr()
        .map_err(|e| Error::io("the side endpoint's address", e))?;
    let engine = b.build().await?;
    let region = engine.register_with(
        HostBuffer::zeroed(mem as usize)?,
        Access::REMOTE_RW,
        Some(&format!("{}{side_addr}", side::REGION_PREFIX)),
    )?;
    let advertised = engine.local_engine().to_string();
    let max = mem as usize;
    std::thread::spawn(move || side::serve(l, advertised, max));
    Ok(Served {
        engine,
        region,
        side: side_addr,
    })
}
