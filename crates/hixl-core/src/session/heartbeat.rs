//! The liveness timer both ends of a control connection run.
//!
//! Stopped until [`Liveness::start`] (when the link is established), then it probes every
//! interval, the first probe at once; after a probe the next one is due an interval after the
//! moment it was sent (a late timeout delays the schedule rather than bursting). Every frame
//! received resets the silence. When the silence reaches `interval × miss_limit` exactly,
//! [`Liveness::on_timeout`] reports the link dead.

use std::time::{Duration, Instant};

use crate::error::Error;
use crate::wire::{Message, HEARTBEAT_FROM_TARGET};

/// One end's probe schedule and silence bound.
#[derive(Debug)]
pub(crate) struct Liveness {
    interval: Duration,
    miss_limit: u32,
    /// `interval × miss_limit`, `None` when it overflows (never dies).
    bound: Option<Duration>,
    last_heard: Instant,
    started: bool,
    next_probe: Option<Instant>,
    seq: u64,
    /// Whether our probes carry [`HEARTBEAT_FROM_TARGET`].
    target: bool,
}

impl Liveness {
    /// A stopped timer; `target` says which end we are.
    pub(crate) fn new(interval: Duration, miss_limit: u32, now: Instant, target: bool) -> Self {
        let interval = interval.max(Duration::from_millis(1));
        let miss_limit = miss_limit.max(1);
        Liveness {
            interval,
            miss_limit,
            bound: interval.checked_mul(miss_limit),
            last_heard: now,
            started: false,
            next_probe: None,
            seq: 0,
            target,
        }
    }

    /// We heard the peer (any frame).
    pub(crate) fn heard(&mut self, now: Instant) {
        self.last_heard = self.last_heard.max(now);
    }

    /// Starts probing: returns the first probe.
    pub(crate) fn start(&mut self, now: Instant) -> Message {
        self.heard(now);
        self.started = true;
        self.probe(now)
    }

    fn probe(&mut self, now: Instant) -> Message {
        self.next_probe = now.checked_add(self.interval);
        self.seq = if self.target {
            self.seq.wrapping_add(1) | HEARTBEAT_FROM_TARGET
        } else {
            self.seq.wrapping_add(1) & !HEARTBEAT_FROM_TARGET
        };
        Message::Heartbeat { seq: self.seq }
    }

    /// When the link dies if nothing is heard before (only once started).
    pub(crate) fn death(&self) -> Option<Instant> {
        if !self.started {
            return None;
        }
        self.last_heard.checked_add(self.bound?)
    }

    /// The next instant [`Liveness::on_timeout`] has something to do.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        super::earliest(self.next_probe, self.death())
    }

    /// Time passed: `Err(silence)` when the link is dead, else the probe due, if any.
    pub(crate) fn on_timeout(&mut self, now: Instant) -> Result<Option<Message>, Duration> {
        if let Some(d) = self.death() {
            if now >= d {
                return Err(now.saturating_duration_since(self.last_heard));
            }
        }
        match self.next_probe {
            Some(t) if now >= t => Ok(Some(self.probe(now))),
            _ => Ok(None),
        }
    }

    /// The answer to a received heartbeat: the peer's probes are echoed, answers to ours are
    /// not answered again.
    pub(crate) fn answer(&self, seq: u64) -> Option<Message> {
        let from_target = seq & HEARTBEAT_FROM_TARGET != 0;
        (from_target != self.target).then_some(Message::Heartbeat { seq })
    }

    /// The error of a link silent for `silence`.
    pub(crate) fn lost(&self, peer: &str, silence: Duration) -> Error {
        Error::HeartbeatLost {
            peer: peer.to_string(),
            silent_ms: silence.as_millis() as u64,
            probes: self.miss_limit,
            interval_ms: self.interval.as_millis() as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn probes_then_dies_exactly_at_the_bound() {
        let t0 = Instant::now();
        let mut l = Liveness::new(100 * MS, 3, t0, false);
        assert_eq!(l.poll_timeout(), None, "stopped");
        assert_eq!(l.start(t0), Message::Heartbeat { seq: 1 });
        assert_eq!(l.poll_timeout(), Some(t0 + 100 * MS));
        assert_eq!(
            l.on_timeout(t0 + 100 * MS),
            Ok(Some(Message::Heartbeat { seq: 2 }))
        );
        assert_eq!(l.on_timeout(t0 + 150 * MS), Ok(None));
        assert_eq!(
            l.on_timeout(t0 + 200 * MS),
            Ok(Some(Message::Heartbeat { seq: 3 }))
        );
        assert_eq!(l.death(), Some(t0 + 300 * MS));
        assert!(l
            .on_timeout(t0 + 300 * MS - Duration::from_nanos(1))
            .is_ok());
        assert_eq!(l.on_timeout(t0 + 300 * MS), Err(300 * MS));
    }

    #[test]
    fn target_probes_carry_the_bit_and_answers_are_not_answered() {
        let t0 = Instant::now();
        let mut t = Liveness::new(MS, 1, t0, true);
        let i = Liveness::new(MS, 1, t0, false);
        let Message::Heartbeat { seq } = t.start(t0) else {
            panic!("not a heartbeat")
        };
        assert_eq!(seq, 1 | HEARTBEAT_FROM_TARGET);
        assert_eq!(i.answer(seq), Some(Message::Heartbeat { seq }));
        assert_eq!(
            t.answer(seq),
            None,
            "the target does not answer its own probe"
        );
        assert_eq!(t.answer(7), Some(Message::Heartbeat { seq: 7 }));
        assert_eq!(i.answer(7), None);
    }

    #[test]
    fn degenerate_settings_are_clamped() {
        let t0 = Instant::now();
        let mut l = Liveness::new(Duration::ZERO, 0, t0, false);
        l.start(t0);
        assert_eq!(l.poll_timeout(), Some(t0 + MS));
        let mut far = Liveness::new(Duration::MAX, u32::MAX, t0, false);
        far.start(t0);
        assert_eq!(far.death(), None);
    }
}
