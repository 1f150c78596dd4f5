//! Who drives a data connection next: the hand-off decisions, as pure functions of what the
//! caller sees under the connection's locks (the callers act; these only decide), so that the
//! rules are tested as tables.

/// Who sends the parts an op has just queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Sender {
    /// The submitting task, at once (a free connection, a small op): no hand-off.
    Submitter,
    /// The writer task, woken: an op of many parts (its first gather would hold the
    /// submitter for no latency gain).
    WriterTask,
    /// The io_uring driver, driven right after by the submitter once the lock is free.
    Ring,
    /// Whoever drives the busy connection now (its writer or a spinner): the parts wait
    /// their turn.
    Current,
}

/// See [`Sender`]. `many`: the op has more parts than one gather takes; `free`: nothing was
/// queued before them.
pub(super) fn sender(uring: bool, many: bool, free: bool) -> Sender {
    match (uring, many, free) {
        (true, _, _) => Sender::Ring,
        (false, true, _) => Sender::WriterTask,
        (false, false, true) => Sender::Submitter,
        (false, false, false) => Sender::Current,
    }
}

/// What a part queued for its answer finds.
#[derive(Debug, Clone, Copy)]
pub(super) struct Queued {
    /// Answers received ahead wait in the stage (announced by no readiness edge).
    pub(super) staged: bool,
    /// The reader task is parked.
    pub(super) parked: bool,
    /// Waiters spinning on the connection now.
    pub(super) spinners: usize,
    /// A submitting or spinning task queued it (not the connection's own tasks).
    pub(super) direct: bool,
    /// Owners spin on their transfers when they await them (`hixl.SpinUs` > 0).
    pub(super) owners_spin: bool,
}

/// Whether queuing a part wakes the reader task: always when answers wait in the stage (the
/// reader must look); else when it is parked and nobody will take the answer: no waiter
/// spins (the last to stop hands the answers over), and the part was not queued directly with
/// owners spinning (its owner takes the answer on its own thread when it awaits the transfer,
/// and one that does not hands it over, see [`nudge_wakes`]).
pub(super) fn wakes_reader(q: Queued) -> bool {
    q.staged || (q.parked && q.spinners == 0 && !(q.direct && q.owners_spin))
}

/// Whether the reader task parks (waits for a kick, its socket unregistered) rather than
/// reading: nothing is awaited (answers only follow requests), the socket is not open yet,
/// or a waiter spins (it drives the connection meanwhile).
pub(super) fn reader_parks(awaiting: bool, open: bool, spinners: usize) -> bool {
    !awaiting || !open || spinners > 0
}

/// Whether a nudge (the last spinner stopped, an owner asked its status instead of awaiting,
/// an op was withdrawn) wakes the reader: it is parked while answers are awaited and nobody
/// spins for them.
pub(super) fn nudge_wakes(parked: bool, awaiting: bool, spinners: usize) -> bool {
    parked && awaiting && spinners == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn who_sends() {
        for many in [false, true] {
            for free in [false, true] {
                assert_eq!(sender(true, many, free), Sender::Ring);
            }
            assert_eq!(sender(false, true, many), Sender::WriterTask);
        }
        assert_eq!(sender(false, false, true), Sender::Submitter);
        assert_eq!(sender(false, false, false), Sender::Current);
    }

    #[test]
    fn who_takes_an_answer() {
        let q = |staged, parked, spinners, direct, owners_spin| Queued {
            staged,
            parked,
            spinners,
            direct,
            owners_spin,
        };
        // Staged answers: the reader must look, whoever else is around.
        assert!(wakes_reader(q(true, false, 3, true, true)));
        // A running reader needs no wake.
        assert!(!wakes_reader(q(false, false, 0, false, false)));
        // Parked, nobody spinning, queued by the writer task: wake it.
        assert!(wakes_reader(q(false, true, 0, false, true)));
        // Parked, but a waiter spins: it takes the answer.
        assert!(!wakes_reader(q(false, true, 1, false, false)));
        // The submitter's own part with owners spinning: the owner takes it.
        assert!(!wakes_reader(q(false, true, 0, true, true)));
        // ...without owners spinning, the reader must.
        assert!(wakes_reader(q(false, true, 0, true, false)));
    }

    #[test]
    fn when_the_reader_parks_and_is_nudged() {
        assert!(
            !reader_parks(true, true, 0),
            "awaited, open, nobody spinning: read"
        );
        assert!(reader_parks(false, true, 0));
        assert!(reader_parks(true, false, 0));
        assert!(reader_parks(true, true, 2));
        assert!(nudge_wakes(true, true, 0));
        assert!(!nudge_wakes(false, true, 0), "not parked");
        assert!(!nudge_wakes(true, false, 0), "nothing awaited");
        assert!(!nudge_wakes(true, true, 1), "a spinner takes it");
    }
}
