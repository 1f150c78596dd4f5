//! Checks of both regions' final images, and of the figures and failures of a phase.

use std::collections::BTreeMap;
use std::time::Duration;

use hixl::{Error, Region};
use hixl_cli::child::Target;

use crate::patterns::pattern;
use crate::role::dump;
use crate::workload::{Fate, Layout, Op, Phase};
use crate::{LOCAL_BG, MARGIN, REMOTE_BG};

/// Checks one half-region image (indexed by the target's offsets): every byte in a slot's
/// ranges is one of `cands(slot)`'s patterns, and every other byte (guards, unused slots) is
/// `background`'s. `big` is an extra range with its own candidates.
pub(crate) fn check_image(
    what: &str,
    img: &[u8],
    lay: &Layout,
    background: u64,
    cands: &dyn Fn(u64) -> Vec<u64>,
    big: &[u64],
) {
    let bg = pattern(background, 0, img.len());
    let mut ranges: Vec<(u64, u64, Vec<u64>)> = Vec::new();
    for s in 0..lay.slots {
        let c = cands(s);
        for o in lay.ranges(s) {
            ranges.push((o, lay.dlen, c.clone()));
        }
    }
    if lay.big > 0 {
        ranges.push((lay.big_off(), lay.big, big.to_vec()));
    }
    let mut pos = 0u64;
    for (off, len, c) in ranges {
        let (g, e) = (pos as usize, off as usize);
        if let Some(i) = (g..e).find(|&i| img[i] != bg[i]) {
            panic!(
                "{what}: guard byte at offset {i} (before the range at {off}) is {:#04x}, its background is {:#04x}: a transfer wrote outside its range",
                img[i], bg[i]
            );
        }
        let pats: Vec<Vec<u8>> = c.iter().map(|&s| pattern(s, off, len as usize)).collect();
        let r = &img[off as usize..(off + len) as usize];
        if pats.len() == 1 {
            if r != &pats[0][..] {
                let i = (0..r.len()).find(|&i| r[i] != pats[0][i]).unwrap_or(0);
                panic!(
                    "{what}: byte at offset {} of the range at {off} is {:#04x}, expected {:#04x}",
                    off + i as u64,
                    r[i],
                    pats[0][i]
                );
            }
        } else if let Some(i) = (0..r.len()).find(|&i| !pats.iter().any(|p| p[i] == r[i])) {
            panic!(
                "{what}: byte at offset {} of a failed transfer's range at {off} is {:#04x}, neither its old nor its new pattern",
                off + i as u64,
                r[i]
            );
        }
        pos = off + len;
    }
    if let Some(i) = (pos as usize..img.len()).find(|&i| img[i] != bg[i]) {
        panic!("{what}: guard byte at offset {i} past the last range was changed");
    }
}

/// The checker itself (no namespaces needed): it must catch a changed guard byte, a wrong
/// byte in a completed range, and a byte in a failed range that is neither old nor new, and
/// accept a failed range holding a mix of both.
pub(crate) fn the_checker_catches_stray_and_wrong_bytes() {
    let lay = Layout {
        descs: 2,
        dlen: 1001,
        gap: 13,
        slots: 3,
        big: 0,
    };
    let mut img = pattern(REMOTE_BG, 0, lay.mem() as usize);
    let [done, failed] = [lay.ranges(0)[1], lay.ranges(1)[0]];
    img[done as usize..(done + lay.dlen) as usize].copy_from_slice(&pattern(
        7,
        done,
        lay.dlen as usize,
    ));
    let half = (failed + lay.dlen / 2) as usize;
    img[failed as usize..half].copy_from_slice(&pattern(8, failed, half - failed as usize));
    let cands = |s: u64| match s {
        0 => vec![7],
        1 => vec![REMOTE_BG, 8],
        _ => vec![REMOTE_BG],
    };
    let check = |img: &[u8]| {
        std::panic::catch_unwind(|| check_image("t", img, &lay, REMOTE_BG, &cands, &[])).is_ok()
    };
    // Slot 0's first range never moved: the checker must expect the new pattern there.
    let first = lay.ranges(0)[0] as usize;
    img[first..first + lay.dlen as usize].copy_from_slice(&pattern(
        7,
        first as u64,
        lay.dlen as usize,
    ));
    assert!(check(&img), "a consistent image was refused");
    for at in [
        done as usize - 1,             // guard before a completed range
        (done + lay.dlen) as usize,    // guard after it
        done as usize + 500,           // inside it
        failed as usize + 3,           // inside a failed range
        lay.mem() as usize - 1,        // the tail
        lay.ranges(2)[1] as usize + 7, // an untouched slot
    ] {
        let mut bad = img.clone();
        bad[at] ^= 0x5A;
        assert!(!check(&bad), "a changed byte at {at} went unnoticed");
    }
}
pub(crate) fn fate_of(fates: &BTreeMap<u64, Fate>, s: u64) -> Fate {
    fates.get(&s).cloned().unwrap_or_else(Fate::new)
}

/// Checks the target's region (dumped by the target itself).
pub(crate) fn check_target(
    target: &mut Target,
    lay: &Layout,
    fates: &BTreeMap<u64, Fate>,
    big: &[u64],
) {
    let img = dump(target, lay.mem());
    check_image(
        "target region",
        &img,
        lay,
        REMOTE_BG,
        &|s| fate_of(fates, s).remote,
        big,
    );
}

/// Checks both halves of the initiator's region; `big` is what the big range's source holds.
pub(crate) fn check_local(local: &Region, lay: &Layout, fates: &BTreeMap<u64, Fate>, big: &[u64]) {
    let mem = lay.mem() as usize;
    let mut img = vec![0u8; 2 * mem];
    local.read_at(0, &mut img).unwrap();
    check_image(
        "initiator write sources",
        &img[..mem],
        lay,
        LOCAL_BG,
        &|s| fate_of(fates, s).src,
        big,
    );
    check_image(
        "initiator read-back buffers",
        &img[mem..],
        lay,
        LOCAL_BG,
        &|s| fate_of(fates, s).dst,
        &[LOCAL_BG],
    );
}
/// Figures of a phase, for the summary line and the assertions.
pub(crate) struct Stats {
    pub(crate) ok: usize,
    pub(crate) failed: usize,
    pub(crate) timeouts: usize,
    pub(crate) lost: usize,
    pub(crate) slowest_failure: Duration,
    pub(crate) bytes_ok: u64,
}

pub(crate) fn stats(p: &Phase) -> Stats {
    let failed: Vec<&Op> = p.ops.iter().filter(|o| o.err.is_some()).collect();
    Stats {
        ok: p.ops.len() - failed.len(),
        failed: failed.len(),
        timeouts: failed
            .iter()
            .filter(|o| matches!(o.err, Some(Error::Timeout { .. })))
            .count(),
        lost: failed
            .iter()
            .filter(|o| o.err.as_ref().is_some_and(Error::is_link_lost))
            .count(),
        slowest_failure: failed.iter().map(|o| o.took).max().unwrap_or_default(),
        bytes_ok: p
            .ops
            .iter()
            .filter(|o| o.err.is_none())
            .map(|o| o.bytes)
            .sum(),
    }
}

/// The property common to every fault: each failure came back within its timeout plus the
/// margin, with a sensible error naming the peer; successes were verified by the workers.
pub(crate) fn assert_failures_sensible(p: &Phase, timeout: Duration, peer: &str) {
    for o in p.ops.iter().filter(|o| o.err.is_some()) {
        let e = o.err.as_ref().unwrap();
        assert!(
            o.took <= timeout + MARGIN,
            "a {} failed only after {:?} (timeout {timeout:?}): {e}",
            if o.write { "write" } else { "read" },
            o.took
        );
        assert!(
            e.is_link_lost() || matches!(e, Error::Timeout { .. } | Error::NotConnected { .. }),
            "unexpected error kind: {e:?}"
        );
        assert!(
            e.to_string().contains(peer),
            "error does not name the peer: {e}"
        );
    }
}
