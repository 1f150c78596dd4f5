//! What a worker makes of a transfer's outcome: the accounting, the model's update, the
//! verification of what a READ brought and the diagnosis of bad bytes.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use hixl::{Error, TransferOp};

use super::lane::Fate;
use super::pattern::{check, fill};
use super::segs::St;
use super::state::{count_kind, example, inc, kind};
use super::transfer::{Mode, Outcome, D};
use super::worker::Worker;
use super::{HANG, LOCAL_SLOTS, REGIONS};

impl Worker {
    /// Whether a failure is one this workload provokes: a tiny timeout expiring, or the link
    /// being cut by this side. An op cut off by our own disconnect should fail with the link's
    /// cause (NotConnected); a TCP READ whose payload was being received can instead fail with
    /// a lost link (PeerLost, or ConnectionLost for the socket's reset). Both are accepted, and counted by kind with an example.
    pub(super) fn expected(&self, e: &Error, mode: Mode) -> bool {
        match e {
            Error::Timeout { .. } => matches!(mode, Mode::Tiny(_)),
            Error::NotConnected { .. } => self.lane.cutting.load(Ordering::SeqCst),
            e if e.is_link_lost() => self.lane.cutting.load(Ordering::SeqCst),
            _ => false,
        }
    }

    pub(super) fn remember(&self, gen: u64, what: &'static str) {
        if gen == 0 {
            return;
        }
        let epoch = self.lane.epoch.load(Ordering::Relaxed);
        let mut m = self.lane.model(self.id);
        if m.history.len() >= 512 {
            m.history.pop_front();
        }
        m.history.push_back(Fate { gen, what, epoch });
    }

    /// Accounts for a transfer's outcome and updates the model; a completed READ is verified.
    pub(super) fn settle(&mut self, op: TransferOp, ds: &[D], gen: u64, mode: Mode, out: Outcome) {
        let lane = self.lane.clone();
        let s = &lane.stats;
        let bytes: u64 = ds.iter().map(|d| d.len).sum();
        let write = op == TransferOp::Write;
        match out {
            Outcome::Done => {
                inc(&s.completed, 1);
                if write {
                    inc(&s.writes, 1);
                    inc(&s.bytes_written, bytes);
                    let mut m = lane.model(self.id);
                    for d in ds {
                        m.remote[d.slot].segs.written(d.roff, d.roff + d.len, gen);
                    }
                    drop(m);
                    self.remember(gen, "completed");
                } else {
                    inc(&s.reads, 1);
                    inc(&s.bytes_read, bytes);
                    for (i, d) in ds.iter().enumerate() {
                        self.verify(d, i, ds.len(), mode);
                    }
                }
            }
            Outcome::Failed(e) => {
                inc(&s.failed, 1);
                count_kind(&s.failed_by_kind, kind(&e));
                let cut = lane.cutting.load(Ordering::SeqCst);
                example(&s.examples, kind(&e), || {
                    format!(
                        "{op} ({}{}): {e} [{}]",
                        mode.name(),
                        if cut { ", link being cut" } else { "" },
                        e.status()
                    )
                });
                let timed_out = matches!(e, Error::Timeout { .. });
                if timed_out && matches!(mode, Mode::Tiny(_)) {
                    inc(&s.tiny_expired, 1);
                }
                if !self.expected(&e, mode) {
                    lane.violation(format!(
                        "{op} of {} descriptors ({bytes} bytes, {}) failed unexpectedly: {e} [{}]",
                        ds.len(),
                        mode.name(),
                        e.status()
                    ));
                }
                // A timed-out op is abandoned: it may still move bytes until it is reaped.
                self.taint(ds, write, timed_out);
                self.remember(gen, if timed_out { "timed out" } else { "failed" });
            }
            Outcome::Hang => {
                inc(&s.failed, 1);
                count_kind(&s.failed_by_kind, "Hang".into());
                lane.violation(format!(
                    "{op} of {} descriptors ({bytes} bytes, {}) did not resolve within {HANG:?}",
                    ds.len(),
                    mode.name()
                ));
                self.taint(ds, write, true);
                self.remember(gen, "hung");
            }
            Outcome::Dropped => {
                inc(&s.dropped, 1);
                self.taint(ds, write, true);
                self.remember(gen, "dropped");
            }
        }
    }

    pub(super) fn taint(&self, ds: &[D], write: bool, local: bool) {
        let mut m = self.lane.model(self.id);
        for d in ds {
            if write {
                m.remote[d.slot].segs.taint(d.roff, d.roff + d.len);
            }
            if local {
                m.local_tainted[d.lslot] = true;
            }
        }
    }

    /// Compares what a completed READ brought with what the model says the target holds.
    pub(super) fn verify(&mut self, d: &D, index: usize, n: usize, mode: Mode) {
        let lane = self.lane.clone();
        let len = d.len as usize;
        if let Err(e) = lane
            .local
            .read_at(self.local_off(d), &mut self.scratch[..len])
        {
            lane.violation(format!("local read_at failed: {e}"));
            return;
        }
        let m = lane.model(self.id);
        let slot = &m.remote[d.slot];
        let mut verified = 0;
        for (a, b, st) in slot.segs.query(d.roff, d.roff + d.len) {
            let St::Known(gen) = st else { continue };
            let buf = &self.scratch[(a - d.roff) as usize..(b - d.roff) as usize];
            let Some(i) = check(buf, gen, slot.region, slot.base + a) else {
                verified += b - a;
                continue;
            };
            let pos = slot.base + a + i as u64;
            let got = &buf[i..(i + 8).min(buf.len())];
            let mut want = vec![0u8; got.len()];
            fill(&mut want, gen, slot.region, pos);
            let why = diagnose(got, pos, slot.region, self.junk, &m.history);
            lane.violation(format!(
                "corruption: worker {} READ descriptor {index} of {n} ({} bytes at {}+{:#x}, {}) \
                 first bad byte at {}+{pos:#x}: got {} want {} (generation {gen}); {why}",
                self.id,
                d.len,
                REGIONS[slot.region as usize],
                slot.base + d.roff,
                mode.name(),
                REGIONS[slot.region as usize],
                hex(got),
                hex(&want)
            ));
            break;
        }
        inc(&lane.stats.verified_bytes, verified);
    }

    /// Ends this worker's taints once its engine has nothing in flight: every op this worker
    /// dropped or abandoned has then been reaped, so the engine promises it touches nothing
    /// any more. Called between steps only (the worker has no op of its own in flight).
    pub(super) fn reclaim(&mut self) {
        let lane = self.lane.clone();
        let mut m = lane.model(self.id);
        if !m.local_tainted.iter().any(|&t| t) && !m.remote.iter().any(|s| s.segs.tainted()) {
            return;
        }
        if lane.engine.ops_in_flight() != 0 {
            return;
        }
        for s in &mut m.remote {
            s.segs.settle();
        }
        m.local_tainted = [false; LOCAL_SLOTS];
        inc(&lane.stats.reclaims, 1);
    }
}

pub(super) fn hex(b: &[u8]) -> String {
    b.iter().fold(String::new(), |mut s, x| {
        let _ = write!(s, "{x:02x}");
        s
    })
}

/// Says what unexpected bytes are: the READ's filler, zeroes, or a known generation's.
pub(super) fn diagnose(
    got: &[u8],
    pos: u64,
    region: u8,
    junk: u8,
    history: &VecDeque<Fate>,
) -> String {
    if got.iter().all(|&b| b == junk) {
        return format!(
            "the bytes are the filler ({junk:#04x}) written before the READ: the READ reported success without landing them"
        );
    }
    let mut want = vec![0u8; got.len()];
    for f in history.iter().rev() {
        fill(&mut want, f.gen, region, pos);
        if want == got {
            return format!(
                "the bytes are generation {}'s, a WRITE that {} in cycle {}",
                f.gen, f.what, f.epoch
            );
        }
    }
    if got.iter().all(|&b| b == 0) {
        return "the bytes are zeroes".into();
    }
    "the bytes match none of this worker's last 512 WRITEs".into()
}
