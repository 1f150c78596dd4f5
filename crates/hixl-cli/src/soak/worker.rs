//! A worker: picks steps of the mixed workload and runs them on its own slots.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use hixl::{Error, OpDesc, Peer, TransferOp};
use tokio::sync::mpsc;

use super::lane::{Lane, Phase};
use super::pattern::{fill, Rng};
use super::state::{count_kind, example, inc, kind};
use super::transfer::{transfer, Mode, Outcome, D};
use super::{LOCAL_SLOTS, MAX_BATCH, NOTIFY_HANG, NOTIFY_TIMEOUT, REMOTE_SLOTS};

pub(super) struct Worker {
    pub(super) lane: Arc<Lane>,
    pub(super) id: usize,
    pub(super) rng: Rng,
    pub(super) scratch: Vec<u8>,
    /// The byte READ destinations are filled with before the READ.
    pub(super) junk: u8,
    pub(super) seq: u64,
    pub(super) steps: usize,
}

/// A draw of [`Worker::step`] for each kind of step: WRITE, READ, notify, dropped, tiny
/// timeout, WRITE and READ at once.
pub(super) const TOUR: [u64; 6] = [0, 35, 65, 75, 85, 95];

impl Worker {
    pub(super) fn local_off(&self, d: &D) -> u64 {
        (self.id * LOCAL_SLOTS + d.lslot) as u64 * self.lane.slot_len + d.loff
    }

    pub(super) fn descs(&self, ds: &[D]) -> Vec<OpDesc> {
        ds.iter()
            .map(|d| {
                let (region, base) = self.lane.place(self.id, d.slot);
                OpDesc::new(
                    self.lane.local.addr() + self.local_off(d),
                    self.lane.remote[region as usize] + base + d.roff,
                    d.len,
                )
            })
            .collect()
    }

    /// Up to `k` descriptors on remote and local slots not used yet (local ones untainted).
    pub(super) fn pick(
        &mut self,
        k: u64,
        used_r: &mut [bool; REMOTE_SLOTS],
        used_l: &mut [bool; LOCAL_SLOTS],
    ) -> Vec<D> {
        let tainted = self.lane.model(self.id).local_tainted;
        let mut rs: Vec<usize> = (0..REMOTE_SLOTS).filter(|&j| !used_r[j]).collect();
        let mut ls: Vec<usize> = (0..LOCAL_SLOTS)
            .filter(|&j| !used_l[j] && !tainted[j])
            .collect();
        self.rng.shuffle(&mut rs);
        self.rng.shuffle(&mut ls);
        let k = (k as usize).min(rs.len()).min(ls.len());
        let slot_len = self.lane.slot_len;
        let max = self.lane.max_size;
        (0..k)
            .map(|i| {
                used_r[rs[i]] = true;
                used_l[ls[i]] = true;
                let len = self.rng.size(max);
                let room = slot_len - len;
                D {
                    slot: rs[i],
                    lslot: ls[i],
                    roff: self.rng.below(room + 1),
                    loff: self.rng.below(room + 1),
                    len,
                }
            })
            .collect()
    }

    /// Fills the local side: a WRITE's source with a fresh generation's pattern (returned),
    /// a READ's destination with a filler byte.
    pub(super) fn prep(&mut self, op: TransferOp, ds: &[D]) -> u64 {
        let lane = self.lane.clone();
        let gen = if op == TransferOp::Write {
            lane.gens.fetch_add(1, Ordering::Relaxed)
        } else {
            self.junk = (self.rng.next() as u8) | 1;
            0
        };
        for d in ds {
            let len = d.len as usize;
            let at = self.local_off(d);
            let buf = &mut self.scratch[..len];
            if op == TransferOp::Write {
                let (region, base) = lane.place(self.id, d.slot);
                fill(buf, gen, region, base + d.roff);
            } else {
                buf.fill(self.junk);
            }
            if let Err(e) = lane.local.write_at(at, buf) {
                lane.violation(format!("local write_at failed: {e}"));
            }
        }
        gen
    }

    pub(super) async fn notify(&mut self, peer: &Peer) {
        let lane = self.lane.clone();
        self.seq += 1;
        let msg = format!("{}.{} {}", lane.name, self.id, self.seq);
        inc(&lane.stats.notifies_sent, 1);
        let r = tokio::time::timeout(
            NOTIFY_HANG,
            peer.notify_timeout("soak.seq", msg, NOTIFY_TIMEOUT),
        )
        .await;
        match r {
            Ok(Ok(())) => inc(&lane.stats.notifies_acked, 1),
            Ok(Err(e)) => {
                inc(&lane.stats.notifies_failed, 1);
                count_kind(&lane.stats.notify_failed_by_kind, kind(&e));
                let cut = lane.cutting.load(Ordering::SeqCst);
                example(&lane.stats.examples, format!("notify {}", kind(&e)), || {
                    format!(
                        "notify{}: {e} [{}]",
                        if cut { " (link being cut)" } else { "" },
                        e.status()
                    )
                });
                let lost = matches!(e, Error::NotConnected { .. }) || e.is_link_lost();
                if !(lost && lane.cutting.load(Ordering::SeqCst)) {
                    lane.violation(format!("notify failed unexpectedly: {e} [{}]", e.status()));
                }
            }
            Err(_) => {
                inc(&lane.stats.notifies_failed, 1);
                count_kind(&lane.stats.notify_failed_by_kind, "Hang".into());
                lane.violation(format!("notify did not resolve within {NOTIFY_HANG:?}"));
            }
        }
    }

    /// One transfer, and for a WRITE that completed (however it was awaited) its read-back.
    /// `false` when no local slot is free.
    pub(super) async fn batch(&mut self, peer: &Peer, op: TransferOp, mode: Mode) -> bool {
        let k = 1 + self.rng.below(MAX_BATCH);
        let ds = self.pick(k, &mut [false; REMOTE_SLOTS], &mut [false; LOCAL_SLOTS]);
        if ds.is_empty() {
            return false;
        }
        let gen = self.prep(op, &ds);
        let out = transfer(&self.lane.clone(), peer, op, &self.descs(&ds), mode).await;
        let done = matches!(out, Outcome::Done);
        self.settle(op, &ds, gen, mode, out);
        if done && op == TransferOp::Write {
            self.read_back(peer, &ds).await;
        }
        true
    }

    pub(super) async fn read_back(&mut self, peer: &Peer, ds: &[D]) {
        self.prep(TransferOp::Read, ds);
        let out = transfer(
            &self.lane.clone(),
            peer,
            TransferOp::Read,
            &self.descs(ds),
            Mode::Plain,
        )
        .await;
        self.settle(TransferOp::Read, ds, 0, Mode::Plain, out);
    }

    /// A WRITE and a READ of the same worker in flight at once, on distinct slots.
    pub(super) async fn pair(&mut self, peer: &Peer) -> bool {
        let (mut ur, mut ul) = ([false; REMOTE_SLOTS], [false; LOCAL_SLOTS]);
        let k1 = 1 + self.rng.below(2);
        let k2 = 1 + self.rng.below(2);
        let w = self.pick(k1, &mut ur, &mut ul);
        let r = self.pick(k2, &mut ur, &mut ul);
        if w.is_empty() || r.is_empty() {
            return false;
        }
        let gen = self.prep(TransferOp::Write, &w);
        self.prep(TransferOp::Read, &r);
        let lane = self.lane.clone();
        let (wd, rd) = (self.descs(&w), self.descs(&r));
        let (ow, or) = tokio::join!(
            transfer(&lane, peer, TransferOp::Write, &wd, Mode::Plain),
            transfer(&lane, peer, TransferOp::Read, &rd, Mode::Plain)
        );
        let done = matches!(ow, Outcome::Done);
        self.settle(TransferOp::Write, &w, gen, Mode::Plain, ow);
        self.settle(TransferOp::Read, &r, 0, Mode::Plain, or);
        if done {
            self.read_back(peer, &w).await;
        }
        true
    }
    pub(super) async fn step(&mut self, peer: &Peer) -> bool {
        self.reclaim();
        let op = if self.rng.below(2) == 0 {
            TransferOp::Write
        } else {
            TransferOp::Read
        };
        // The first steps visit every kind once, so that even a short run covers them all.
        let pick = match TOUR.get(self.steps) {
            Some(&p) => p,
            None => self.rng.below(100),
        };
        self.steps += 1;
        match pick {
            0..=34 => self.batch(peer, TransferOp::Write, Mode::Plain).await,
            35..=64 => self.batch(peer, TransferOp::Read, Mode::Plain).await,
            65..=74 => {
                self.notify(peer).await;
                true
            }
            75..=84 => {
                let us = match self.rng.below(3) {
                    0 => 0,
                    _ => 1 + self.rng.below(2000),
                };
                self.batch(peer, op, Mode::Drop(us)).await
            }
            85..=94 => {
                let us = 1 + self.rng.below(300);
                self.batch(peer, op, Mode::Tiny(us)).await
            }
            _ => self.pair(peer).await,
        }
    }

    /// Every remote slot whole: written with a fresh generation and read back (`fill`), or
    /// read and verified against the model (the sweep at the start of each cycle).
    pub(super) async fn whole(&mut self, peer: &Peer, fill: bool) {
        let tainted = self.lane.model(self.id).local_tainted;
        let free: Vec<usize> = (0..LOCAL_SLOTS).filter(|&j| !tainted[j]).collect();
        let ds: Vec<D> = (0..REMOTE_SLOTS)
            .zip(free)
            .map(|(slot, lslot)| D {
                slot,
                lslot,
                roff: 0,
                loff: 0,
                len: self.lane.slot_len,
            })
            .collect();
        if ds.is_empty() {
            return;
        }
        if fill {
            let gen = self.prep(TransferOp::Write, &ds);
            let out = transfer(
                &self.lane.clone(),
                peer,
                TransferOp::Write,
                &self.descs(&ds),
                Mode::Plain,
            )
            .await;
            let done = matches!(out, Outcome::Done);
            self.settle(TransferOp::Write, &ds, gen, Mode::Plain, out);
            if done {
                self.read_back(peer, &ds).await;
            }
        } else {
            self.read_back(peer, &ds).await;
        }
    }

    /// Runs until told to stop; returns the scratch buffer, so that the memory figures at the
    /// end are not lowered by its release.
    pub(super) async fn run(mut self, parked: mpsc::UnboundedSender<u64>) -> Vec<u8> {
        let mut rx = self.lane.phase.subscribe();
        let mut first = true;
        let mut fresh = true;
        loop {
            let phase = *rx.borrow_and_update();
            match phase {
                Phase::Stop => break,
                Phase::Pause(cycle) => {
                    let _ = parked.send(cycle);
                    // Until the phase moves on (to the next cycle's Run, or straight to its
                    // Pause if this task was not scheduled in between).
                    while *rx.borrow_and_update() == phase {
                        if rx.changed().await.is_err() {
                            return self.scratch;
                        }
                    }
                    fresh = true;
                    continue;
                }
                Phase::Run(_) => {}
            }
            let Some(peer) = self.lane.peer() else {
                if rx.changed().await.is_err() {
                    return self.scratch;
                }
                continue;
            };
            if fresh {
                self.whole(&peer, first).await;
                if first {
                    self.lane.filled.fetch_add(1, Ordering::SeqCst);
                }
                first = false;
                fresh = false;
                continue;
            }
            if !self.step(&peer).await {
                // Every local slot is tainted: wait until the engine has reaped the abandoned
                // ops (or the cycle ends).
                inc(&self.lane.stats.starved, 1);
                let lane = self.lane.clone();
                let drained = async {
                    while lane.engine.ops_in_flight() != 0 {
                        tokio::time::sleep(Duration::from_micros(200)).await;
                    }
                };
                tokio::select! {
                    r = rx.changed() => if r.is_err() {
                        return self.scratch;
                    },
                    _ = drained => {}
                }
            }
            // The pattern work is CPU-bound: let the engine's tasks and other workers run.
            tokio::task::yield_now().await;
        }
        if first {
            self.lane.filled.fetch_add(1, Ordering::SeqCst);
        }
        self.scratch
    }
}
