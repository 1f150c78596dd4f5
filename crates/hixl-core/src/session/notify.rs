//! Notify bookkeeping: the initiator's ledger of sequence numbers waiting for acks, and the
//! target's per-link budget of undrained notifies.

use std::collections::BTreeSet;

use crate::error::Error;
use crate::status::Status;
use crate::types::NOTIFY_MAX_LEN;

/// Checks a notify's name and message against HIXL's limit, naming the offending field.
pub(crate) fn check_lengths(name: &[u8], msg: &[u8]) -> Result<(), Error> {
    for (field, v) in [("name", name), ("msg", msg)] {
        if v.len() > NOTIFY_MAX_LEN {
            return Err(Error::NotifyTooLong {
                field,
                len: v.len(),
                max: NOTIFY_MAX_LEN,
            });
        }
    }
    Ok(())
}

/// The initiator's notifies: sequence numbers from 1, strictly increasing, and those not yet
/// acked.
#[derive(Debug)]
pub(crate) struct Ledger {
    next: u64,
    pending: BTreeSet<u64>,
    limit: usize,
}

impl Ledger {
    pub(crate) fn new(limit: usize) -> Ledger {
        Ledger {
            next: 1,
            pending: BTreeSet::new(),
            limit: limit.max(1),
        }
    }

    /// A new sequence number, or `None` when `limit` notifies already wait for an ack (or
    /// the sequence space is used up).
    pub(crate) fn allocate(&mut self) -> Option<u64> {
        if self.pending.len() >= self.limit {
            return None;
        }
        let seq = self.next;
        self.next = self.next.checked_add(1)?;
        self.pending.insert(seq);
        Some(seq)
    }

    /// The limit on notifies waiting for an ack.
    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    /// Takes a pending seq off the ledger; false when it is not pending (unknown, acked or
    /// cancelled).
    pub(crate) fn resolve(&mut self, seq: u64) -> bool {
        self.pending.remove(&seq)
    }

    /// Every pending seq, in order, emptying the ledger.
    pub(crate) fn take_all(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.pending).into_iter().collect()
    }

    /// How many wait for an ack.
    pub(crate) fn pending(&self) -> usize {
        self.pending.len()
    }
}

/// The result of an ack's status, as the asynchronous engine maps it.
pub(crate) fn ack_result(peer: &str, status: u32, limit: usize) -> Result<(), Error> {
    match Status::from_code(status) {
        Some(Status::Success) => Ok(()),
        Some(Status::ResourceExhausted) => Err(Error::NotifyQueueFull {
            peer: peer.to_string(),
            limit,
        }),
        s => Err(Error::Remote {
            peer: peer.to_string(),
            status: s.unwrap_or(Status::Failed),
            message: "notify refused".into(),
        }),
    }
}

/// The target's count of this link's notifies the application has not drained yet.
#[derive(Debug)]
pub(crate) struct Budget {
    undrained: usize,
    limit: usize,
}

impl Budget {
    pub(crate) fn new(limit: usize) -> Budget {
        Budget {
            undrained: 0,
            limit,
        }
    }

    /// Takes one slot; false when the budget is spent.
    pub(crate) fn admit(&mut self) -> bool {
        if self.undrained >= self.limit {
            return false;
        }
        self.undrained += 1;
        true
    }

    /// `n` notifies of this link were drained.
    pub(crate) fn drained(&mut self, n: usize) {
        self.undrained = self.undrained.saturating_sub(n);
    }

    pub(crate) fn undrained(&self) -> usize {
        self.undrained
    }

    pub(crate) fn limit(&self) -> usize {
        self.limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ledger_numbers_from_one_and_resolves_once() {
        let mut l = Ledger::new(2);
        assert_eq!(l.allocate(), Some(1));
        assert_eq!(l.allocate(), Some(2));
        assert_eq!(l.allocate(), None, "limit");
        assert!(l.resolve(1));
        assert!(!l.resolve(1), "twice");
        assert!(!l.resolve(99), "unknown");
        assert_eq!(l.allocate(), Some(3), "seqs are never reused");
        assert_eq!(l.take_all(), vec![2, 3]);
        assert_eq!(l.pending(), 0);
    }

    #[test]
    fn budget_and_lengths() {
        let mut b = Budget::new(2);
        assert!(b.admit() && b.admit() && !b.admit());
        b.drained(5);
        assert_eq!(b.undrained(), 0);
        assert!(check_lengths(&[0; NOTIFY_MAX_LEN], &[]).is_ok());
        match check_lengths(b"n", &[0; NOTIFY_MAX_LEN + 1]) {
            Err(Error::NotifyTooLong { field, len, .. }) => {
                assert_eq!((field, len), ("msg", NOTIFY_MAX_LEN + 1))
            }
            r => panic!("{r:?}"),
        }
        assert!(matches!(
            ack_result("p", Status::ResourceExhausted.code(), 4),
            Err(Error::NotifyQueueFull { limit: 4, .. })
        ));
        assert!(matches!(
            ack_result("p", 12345, 4),
            Err(Error::Remote {
                status: Status::Failed,
                ..
            })
        ));
    }
}
