//! Op table: in-flight transfers in a slab, addressed by generation-tagged tokens.
//!
//! Lifecycle of one op:
//!
//! ```text
//! Staged --post(n)--> Posted --set_waiter--> Waiting --last part--> Done --take--> (free)
//!    \                   \                       \
//!     `-----------------abandon (future dropped or timed out)----> Abandoned --last part--> (free)
//! ```
//!
//! A token is `slot | generation << 32`. A completion whose generation does not match the slot
//! is stale (its op was already reaped) and is reported as such, never applied.
//!
//! **Keep-alive.** The table is the one owner of what keeps an op's memory valid while a
//! device may touch it (`K`: region leases, peer mappings). An op's keep-alive is handed in
//! at [`OpTable::post`] and handed back, to be dropped by the caller outside its lock, when
//! the op is *reaped*: its last posted part is done, whether the op completed, failed or was
//! abandoned. So while any part of an op is outstanding, its keep-alive is held; transports
//! hold only raw ranges into it. (Each slot keeps its vector's capacity: a reused slot
//! allocates nothing.)

use crate::error::Error;
use crate::types::TransferStatus;

/// Identifies one op: `slot | generation << 32`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Token(pub u64);

impl Token {
    fn new(slot: u32, generation: u32) -> Token {
        Token(u64::from(slot) | (u64::from(generation) << 32))
    }
    /// Slab slot.
    pub fn slot(self) -> u32 {
        self.0 as u32
    }
    /// Generation of the slot when the op was created.
    pub fn generation(self) -> u32 {
        (self.0 >> 32) as u32
    }
}

/// Where an op is in its lifecycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Allocated; being validated and split into parts.
    Staged,
    /// Parts handed to the device; nobody waits yet.
    Posted,
    /// Parts outstanding and a waiter registered.
    Waiting,
    /// Every part finished; the result waits to be taken.
    Done,
    /// The owner went away while parts were still outstanding; freed at the last part.
    Abandoned,
}

#[derive(Debug)]
struct Op<W> {
    phase: Phase,
    remaining: u32,
    error: Option<Error>,
    waiter: Option<W>,
}

#[derive(Debug)]
struct Slot<W, K> {
    generation: u32,
    op: Option<Op<W>>,
    /// The op's keep-alive, from post until it is reaped (empty otherwise; its capacity stays).
    keep: Vec<K>,
}

/// What applying a completion did.
#[derive(Debug)]
pub enum Completed<W> {
    /// The token's generation is not live: the completion was ignored.
    Stale,
    /// More parts are outstanding.
    Pending,
    /// That was the last part; wake this waiter (outside any lock), if there was one.
    Finished(Option<W>),
    /// That was the last part of an abandoned op; its slot is free again. Wake this waiter
    /// (outside any lock), if one watches the parked op ([`OpTable::watch_parked`]).
    Reaped(Option<W>),
}

/// A misuse of the op table by the engine (a bug, reported rather than panicking).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum OpTableError {
    /// The token is not live.
    #[error("op token {0:#x} is not live")]
    Stale(u64),
    /// The op is not in the phase the call needs.
    #[error("op token {token:#x} is {phase:?}, expected {expected}")]
    WrongPhase {
        /// The token.
        token: u64,
        /// Its phase.
        phase: Phase,
        /// What the call needed.
        expected: &'static str,
    },
}

/// The slab of in-flight ops. `W` is what wakes an owner (a `Waker` in the async layer); `K`
/// is what keeps an op's memory valid until its last part is done (see the module docs).
#[derive(Debug)]
pub struct OpTable<W, K = ()> {
    slots: Vec<Slot<W, K>>,
    free: Vec<u32>,
    live: usize,
}

impl<W, K> Default for OpTable<W, K> {
    fn default() -> Self {
        OpTable {
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
        }
    }
}

impl<W, K> OpTable<W, K> {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Ops not yet freed (including abandoned ones still owned by the device).
    pub fn live(&self) -> usize {
        self.live
    }

    /// Ops whose parts a transport still owns (staged, posted, waited on or abandoned): the
    /// ones whose completions must still be drained. O(slots); for shutdown, not hot paths.
    pub fn outstanding(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| matches!(&s.op, Some(op) if op.phase != Phase::Done))
            .count()
    }

    /// Allocates a Staged op.
    pub fn insert(&mut self) -> Token {
        let op = Op {
            phase: Phase::Staged,
            remaining: 0,
            error: None,
            waiter: None,
        };
        self.live += 1;
        if let Some(slot) = self.free.pop() {
            let s = &mut self.slots[slot as usize];
            s.op = Some(op);
            return Token::new(slot, s.generation);
        }
        let slot = self.slots.len() as u32;
        self.slots.push(Slot {
            generation: 0,
            op: Some(op),
            keep: Vec::new(),
        });
        Token::new(slot, 0)
    }

    fn op_mut(&mut self, t: Token) -> Option<&mut Op<W>> {
        let s = self.slots.get_mut(t.slot() as usize)?;
        if s.generation != t.generation() {
            return None;
        }
        s.op.as_mut()
    }

    fn op(&self, t: Token) -> Option<&Op<W>> {
        let s = self.slots.get(t.slot() as usize)?;
        if s.generation != t.generation() {
            return None;
        }
        s.op.as_ref()
    }

    fn release(&mut self, t: Token) -> Option<Op<W>> {
        let s = self.slots.get_mut(t.slot() as usize)?;
        if s.generation != t.generation() {
            return None;
        }
        let op = s.op.take()?;
        s.generation = s.generation.wrapping_add(1);
        self.free.push(t.slot());
        self.live -= 1;
        Some(op)
    }

    /// The phase of a live op.
    pub fn phase(&self, t: Token) -> Option<Phase> {
        self.op(t).map(|o| o.phase)
    }

    /// Whether the op is still wanted (not abandoned, not freed). Devices check this before
    /// starting a queued part, so a dropped transfer does not move more bytes.
    pub fn is_wanted(&self, t: Token) -> bool {
        matches!(self.op(t), Some(o) if o.phase != Phase::Abandoned)
    }

    /// The slot of a live token.
    fn slot_mut(&mut self, t: Token) -> Option<&mut Slot<W, K>> {
        let s = self.slots.get_mut(t.slot() as usize)?;
        (s.generation == t.generation() && s.op.is_some()).then_some(s)
    }

    /// Staged → Posted with `parts` outstanding parts, the op's table entry taking `keep`, what
    /// keeps its memory valid, until the op is reaped. Zero parts makes it Done at once (and
    /// hands `keep` back in `reaped`, as does an error).
    ///
    /// # Errors
    /// [`OpTableError`] if the token is stale or the op is not Staged.
    pub fn post(
        &mut self,
        t: Token,
        parts: u32,
        keep: impl IntoIterator<Item = K>,
        reaped: &mut Vec<K>,
    ) -> Result<(), OpTableError> {
        let Some(s) = self.slot_mut(t) else {
            reaped.extend(keep);
            return Err(OpTableError::Stale(t.0));
        };
        let Some(op) = s.op.as_mut() else {
            reaped.extend(keep);
            return Err(OpTableError::Stale(t.0));
        };
        if op.phase != Phase::Staged {
            let phase = op.phase;
            reaped.extend(keep);
            return Err(OpTableError::WrongPhase {
                token: t.0,
                phase,
                expected: "Staged",
            });
        }
        op.remaining = parts;
        if parts == 0 {
            op.phase = Phase::Done;
            reaped.extend(keep);
        } else {
            op.phase = Phase::Posted;
            s.keep.extend(keep);
        }
        Ok(())
    }

    /// Records one part's outcome. The first error wins and is what the owner sees. The last
    /// part reaps the op: its keep-alive is moved to `reaped`, for the caller to drop outside
    /// its lock.
    pub fn complete(
        &mut self,
        t: Token,
        result: Result<(), Error>,
        reaped: &mut Vec<K>,
    ) -> Completed<W> {
        let Some(s) = self.slot_mut(t) else {
            return Completed::Stale;
        };
        let Some(op) = s.op.as_mut() else {
            return Completed::Stale;
        };
        if op.remaining == 0 || matches!(op.phase, Phase::Staged | Phase::Done) {
            return Completed::Stale;
        }
        if let Err(e) = result {
            op.error.get_or_insert(e);
        }
        op.remaining -= 1;
        if op.remaining > 0 {
            return Completed::Pending;
        }
        // The device is done with every part: nothing needs the op's memory any more.
        reaped.append(&mut s.keep);
        if op.phase == Phase::Abandoned {
            let waiter = op.waiter.take();
            self.release(t);
            return Completed::Reaped(waiter);
        }
        op.phase = Phase::Done;
        Completed::Finished(op.waiter.take())
    }

    /// Fails every outstanding part of the op at once (its link died). Returns like the last
    /// part of [`OpTable::complete`].
    pub fn fail_all(&mut self, t: Token, error: Error, reaped: &mut Vec<K>) -> Completed<W> {
        let Some(op) = self.op_mut(t) else {
            return Completed::Stale;
        };
        if op.remaining == 0 {
            return Completed::Stale;
        }
        op.remaining = 1;
        self.complete(t, Err(error), reaped)
    }

    /// How many keep-alive items the op's entry holds (0 once it is reaped).
    pub fn kept(&self, t: Token) -> usize {
        match self.slots.get(t.slot() as usize) {
            Some(s) if s.generation == t.generation() => s.keep.len(),
            _ => 0,
        }
    }

    /// The owner polls: returns the result if Done (and frees the slot); otherwise stores
    /// `waiter` (replacing an older one) and returns `None`.
    ///
    /// A stale token yields `Some(Err(..))` rather than hanging the owner forever.
    pub fn poll_result(&mut self, t: Token, waiter: W) -> Option<Result<(), Error>> {
        let Some(op) = self.op_mut(t) else {
            return Some(Err(Error::UnknownRequest { req: t.0 }));
        };
        match op.phase {
            Phase::Done => {
                let err = op.error.take();
                self.release(t);
                Some(err.map_or(Ok(()), Err))
            }
            Phase::Abandoned => Some(Err(Error::UnknownRequest { req: t.0 })),
            Phase::Staged | Phase::Posted | Phase::Waiting => {
                op.waiter = Some(waiter);
                if op.phase == Phase::Posted {
                    op.phase = Phase::Waiting;
                }
                None
            }
        }
    }

    /// Status without consuming (HIXL `GetTransferStatus` before the terminal read).
    pub fn status(&self, t: Token) -> Option<TransferStatus> {
        let op = self.op(t)?;
        Some(match op.phase {
            Phase::Done if op.error.is_some() => TransferStatus::Failed,
            Phase::Done => TransferStatus::Completed,
            Phase::Abandoned => TransferStatus::Failed,
            _ => TransferStatus::Waiting,
        })
    }

    /// The owner goes away (future dropped, deadline passed). A Done or Staged op is freed at
    /// once; one with parts outstanding is parked as Abandoned until its last part completes,
    /// so the device never touches memory whose owner thinks it is free.
    ///
    /// Returns `true` if the slot was freed now.
    pub fn abandon(&mut self, t: Token) -> bool {
        let Some(op) = self.op_mut(t) else {
            return false;
        };
        match op.phase {
            Phase::Done | Phase::Staged => {
                self.release(t);
                true
            }
            Phase::Abandoned => false,
            Phase::Posted | Phase::Waiting => {
                op.phase = Phase::Abandoned;
                op.waiter = None;
                false
            }
        }
    }

    /// Watches an abandoned op until its device is done with it: while parts are outstanding
    /// `waiter` is stored (woken when the last part reaps the op) and `true` comes back;
    /// `false` once nothing of the op is in flight any more (its slot was reaped or reused).
    /// An owner that must not go on while its memory may still be written (a leased pull
    /// before it releases its lease) waits for `false`.
    pub fn watch_parked(&mut self, t: Token, waiter: W) -> bool {
        match self.op_mut(t) {
            Some(op) if op.phase == Phase::Abandoned => {
                op.waiter = Some(waiter);
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests;
