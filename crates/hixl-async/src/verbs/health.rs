//! A rail's health: up, or paused with the cause and the time it may be probed back; the
//! cooldown doubles with each pause that follows a short stretch up, and starts over once the
//! rail has stayed up for a while. Pure: the caller passes the time.

use std::time::{Duration, Instant};

/// First cooldown of a paused rail.
pub(crate) const FIRST_COOLDOWN: Duration = Duration::from_millis(500);
/// Longest cooldown.
pub(crate) const MAX_COOLDOWN: Duration = Duration::from_secs(30);
/// A rail up this long after its last pause starts over at [`FIRST_COOLDOWN`].
const STABLE: Duration = Duration::from_secs(60);

/// Where a rail is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum RailState {
    /// Takes slices.
    Up,
    /// Takes nothing until `until`, then is probed (its port checked, its queue pairs
    /// connected again).
    Paused { until: Instant, cause: String },
    /// Being probed back: its new queue pairs are being connected.
    Probing { cause: String },
}

/// A rail's state and its pause history.
#[derive(Debug)]
pub(crate) struct Health {
    state: RailState,
    cooldown: Duration,
    /// When it last came up.
    up_since: Option<Instant>,
    pauses: u64,
}

impl Health {
    pub(crate) fn up(now: Instant) -> Health {
        Health {
            state: RailState::Up,
            cooldown: FIRST_COOLDOWN,
            up_since: Some(now),
            pauses: 0,
        }
    }

    /// A rail that could not be connected at all yet: paused from the start.
    pub(crate) fn paused(now: Instant, cause: String) -> Health {
        let mut h = Health::up(now);
        h.pause(now, cause);
        h
    }

    pub(crate) fn is_up(&self) -> bool {
        self.state == RailState::Up
    }

    pub(crate) fn pauses(&self) -> u64 {
        self.pauses
    }

    /// Pauses the rail for its cooldown (the cooldown then doubles, up to [`MAX_COOLDOWN`]).
    /// Returns false, changing nothing, when it was not up (already paused or probing, with
    /// the first cause kept), except that a failed probe pauses it again.
    pub(crate) fn pause(&mut self, now: Instant, cause: String) -> bool {
        match &self.state {
            RailState::Paused { .. } => return false,
            RailState::Up => {
                if self
                    .up_since
                    .is_some_and(|t| now.saturating_duration_since(t) >= STABLE)
                {
                    self.cooldown = FIRST_COOLDOWN;
                }
            }
            RailState::Probing { .. } => {}
        }
        self.pauses += 1;
        self.state = RailState::Paused {
            until: now + self.cooldown,
            cause,
        };
        self.cooldown = (self.cooldown * 2).min(MAX_COOLDOWN);
        self.up_since = None;
        true
    }

    /// When a paused rail may be probed.
    pub(crate) fn due(&self) -> Option<Instant> {
        match &self.state {
            RailState::Paused { until, .. } => Some(*until),
            _ => None,
        }
    }

    /// A probe starts if the rail is paused and its time has come.
    pub(crate) fn start_probe(&mut self, now: Instant) -> bool {
        match &self.state {
            RailState::Paused { until, cause } if *until <= now => {
                self.state = RailState::Probing {
                    cause: cause.clone(),
                };
                true
            }
            _ => false,
        }
    }

    /// The probe connected the rail again.
    pub(crate) fn resume(&mut self, now: Instant) {
        self.state = RailState::Up;
        self.up_since = Some(now);
    }

    /// What happened to the rail, for an error or `hixl info --peer`.
    pub(crate) fn describe(&self, now: Instant) -> String {
        match &self.state {
            RailState::Up => "up".to_owned(),
            RailState::Paused { until, cause } => format!(
                "paused ({cause}); probed again in {} ms",
                until.saturating_duration_since(now).as_millis()
            ),
            RailState::Probing { cause } => format!("being probed back (paused: {cause})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cooldown_doubles_on_repeat_and_starts_over_after_a_stable_stretch() {
        let t0 = Instant::now();
        let mut h = Health::up(t0);
        assert!(h.pause(t0, "port down".into()));
        assert_eq!(h.due(), Some(t0 + FIRST_COOLDOWN));
        assert!(!h.pause(t0, "again".into()), "already paused");
        assert!(h.describe(t0).contains("port down"));
        assert!(!h.start_probe(t0), "not yet");
        let t1 = t0 + FIRST_COOLDOWN;
        assert!(h.start_probe(t1));
        // The probe fails: paused again, twice as long.
        assert!(h.pause(t1, "still down".into()));
        assert_eq!(h.due(), Some(t1 + 2 * FIRST_COOLDOWN));
        let t2 = t1 + 2 * FIRST_COOLDOWN;
        assert!(h.start_probe(t2));
        h.resume(t2);
        assert!(h.is_up());
        // A pause soon after coming up keeps growing the cooldown...
        assert!(h.pause(t2, "flap".into()));
        assert_eq!(h.due(), Some(t2 + 4 * FIRST_COOLDOWN));
        // ...one after a stable stretch starts over.
        let t3 = t2 + Duration::from_secs(10);
        assert!(h.start_probe(t3));
        h.resume(t3);
        let t4 = t3 + STABLE;
        assert!(h.pause(t4, "cut".into()));
        assert_eq!(h.due(), Some(t4 + FIRST_COOLDOWN));
        assert_eq!(h.pauses(), 4);
    }

    #[test]
    fn the_cooldown_is_bounded() {
        let mut t = Instant::now();
        let mut h = Health::paused(t, "never connected".into());
        for _ in 0..20 {
            t = h.due().expect("paused");
            assert!(h.start_probe(t));
            assert!(h.pause(t, "no".into()));
        }
        assert_eq!(h.due(), Some(t + MAX_COOLDOWN));
    }
}
