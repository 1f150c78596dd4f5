//! The target engine and its regions, and the raw session the inputs' data connections join.

use hixl_async::{Engine, HostBuffer, Region};
use hixl_core::{Access, MemDesc, MemKind};
use hixl_fuzz::{handshake, FdWatch, Handshake, Prober};

use crate::{GUARD, PEER, W_BUF, W_LEN, W_OFF};

/// A region as the harness sees it.
#[derive(Clone, Copy)]
pub(crate) struct Reg {
    pub(crate) addr: u64,
    pub(crate) len: u64,
    pub(crate) rkey: u64,
    pub(crate) access: Access,
}

impl Reg {
    fn of(r: &Region) -> Reg {
        Reg {
            addr: r.addr(),
            len: r.len(),
            rkey: r.rkey(),
            access: r.access(),
        }
    }
}

pub(crate) struct Ctx {
    pub(crate) engine: Engine,
    pub(crate) addr: String,
    /// The buffer `w` is registered in; never freed (the registration outlives everything).
    pub(crate) wbuf: HostBuffer,
    pub(crate) w: Reg,
    pub(crate) r: Reg,
    pub(crate) r_bytes: Vec<u8>,
    pub(crate) rbuf: Region,
    pub(crate) l: Reg,
    pub(crate) lbuf: Region,
    pub(crate) l_bytes: Vec<u8>,
    pub(crate) d: Reg,
    pub(crate) dbuf: HostBuffer,
    pub(crate) d_bytes: Vec<u8>,
    pub(crate) session: Handshake,
    pub(crate) probers: Vec<Prober>,
    pub(crate) inputs: u64,
    pub(crate) fds: FdWatch,
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| seed.wrapping_add((i as u8).wrapping_mul(7)))
        .collect()
}

pub(crate) async fn setup() -> Ctx {
    let engine = Engine::builder("127.0.0.1")
        .ephemeral_port()
        // The raw session sends no heartbeats: it must not be dropped for silence.
        .option("hixl.HeartbeatIntervalMs", "600000")
        .option("hixl.HeartbeatMissLimit", "100")
        .build()
        .await
        .expect("harness setup: target engine");
    let mut wbuf = HostBuffer::zeroed(W_BUF).expect("harness setup: buffer");
    wbuf.as_mut_slice().fill(GUARD);
    wbuf.as_mut_slice()[W_OFF..W_OFF + W_LEN].copy_from_slice(&pattern(W_LEN, 1));
    let wdesc = MemDesc::new(wbuf.as_ptr() as u64 + W_OFF as u64, W_LEN as u64);
    // SAFETY: `wbuf` lives in the context for the rest of the process, so the registered
    // range stays valid memory for as long as the engine exists.
    let w = unsafe { engine.register_raw(wdesc, MemKind::Host, Access::REMOTE_RW, Some("w")) }
        .expect("harness setup: register w");
    let mut rb = HostBuffer::zeroed(4096).expect("harness setup: buffer");
    let r_bytes = pattern(4096, 2);
    rb.as_mut_slice().copy_from_slice(&r_bytes);
    let rbuf = engine
        .register_with(rb, Access::REMOTE_READ, Some("r"))
        .expect("harness setup: register r");
    let mut lb = HostBuffer::zeroed(4096).expect("harness setup: buffer");
    let l_bytes = pattern(4096, 3);
    lb.as_mut_slice().copy_from_slice(&l_bytes);
    let lbuf = engine
        .register_with(lb, Access::LOCAL, Some("l"))
        .expect("harness setup: register l");
    let mut db = HostBuffer::zeroed(4096).expect("harness setup: buffer");
    let d_bytes = pattern(4096, 4);
    db.as_mut_slice().copy_from_slice(&d_bytes);
    let dreg = engine
        .register_with(db, Access::REMOTE_RW, Some("d"))
        .expect("harness setup: register d");
    let d = Reg::of(&dreg);
    let dbuf = engine
        .deregister(&dreg)
        .await
        .expect("harness setup: deregister d")
        .expect("harness setup: d's buffer handed back");
    let addr = engine.local_engine().to_string();
    let session = handshake(&addr, PEER).await;
    let probers = vec![
        Prober::new(&[("hixl.Transport", "tcp")]).await,
        Prober::new(&[]).await,
    ];
    Ctx {
        w: Reg::of(&w),
        r: Reg::of(&rbuf),
        l: Reg::of(&lbuf),
        engine,
        addr,
        wbuf,
        r_bytes,
        rbuf,
        lbuf,
        l_bytes,
        d,
        dbuf,
        d_bytes,
        session,
        probers,
        inputs: 0,
        fds: FdWatch::default(),
    }
}
