//! Who drives a data connection next: the hand-off decisions, as pure functions of what the
//! caller sees under the connection's locks (the callers act; these only decide), so that the
//! rules are tested as tables.

use crate::tcp::uring::Status;

/// Who sends the parts an op has just queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Sender {
    /// The submitting task, at once (a free connection, a small op): no hand-off.
    Submitter,
    /// The sending task, woken: an op of many parts (its first gather would hold the
    /// submitter for no latency gain).
    Task,
    /// The ring, driven right after by the submitter once the lock is free.
    Ring,
    /// Whoever drives the busy connection now (its sending task or a spinner): the parts
    /// wait their turn.
    Current,
}

/// See [`Sender`]. `ring`: sends go through an io_uring; `many`: the op has more parts than
/// one gather takes; `free`: nothing was queued before them.
pub(super) fn sender(ring: bool, many: bool, free: bool) -> Sender {
    match (ring, many, free) {
        (true, _, _) => Sender::Ring,
        (false, true, _) => Sender::Task,
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

/// What the connection's sending task waits for now, published (`Conn::sending`) for the
/// submitters and spinners that decide whether to wake it ([`ring_hands_over`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum Sending {
    /// It runs (it looks at everything before it waits again).
    Busy = 0,
    /// It waits to be woken: nothing is in flight.
    Idle = 1,
    /// It waits for its I/O (the socket's room, the ring's completions; registered with
    /// tokio), with io_uring also for a kick.
    Io = 2,
    /// It waits for the spinning waiters to stop (they reap meanwhile; io_uring).
    Spin = 3,
}

impl Sending {
    /// The state stored as `v`.
    pub(super) fn from_u8(v: u8) -> Sending {
        match v {
            1 => Sending::Idle,
            2 => Sending::Io,
            3 => Sending::Spin,
            _ => Sending::Busy,
        }
    }
}

/// With epoll, what the sending task waits for after its pump: room in the socket when the
/// socket refused part of the backlog (`blocked`), else a kick.
pub(super) fn socket_waits(blocked: bool) -> Sending {
    if blocked {
        Sending::Io
    } else {
        Sending::Idle
    }
}

/// With io_uring, what the sending task waits for after its drive: the spinners to stop
/// while there are (they reap meanwhile), else the ring's completions while a send is in
/// flight (asked only then), else a kick.
pub(super) fn ring_waits(spinners: usize, in_flight: impl FnOnce() -> bool) -> Sending {
    if spinners > 0 {
        Sending::Spin
    } else if in_flight() {
        Sending::Io
    } else {
        Sending::Idle
    }
}

/// With io_uring, whether the sending task, having published `waits`, drives again at once
/// for what changed before (what changes after wakes it, see [`ring_hands_over`]):
/// completions left for a pump (the drive's rounds ran out); going idle, a send in flight,
/// parts queued (`pending`) or a spinner come meanwhile; waiting for completions, none in
/// flight any more; waiting for the spinners, none left: the last one stopped before the
/// state was published, and its hand-over found the task running.
pub(super) fn ring_again(
    waits: Sending,
    ring: Status,
    pending: impl FnOnce() -> bool,
    spinners: impl FnOnce() -> usize,
) -> bool {
    ring.results
        || match waits {
            Sending::Idle => ring.in_flight || pending() || spinners() > 0,
            Sending::Io => !ring.in_flight,
            Sending::Spin => spinners() == 0,
            Sending::Busy => false,
        }
}

/// With io_uring, after a submitter or a spinner drove the ring and nobody spins: whether the
/// sending task (waiting for `sending`) must be woken for what was left (requests in flight
/// that nobody may reap, completions, or parts not yet sent: `pending`), unless it waits for
/// it already. A running task looks at everything before it waits again.
pub(super) fn ring_hands_over(
    ring: Status,
    sending: Sending,
    pending: impl FnOnce() -> bool,
) -> bool {
    match sending {
        // Waiting for a kick: the last spinner's, or a submitter's.
        Sending::Idle | Sending::Spin => ring.in_flight || ring.results || pending(),
        Sending::Io => ring.results || (!ring.in_flight && pending()),
        Sending::Busy => false,
    }
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
            assert_eq!(sender(false, true, many), Sender::Task);
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
        // Parked, nobody spinning, queued by the sending task: wake it.
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

    #[test]
    fn sending_state_round_trips() {
        for s in [Sending::Busy, Sending::Idle, Sending::Io, Sending::Spin] {
            assert_eq!(Sending::from_u8(s as u8), s);
        }
    }

    #[test]
    fn what_the_sending_task_waits_for() {
        assert_eq!(socket_waits(true), Sending::Io);
        assert_eq!(socket_waits(false), Sending::Idle);
        assert_eq!(ring_waits(1, || panic!("not asked")), Sending::Spin);
        assert_eq!(ring_waits(0, || true), Sending::Io);
        assert_eq!(ring_waits(0, || false), Sending::Idle);
    }

    fn st(in_flight: bool, results: bool) -> Status {
        Status { in_flight, results }
    }

    #[test]
    fn when_the_sending_task_drives_again() {
        let no = || panic!("not asked");
        // Completions left for a pump: whatever it waits for.
        for w in [Sending::Idle, Sending::Io, Sending::Spin] {
            assert!(ring_again(w, st(true, true), no, || 0));
        }
        // Going idle with a send in flight, parts queued or a spinner come meanwhile.
        assert!(ring_again(Sending::Idle, st(true, false), no, || 0));
        assert!(ring_again(Sending::Idle, st(false, false), || true, || 0));
        assert!(ring_again(Sending::Idle, st(false, false), || false, || 1));
        assert!(!ring_again(Sending::Idle, st(false, false), || false, || 0));
        // Waiting for completions that came meanwhile (reaped by another).
        assert!(ring_again(Sending::Io, st(false, false), no, || 0));
        assert!(!ring_again(Sending::Io, st(true, false), no, || 0));
        // Waiting for spinners: they reap, and the last to stop hands over.
        assert!(!ring_again(Sending::Spin, st(true, false), no, || 1));
        // ...unless it stopped before the state was published (it found the task running).
        assert!(ring_again(Sending::Spin, st(true, false), no, || 0));
    }

    #[test]
    fn when_a_direct_drive_hands_over() {
        let no = || panic!("not asked");
        for w in [Sending::Idle, Sending::Spin] {
            assert!(ring_hands_over(st(true, false), w, no));
            assert!(ring_hands_over(st(false, true), w, no));
            assert!(ring_hands_over(st(false, false), w, || true));
            assert!(!ring_hands_over(st(false, false), w, || false));
        }
        // Waiting for the ring: woken by its completions, not for a send in flight.
        assert!(!ring_hands_over(st(true, false), Sending::Io, no));
        assert!(ring_hands_over(st(true, true), Sending::Io, no));
        assert!(ring_hands_over(st(false, false), Sending::Io, || true));
        assert!(!ring_hands_over(st(false, false), Sending::Io, || false));
        // Running: it looks again before it waits.
        assert!(!ring_hands_over(st(true, true), Sending::Busy, no));
    }
}
