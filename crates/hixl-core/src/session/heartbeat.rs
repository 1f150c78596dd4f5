//! The liveness timer both ends of a control connection run.
//!
//! Stopped until [`Liveness::start`] (when the link is established), which sends a first
//! probe at once. Every frame received resets the silence; when the silence reaches
//! `interval × miss_limit` exactly, [`Liveness::on_timeout`] reports the link dead.
//!
//! The two ends probe differently, so that an idle link carries one probe and its answer per
//! interval, not two of each:
//!
//! - The initiator probes every interval, whatever it hears (its probes are what keep the
//!   target's silence short). With a `grid`, each probe after the first falls on
//!   `grid + k × interval`, the latest such instant no later than an interval after the
//!   previous probe: probes are never further apart than an interval, and the links of a
//!   process that share a grid probe in the same instant, so that one timer wake-up of the
//!   runtime serves them all. Without one, the next probe is due an interval after the moment
//!   the previous one was sent (a late timeout delays the schedule rather than bursting).
//! - The target answers probes and probes only a silent link: once it has heard nothing for
//!   one and a half intervals, then every interval while the silence lasts. An initiator that
//!   probes keeps it quiet; its probes only matter against a peer that does not.

use std::time::{Duration, Instant};

use crate::error::Error;
use crate::wire::{Message, HEARTBEAT_FROM_TARGET};

/// Silence, in halves of an interval, after which the target probes: one and a half
/// intervals, so that an initiator's probe delayed by up to half an interval (a busy
/// scheduler, a slow network) does not draw one.
const QUIET_HALVES: u32 = 3;

/// One end's probe schedule and silence bound.
#[derive(Debug)]
pub(crate) struct Liveness {
    interval: Duration,
    miss_limit: u32,
    /// `interval × miss_limit`, `None` when it overflows (never dies).
    bound: Option<Duration>,
    /// The target's silence before it probes, `None` when it overflows (never probes).
    quiet: Option<Duration>,
    last_heard: Instant,
    started: bool,
    /// When the last probe went (only once started).
    last_probe: Option<Instant>,
    /// Initiator: when the next probe is due.
    next_probe: Option<Instant>,
    /// Initiator: the instant its probes are aligned to.
    grid: Option<Instant>,
    seq: u64,
    /// Whether we are the target end (our probes carry [`HEARTBEAT_FROM_TARGET`]).
    target: bool,
}

impl Liveness {
    /// A stopped timer; `target` says which end we are, `grid` what an initiator aligns its
    /// probes to (ignored on the target).
    pub(crate) fn new(
        interval: Duration,
        miss_limit: u32,
        now: Instant,
        target: bool,
        grid: Option<Instant>,
    ) -> Self {
        let interval = interval.max(Duration::from_millis(1));
        let miss_limit = miss_limit.max(1);
        Liveness {
            interval,
            miss_limit,
            bound: interval.checked_mul(miss_limit),
            quiet: interval
                .checked_mul(QUIET_HALVES)
                .map(|d| d / 2)
                .filter(|_| target),
            last_heard: now,
            started: false,
            last_probe: None,
            next_probe: None,
            grid: grid.filter(|_| !target),
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
        self.last_probe = Some(now);
        if !self.target {
            self.next_probe = now.checked_add(self.interval).map(|t| self.align(t, now));
        }
        self.seq = if self.target {
            self.seq.wrapping_add(1) | HEARTBEAT_FROM_TARGET
        } else {
            self.seq.wrapping_add(1) & !HEARTBEAT_FROM_TARGET
        };
        Message::Heartbeat { seq: self.seq }
    }

    /// The latest grid instant at or before `due` (the initiator's next probe), if it is
    /// after `sent`; `due` itself without a grid.
    fn align(&self, due: Instant, sent: Instant) -> Instant {
        let Some(grid) = self.grid else { return due };
        let step = self.interval.as_nanos();
        // How far `due` is past the grid instant before it.
        let past = match due.checked_duration_since(grid) {
            Some(d) => d.as_nanos() % step,
            None => (step - (grid - due).as_nanos() % step) % step,
        };
        match u64::try_from(past)
            .ok()
            .and_then(|p| due.checked_sub(Duration::from_nanos(p)))
        {
            Some(t) if t > sent => t,
            _ => due,
        }
    }

    /// When the next probe is due (only once started).
    fn probe_due(&self) -> Option<Instant> {
        if !self.started {
            return None;
        }
        if !self.target {
            return self.next_probe;
        }
        // The target: after `quiet` of silence, then every interval while it lasts.
        let after_silence = self.last_heard.checked_add(self.quiet?)?;
        let after_last = self.last_probe.and_then(|p| p.checked_add(self.interval));
        Some(after_last.map_or(after_silence, |t| t.max(after_silence)))
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
        super::earliest(self.probe_due(), self.death())
    }

    /// Time passed: `Err(silence)` when the link is dead, else the probe due, if any.
    pub(crate) fn on_timeout(&mut self, now: Instant) -> Result<Option<Message>, Duration> {
        if let Some(d) = self.death() {
            if now >= d {
                return Err(now.saturating_duration_since(self.last_heard));
            }
        }
        match self.probe_due() {
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
        let mut l = Liveness::new(100 * MS, 3, t0, false, None);
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
        let mut t = Liveness::new(MS, 1, t0, true, None);
        let i = Liveness::new(MS, 1, t0, false, None);
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
    fn the_target_probes_only_after_silence() {
        let t0 = Instant::now();
        let mut t = Liveness::new(100 * MS, 5, t0, true, Some(t0));
        let Message::Heartbeat { seq } = t.start(t0) else {
            panic!("not a heartbeat")
        };
        assert_eq!(
            seq,
            1 | HEARTBEAT_FROM_TARGET,
            "the first probe goes at once"
        );
        // Heard every interval: the next probe keeps moving away.
        for k in 1..=50 {
            assert_eq!(t.poll_timeout(), Some(t0 + (k - 1) * 100 * MS + 150 * MS));
            assert_eq!(t.on_timeout(t0 + k * 100 * MS), Ok(None));
            t.heard(t0 + k * 100 * MS);
        }
        // Silent from 5 s on: probes at 1.5 intervals of silence, then every interval, and
        // the death exactly at the bound.
        let h = t0 + 5000 * MS;
        assert_eq!(t.poll_timeout(), Some(h + 150 * MS));
        assert_eq!(t.on_timeout(h + 149 * MS), Ok(None));
        assert!(matches!(t.on_timeout(h + 150 * MS), Ok(Some(_))));
        assert_eq!(t.poll_timeout(), Some(h + 250 * MS));
        assert!(matches!(t.on_timeout(h + 250 * MS), Ok(Some(_))));
        assert!(matches!(t.on_timeout(h + 350 * MS), Ok(Some(_))));
        assert!(matches!(t.on_timeout(h + 450 * MS), Ok(Some(_))));
        assert_eq!(t.poll_timeout(), Some(h + 500 * MS), "death, not a probe");
        assert_eq!(t.on_timeout(h + 500 * MS), Err(500 * MS));
    }

    #[test]
    fn initiator_probes_fall_on_the_grid_never_more_than_an_interval_apart() {
        let t0 = Instant::now();
        // Grids before and after the start, a start off the grid, late timeouts.
        for grid in [t0, t0 + 37 * MS, t0 + 10_000 * MS, t0 + 3 * MS] {
            let mut l = Liveness::new(100 * MS, 5, t0 + 50 * MS, false, Some(grid));
            let start = t0 + 64 * MS;
            l.start(start);
            let mut last = start;
            for late in [0, 1, 7, 0, 99, 0, 2] {
                let due = l.poll_timeout().expect("due");
                assert!(
                    due > last && due <= last + 100 * MS,
                    "{due:?} after {last:?}"
                );
                let off = match due.checked_duration_since(grid) {
                    Some(d) => d.as_nanos() % (100 * MS).as_nanos(),
                    None => (grid - due).as_nanos() % (100 * MS).as_nanos(),
                };
                assert_eq!(off, 0, "on the grid");
                let at = due + late * MS;
                l.heard(at);
                assert!(matches!(l.on_timeout(at), Ok(Some(_))));
                last = at;
            }
        }
        // Without a grid: an interval after each probe.
        let mut l = Liveness::new(100 * MS, 5, t0, false, None);
        l.start(t0 + 64 * MS);
        assert_eq!(l.poll_timeout(), Some(t0 + 164 * MS));
    }

    #[test]
    fn degenerate_settings_are_clamped() {
        let t0 = Instant::now();
        let mut l = Liveness::new(Duration::ZERO, 0, t0, false, None);
        l.start(t0);
        assert_eq!(l.poll_timeout(), Some(t0 + MS));
        let mut far = Liveness::new(Duration::MAX, u32::MAX, t0, false, None);
        far.start(t0);
        assert_eq!(far.death(), None);
    }
}
