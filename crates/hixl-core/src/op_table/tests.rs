//! The op table's unit tests and model-based property tests.
use super::*;
use proptest::prelude::*;

fn err() -> Error {
    Error::PeerLost {
        peer: "p".into(),
        cause: "test".into(),
    }
}

#[test]
fn full_lifecycle() {
    let mut t: OpTable<u32> = OpTable::new();
    let tok = t.insert();
    assert_eq!(t.phase(tok), Some(Phase::Staged));
    t.post(tok, 2, [], &mut vec![]).unwrap();
    assert!(t.poll_result(tok, 7).is_none());
    assert_eq!(t.phase(tok), Some(Phase::Waiting));
    assert!(matches!(
        t.complete(tok, Ok(()), &mut vec![]),
        Completed::Pending
    ));
    assert_eq!(t.status(tok), Some(TransferStatus::Waiting));
    assert!(matches!(
        t.complete(tok, Ok(()), &mut vec![]),
        Completed::Finished(Some(7))
    ));
    assert_eq!(t.status(tok), Some(TransferStatus::Completed));
    assert!(matches!(t.poll_result(tok, 8), Some(Ok(()))));
    assert_eq!(t.live(), 0);
    // the slot's generation moved on: the old token is stale everywhere
    assert!(matches!(
        t.complete(tok, Ok(()), &mut vec![]),
        Completed::Stale
    ));
    assert!(t.status(tok).is_none());
    let tok2 = t.insert();
    assert_eq!(tok2.slot(), tok.slot());
    assert_ne!(tok2.generation(), tok.generation());
    assert!(matches!(
        t.complete(tok, Ok(()), &mut vec![]),
        Completed::Stale
    ));
}

#[test]
fn first_error_wins() {
    let mut t: OpTable<()> = OpTable::new();
    let tok = t.insert();
    t.post(tok, 3, [], &mut vec![]).unwrap();
    t.complete(tok, Ok(()), &mut vec![]);
    t.complete(tok, Err(err()), &mut vec![]);
    t.complete(tok, Err(Error::NotInitialized), &mut vec![]);
    assert_eq!(t.status(tok), Some(TransferStatus::Failed));
    assert!(matches!(
        t.poll_result(tok, ()),
        Some(Err(Error::PeerLost { .. }))
    ));
}

#[test]
fn abandoned_op_is_kept_until_the_device_is_done() {
    let mut t: OpTable<()> = OpTable::new();
    let tok = t.insert();
    t.post(tok, 2, [], &mut vec![]).unwrap();
    assert!(!t.abandon(tok));
    assert!(!t.is_wanted(tok));
    assert_eq!(t.live(), 1);
    // slot not reusable yet
    let other = t.insert();
    assert_ne!(other.slot(), tok.slot());
    assert!(matches!(
        t.complete(tok, Ok(()), &mut vec![]),
        Completed::Pending
    ));
    assert!(matches!(
        t.complete(tok, Ok(()), &mut vec![]),
        Completed::Reaped(None)
    ));
    assert_eq!(t.live(), 1);
}

#[test]
fn a_watched_parked_op_wakes_its_watcher_when_reaped() {
    let mut t: OpTable<u8> = OpTable::new();
    let tok = t.insert();
    t.post(tok, 2, [], &mut vec![]).unwrap();
    // Not abandoned yet: nothing to watch.
    assert!(!t.watch_parked(tok, 1));
    assert!(!t.abandon(tok));
    assert!(t.watch_parked(tok, 2));
    assert!(matches!(
        t.complete(tok, Ok(()), &mut vec![]),
        Completed::Pending
    ));
    assert!(t.watch_parked(tok, 3), "one part is still in flight");
    assert!(matches!(
        t.complete(tok, Ok(()), &mut vec![]),
        Completed::Reaped(Some(3))
    ));
    assert!(
        !t.watch_parked(tok, 4),
        "reaped: nothing of it is in flight"
    );
    // Its slot, reused, is another op: the old token sees nothing parked.
    let next = t.insert();
    assert_eq!(next.slot(), tok.slot());
    assert!(!t.watch_parked(tok, 5));
}

#[test]
fn misuse_is_reported_not_panicking() {
    let mut t: OpTable<()> = OpTable::new();
    let tok = t.insert();
    t.post(tok, 1, [], &mut vec![]).unwrap();
    assert!(matches!(
        t.post(tok, 1, [], &mut vec![]),
        Err(OpTableError::WrongPhase { .. })
    ));
    assert_eq!(
        t.post(Token(999), 1, [], &mut vec![]),
        Err(OpTableError::Stale(999))
    );
    assert!(matches!(t.poll_result(Token(999), ()), Some(Err(_))));
    assert!(matches!(
        t.fail_all(tok, err(), &mut vec![]),
        Completed::Finished(None)
    ));
    let z = t.insert();
    t.post(z, 0, [], &mut vec![]).unwrap();
    assert!(matches!(t.poll_result(z, ()), Some(Ok(()))));
}

#[test]
fn keep_alive_is_held_until_the_last_part_and_handed_back_once() {
    let mut t: OpTable<(), u32> = OpTable::new();
    let mut reaped = Vec::new();
    let tok = t.insert();
    t.post(tok, 2, [1, 2], &mut reaped).unwrap();
    assert!(reaped.is_empty());
    assert_eq!(t.kept(tok), 2);
    // Abandoned with a part outstanding: still held.
    assert!(!t.abandon(tok));
    assert!(matches!(
        t.complete(tok, Ok(()), &mut reaped),
        Completed::Pending
    ));
    assert!(reaped.is_empty() && t.kept(tok) == 2);
    assert!(matches!(
        t.complete(tok, Ok(()), &mut reaped),
        Completed::Reaped(None)
    ));
    assert_eq!(reaped, [1, 2]);
    // A reused slot starts empty; a zero-part op and a misuse hand the keep back at once.
    let z = t.insert();
    assert_eq!(z.slot(), tok.slot());
    assert_eq!(t.kept(z), 0);
    reaped.clear();
    t.post(z, 0, [3], &mut reaped).unwrap();
    assert_eq!(reaped, [3]);
    assert!(t.post(z, 1, [4], &mut reaped).is_err());
    assert!(t.post(Token(999), 1, [5], &mut reaped).is_err());
    assert_eq!(reaped, [3, 4, 5]);
    // Completed with the owner present: handed back at the last part, before the take.
    let w = t.insert();
    reaped.clear();
    t.post(w, 1, [6], &mut reaped).unwrap();
    assert!(matches!(
        t.fail_all(w, err(), &mut reaped),
        Completed::Finished(None)
    ));
    assert_eq!(reaped, [6]);
    assert!(matches!(t.poll_result(w, ()), Some(Err(_))));
}

#[derive(Debug, Clone)]
enum Step {
    Insert(u32),
    Complete(usize, bool),
    Poll(usize),
    Abandon(usize),
    StaleComplete(u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0u32..4).prop_map(Step::Insert),
        (any::<usize>(), any::<bool>()).prop_map(|(i, ok)| Step::Complete(i, ok)),
        any::<usize>().prop_map(Step::Poll),
        any::<usize>().prop_map(Step::Abandon),
        any::<u64>().prop_map(Step::StaleComplete),
    ]
}

proptest! {
    // Against a model: every part completion is applied exactly once to the right op, and
    // `live` counts exactly the ops that are neither taken nor reaped.
    #[test]
    fn churn_matches_model(steps in proptest::collection::vec(step(), 1..200)) {
        let mut t: OpTable<()> = OpTable::new();
        // (token, remaining, owner_present)
        let mut model: Vec<(Token, u32, bool)> = Vec::new();
        for s in steps {
            match s {
                Step::Insert(n) => {
                    let tok = t.insert();
                    t.post(tok, n, [], &mut vec![]).unwrap();
                    model.push((tok, n, true));
                }
                Step::Complete(i, ok) if !model.is_empty() => {
                    let i = i % model.len();
                    let (tok, rem, owner) = model[i];
                    let r = t.complete(tok, if ok { Ok(()) } else { Err(err()) }, &mut vec![]);
                    if rem == 0 { prop_assert!(matches!(r, Completed::Stale)); continue; }
                    model[i].1 -= 1;
                    if rem > 1 { prop_assert!(matches!(r, Completed::Pending)); }
                    else if owner { prop_assert!(matches!(r, Completed::Finished(_))); }
                    else { prop_assert!(matches!(r, Completed::Reaped(None))); model.remove(i); }
                }
                Step::Poll(i) if !model.is_empty() => {
                    let i = i % model.len();
                    let (tok, rem, owner) = model[i];
                    if !owner { continue; }
                    let r = t.poll_result(tok, ());
                    if rem == 0 { prop_assert!(r.is_some()); model.remove(i); }
                    else { prop_assert!(r.is_none()); }
                }
                Step::Abandon(i) if !model.is_empty() => {
                    let i = i % model.len();
                    let (tok, rem, owner) = model[i];
                    if !owner { continue; }
                    let freed = t.abandon(tok);
                    prop_assert_eq!(freed, rem == 0);
                    if freed { model.remove(i); } else { model[i].2 = false; }
                }
                Step::StaleComplete(raw) => {
                    let tok = Token(raw);
                    if !model.iter().any(|m| m.0 == tok) {
                        prop_assert!(matches!(t.complete(tok, Ok(()), &mut vec![]), Completed::Stale));
                    }
                }
                _ => {}
            }
            prop_assert_eq!(t.live(), model.len());
        }
    }
}

/// A keep-alive item that logs its drop.
#[derive(Debug)]
struct Probe {
    id: u64,
    log: std::rc::Rc<std::cell::RefCell<Vec<u64>>>,
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.log.borrow_mut().push(self.id);
    }
}

#[derive(Debug, Clone)]
enum KeepStep {
    Insert(u32, usize),
    Complete(usize, bool),
    FailAll(usize),
    Poll(usize),
    Abandon(usize),
}

fn keep_step() -> impl Strategy<Value = KeepStep> {
    prop_oneof![
        ((0u32..4), (0usize..3)).prop_map(|(n, k)| KeepStep::Insert(n, k)),
        (any::<usize>(), any::<bool>()).prop_map(|(i, ok)| KeepStep::Complete(i, ok)),
        any::<usize>().prop_map(KeepStep::FailAll),
        any::<usize>().prop_map(KeepStep::Poll),
        any::<usize>().prop_map(KeepStep::Abandon),
    ]
}

/// One op of the keep-alive model.
struct ModelOp {
    tok: Token,
    remaining: u32,
    owner: bool,
    keeps: Vec<u64>,
}

proptest! {
    // Against a model: each keep-alive item is handed back exactly once, at the step where
    // its op's last part is done (or at once for an op with nothing posted), never while a
    // part is outstanding, and never dropped inside the table.
    #[test]
    fn keep_alive_matches_model(steps in proptest::collection::vec(keep_step(), 1..200)) {
        let log = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let mut t: OpTable<(), Probe> = OpTable::new();
        let mut model: Vec<ModelOp> = Vec::new();
        let mut next_id = 0u64;
        for s in steps {
            let mut reaped: Vec<Probe> = Vec::new();
            let mut expect: Vec<u64> = Vec::new();
            match s {
                KeepStep::Insert(n, k) => {
                    let tok = t.insert();
                    let keeps: Vec<u64> = (next_id..next_id + k as u64).collect();
                    next_id += k as u64;
                    let probes = keeps.iter().map(|&id| Probe { id, log: log.clone() });
                    t.post(tok, n, probes, &mut reaped).unwrap();
                    if n == 0 { expect = keeps.clone(); }
                    model.push(ModelOp { tok, remaining: n, owner: true, keeps: if n == 0 { Vec::new() } else { keeps } });
                }
                KeepStep::Complete(i, _) | KeepStep::FailAll(i) if !model.is_empty() => {
                    let i = i % model.len();
                    let all = matches!(s, KeepStep::FailAll(_));
                    let ok = ok_of(&s);
                    let tok = model[i].tok;
                    let r = if all {
                        t.fail_all(tok, err(), &mut reaped)
                    } else {
                        t.complete(tok, if ok { Ok(()) } else { Err(err()) }, &mut reaped)
                    };
                    if model[i].remaining == 0 {
                        prop_assert!(matches!(r, Completed::Stale));
                    } else {
                        model[i].remaining = if all { 0 } else { model[i].remaining - 1 };
                        if model[i].remaining == 0 {
                            expect = std::mem::take(&mut model[i].keeps);
                            if !model[i].owner { model.remove(i); }
                        }
                    }
                }
                KeepStep::Poll(i) if !model.is_empty() => {
                    let i = i % model.len();
                    if model[i].owner && t.poll_result(model[i].tok, ()).is_some() {
                        model.remove(i);
                    }
                }
                KeepStep::Abandon(i) if !model.is_empty() => {
                    let i = i % model.len();
                    if model[i].owner {
                        if t.abandon(model[i].tok) { model.remove(i); } else { model[i].owner = false; }
                    }
                }
                _ => {}
            }
            prop_assert!(log.borrow().is_empty(), "dropped inside the table");
            let mut got: Vec<u64> = reaped.iter().map(|p| p.id).collect();
            got.sort_unstable();
            expect.sort_unstable();
            prop_assert_eq!(&got, &expect);
            for m in &model {
                prop_assert_eq!(t.kept(m.tok), m.keeps.len());
                prop_assert!(m.remaining > 0 || m.keeps.is_empty());
            }
            drop(reaped);
            let mut dropped = std::mem::take(&mut *log.borrow_mut());
            dropped.sort_unstable();
            prop_assert_eq!(dropped, expect);
            prop_assert_eq!(t.live(), model.len());
        }
    }
}

fn ok_of(s: &KeepStep) -> bool {
    !matches!(s, KeepStep::Complete(_, false))
}
