//! Memory ownership: page runs, the model of every byte, quarantine, and the check of a
//! region against the model.

use std::collections::BTreeMap;

use crate::rng::Rng;
use crate::PAGE;

/// Free page runs of one region: start page → pages.
#[derive(Debug)]
pub(crate) struct Runs {
    pub(crate) free: BTreeMap<usize, usize>,
    pub(crate) pages: usize,
}

impl Runs {
    pub(crate) fn new(pages: usize) -> Runs {
        Runs {
            free: BTreeMap::from([(0, pages)]),
            pages,
        }
    }

    /// A free run of `n` pages: first fit from a random page on.
    pub(crate) fn alloc(&mut self, n: usize, rng: &mut Rng) -> Option<usize> {
        let pivot = rng.below(self.pages as u64) as usize;
        let (s, l) = self
            .free
            .range(pivot..)
            .chain(self.free.range(..pivot))
            .find(|(_, &l)| l >= n)
            .map(|(&s, &l)| (s, l))?;
        self.free.remove(&s);
        if l > n {
            self.free.insert(s + n, l - n);
        }
        Some(s)
    }

    pub(crate) fn release(&mut self, mut s: usize, mut n: usize) {
        if let Some((&ps, &pl)) = self.free.range(..s).next_back() {
            assert!(ps + pl <= s, "run {s}+{n} released twice");
            if ps + pl == s {
                self.free.remove(&ps);
                s = ps;
                n += pl;
            }
        }
        if let Some(&nl) = self.free.get(&(s + n)) {
            self.free.remove(&(s + n));
            n += nl;
        }
        self.free.insert(s, n);
    }
}

/// One region: what every byte must hold, and its free runs.
#[derive(Debug)]
pub(crate) struct Side {
    pub(crate) model: Vec<u8>,
    pub(crate) runs: Runs,
}

/// A destination range of an op that did not complete: each byte holds its old value (which
/// the model keeps, since the range is not reused in the round) or the op's (drawn from
/// `seed`).
#[derive(Debug)]
pub(crate) struct Quarantined {
    pub(crate) op: u64,
    pub(crate) on_target: bool,
    pub(crate) off: usize,
    pub(crate) len: usize,
    pub(crate) seed: u64,
}

#[derive(Debug)]
pub(crate) struct Model {
    pub(crate) target: Side,
    pub(crate) local: Side,
    pub(crate) quarantine: Vec<Quarantined>,
}

impl Model {
    pub(crate) fn side(&mut self, on_target: bool) -> &mut Side {
        if on_target {
            &mut self.target
        } else {
            &mut self.local
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Piece {
    /// Offsets of the descriptor's ranges in the local and the target region.
    pub(crate) loff: usize,
    pub(crate) roff: usize,
    pub(crate) len: usize,
    /// The page runs holding them.
    pub(crate) lrun: (usize, usize),
    pub(crate) rrun: (usize, usize),
}

pub(crate) fn pages_for(bytes: usize) -> usize {
    bytes.div_ceil(PAGE)
}

/// A run for each side; the range starts 0–63 bytes into its run and is followed by at least
/// one guard byte, so a neighbour's stray byte cannot hide in another op's range.
pub(crate) fn alloc_piece(m: &mut Model, len: usize, rng: &mut Rng) -> Option<Piece> {
    let pad = |rng: &mut Rng| {
        if rng.chance(25) {
            0
        } else {
            rng.range(1, 63) as usize
        }
    };
    let (lpad, rpad) = (pad(rng), pad(rng));
    let (lp, rp) = (pages_for(lpad + len + 1), pages_for(rpad + len + 1));
    let l = m.local.runs.alloc(lp, rng)?;
    let Some(r) = m.target.runs.alloc(rp, rng) else {
        m.local.runs.release(l, lp);
        return None;
    };
    Some(Piece {
        loff: l * PAGE + lpad,
        roff: r * PAGE + rpad,
        len,
        lrun: (l, lp),
        rrun: (r, rp),
    })
}

pub(crate) fn release(m: &mut Model, p: &Piece) {
    m.local.runs.release(p.lrun.0, p.lrun.1);
    m.target.runs.release(p.rrun.0, p.rrun.1);
}
