//! Checks of the target's state after an input: its memory and its session.

use crate::setup::Ctx;
use crate::{GUARD, W_LEN, W_OFF};

/// `w`'s bytes, and whether every guard byte around it is intact.
pub(crate) fn snapshot_w(ctx: &Ctx) -> (Vec<u8>, Option<usize>) {
    let all = ctx.wbuf.as_slice();
    let bad = all[..W_OFF]
        .iter()
        .chain(&all[W_OFF + W_LEN..])
        .position(|&b| b != GUARD);
    (all[W_OFF..W_OFF + W_LEN].to_vec(), bad)
}

pub(crate) fn check_memory(ctx: &Ctx, want_w: Option<&[u8]>, what: &str) {
    let (w, bad) = snapshot_w(ctx);
    if let Some(at) = bad {
        let off = if at < W_OFF { at } else { at + W_LEN };
        panic!(
            "invariant violated: guard byte at offset {off} of w's buffer (w is {W_OFF}..{}) was overwritten ({what})",
            W_OFF + W_LEN
        );
    }
    if let Some(want) = want_w {
        if w != want {
            let at = w.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
            panic!(
                "invariant violated: w differs from the model's bytes from offset {at} ({what})"
            );
        }
    }
    let mut r = vec![0u8; 4096];
    ctx.rbuf
        .read_at(0, &mut r)
        .expect("harness setup: reading r");
    assert!(
        r == ctx.r_bytes,
        "invariant violated: the read-only region r was written ({what})"
    );
    let mut l = vec![0u8; 4096];
    ctx.lbuf
        .read_at(0, &mut l)
        .expect("harness setup: reading l");
    assert!(
        l == ctx.l_bytes,
        "invariant violated: the local-only region l was written ({what})"
    );
    assert!(
        ctx.dbuf.as_slice() == &ctx.d_bytes[..],
        "invariant violated: the deregistered region d was written ({what})"
    );
}

/// Fails if the engine closed the session's control connection; discards what it sent.
pub(crate) fn check_session(ctx: &Ctx) {
    let mut buf = [0u8; 4096];
    loop {
        match ctx.session.stream.try_read(&mut buf) {
            Ok(0) => panic!(
                "invariant violated: the engine closed the session's control connection after a data-connection input"
            ),
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(e) => panic!("invariant violated: the session's control connection failed: {e}"),
        }
    }
}
