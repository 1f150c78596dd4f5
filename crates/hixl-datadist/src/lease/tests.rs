//! The lease table's rules, frame by frame and tick by tick.

use super::*;

const TTL: Duration = Duration::from_millis(100);

fn table(now: Instant) -> (LeaseTable, LeaseGrant) {
    let mut t = LeaseTable::default();
    let g = t
        .create(1, 42, &[7, 8], &[3, 4, 5], TTL, 0xabc, now)
        .unwrap();
    (t, g)
}

fn acquire(g: &LeaseGrant, ticket: u64, window_ms: u32) -> Option<Frame> {
    shared(g, ticket, window_ms, 1)
}

/// An acquire declaring `readers` reader links.
fn shared(g: &LeaseGrant, ticket: u64, window_ms: u32, readers: u32) -> Option<Frame> {
    Some(Frame::Acquire {
        lease: g.lease_id,
        gen: g.generation,
        ticket,
        window_ms,
        digest: g.digest(),
        readers,
    })
}

fn release(g: &LeaseGrant, ticket: u64, done: bool) -> Option<Frame> {
    Some(Frame::Release {
        lease: g.lease_id,
        gen: g.generation,
        ticket,
        done,
    })
}

#[test]
fn done_ends_the_lease_after_the_pull() {
    let t0 = Instant::now();
    let (mut t, g) = table(t0);
    let (r, ended) = t.on_frame(acquire(&g, 1, 1000), 77, t0);
    assert_eq!(r, Ok(()));
    assert!(ended.is_empty());
    let (r, ended) = t.on_frame(release(&g, 1, true), 77, t0);
    assert_eq!(r, Ok(()));
    assert_eq!(ended.len(), 1);
    assert_eq!(ended[0].why, LeaseEnd::Done);
    assert_eq!(ended[0].blocks, vec![3, 4, 5]);
    assert_eq!(ended[0].caches, vec![7, 8]);
    assert!(t.is_empty());
    // the grant is dead for good
    let (r, _) = t.on_frame(acquire(&g, 2, 1000), 77, t0);
    assert_eq!(r, Err(Refusal::NotLive));
}

#[test]
fn expiry_waits_for_a_held_ticket_and_progress_extends() {
    let t0 = Instant::now();
    let (mut t, g) = table(t0);
    assert_eq!(t.next_deadline(), Some(t0 + TTL));
    // progress at 90 ms moves the deadline to 190 ms
    t.on_frame(acquire(&g, 1, 500), 77, t0 + Duration::from_millis(90))
        .0
        .unwrap();
    assert!(t.tick(t0 + Duration::from_millis(300), |_| true).is_empty());
    // the ticket's window (590 ms) passes: the lease, past its TTL, expires
    let ended = t.tick(t0 + Duration::from_millis(600), |_| true);
    assert_eq!(ended.len(), 1);
    assert_eq!(ended[0].why, LeaseEnd::Expired);
    // a lost done: no progress → expiry
    let (mut t, g) = table(t0);
    t.on_frame(acquire(&g, 1, 50), 77, t0).0.unwrap();
    t.on_frame(release(&g, 1, false), 77, t0 + Duration::from_millis(20))
        .0
        .unwrap();
    assert!(t.tick(t0 + Duration::from_millis(119), |_| true).is_empty());
    let ended = t.tick(t0 + Duration::from_millis(120), |_| true);
    assert_eq!(ended[0].why, LeaseEnd::Expired);
}

#[test]
fn a_ticket_past_its_window_is_held_for_the_grace_while_its_link_lives() {
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let mut t = LeaseTable::with_grace(ms(400));
    assert_eq!(t.grace(), ms(400));
    let g = t.create(1, 42, &[7], &[3], TTL, 0xabc, t0).unwrap();
    t.on_frame(acquire(&g, 1, 50), 77, t0).0.unwrap();
    // Revoked mid-pull: the end waits for the ticket, past its window (the puller may
    // still be quiescing what it had in flight at its deadline)...
    assert!(t.revoke(g.lease_id));
    assert!(t.tick(t0 + ms(200), |_| true).is_empty());
    // ...until the puller releases it, which ends the lease at once,
    let (r, ended) = t.on_frame(release(&g, 1, false), 77, t0 + ms(300));
    assert_eq!(r, Ok(()));
    assert_eq!(ended.len(), 1);
    assert_eq!(ended[0].why, LeaseEnd::Revoked);
    // or its link dies (at once),
    let g = t.create(1, 43, &[7], &[3], TTL, 0xabc, t0).unwrap();
    t.on_frame(acquire(&g, 1, 50), 77, t0).0.unwrap();
    assert!(t.revoke(g.lease_id));
    assert_eq!(t.tick(t0 + ms(60), |l| l != 77).len(), 1);
    // or window + grace passes (a puller that hangs).
    let g = t.create(1, 44, &[7], &[3], TTL, 0xabc, t0).unwrap();
    t.on_frame(acquire(&g, 1, 50), 77, t0).0.unwrap();
    assert!(t.revoke(g.lease_id));
    assert!(t.tick(t0 + ms(449), |_| true).is_empty());
    assert_eq!(t.tick(t0 + ms(450), |_| true).len(), 1);
}

#[test]
fn a_dead_link_ends_the_lease_at_once_even_mid_pull() {
    let t0 = Instant::now();
    let (mut t, g) = table(t0);
    t.on_frame(acquire(&g, 1, 60_000), 77, t0).0.unwrap();
    assert!(t.any_bound());
    assert!(t.tick(t0, |_| true).is_empty());
    let ended = t.tick(t0, |l| l != 77);
    assert_eq!(ended[0].why, LeaseEnd::LinkDown);
}

#[test]
fn other_links_ending_leases_and_stale_generations_are_refused() {
    let t0 = Instant::now();
    let (mut t, g) = table(t0);
    t.on_frame(acquire(&g, 1, 1000), 77, t0).0.unwrap();
    assert_eq!(
        t.on_frame(acquire(&g, 2, 1000), 78, t0).0,
        Err(Refusal::OtherLink)
    );
    let stale = LeaseGrant {
        generation: g.generation + 1,
        ..g.clone()
    };
    assert_eq!(
        t.on_frame(acquire(&stale, 2, 1000), 77, t0).0,
        Err(Refusal::NotLive)
    );
    assert_eq!(t.on_frame(None, 77, t0).0, Err(Refusal::Malformed));
    let mut forged = g.clone();
    forged.blocks.push(63);
    assert_eq!(
        t.on_frame(acquire(&forged, 2, 1000), 77, t0).0,
        Err(Refusal::Mismatch)
    );
    // revoked while a pull holds a ticket: no new pull, ends when the ticket is back
    assert!(t.revoke(g.lease_id));
    assert!(!t.revoke(999));
    assert!(t.tick(t0, |_| true).is_empty());
    assert_eq!(
        t.on_frame(acquire(&g, 3, 1000), 77, t0).0,
        Err(Refusal::Ending)
    );
    let (_, ended) = t.on_frame(release(&g, 1, false), 77, t0);
    assert_eq!(ended[0].why, LeaseEnd::Revoked);
}

#[test]
fn held_blocks_cannot_be_leased_again_until_the_end() {
    let t0 = Instant::now();
    let (mut t, g) = table(t0);
    let e = t.create(1, 43, &[8], &[9, 5], TTL, 1, t0).unwrap_err();
    assert_eq!(e.status, LlmStatus::LeaseHeld);
    assert!(e.message.contains("block 5 of cache 8"), "{e}");
    assert!(e.message.contains("request 42"), "{e}");
    assert_eq!(t.holder(7, &[1, 4]), Some((4, 42)));
    assert_eq!(t.holds_cache(8), Some(42));
    assert!(
        t.create(1, 43, &[9], &[5], TTL, 1, t0).is_ok(),
        "other cache"
    );
    for bad in [
        t.create(1, 44, &[7], &[], TTL, 1, t0),
        t.create(1, 44, &[], &[1], TTL, 1, t0),
        t.create(1, 44, &[7], &[1], Duration::ZERO, 1, t0),
        t.create(1, 44, &[7], &[1, 1], TTL, 1, t0),
        t.create(1, 44, &[6, 6], &[1], TTL, 1, t0),
    ] {
        assert_eq!(bad.unwrap_err().status, LlmStatus::ParamInvalid);
    }
    t.on_frame(release(&g, 0, true), 77, t0).0.unwrap();
    assert!(t.holder(7, &[3, 4, 5]).is_none());
    let again = t.create(1, 45, &[7], &[3, 4, 5], TTL, 2, t0).unwrap();
    assert!(again.lease_id > g.lease_id, "lease ids are never reused");
}

#[test]
fn a_minted_grant_is_refused_until_the_owner_creates_it() {
    let t0 = Instant::now();
    let mut t = LeaseTable::default();
    let minted = LeaseGrant {
        owner: 1,
        lease_id: 1000,
        generation: 0x5eed,
        request_id: 42,
        caches: vec![7],
        blocks: vec![2, 3],
        ttl_ms: TTL.as_millis() as u64,
    };
    assert_eq!(
        t.on_frame(acquire(&minted, 1, 1000), 77, t0).0,
        Err(Refusal::NotLive)
    );
    let g = t
        .create_as(1, 42, &[7], &[2, 3], TTL, Some(1000), 0x5eed, t0)
        .unwrap();
    assert_eq!(g, minted);
    t.on_frame(acquire(&minted, 1, 1000), 77, t0).0.unwrap();
    for (id, gen) in [(1000, 9), (0, 9), (1001, 0)] {
        let e = t
            .create_as(1, 43, &[8], &[1], TTL, Some(id), gen, t0)
            .unwrap_err();
        assert_eq!(e.status, LlmStatus::ParamInvalid, "{e}");
    }
    // The automatic ids step over a minted one that is live.
    t.next_id = 999;
    let auto = t.create(1, 44, &[9], &[1], TTL, 3, t0).unwrap();
    assert_eq!(auto.lease_id, 1001);
}

#[test]
fn a_ttl_that_does_not_fit_is_refused_by_name_and_the_table_keeps_working() {
    let t0 = Instant::now();
    let mut t = LeaseTable::default();
    for ttl in [
        Duration::MAX,
        Duration::from_millis(u64::MAX),
        MAX_TTL + Duration::from_nanos(1),
    ] {
        let e = t.create(1, 42, &[7], &[1, 2], ttl, 1, t0).unwrap_err();
        assert_eq!(e.status, LlmStatus::ParamInvalid, "{e}");
        assert!(e.message.contains("lease TTL of request 42"), "{e}");
        assert!(
            e.message.contains(&format!("{} ms", ttl.as_millis())),
            "{e}"
        );
        assert!(
            t.is_empty() && t.holder(7, &[1, 2]).is_none(),
            "nothing left behind"
        );
    }
    // The longest TTL is taken, and the same blocks can be leased once it is refused.
    let g = t.create(1, 42, &[7], &[1, 2], MAX_TTL, 1, t0).unwrap();
    assert_eq!(g.ttl_ms, MAX_TTL.as_millis() as u64);
    assert!(t
        .tick(t0 + MAX_TTL - Duration::from_millis(1), |_| true)
        .is_empty());
    // Progress extends it without overflow, and the ticket window is capped.
    t.on_frame(acquire(&g, 1, u32::MAX), 77, t0).0.unwrap();
    t.on_frame(release(&g, 1, false), 77, t0 + MAX_WINDOW)
        .0
        .unwrap();
    let ended = t.tick(t0 + MAX_WINDOW + MAX_TTL, |_| true);
    assert_eq!(ended.len(), 1);
    assert_eq!(ended[0].why, LeaseEnd::Expired);
}

/// Two reader links: each binds, a third is refused; one link's done (counted once, however
/// often it says it) leaves the lease live; the other's ends it once no ticket is out.
#[test]
fn a_shared_lease_ends_done_when_every_reader_is_done() {
    let t0 = Instant::now();
    let (mut t, g) = table(t0);
    assert_eq!(t.on_frame(shared(&g, 1, 1000, 2), 77, t0).0, Ok(()));
    assert_eq!(t.on_frame(shared(&g, 2, 1000, 2), 78, t0).0, Ok(()));
    assert_eq!(
        t.on_frame(shared(&g, 3, 1000, 2), 79, t0).0,
        Err(Refusal::OtherLink)
    );
    assert_eq!(
        t.on_frame(release(&g, 3, false), 79, t0).0,
        Err(Refusal::OtherLink),
        "a release from a link past the readers"
    );
    // Renew and release from either bound link.
    let renew = Some(Frame::Renew {
        lease: g.lease_id,
        gen: g.generation,
    });
    assert_eq!(t.on_frame(renew, 78, t0).0, Ok(()));
    for _ in 0..2 {
        let (r, ended) = t.on_frame(release(&g, 1, true), 77, t0);
        assert_eq!(r, Ok(()));
        assert!(
            ended.is_empty(),
            "one reader's done, even twice, ends nothing"
        );
    }
    assert_eq!(t.len(), 1);
    assert_eq!(
        t.on_frame(shared(&g, 4, 1000, 2), 77, t0).0,
        Err(Refusal::Ending),
        "a reader that was done takes no new pull"
    );
    // The other reader's done while its ticket 2 is out of another pull: ends with it.
    assert_eq!(t.on_frame(shared(&g, 5, 1000, 2), 78, t0).0, Ok(()));
    let (r, ended) = t.on_frame(release(&g, 5, true), 78, t0);
    assert_eq!(r, Ok(()));
    assert!(ended.is_empty(), "ticket 2 is still out");
    let (_, ended) = t.on_frame(release(&g, 2, false), 78, t0);
    assert_eq!(ended.len(), 1);
    assert_eq!(ended[0].why, LeaseEnd::Done);
    assert!(t.is_empty());
}

/// The first acquire fixes the reader count: another count is refused, from a new link or a
/// bound one, before it binds anything.
#[test]
fn every_acquire_of_a_lease_declares_the_same_readers() {
    let t0 = Instant::now();
    let (mut t, g) = table(t0);
    t.on_frame(shared(&g, 1, 1000, 3), 77, t0).0.unwrap();
    for (link, readers) in [(78, 2), (78, 1), (77, 4)] {
        assert_eq!(
            t.on_frame(shared(&g, 2, 1000, readers), link, t0).0,
            Err(Refusal::ReaderCount),
            "{readers} readers from link {link}"
        );
    }
    for link in [78, 79] {
        t.on_frame(shared(&g, 2, 1000, 3), link, t0).0.unwrap();
    }
    assert_eq!(
        t.on_frame(shared(&g, 2, 1000, 3), 80, t0).0,
        Err(Refusal::OtherLink)
    );
    // A lease first acquired alone stays a lease of one link.
    let (mut t, g) = table(t0);
    t.on_frame(acquire(&g, 1, 1000), 77, t0).0.unwrap();
    assert_eq!(
        t.on_frame(shared(&g, 2, 1000, 2), 78, t0).0,
        Err(Refusal::ReaderCount)
    );
    assert_eq!(
        t.on_frame(acquire(&g, 2, 1000), 78, t0).0,
        Err(Refusal::OtherLink)
    );
}

/// A reader link that dies before its done ends the lease (its tickets void, the other
/// reader's pull in flight finishes first); one that dies after its done ends nothing.
#[test]
fn a_shared_lease_ends_when_a_reader_dies_before_it_is_done() {
    let t0 = Instant::now();
    let (mut t, g) = table(t0);
    t.on_frame(shared(&g, 1, 60_000, 2), 77, t0).0.unwrap();
    t.on_frame(shared(&g, 2, 60_000, 2), 78, t0).0.unwrap();
    let ended = t.tick(t0, |l| l != 77);
    assert!(ended.is_empty(), "78's ticket is still out");
    assert_eq!(
        t.on_frame(shared(&g, 3, 1000, 2), 78, t0).0,
        Err(Refusal::Ending)
    );
    let (_, ended) = t.on_frame(release(&g, 2, false), 78, t0);
    assert_eq!(ended[0].why, LeaseEnd::LinkDown);

    let (mut t, g) = table(t0);
    t.on_frame(shared(&g, 1, 60_000, 2), 77, t0).0.unwrap();
    t.on_frame(release(&g, 1, true), 77, t0).0.unwrap();
    assert!(t.tick(t0, |l| l != 77).is_empty(), "77 was done");
    t.on_frame(shared(&g, 2, 60_000, 2), 78, t0).0.unwrap();
    let (_, ended) = t.on_frame(release(&g, 2, true), 78, t0);
    assert_eq!(ended[0].why, LeaseEnd::Done);
    // Both dead, one before its done: LinkDown, at once.
    let (mut t, g) = table(t0);
    t.on_frame(shared(&g, 1, 60_000, 2), 77, t0).0.unwrap();
    t.on_frame(release(&g, 1, true), 77, t0).0.unwrap();
    t.on_frame(shared(&g, 2, 60_000, 2), 78, t0).0.unwrap();
    let ended = t.tick(t0, |_| false);
    assert_eq!(ended[0].why, LeaseEnd::LinkDown);
}

proptest::proptest! {
    /// Any TTL is either refused (`LLM_PARAM_INVALID`, nothing held) or makes a lease that
    /// expires by its TTL; no TTL panics.
    #[test]
    fn any_ttl_is_refused_or_expires_by_it(
        secs in proptest::prop_oneof![0u64..200_000, proptest::num::u64::ANY],
        nanos in 0u32..1_000_000_000,
    ) {
        let ttl = Duration::new(secs, nanos);
        let t0 = Instant::now();
        let mut t = LeaseTable::default();
        match t.create(1, 9, &[3], &[0], ttl, 1, t0) {
            Err(e) => {
                proptest::prop_assert_eq!(e.status, LlmStatus::ParamInvalid);
                proptest::prop_assert!(ttl.is_zero() || ttl > MAX_TTL);
                proptest::prop_assert!(t.is_empty());
            }
            Ok(_) => {
                proptest::prop_assert!(!ttl.is_zero() && ttl <= MAX_TTL);
                proptest::prop_assert_eq!(t.next_deadline(), Some(t0 + ttl));
                proptest::prop_assert_eq!(t.tick(t0 + ttl, |_| true).len(), 1);
            }
        }
    }
}
