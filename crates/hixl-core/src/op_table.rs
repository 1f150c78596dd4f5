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
struct Slot<W> {
    generation: u32,
    op: Option<Op<W>>,
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
    /// That was the last part of an abandoned op; its slot is free again.
    Reaped,
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

/// The slab of in-flight ops. `W` is what wakes an owner (a `Waker` in the async layer).
#[derive(Debug)]
pub struct OpTable<W> {
    slots: Vec<Slot<W>>,
    free: Vec<u32>,
    live: usize,
}

impl<W> Default for OpTable<W> {
    fn default() -> Self {
        OpTable {
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
        }
    }
}

impl<W> OpTable<W> {
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

    /// Staged → Posted with `parts` outstanding parts. Zero parts makes it Done at once.
    ///
    /// # Errors
    /// [`OpTableError`] if the token is stale or the op is not Staged.
    pub fn post(&mut self, t: Token, parts: u32) -> Result<(), OpTableError> {
        let op = self.op_mut(t).ok_or(OpTableError::Stale(t.0))?;
        if op.phase != Phase::Staged {
            return Err(OpTableError::WrongPhase {
                token: t.0,
                phase: op.phase,
                expected: "Staged",
            });
        }
        op.remaining = parts;
        op.phase = if parts == 0 {
            Phase::Done
        } else {
            Phase::Posted
        };
        Ok(())
    }

    /// Records one part's outcome. The first error wins and is what the owner sees.
    pub fn complete(&mut self, t: Token, result: Result<(), Error>) -> Completed<W> {
        let Some(op) = self.op_mut(t) else {
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
        if op.phase == Phase::Abandoned {
            self.release(t);
            return Completed::Reaped;
        }
        op.phase = Phase::Done;
        Completed::Finished(op.waiter.take())
    }

    /// Fails every outstanding part of the op at once (its link died). Returns like the last
    /// part of [`OpTable::complete`].
    pub fn fail_all(&mut self, t: Token, error: Error) -> Completed<W> {
        let Some(op) = self.op_mut(t) else {
            return Completed::Stale;
        };
        if op.remaining == 0 {
            return Completed::Stale;
        }
        op.remaining = 1;
        self.complete(t, Err(error))
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn err() -> Error {
        Error::PeerLost {
            peer: "p".into(),
            cause: "test".into(),
        }
    }

    #[test]
    fn full_lifecycle() {
        let mut t: OpTable<u32> = OpTable::new();
        let tok = t.insert();
        assert_eq!(t.phase(tok), Some(Phase::Staged));
        t.post(tok, 2).unwrap();
        assert!(t.poll_result(tok, 7).is_none());
        assert_eq!(t.phase(tok), Some(Phase::Waiting));
        assert!(matches!(t.complete(tok, Ok(())), Completed::Pending));
        assert_eq!(t.status(tok), Some(TransferStatus::Waiting));
        assert!(matches!(
            t.complete(tok, Ok(())),
            Completed::Finished(Some(7))
        ));
        assert_eq!(t.status(tok), Some(TransferStatus::Completed));
        assert!(matches!(t.poll_result(tok, 8), Some(Ok(()))));
        assert_eq!(t.live(), 0);
        // the slot's generation moved on: the old token is stale everywhere
        assert!(matches!(t.complete(tok, Ok(())), Completed::Stale));
        assert!(t.status(tok).is_none());
        let tok2 = t.insert();
        assert_eq!(tok2.slot(), tok.slot());
        assert_ne!(tok2.generation(), tok.generation());
        assert!(matches!(t.complete(tok, Ok(())), Completed::Stale));
    }

    #[test]
    fn first_error_wins() {
        let mut t: OpTable<()> = OpTable::new();
        let tok = t.insert();
        t.post(tok, 3).unwrap();
        t.complete(tok, Ok(()));
        t.complete(tok, Err(err()));
        t.complete(tok, Err(Error::NotInitialized));
        assert_eq!(t.status(tok), Some(TransferStatus::Failed));
        assert!(matches!(
            t.poll_result(tok, ()),
            Some(Err(Error::PeerLost { .. }))
        ));
    }

    #[test]
    fn abandoned_op_is_kept_until_the_device_is_done() {
        let mut t: OpTable<()> = OpTable::new();
        let tok = t.insert();
        t.post(tok, 2).unwrap();
        assert!(!t.abandon(tok));
        assert!(!t.is_wanted(tok));
        assert_eq!(t.live(), 1);
        // slot not reusable yet
        let other = t.insert();
        assert_ne!(other.slot(), tok.slot());
        assert!(matches!(t.complete(tok, Ok(())), Completed::Pending));
        assert!(matches!(t.complete(tok, Ok(())), Completed::Reaped));
        assert_eq!(t.live(), 1);
    }

    #[test]
    fn misuse_is_reported_not_panicking() {
        let mut t: OpTable<()> = OpTable::new();
        let tok = t.insert();
        t.post(tok, 1).unwrap();
        assert!(matches!(
            t.post(tok, 1),
            Err(OpTableError::WrongPhase { .. })
        ));
        assert_eq!(t.post(Token(999), 1), Err(OpTableError::Stale(999)));
        assert!(matches!(t.poll_result(Token(999), ()), Some(Err(_))));
        assert!(matches!(t.fail_all(tok, err()), Completed::Finished(None)));
        let z = t.insert();
        t.post(z, 0).unwrap();
        assert!(matches!(t.poll_result(z, ()), Some(Ok(()))));
    }

    #[derive(Debug, Clone)]
    enum Step {
        Insert(u32),
        Complete(usize, bool),
        Poll(usize),
        Abandon(usize),
        StaleComplete(u64),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0u32..4).prop_map(Step::Insert),
            (any::<usize>(), any::<bool>()).prop_map(|(i, ok)| Step::Complete(i, ok)),
            any::<usize>().prop_map(Step::Poll),
            any::<usize>().prop_map(Step::Abandon),
            any::<u64>().prop_map(Step::StaleComplete),
        ]
    }

    proptest! {
        // Against a model: every part completion is applied exactly once to the right op, and
        // `live` counts exactly the ops that are neither taken nor reaped.
        #[test]
        fn churn_matches_model(steps in proptest::collection::vec(step(), 1..200)) {
            let mut t: OpTable<()> = OpTable::new();
            // (token, remaining, owner_present)
            let mut model: Vec<(Token, u32, bool)> = Vec::new();
            for s in steps {
                match s {
                    Step::Insert(n) => {
                        let tok = t.insert();
                        t.post(tok, n).unwrap();
                        model.push((tok, n, true));
                    }
                    Step::Complete(i, ok) if !model.is_empty() => {
                        let i = i % model.len();
                        let (tok, rem, owner) = model[i];
                        let r = t.complete(tok, if ok { Ok(()) } else { Err(err()) });
                        if rem == 0 { prop_assert!(matches!(r, Completed::Stale)); continue; }
                        model[i].1 -= 1;
                        if rem > 1 { prop_assert!(matches!(r, Completed::Pending)); }
                        else if owner { prop_assert!(matches!(r, Completed::Finished(_))); }
                        else { prop_assert!(matches!(r, Completed::Reaped)); model.remove(i); }
                    }
                    Step::Poll(i) if !model.is_empty() => {
                        let i = i % model.len();
                        let (tok, rem, owner) = model[i];
                        if !owner { continue; }
                        let r = t.poll_result(tok, ());
                        if rem == 0 { prop_assert!(r.is_some()); model.remove(i); }
                        else { prop_assert!(r.is_none()); }
                    }
                    Step::Abandon(i) if !model.is_empty() => {
                        let i = i % model.len();
                        let (tok, rem, owner) = model[i];
                        if !owner { continue; }
                        let freed = t.abandon(tok);
                        prop_assert_eq!(freed, rem == 0);
                        if freed { model.remove(i); } else { model[i].2 = false; }
                    }
                    Step::StaleComplete(raw) => {
                        let tok = Token(raw);
                        if !model.iter().any(|m| m.0 == tok) {
                            prop_assert!(matches!(t.complete(tok, Ok(())), Completed::Stale));
                        }
                    }
                    _ => {}
                }
                prop_assert_eq!(t.live(), model.len());
            }
        }
    }
}
