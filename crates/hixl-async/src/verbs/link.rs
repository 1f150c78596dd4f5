//! An initiator's link to one peer over verbs: its rails, the peer's device keys, and where
//! each slice of a transfer goes — placed, re-placed when its rail fails, failed when no rail
//! is left.
//!
//! Every slice has exactly one outcome: it is in the backend's slice table from placement
//! until either the drain takes its completion out (landed, or failed and re-placed under a
//! new id) or this link takes it out to fail it; whoever removes it reports it.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Instant;

use hixl_core::wire::Message;
use hixl_core::{Error, PartResult, Status, Token, TransferOp};
use hixl_verbs::{LocalRange, NicInfo, RemoteRange, WorkRequest};
use tokio::sync::{oneshot, Notify};

use super::rail::{Pumped, Queued, Rail};
use super::source::{no_rail, Slice, SliceOwner};
use super::{stripe, VerbsBackend};
use crate::completion::Completion;
use crate::link_state::LinkState;
use crate::sink::Completions;
use crate::sync::{lock, read, write};

/// One descriptor a batch took: its ranges, our keys on every device and the peer's on every
/// device of its (`None` where the peer has no key on a device).
pub(crate) struct Piece {
    pub(crate) local: u64,
    pub(crate) remote: u64,
    pub(crate) len: u64,
    pub(crate) lkeys: Arc<[u32]>,
    pub(crate) rkeys: Arc<[Option<u32>]>,
    pub(crate) numa: Option<u32>,
}

/// Sends a transport message on the link's control connection; false once it is gone.
pub(crate) type ControlSend = Box<dyn Fn(Message) -> bool + Send + Sync>;

/// What the handshake connected: the rails and what the peer sent.
pub(crate) struct Connected {
    pub(crate) rails: Vec<Rail>,
    pub(crate) remote: Vec<NicInfo>,
    pub(crate) keys: Vec<(u64, u32, u32)>,
}

/// An initiator's link to one peer over verbs.
pub(crate) struct VerbsLink {
    pub(crate) peer: Arc<str>,
    /// Where failures found outside the drain go.
    sink: Completions,
    pub(crate) backend: Arc<VerbsBackend>,
    pub(crate) state: Arc<LinkState>,
    /// Rail `i` is `rails[i]`.
    pub(crate) rails: Vec<Rail>,
    /// The peer's devices, as its offer listed them.
    pub(crate) remote: Vec<NicInfo>,
    /// The peer's device keys by memory-table rkey, one per device of the peer.
    keys: RwLock<HashMap<u64, Arc<[Option<u32>]>>>,
    /// What `Peer::transport` says.
    pub(crate) describe: String,
    me: Weak<VerbsLink>,
    /// Wakes the keeper (a rail was paused).
    pub(crate) wake: Arc<Notify>,
    /// The keeper's probes waiting for their `VerbsAccept`, by rail.
    pub(crate) answers: Mutex<HashMap<u32, oneshot::Sender<Message>>>,
    /// The control connection, once the link is built.
    pub(crate) control: Mutex<Option<ControlSend>>,
}

impl std::fmt::Debug for VerbsLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsLink")
            .field("peer", &self.peer)
            .field("describe", &self.describe)
            .finish_non_exhaustive()
    }
}

/// Failures to report, collected while locks are held and reported after.
type Fails = Vec<PartResult>;

impl VerbsLink {
    /// The link over `c`'s rails, registered with the backend's drain; its rails are closed
    /// (their queue pairs flushed, their queued slices failed) when the link dies.
    pub(crate) fn start(
        backend: &Arc<VerbsBackend>,
        sink: &Completions,
        state: Arc<LinkState>,
        peer: Arc<str>,
        c: Connected,
    ) -> Arc<VerbsLink> {
        let Connected {
            rails,
            remote,
            keys,
        } = c;
        let describe = describe(backend, &rails, Instant::now());
        let l = Arc::new_cyclic(|me| VerbsLink {
            me: me.clone(),
            peer,
            sink: sink.clone(),
            backend: backend.clone(),
            state: state.clone(),
            rails,
            remote,
            keys: RwLock::new(HashMap::new()),
            describe,
            wake: Arc::new(Notify::new()),
            answers: Mutex::new(HashMap::new()),
            control: Mutex::new(None),
        });
        l.update_keys(&keys);
        let owner: Weak<dyn SliceOwner> = Arc::downgrade(&l) as Weak<VerbsLink>;
        backend.source.add_link(owner);
        let weak = Arc::downgrade(&l);
        let st = state.clone();
        st.spawn(async move {
            state.dead().await;
            if let Some(l) = weak.upgrade() {
                l.close();
            }
        });
        l
    }

    /// The peer's device keys of the region with memory-table key `rkey`.
    pub(crate) fn key(&self, rkey: u64) -> Option<Arc<[Option<u32>]>> {
        read(&self.keys).get(&rkey).cloned()
    }

    /// Takes the peer's `(rkey, device, key)` list, merged in (an entry for a device the peer
    /// did not offer is ignored). Entries of regions gone are never looked up (lookups start
    /// from the memory table) and [`VerbsLink::prune_keys`] drops them with the next table.
    pub(crate) fn update_keys(&self, v: &[(u64, u32, u32)]) {
        let n = self.remote.len();
        let mut k = write(&self.keys);
        for &(rkey, dev, key) in v {
            let Some(d) = usize::try_from(dev).ok().filter(|&d| d < n) else {
                continue;
            };
            let e = k.entry(rkey).or_insert_with(|| vec![None; n].into());
            let mut keys = e.to_vec();
            keys[d] = Some(key);
            *e = keys.into();
        }
    }

    /// Drops keys of regions no longer in the peer's memory table.
    pub(crate) fn prune_keys(&self, table: &[hixl_core::RemoteRegion]) {
        let mut k = write(&self.keys);
        if k.len() > table.len() {
            let live: std::collections::HashSet<u64> = table.iter().map(|r| r.rkey).collect();
            k.retain(|r, _| live.contains(r));
        }
    }

    /// Places one call's pieces, cut into slices (the op table counts
    /// [`stripe::count`] parts per piece).
    pub(crate) fn submit(&self, token: Token, op: TransferOp, pieces: Vec<Piece>) {
        let mut fails = Fails::new();
        let mut touched = Vec::new();
        for p in pieces {
            for (off, len) in stripe::cut(p.len, self.backend.slice_bytes) {
                let s = Slice {
                    op: token,
                    kind: op,
                    local: p.local + off,
                    remote: p.remote + off,
                    len,
                    lkeys: p.lkeys.clone(),
                    rkeys: p.rkeys.clone(),
                    numa: p.numa,
                    link: self.me.clone() as Weak<dyn SliceOwner>,
                    at: (0, 0),
                    generation: 0,
                    withdrawn: false,
                };
                self.place(s, &mut touched, &mut fails);
            }
        }
        self.pump_slots(touched, &mut fails);
        self.report(fails);
    }

    /// The rail and queue pair for `s`, with our lkey and the peer's rkey there: the queue
    /// pair with the fewest bytes outstanding among the rails that are up and reach both
    /// ranges, those on the memory's NUMA node first when the host says where both are.
    fn choose(&self, s: &Slice) -> Option<(usize, usize, u32, u32)> {
        let keys = |r: &Rail| -> Option<(u32, u32)> {
            let l = *s.lkeys.get(r.plan.local)?;
            let k = (*s.rkeys.get(r.plan.remote)?)?;
            Some((l, k))
        };
        let usable = || {
            self.rails
                .iter()
                .filter(|r| r.is_up())
                .filter_map(move |r| keys(r).map(|k| (r, k)))
        };
        let near = s
            .numa
            .filter(|&n| usable().any(|(r, _)| r.numa.map(u32::from) == Some(n)));
        let best = stripe::least_loaded(
            usable()
                .filter(|(r, _)| near.is_none() || r.numa.map(u32::from) == near)
                .flat_map(|(r, k)| {
                    r.load
                        .iter()
                        .enumerate()
                        .map(move |(q, l)| ((r.index, q, k), l.load(Ordering::Relaxed)))
                }),
        )?;
        let (r, q, (l, k)) = best;
        Some((r, q, l, k))
    }

    /// Puts slice `s` (not in the slice table) on a rail, or fails it when no rail is left.
    fn place(&self, mut s: Slice, touched: &mut Vec<(usize, usize)>, fails: &mut Fails) {
        let Some((r, q, lkey, rkey)) = self.choose(&s) else {
            return fails.push((s.op, Err(self.no_rail())));
        };
        let rail = &self.rails[r];
        s.at = (r, q);
        s.generation = rail.generation();
        let (op, kind, local, remote, len) = (s.op, s.kind, s.local, s.remote, s.len);
        let wr = WorkRequest {
            token: Token(0),
            op: kind,
            local: LocalRange {
                addr: local,
                len,
                lkey,
            },
            remote: RemoteRange { addr: remote, rkey },
        };
        if wr.pieces(rail.max_msg) > rail.capacity as u64 {
            // Cannot happen with real limits (a slice is at most 1/1024 of a descriptor, and
            // max message × send-queue depth is terabytes), but it must fail, not wait.
            return fails.push((
                op,
                Err(Error::OpTooLarge {
                    len,
                    work_requests: wr.pieces(rail.max_msg),
                    capacity: rail.capacity,
                }),
            ));
        }
        let id = self.backend.source.insert(s);
        rail.load[q].fetch_add(len, Ordering::Relaxed);
        lock(&rail.slots[q]).backlog.push_back(Queued {
            wr: WorkRequest {
                token: Token(id),
                ..wr
            },
            op,
        });
        touched.push((r, q));
    }

    /// Takes slice `id` (queued, never posted, or flushed) off its rail and places it again.
    fn replace(&self, id: u64, touched: &mut Vec<(usize, usize)>, fails: &mut Fails) {
        let Some(s) = self.backend.source.remove(id) else {
            return; // already reported
        };
        self.unload(&s);
        if s.withdrawn {
            return fails.push((s.op, Err(self.cause("transfer withdrawn"))));
        }
        self.place(s, touched, fails);
    }

    fn unload(&self, s: &Slice) {
        if let Some(l) = self.rails.get(s.at.0).and_then(|r| r.load.get(s.at.1)) {
            l.fetch_sub(s.len.min(l.load(Ordering::Relaxed)), Ordering::Relaxed);
        }
    }

    /// Pauses rail `r` (a no-op when it is not up) and places what it had queued elsewhere.
    pub(crate) fn rail_broken(
        &self,
        r: usize,
        cause: String,
        touched: &mut Vec<(usize, usize)>,
        fails: &mut Fails,
    ) {
        let rail = &self.rails[r];
        let Some(waiting) = rail.pause(Instant::now(), cause.clone()) else {
            return;
        };
        tracing::warn!(peer = %self.peer, "RDMA rail {} {} paused: {cause}", r, rail.name);
        self.wake.notify_one();
        for w in waiting {
            self.replace(w.wr.token.0, touched, fails);
        }
    }

    /// Posts what the touched queue pairs have queued; re-places what a failed or missing
    /// queue pair cannot take.
    fn pump_slots(&self, mut touched: Vec<(usize, usize)>, fails: &mut Fails) {
        while !touched.is_empty() {
            touched.sort_unstable();
            touched.dedup();
            let mut next = Vec::new();
            for (r, q) in touched {
                self.pump_one(r, q, &mut next, fails);
            }
            touched = next;
        }
    }

    /// Posts what queue pair `q` of rail `r` has queued; what it cannot take is placed again
    /// (the queue pairs that placing touched go to `next`).
    fn pump_one(&self, r: usize, q: usize, next: &mut Vec<(usize, usize)>, fails: &mut Fails) {
        match self.rails[r].pump(q, &self.peer) {
            Pumped::Done => {}
            Pumped::NoQp(v) => {
                for w in v {
                    self.replace(w.wr.token.0, next, fails);
                }
            }
            Pumped::Broken { cause, unposted } => {
                self.rail_broken(r, cause.to_string(), next, fails);
                for w in unposted {
                    self.replace(w.wr.token.0, next, fails);
                }
            }
        }
    }

    /// Posts queued slices into freed send-queue room (after every drain): nothing is
    /// allocated unless a queue pair could not take its backlog.
    pub(crate) fn pump_all(&self) {
        let (mut next, mut fails) = (Vec::new(), Fails::new());
        for r in &self.rails {
            for q in 0..r.slots.len() {
                self.pump_one(r.index, q, &mut next, &mut fails);
            }
        }
        self.pump_slots(next, &mut fails);
        self.report(fails);
    }

    /// The owner of `op` went away: its queued slices are failed with `cause` and never
    /// posted; posted ones finish on the device and are never placed again.
    pub(crate) fn withdraw(&self, op: Token, cause: &Error) {
        self.backend.source.withdraw(op);
        let mut mine = Vec::new();
        for r in &self.rails {
            for slot in &r.slots {
                let mut s = lock(slot);
                s.backlog.retain(|w| {
                    let m = w.op == op;
                    if m {
                        mine.push(w.wr.token.0);
                    }
                    !m
                });
            }
        }
        let mut fails = Fails::new();
        for id in mine {
            if let Some(s) = self.backend.source.remove(id) {
                self.unload(&s);
                fails.push((op, Err(cause.clone())));
            }
        }
        self.report(fails);
    }

    /// The link died: every rail's queue pairs are dropped (what they hold comes back
    /// flushed and is failed with the link's cause) and their queued slices failed.
    pub(crate) fn close(&self) {
        let cause = self.cause("link closed");
        let mut fails = Fails::new();
        for r in &self.rails {
            for w in r.close() {
                if let Some(s) = self.backend.source.remove(w.wr.token.0) {
                    self.unload(&s);
                    fails.push((s.op, Err(cause.clone())));
                }
            }
        }
        self.report(fails);
        // A probe waiting for its answer ends now.
        lock(&self.answers).clear();
        self.wake.notify_one();
    }

    /// Sends a transport message on the control connection.
    pub(crate) fn send_control(&self, m: Message) -> bool {
        lock(&self.control).as_ref().is_some_and(|f| f(m))
    }

    /// The link's cause once dead, else a loss with `what`.
    fn cause(&self, what: &str) -> Error {
        self.state.error().unwrap_or_else(|| Error::PeerLost {
            peer: self.peer.to_string(),
            cause: what.into(),
        })
    }

    /// The error of a slice with no rail left: each rail and what happened to it.
    fn no_rail(&self) -> Error {
        if let Some(e) = self.state.error() {
            return e;
        }
        let now = Instant::now();
        let v: Vec<String> = self.rails.iter().map(|r| r.describe(now)).collect();
        no_rail(&self.peer, &v)
    }

    /// Each rail, its pairing, its state and counters.
    pub(crate) fn rails_info(&self) -> Vec<crate::RailInfo> {
        let now = Instant::now();
        self.rails
            .iter()
            .map(|r| {
                let c = &r.counters;
                let h = lock(&r.health);
                crate::RailInfo {
                    index: r.index,
                    local: self.backend.nics[r.plan.local].info.name.clone(),
                    remote: self.remote[r.plan.remote].name.clone(),
                    why: r.plan.why.clone(),
                    mtu: r.plan.mtu.bytes(),
                    qps: r.slots.len(),
                    up: r.is_up(),
                    state: h.describe(now),
                    bytes: c.bytes.load(Ordering::Relaxed),
                    ops: c.slices.load(Ordering::Relaxed),
                    errors: c.errors.load(Ordering::Relaxed),
                    pauses: h.pauses(),
                }
            })
            .collect()
    }

    /// Reports failures found outside the drain through the engine's completions.
    pub(crate) fn report(&self, fails: Fails) {
        if fails.is_empty() {
            return;
        }
        self.sink.complete_all(
            fails
                .into_iter()
                .map(|(token, result)| Completion { token, result }),
        );
    }
}

impl SliceOwner for VerbsLink {
    /// Slice `s` landed (the drain took it out of the table).
    fn landed(&self, s: &Slice) {
        self.unload(s);
        if let Some(r) = self.rails.get(s.at.0) {
            r.counters.bytes.fetch_add(s.len, Ordering::Relaxed);
            r.counters.slices.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Slice `s` failed with `e` (the drain took it out of the table): reported in `out`
    /// when it is final — the link is dead, its op is withdrawn, or the peer refused the
    /// access itself — and otherwise placed again after its rail is paused.
    fn slice_failed(&self, s: Slice, e: Error, out: &mut Vec<PartResult>) {
        self.unload(&s);
        let Some(rail) = self.rails.get(s.at.0) else {
            return out.push((s.op, Err(e)));
        };
        rail.counters.errors.fetch_add(1, Ordering::Relaxed);
        if let Some(cause) = self.state.error() {
            return out.push((s.op, Err(cause)));
        }
        let mut touched = Vec::new();
        // Only a failure on the rail's current queue pairs pauses it: flushes of queue pairs
        // dropped at an earlier pause come back after it.
        if s.generation == rail.generation() {
            self.rail_broken(s.at.0, e.to_string(), &mut touched, out);
        }
        if s.withdrawn || e.status() == Status::ParamInvalid {
            // Refused by a device (a remote access error, a bad local range): the same
            // request fails on every rail.
            out.push((s.op, Err(e)));
        } else {
            self.place(s, &mut touched, out);
        }
        self.pump_slots(touched, out);
    }

    fn pump_all(&self) {
        VerbsLink::pump_all(self);
    }
}

/// What `Peer::transport` says of a verbs link.
fn describe(b: &VerbsBackend, rails: &[Rail], now: Instant) -> String {
    let v: Vec<String> = rails
        .iter()
        .map(|r| {
            format!(
                "{} mtu {}{}",
                r.name,
                r.plan.mtu.bytes(),
                if r.is_up() {
                    String::new()
                } else {
                    format!(" [{}]", lock(&r.health).describe(now))
                }
            )
        })
        .collect();
    format!(
        "verbs (RDMA RC: {} rail{} x {} QPs, slices of {} KiB: {})",
        rails.len(),
        if rails.len() == 1 { "" } else { "s" },
        b.qps_per_rail,
        b.slice_bytes >> 10,
        v.join(", ")
    )
}
