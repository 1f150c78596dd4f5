//! One op: how it is treated after it is posted, what came of it, and the tally.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};
use std::task::Poll;
use std::time::{Duration, Instant};

use futures::FutureExt;
use hixl_async::{Peer, Region};
use hixl_core::{Error, OpDesc, RemoteRegion, TransferOp, TransferStatus};

use crate::model::{alloc_piece, release, Model, Piece, Quarantined};
use crate::rng::{fill, Rng};
use crate::{HANG, LATE};

/// How an op is treated after it is posted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum How {
    /// Awaited to completion.
    Await,
    /// Dropped right after creation.
    DropNow,
    /// Polled 0–7 times (yielding in between), then dropped if not ready.
    PollsThenDrop,
    /// Polled once with `now_or_never`, dropped if not ready.
    NowOrNever,
    /// Under `tokio::time::timeout` of a few µs–ms, dropped when that elapses.
    TokioTimeout,
    /// Not polled for a short sleep, then dropped.
    SleepThenDrop,
    /// `.timeout(d)` with d of 1 µs–5 ms.
    Deadline,
    /// `.timeout(d).quiesce_on_timeout()` with d of 1 µs–5 ms: a timeout resolves only once
    /// nothing of the op moves, so its destination is settled (each byte old or new) and
    /// reused at once; a byte landing later breaks the round's model.
    Quiesce,
    /// Polled, left alone for a while, then awaited to completion.
    PauseThenAwait,
    /// One descriptor out of the peer's bounds: refused as a whole, nothing moves.
    Invalid,
}

impl How {
    pub(crate) fn pick(rng: &mut Rng) -> How {
        match rng.below(100) {
            0..=24 => How::Await,
            25..=39 => How::DropNow,
            40..=51 => How::PollsThenDrop,
            52..=56 => How::NowOrNever,
            57..=69 => How::TokioTimeout,
            70..=75 => How::SleepThenDrop,
            76..=82 => How::Deadline,
            83..=88 => How::Quiesce,
            89..=95 => How::PauseThenAwait,
            _ => How::Invalid,
        }
    }
}

/// What came of an op.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Fate {
    Completed,
    /// Dropped or timed out before it was seen to complete.
    Abandoned,
    /// Timed out and quiesced: nothing of it moves any more.
    Settled,
    Refused,
    NoSpace,
}

/// Counts of (how, fate) and of what landed in quarantined ranges.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    pub(crate) ops: BTreeMap<(How, Fate), u64>,
    /// Quarantined destination ranges: untouched, fully written, partly written.
    pub(crate) untouched: u64,
    pub(crate) landed: u64,
    pub(crate) partial: u64,
    /// Abandoned ops still in flight when the round's last op had been posted.
    pub(crate) in_flight_at_end: u64,
}

impl Tally {
    pub(crate) fn add(&mut self, other: &Tally) {
        for (k, v) in &other.ops {
            *self.ops.entry(*k).or_default() += v;
        }
        self.untouched += other.untouched;
        self.landed += other.landed;
        self.partial += other.partial;
        self.in_flight_at_end += other.in_flight_at_end;
    }

    pub(crate) fn report(&self, what: &str) -> String {
        let mut s = format!("{what}:");
        for ((h, f), n) in &self.ops {
            s.push_str(&format!(" {h:?}/{f:?}={n}"));
        }
        let total: u64 = self.ops.values().sum();
        s.push_str(&format!(
            "; {total} ops; quarantined ranges: {} untouched, {} fully landed, {} partly landed; {} ops in flight after the last post",
            self.untouched, self.landed, self.partial, self.in_flight_at_end
        ));
        s
    }
}

/// What every task of a round shares.
pub(crate) struct Cx {
    pub(crate) seed: u64,
    pub(crate) peer: Peer,
    pub(crate) remote: Region,
    pub(crate) local: Region,
    pub(crate) rr: RemoteRegion,
    pub(crate) model: Mutex<Model>,
    pub(crate) tally: Mutex<Tally>,
}

impl Cx {
    pub(crate) fn model(&self) -> MutexGuard<'_, Model> {
        self.model.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn count(&self, how: How, fate: Fate) {
        let mut t = self.tally.lock().unwrap_or_else(|p| p.into_inner());
        *t.ops.entry((how, fate)).or_default() += 1;
    }

    /// The region a piece's source or destination is in (`true`: the target's).
    pub(crate) fn region(&self, on_target: bool) -> &Region {
        if on_target {
            &self.remote
        } else {
            &self.local
        }
    }
}

/// Per-task buffers, reused from op to op (so that allocations do not blur the RSS check).
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    pub(crate) data: Vec<u8>,
    pub(crate) got: Vec<u8>,
}

impl Scratch {
    /// `len` bytes drawn from `seed`.
    pub(crate) fn draw(&mut self, len: usize, seed: u64) -> &[u8] {
        Scratch::draw_into(&mut self.data, len, seed)
    }

    /// Reads `len` bytes of `region` at `off` into `got`.
    pub(crate) fn read(&mut self, region: &Region, off: usize, len: usize) {
        self.got.resize(len, 0);
        region
            .read_at(off as u64, &mut self.got)
            .expect("read destination");
    }

    pub(crate) fn draw_into(buf: &mut Vec<u8>, len: usize, seed: u64) -> &[u8] {
        buf.resize(len, 0);
        fill(&mut buf[..len], seed);
        &buf[..len]
    }
}

/// Bytes from 1 to 4 MiB, log-uniform, and now and then up to 6 MiB.
pub(crate) fn op_size(rng: &mut Rng) -> usize {
    if rng.chance(4) {
        return rng.range(4 << 20, 6 << 20) as usize;
    }
    let bits = rng.range(0, 22);
    rng.range(1, 1 << bits) as usize
}

/// `total` bytes in `n` non-empty pieces.
pub(crate) fn split(total: usize, n: usize, rng: &mut Rng) -> Vec<usize> {
    let n = n.clamp(1, total);
    let mut cuts: Vec<usize> = (0..n - 1)
        .map(|_| rng.range(1, total as u64 - 1) as usize)
        .collect();
    cuts.sort_unstable();
    cuts.dedup();
    let mut out = Vec::with_capacity(n);
    let mut at = 0;
    for c in cuts {
        out.push(c - at);
        at = c;
    }
    out.push(total - at);
    out
}

/// Fails the test with the op's identity (the seed is printed at the start).
pub(crate) fn expect_ok(cx: &Cx, id: u64, r: hixl_core::Result<()>) {
    if let Err(e) = r {
        panic!(
            "op {id} (seed {:#x}) failed although nothing was injected: {e:?}",
            cx.seed
        );
    }
}

/// Posts one random op and treats it as `how` says (random when `None`; a given `how` also
/// makes the op large).
pub(crate) async fn one_op(
    cx: &Cx,
    rng: &mut Rng,
    scratch: &mut Scratch,
    id: u64,
    how: Option<How>,
) {
    let write = rng.chance(50);
    let op = if write {
        TransferOp::Write
    } else {
        TransferOp::Read
    };
    let total = match how {
        None => op_size(rng),
        Some(_) => rng.range(4 << 20, 6 << 20) as usize,
    };
    let n = if rng.chance(50) {
        1
    } else {
        rng.range(2, 8) as usize
    };
    let lens = split(total, n, rng);
    let how = how.unwrap_or_else(|| How::pick(rng));
    // Runs for every descriptor, or none.
    let pieces = {
        let mut m = cx.model();
        let mut got: Vec<Piece> = Vec::with_capacity(lens.len());
        for &len in &lens {
            match alloc_piece(&mut m, len, rng) {
                Some(p) => got.push(p),
                None => {
                    for p in &got {
                        release(&mut m, p);
                    }
                    drop(m);
                    cx.count(how, Fate::NoSpace);
                    return;
                }
            }
        }
        got
    };
    // Source data in place, and in the model. Each piece's bytes are drawn from a seed, so
    // they can be drawn again instead of being kept.
    let seeds: Vec<u64> = pieces.iter().map(|_| rng.next()).collect();
    // (source on the target?, source offset, destination offset)
    let ends = |p: &Piece| {
        if write {
            (false, p.loff, p.roff)
        } else {
            (true, p.roff, p.loff)
        }
    };
    for (p, &seed) in pieces.iter().zip(&seeds) {
        let (src_t, so, _) = ends(p);
        let d = scratch.draw(p.len, seed);
        cx.model().side(src_t).model[so..so + p.len].copy_from_slice(d);
        cx.region(src_t)
            .write_at(so as u64, d)
            .expect("write source");
    }
    let mut descs: Vec<OpDesc> = pieces
        .iter()
        .map(|p| {
            OpDesc::new(
                cx.local.addr() + p.loff as u64,
                cx.rr.addr + p.roff as u64,
                p.len as u64,
            )
        })
        .collect();

    let fate = if how == How::Invalid {
        let at = rng.below(descs.len() as u64 + 1) as usize;
        let bad = OpDesc::new(cx.local.addr(), cx.rr.addr + cx.rr.len - 8, 16);
        descs.insert(at, bad);
        let mut t = cx.peer.transfer(op, &descs);
        assert_eq!(t.status(), TransferStatus::Failed);
        match (&mut t).now_or_never() {
            Some(Err(Error::RemoteOutOfBounds { .. })) => {}
            other => panic!("op {id}: a descriptor out of bounds gave {other:?}"),
        }
        Fate::Refused
    } else {
        let mut t = cx.peer.transfer(op, &descs);
        let st = t.status();
        if !matches!(st, TransferStatus::Waiting | TransferStatus::Completed) {
            let r = (&mut t).now_or_never();
            panic!(
                "op {id} (seed {:#x}, {op:?} of {lens:?} bytes, {descs:x?}, remote region {:#x}+{:#x}, local {:#x}+{:#x}): fresh transfer is {st:?}: {r:?}",
                cx.seed,
                cx.rr.addr,
                cx.rr.len,
                cx.local.addr(),
                cx.local.len()
            );
        }
        match how {
            How::Await => match tokio::time::timeout(HANG, &mut t).await {
                Ok(r) => {
                    expect_ok(cx, id, r);
                    assert_eq!(t.status(), TransferStatus::Completed);
                    Fate::Completed
                }
                Err(_) => panic!("op {id} (seed {:#x}) hung for {HANG:?}", cx.seed),
            },
            How::DropNow => {
                drop(t);
                Fate::Abandoned
            }
            How::PollsThenDrop => {
                let k = rng.below(8);
                let mut done = None;
                for _ in 0..k {
                    if let Poll::Ready(r) = futures::poll!(&mut t) {
                        done = Some(r);
                        break;
                    }
                    tokio::task::yield_now().await;
                }
                match done {
                    Some(r) => {
                        expect_ok(cx, id, r);
                        Fate::Completed
                    }
                    None => {
                        drop(t);
                        Fate::Abandoned
                    }
                }
            }
            How::NowOrNever => match (&mut t).now_or_never() {
                Some(r) => {
                    expect_ok(cx, id, r);
                    Fate::Completed
                }
                None => {
                    drop(t);
                    Fate::Abandoned
                }
            },
            How::TokioTimeout => {
                let d = Duration::from_micros(rng.range(1, 3000));
                match tokio::time::timeout(d, &mut t).await {
                    Ok(r) => {
                        expect_ok(cx, id, r);
                        Fate::Completed
                    }
                    Err(_) => {
                        drop(t);
                        Fate::Abandoned
                    }
                }
            }
            How::SleepThenDrop => {
                tokio::time::sleep(Duration::from_micros(rng.range(1, 2000))).await;
                drop(t);
                Fate::Abandoned
            }
            How::Deadline => {
                let d = Duration::from_micros(rng.range(1, 5000));
                let started = Instant::now();
                let mut t = t.timeout(d);
                let r = tokio::time::timeout(HANG, &mut t)
                    .await
                    .unwrap_or_else(|_| panic!("op {id} with deadline {d:?} hung"));
                match r {
                    Ok(()) => {
                        assert_eq!(t.status(), TransferStatus::Completed);
                        Fate::Completed
                    }
                    Err(Error::Timeout { after, .. }) => {
                        let took = started.elapsed();
                        assert_eq!(after, d, "op {id}");
                        assert!(took >= d, "op {id}: timed out after {took:?} < {d:?}");
                        assert!(
                            took < d + LATE,
                            "op {id}: deadline {d:?} reported after {took:?}"
                        );
                        assert_eq!(t.status(), TransferStatus::TimedOut, "op {id}");
                        Fate::Abandoned
                    }
                    Err(e) => panic!("op {id} (seed {:#x}) with a deadline: {e:?}", cx.seed),
                }
            }
            How::Quiesce => {
                let d = Duration::from_micros(rng.range(1, 5000));
                let mut t = t.timeout(d).quiesce_on_timeout();
                let r = tokio::time::timeout(HANG, &mut t)
                    .await
                    .unwrap_or_else(|_| panic!("op {id} quiescing after {d:?} hung"));
                match r {
                    Ok(()) => Fate::Completed,
                    Err(Error::Timeout { after, .. }) => {
                        assert_eq!(after, d, "op {id}");
                        assert_eq!(t.status(), TransferStatus::TimedOut, "op {id}");
                        Fate::Settled
                    }
                    Err(e) => panic!("op {id} (seed {:#x}) quiescing: {e:?}", cx.seed),
                }
            }
            How::PauseThenAwait => {
                let mut done = None;
                for _ in 0..rng.below(4) {
                    if let Poll::Ready(r) = futures::poll!(&mut t) {
                        done = Some(r);
                        break;
                    }
                }
                let d = Duration::from_micros(rng.range(1, 1000));
                let r = match done {
                    Some(r) => r,
                    None => match tokio::time::timeout(d, &mut t).await {
                        Ok(r) => r,
                        Err(_) => {
                            tokio::time::sleep(Duration::from_micros(rng.range(1, 2000))).await;
                            tokio::time::timeout(HANG, &mut t)
                                .await
                                .unwrap_or_else(|_| panic!("op {id} hung"))
                        }
                    },
                };
                expect_ok(cx, id, r);
                Fate::Completed
            }
            How::Invalid => unreachable!(),
        }
    };
    cx.count(how, fate);

    match fate {
        Fate::Completed | Fate::Refused => {
            // The destination holds the data now (or, refused, what it held before).
            for (p, &seed) in pieces.iter().zip(&seeds) {
                let (src_t, _, dof) = ends(p);
                scratch.read(cx.region(!src_t), dof, p.len);
                let Scratch { data, got } = &mut *scratch;
                if fate == Fate::Completed {
                    Scratch::draw_into(data, p.len, seed);
                } else {
                    data.clear();
                    data.extend_from_slice(&cx.model().side(!src_t).model[dof..dof + p.len]);
                }
                let want = &data[..p.len];
                if got[..] != *want {
                    let i = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
                    panic!(
                        "op {id} (seed {:#x}, {op:?} {how:?} {fate:?}): destination {} offset {dof}+{i} of {} holds {:#04x}, expected {:#04x}",
                        cx.seed,
                        if src_t { "local" } else { "target" },
                        p.len,
                        got[i],
                        want[i]
                    );
                }
                let mut m = cx.model();
                if fate == Fate::Completed {
                    m.side(!src_t).model[dof..dof + p.len].copy_from_slice(want);
                }
                release(&mut m, p);
            }
        }
        Fate::Settled => {
            // Each byte holds what it held or the op's; it is taken as the model's and the
            // run reused at once, so a byte of this op landing later is caught.
            for (p, &seed) in pieces.iter().zip(&seeds) {
                let (src_t, _, dof) = ends(p);
                scratch.read(cx.region(!src_t), dof, p.len);
                let Scratch { data, got } = &mut *scratch;
                Scratch::draw_into(data, p.len, seed);
                let mut m = cx.model();
                let old = &mut m.side(!src_t).model[dof..dof + p.len];
                if let Some(i) = (0..p.len).find(|&i| got[i] != old[i] && got[i] != data[i]) {
                    panic!(
                        "op {id} (seed {:#x}, {op:?}, quiesced): destination offset {dof}+{i} holds {:#04x}, neither the old {:#04x} nor the new {:#04x}",
                        cx.seed, got[i], old[i], data[i]
                    );
                }
                old.copy_from_slice(got);
                release(&mut m, p);
            }
        }
        Fate::Abandoned => {
            let mut m = cx.model();
            for (p, &seed) in pieces.iter().zip(&seeds) {
                let (src_t, _, dof) = ends(p);
                m.quarantine.push(Quarantined {
                    op: id,
                    on_target: !src_t,
                    off: dof,
                    len: p.len,
                    seed,
                });
            }
        }
        Fate::NoSpace => unreachable!(),
    }
}
