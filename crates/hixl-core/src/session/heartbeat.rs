//! The liveness timer both ends of a control connection run.
//!
//! Stopped until [`Liveness::start`] (when the link is established); the initiator's first
//! probe follows one interval later. Every frame received resets the silence; when the silence reaches
//! `period × miss_limit` exactly, [`Liveness::on_timeout`] reports the link dead.
//!
//! The two ends probe differently, so that an idle link carries one probe and its answer per
//! period, not two of each:
//!
//! - The initiator probes every period, whatever it hears (its probes are what keep the
//!   target's silence short). Its period is the interval while the link is *active* (work in
//!   flight, reported with [`Liveness::work`], and for `interval × miss_limit` after the last
//!   report), and the idle period otherwise (when it has one longer than the interval). The
//!   first report on an idle link probes at once and counts the silence from that instant,
//!   so that work in flight always sees the active bound. Each probe carries the period
//!   until the next one ([`HEARTBEAT_PERIOD_SHIFT`]); turning idle sends one, so that the
//!   target learns the longer period before the silence starts. With a `grid`, each probe
//!   after the first falls on `grid + k × period`, the latest such instant no later than a
//!   period after the previous probe: probes are never further apart than a period, and the
//!   links of a process that share a grid probe in the same instant, so that one timer
//!   wake-up of the runtime serves them all. Without one, the next probe is due a period
//!   after the moment the previous one was sent (a late timeout delays the schedule rather
//!   than bursting).
//! - The target answers probes and probes only a silent link: once it has heard nothing for
//!   one and a half periods, then every period while the silence lasts. Its period is the
//!   one its initiator last announced, never below its own interval nor above its own idle
//!   period (so that a peer cannot make it wait forever); its interval until one is
//!   announced (an older initiator). An initiator that probes keeps it quiet; its probes
//!   only matter against a peer that does not.

use std::time::{Duration, Instant};

use crate::error::Error;
use crate::wire::{
    Message, HEARTBEAT_FROM_TARGET, HEARTBEAT_PERIOD_MAX_MS, HEARTBEAT_PERIOD_SHIFT,
};

/// Silence, in halves of a period, after which the target probes: one and a half periods,
/// so that an initiator's probe delayed by up to half a period (a busy scheduler, a slow
/// network) does not draw one.
const QUIET_HALVES: u32 = 3;

/// The low bits of a heartbeat's sequence number, which count.
const SEQ_MASK: u64 = (1 << HEARTBEAT_PERIOD_SHIFT) - 1;

/// The period an initiator's heartbeat announces, if any.
pub(crate) fn announced(seq: u64) -> Option<Duration> {
    if seq & HEARTBEAT_FROM_TARGET != 0 {
        return None;
    }
    let ms = (seq >> HEARTBEAT_PERIOD_SHIFT) & HEARTBEAT_PERIOD_MAX_MS;
    (ms > 0).then(|| Duration::from_millis(ms))
}

/// One end's probe schedule and silence bound.
#[derive(Debug)]
pub(crate) struct Liveness {
    interval: Duration,
    miss_limit: u32,
    /// Initiator: the period of an idle link, `None` when idle links probe like active ones.
    /// Target: the longest announced period it honours (its interval when `None`).
    idle: Option<Duration>,
    /// The period in force: the initiator's (interval while active, idle period otherwise),
    /// or the one the target's initiator announced (clamped).
    period: Duration,
    /// Initiator: whether the link is active (always, without an idle period).
    active: bool,
    /// Initiator: when an active link turns idle unless more work is reported (`None`: never).
    hold_until: Option<Instant>,
    last_heard: Instant,
    /// The silence is counted from the later of `last_heard` and this: the instant an idle
    /// link turned active.
    armed: Instant,
    /// Target: until the first frame after the start, its silence bound is counted from this
    /// instant at the earliest (when the initiator's first probe is due), not from the start.
    first_due: Option<Instant>,
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
    /// probes to (ignored on the target), `idle` the initiator's idle period or the longest
    /// period a target honours (`None`, or not above the interval: none).
    pub(crate) fn new(
        interval: Duration,
        miss_limit: u32,
        idle: Option<Duration>,
        now: Instant,
        target: bool,
        grid: Option<Instant>,
    ) -> Self {
        let interval = interval.max(Duration::from_millis(1));
        let miss_limit = miss_limit.max(1);
        let idle = idle.filter(|&d| d > interval);
        Liveness {
            interval,
            miss_limit,
            idle,
            // An initiator's link starts idle: nothing is in flight before it is established.
            period: match idle {
                Some(d) if !target => d,
                _ => interval,
            },
            active: idle.is_none() || target,
            hold_until: None,
            last_heard: now,
            armed: now,
            first_due: None,
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
        if self.started {
            self.first_due = None;
        }
    }

    /// Starts the timer; its silence is counted from `now`. Neither end probes at once: the
    /// handshake just finished is each end's latest sign of life, and a probe and its answer
    /// per link at that instant are what a thousand peers connecting at once would pay two
    /// thousand frames and wake-ups for, in the middle of their connects. The initiator's
    /// first probe, which announces its period, is due one interval later; on a grid, at the
    /// grid instant within that interval, so that the links established in one interval
    /// send their first probes in one wake-up of the runtime. That is before the one and a
    /// half intervals of silence after which a target of the same interval probes (a target
    /// of a shorter one probes first; it is answered, and learns the period from the first
    /// probe). The target, which starts when it sends the table, counts its silence bound
    /// from one interval later until it hears a frame, so that the link stays up for any
    /// round trip below the bound, as it would if the initiator probed at once.
    pub(crate) fn start(&mut self, now: Instant) {
        self.heard(now);
        self.started = true;
        let first = now.checked_add(self.interval);
        if self.target {
            self.first_due = first;
        } else {
            self.next_probe = first.map(|t| self.align(t, now, self.interval));
        }
    }

    /// Initiator: work is in flight now. The link is active until `interval × miss_limit`
    /// after the last call; an idle link turns active at once and returns the probe to send
    /// now (once started), its silence counted from `now`.
    pub(crate) fn work(&mut self, now: Instant) -> Option<Message> {
        if self.target || self.idle.is_none() {
            return None;
        }
        self.hold_until = self
            .interval
            .checked_mul(self.miss_limit)
            .and_then(|d| now.checked_add(d));
        if self.active {
            return None;
        }
        self.active = true;
        self.period = self.interval;
        self.armed = self.armed.max(now);
        self.started.then(|| self.probe(now))
    }

    /// Initiator: a probe to send now, out of schedule (the next one falls a period after it),
    /// once started: its answer is a barrier on the control connection.
    pub(crate) fn probe_now(&mut self, now: Instant) -> Option<Message> {
        (!self.target && self.started).then(|| self.probe(now))
    }

    /// Initiator: whether the link is active and turns idle at `now` unless work is reported.
    pub(crate) fn turns_idle(&self, now: Instant) -> bool {
        self.active && self.idle.is_some() && self.hold_until.is_some_and(|t| now >= t)
    }

    fn probe(&mut self, now: Instant) -> Message {
        self.last_probe = Some(now);
        if self.target {
            self.seq = self.seq.wrapping_add(1) | HEARTBEAT_FROM_TARGET;
            return Message::Heartbeat { seq: self.seq };
        }
        self.next_probe = now
            .checked_add(self.period)
            .map(|t| self.align(t, now, self.period));
        self.seq = self.seq.wrapping_add(1) & SEQ_MASK;
        let ms = u64::try_from(self.period.as_millis())
            .unwrap_or(u64::MAX)
            .min(HEARTBEAT_PERIOD_MAX_MS);
        Message::Heartbeat {
            seq: self.seq | ms << HEARTBEAT_PERIOD_SHIFT,
        }
    }

    /// The latest instant `grid + k × step` at or before `due` (the initiator's next probe),
    /// if it is after `sent`; `due` itself without a grid.
    fn align(&self, due: Instant, sent: Instant, step: Duration) -> Instant {
        let Some(grid) = self.grid else { return due };
        let step = step.as_nanos();
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
        // The target: after `quiet` of silence, then every period while it lasts.
        let quiet = self.period.checked_mul(QUIET_HALVES)? / 2;
        let after_silence = self.last_heard.checked_add(quiet)?;
        let after_last = self.last_probe.and_then(|p| p.checked_add(self.period));
        Some(after_last.map_or(after_silence, |t| t.max(after_silence)))
    }

    /// When the link dies if nothing is heard before (only once started).
    pub(crate) fn death(&self) -> Option<Instant> {
        if !self.started {
            return None;
        }
        let bound = self.period.checked_mul(self.miss_limit)?;
        let from = self.last_heard.max(self.armed);
        from.max(self.first_due.unwrap_or(from)).checked_add(bound)
    }

    /// The next instant [`Liveness::on_timeout`] has something to do.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        let idle_at = self
            .hold_until
            .filter(|_| self.started && self.active && self.idle.is_some());
        super::earliest(super::earliest(self.probe_due(), self.death()), idle_at)
    }

    /// Time passed: `Err(silence)` when the link is dead, else the probe due, if any (an
    /// initiator turning idle probes, to announce its idle period).
    pub(crate) fn on_timeout(&mut self, now: Instant) -> Result<Option<Message>, Duration> {
        if let Some(d) = self.death() {
            if now >= d {
                return Err(now.saturating_duration_since(self.last_heard.max(self.armed)));
            }
        }
        if let (true, Some(idle)) = (self.started && self.turns_idle(now), self.idle) {
            self.active = false;
            self.period = idle;
            return Ok(Some(self.probe(now)));
        }
        match self.probe_due() {
            Some(t) if now >= t => Ok(Some(self.probe(now))),
            _ => Ok(None),
        }
    }

    /// A heartbeat received: the answer to send, if it is the peer's probe (answers to ours
    /// are not answered again). The target takes the period its initiator announces.
    pub(crate) fn on_heartbeat(&mut self, seq: u64) -> Option<Message> {
        let from_target = seq & HEARTBEAT_FROM_TARGET != 0;
        if self.target && !from_target {
            let longest = self.idle.unwrap_or(self.interval);
            self.period = announced(seq).map_or(self.interval, |p| p.clamp(self.interval, longest));
        }
        (from_target != self.target).then_some(Message::Heartbeat { seq })
    }

    /// The error of a link silent for `silence`.
    pub(crate) fn lost(&self, peer: &str, silence: Duration) -> Error {
        Error::HeartbeatLost {
            peer: peer.to_string(),
            silent_ms: silence.as_millis() as u64,
            probes: self.miss_limit,
            interval_ms: self.period.as_millis() as u64,
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
        let mut l = Liveness::new(100 * MS, 3, None, t0, false, None);
        assert_eq!(l.poll_timeout(), None, "stopped");
        // Each probe announces its period (100 ms) above the count.
        let hb = |n: u64| Message::Heartbeat { seq: n | 100 << 32 };
        l.start(t0);
        assert_eq!(
            l.poll_timeout(),
            Some(t0 + 100 * MS),
            "nothing at the start: the first probe an interval later"
        );
        assert_eq!(l.on_timeout(t0 + 99 * MS), Ok(None));
        assert_eq!(l.on_timeout(t0 + 100 * MS), Ok(Some(hb(1))));
        assert_eq!(l.on_timeout(t0 + 150 * MS), Ok(None));
        assert_eq!(l.on_timeout(t0 + 200 * MS), Ok(Some(hb(2))));
        assert_eq!(l.death(), Some(t0 + 300 * MS));
        assert!(l
            .on_timeout(t0 + 300 * MS - Duration::from_nanos(1))
            .is_ok());
        assert_eq!(l.on_timeout(t0 + 300 * MS), Err(300 * MS));
    }

    #[test]
    fn target_probes_carry_the_bit_and_answers_are_not_answered() {
        let t0 = Instant::now();
        let mut t = Liveness::new(MS, 3, None, t0, true, None);
        let mut i = Liveness::new(MS, 1, None, t0, false, None);
        t.start(t0);
        // Its first probe comes after one and a half periods of silence.
        let Ok(Some(Message::Heartbeat { seq })) = t.on_timeout(t0 + 3 * MS / 2) else {
            panic!("no probe after the silence")
        };
        assert_eq!(seq, 1 | HEARTBEAT_FROM_TARGET);
        assert_eq!(i.on_heartbeat(seq), Some(Message::Heartbeat { seq }));
        assert_eq!(
            t.on_heartbeat(seq),
            None,
            "the target does not answer its own probe"
        );
        assert_eq!(t.on_heartbeat(7), Some(Message::Heartbeat { seq: 7 }));
        assert_eq!(i.on_heartbeat(7), None);
    }

    #[test]
    fn the_target_probes_only_after_silence() {
        let t0 = Instant::now();
        let mut t = Liveness::new(100 * MS, 5, None, t0, true, Some(t0));
        t.start(t0);
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
            let mut l = Liveness::new(100 * MS, 5, None, t0 + 50 * MS, false, Some(grid));
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
        let mut l = Liveness::new(100 * MS, 5, None, t0, false, None);
        l.start(t0 + 64 * MS);
        assert_eq!(l.poll_timeout(), Some(t0 + 164 * MS));
    }

    #[test]
    fn degenerate_settings_are_clamped() {
        let t0 = Instant::now();
        let mut l = Liveness::new(Duration::ZERO, 0, None, t0, false, None);
        l.start(t0);
        assert_eq!(l.poll_timeout(), Some(t0 + MS));
        let mut far = Liveness::new(Duration::MAX, u32::MAX, None, t0, false, None);
        far.start(t0);
        assert_eq!(far.death(), None);
    }
}
