//! What a slot of target memory holds, byte range by byte range.

/// The state of a byte range of target memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum St {
    /// Written by this generation, verifiably.
    Known(u64),
    /// Nothing verifiable (never written, or written by an op whose fate is unknown).
    Unknown,
    /// An op that failed, timed out or was dropped may still write here, until the engine has
    /// nothing in flight.
    Tainted,
}

/// Sorted, non-overlapping `(start, end, state)` ranges covering a slot.
#[derive(Clone, Debug)]
pub(super) struct Segs(Vec<(u64, u64, St)>);

impl Segs {
    pub(super) fn new(len: u64) -> Segs {
        Segs(vec![(0, len, St::Unknown)])
    }

    fn push(out: &mut Vec<(u64, u64, St)>, s: (u64, u64, St)) {
        if s.0 >= s.1 {
            return;
        }
        if let Some(last) = out.last_mut() {
            if last.1 == s.0 && last.2 == s.2 {
                last.1 = s.1;
                return;
            }
        }
        out.push(s);
    }

    /// Applies `f` to the state of every byte in `start..end`.
    pub(super) fn update(&mut self, start: u64, end: u64, f: impl Fn(St) -> St) {
        if start >= end {
            return;
        }
        let mut out = Vec::with_capacity(self.0.len() + 2);
        for &(a, b, st) in &self.0 {
            if b <= start || a >= end {
                Self::push(&mut out, (a, b, st));
                continue;
            }
            Self::push(&mut out, (a, start.max(a), st));
            Self::push(&mut out, (a.max(start), b.min(end), f(st)));
            Self::push(&mut out, (end.min(b), b, st));
        }
        self.0 = out;
    }

    /// A completed write of generation `gen`: tainted bytes stay tainted.
    pub(super) fn written(&mut self, start: u64, end: u64, gen: u64) {
        self.update(start, end, |s| match s {
            St::Tainted => St::Tainted,
            _ => St::Known(gen),
        });
    }

    pub(super) fn taint(&mut self, start: u64, end: u64) {
        self.update(start, end, |_| St::Tainted);
    }

    /// The end of a cycle: nothing is in flight any more; tainted bytes are just unknown.
    pub(super) fn settle(&mut self) {
        if let Some(end) = self.0.last().map(|s| s.1) {
            self.update(0, end, |s| match s {
                St::Tainted => St::Unknown,
                s => s,
            });
        }
    }

    /// The ranges whose content is known: `(start, end, generation)`.
    pub(super) fn known(&self) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        self.0.iter().filter_map(|&(a, b, st)| match st {
            St::Known(g) => Some((a, b, g)),
            _ => None,
        })
    }

    pub(super) fn tainted(&self) -> bool {
        self.0.iter().any(|s| s.2 == St::Tainted)
    }

    /// The ranges overlapping `start..end`, clipped to it.
    pub(super) fn query(&self, start: u64, end: u64) -> impl Iterator<Item = (u64, u64, St)> + '_ {
        self.0
            .iter()
            .filter(move |s| s.1 > start && s.0 < end)
            .map(move |&(a, b, st)| (a.max(start), b.min(end), st))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::soak::pattern::Rng;

    #[test]
    fn segments_match_a_byte_model() {
        const LEN: u64 = 300;
        let mut rng = Rng::new(42);
        for _ in 0..200 {
            let mut s = Segs::new(LEN);
            let mut model = vec![St::Unknown; LEN as usize];
            for _ in 0..60 {
                let a = rng.below(LEN);
                let b = a + rng.below(LEN - a + 1);
                match rng.below(3) {
                    0 => {
                        let g = 1 + rng.below(4);
                        s.written(a, b, g);
                        for m in &mut model[a as usize..b as usize] {
                            if *m != St::Tainted {
                                *m = St::Known(g);
                            }
                        }
                    }
                    1 => {
                        s.taint(a, b);
                        model[a as usize..b as usize].fill(St::Tainted);
                    }
                    _ => {
                        s.settle();
                        for m in &mut model {
                            if *m == St::Tainted {
                                *m = St::Unknown;
                            }
                        }
                    }
                }
                // Covering, sorted, merged.
                assert_eq!(s.0.first().map(|x| x.0), Some(0));
                assert_eq!(s.0.last().map(|x| x.1), Some(LEN));
                for w in s.0.windows(2) {
                    assert_eq!(w[0].1, w[1].0);
                    assert_ne!(w[0].2, w[1].2);
                }
                let q0 = rng.below(LEN);
                let q1 = q0 + rng.below(LEN - q0 + 1);
                let mut covered = q0;
                for (x, y, st) in s.query(q0, q1) {
                    assert_eq!(x, covered);
                    assert!(model[x as usize..y as usize].iter().all(|m| *m == st));
                    covered = y;
                }
                assert_eq!(covered, q1.max(q0));
            }
        }
    }
}
