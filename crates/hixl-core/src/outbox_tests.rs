//! The outbox and the answer matcher together against a model target, as a connection drives
//! them: parts queued in batches, ops withdrawn at any time, sends and receives of any size.
//! Every part resolves exactly once (dropped while its op was withdrawn before it was
//! gathered, else answered), every write's bytes reach the target once and in order, every
//! read's bytes land once where they belong.

use bytes::BytesMut;
use proptest::prelude::*;

use super::*;
use crate::answers::{Answers, Awaited, Next};
use crate::wire::{encode_ack, encode_data_req, encode_read_resp, DataReq, Message};

#[derive(Debug, Clone)]
struct P {
    /// The op (and request id).
    op: u64,
    write: bool,
    len: u64,
}

impl P {
    fn data(&self) -> Vec<u8> {
        (0..self.len)
            .map(|i| (self.op as u8).wrapping_mul(31) ^ i as u8)
            .collect()
    }
    fn req(&self) -> DataReq {
        DataReq {
            id: self.op,
            rkey: 1,
            addr: 0x1000,
            len: self.len,
        }
    }
}

impl Outgoing for P {
    fn put_request(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&encode_data_req(self.write, &self.req()));
    }
    fn is_write(&self) -> bool {
        self.write
    }
    fn bytes(&self) -> u64 {
        if self.write {
            self.len
        } else {
            0
        }
    }
}

impl Awaited for P {
    fn id(&self) -> u64 {
        self.op
    }
    fn is_write(&self) -> bool {
        self.write
    }
    fn bytes(&self) -> u64 {
        self.len
    }
    fn target(&self) -> (u64, u64) {
        (1, 0x1000)
    }
}

/// The target: takes requests off the byte stream, checks write payloads, answers.
#[derive(Default)]
struct Target {
    rx: BytesMut,
    /// A write being received: its request and the bytes so far.
    writing: Option<(DataReq, Vec<u8>)>,
    /// Writes received whole: op, bytes.
    writes: Vec<(u64, Vec<u8>)>,
    answers: Vec<u8>,
}

impl Target {
    fn take(&mut self, bytes: &[u8]) {
        self.rx.extend_from_slice(bytes);
        loop {
            if let Some((req, got)) = self.writing.as_mut() {
                let k = (req.len as usize - got.len()).min(self.rx.len());
                got.extend_from_slice(&self.rx.split_to(k));
                if got.len() < req.len as usize {
                    return;
                }
                let (req, got) = self.writing.take().expect("a write");
                self.writes.push((req.id, got));
                self.answers.extend_from_slice(&encode_ack(req.id, 0));
                continue;
            }
            match Message::decode(&mut self.rx).expect("the initiator's stream is in frame") {
                Some(Message::WriteReq(r)) => self.writing = Some((r, Vec::new())),
                Some(Message::ReadReq(r)) => {
                    self.answers
                        .extend_from_slice(&encode_read_resp(r.id, 0, r.len));
                    let p = P {
                        op: r.id,
                        write: false,
                        len: r.len,
                    };
                    self.answers.extend_from_slice(&p.data());
                }
                Some(m) => panic!("unexpected {m:?}"),
                None => return,
            }
        }
    }
}

#[derive(Debug, Clone)]
enum Act {
    /// Queue a batch of parts: (write, len) each.
    Queue(Vec<(bool, u64)>),
    /// Withdraw the op with this index (of those queued so far).
    Withdraw(usize),
    /// One send of at most this many bytes.
    Send(usize),
    /// One receive of at most this many answer bytes.
    Recv(usize),
}

fn act() -> impl Strategy<Value = Act> {
    prop_oneof![
        proptest::collection::vec((any::<bool>(), 1u64..300), 1..6).prop_map(Act::Queue),
        any::<usize>().prop_map(Act::Withdraw),
        (1usize..400).prop_map(Act::Send),
        (1usize..400).prop_map(Act::Recv),
    ]
}

proptest! {
    #[test]
    fn every_part_resolves_once_and_every_byte_moves_once(
        acts in proptest::collection::vec(act(), 1..80),
        parts_bound in 1usize..6,
        bytes_bound in 1u64..700,
    ) {
        let bounds = Bounds { parts: parts_bound, bytes: bytes_bound };
        let mut ob = Outbox::<P>::default();
        let mut ans = Answers::<P>::default();
        let mut target = Target::default();
        let (mut queued, mut withdrawn) = (Vec::<P>::new(), std::collections::BTreeSet::new());
        let (mut dropped, mut resolved) = (Vec::new(), Vec::new());
        let mut landed: std::collections::BTreeMap<u64, Vec<u8>> = Default::default();
        let mut stage: Vec<u8> = Vec::new();
        let mut answered = 0usize;
        // Every act, then sends and receives until nothing moves.
        let flush = std::iter::repeat_n([Act::Send(usize::MAX), Act::Recv(usize::MAX)], 4 * 1024)
            .flatten();
        for a in acts.into_iter().chain(flush) {
            match a {
                Act::Queue(v) => {
                    let first = queued.len() as u64 + 1;
                    let batch: Vec<P> = v
                        .into_iter()
                        .enumerate()
                        .map(|(i, (write, len))| P { op: first + i as u64, write, len })
                        .collect();
                    queued.extend(batch.iter().cloned());
                    ob.queue(batch);
                }
                Act::Withdraw(i) if !queued.is_empty() => {
                    withdrawn.insert(queued[i % queued.len()].op);
                }
                Act::Withdraw(_) => {}
                Act::Send(max) => {
                    let mut to_answers = |p: P| ans.push(p);
                    if !ob.is_gathered() {
                        let mut wanted = |p: &P| !withdrawn.contains(&p.op);
                        let mut drop_it = |p: P| dropped.push(p.op);
                        prop_assert!(ob.gather(bounds, &mut wanted, &mut drop_it, &mut to_answers).is_ok());
                    }
                    let mut bytes = Vec::new();
                    for piece in ob.pieces() {
                        match piece {
                            Piece::Head(h) => bytes.extend_from_slice(h),
                            Piece::Payload(p, from) => bytes.extend_from_slice(&p.data()[from as usize..]),
                        }
                    }
                    let k = bytes.len().min(max);
                    target.take(&bytes[..k]);
                    prop_assert!(ob.sent(k, &mut to_answers).is_ok());
                }
                Act::Recv(max) => {
                    let k = (target.answers.len() - answered).min(max);
                    stage.extend_from_slice(&target.answers[answered..answered + k]);
                    answered += k;
                    let mut done = |p: P, r: Result<(), crate::Error>| resolved.push((p.op, r.is_ok()));
                    loop {
                        match ans.next() {
                            Next::Idle => break,
                            Next::Frames { need } if stage.len() < need => break,
                            Next::Frames { .. } => {
                                let n = ans.take(&stage, "t", &mut done);
                                prop_assert!(n.is_ok(), "{:?}", n);
                                stage.drain(..n.unwrap_or(0));
                            }
                            Next::Payload { got, len } => {
                                if stage.is_empty() {
                                    break;
                                }
                                let op = ans.front().map(|f| f.op).unwrap_or(0);
                                let k = stage.len().min((len - got) as usize);
                                let mem = landed.entry(op).or_default();
                                prop_assert_eq!(mem.len() as u64, got, "bytes land in order, once");
                                mem.extend(stage.drain(..k));
                                ans.landed(k as u64, &mut done);
                            }
                        }
                    }
                }
            }
        }
        prop_assert!(ob.is_free() && !ans.awaiting(), "everything went and came back");
        // Each part once: dropped, or answered Ok.
        let mut all: Vec<u64> = dropped.iter().copied().chain(resolved.iter().map(|r| r.0)).collect();
        all.sort_unstable();
        prop_assert_eq!(all, (1..=queued.len() as u64).collect::<Vec<_>>());
        prop_assert!(resolved.iter().all(|r| r.1));
        for op in &dropped {
            prop_assert!(withdrawn.contains(op), "only a withdrawn op's parts are dropped");
        }
        // The writes reached the target whole, once, in the order they were queued.
        let writes: Vec<u64> = target.writes.iter().map(|w| w.0).collect();
        let want: Vec<u64> = queued.iter().filter(|p| p.write && !dropped.contains(&p.op)).map(|p| p.op).collect();
        prop_assert_eq!(writes, want);
        for (op, bytes) in &target.writes {
            prop_assert_eq!(bytes, &queued[*op as usize - 1].data());
        }
        for p in queued.iter().filter(|p| !p.write && !dropped.contains(&p.op)) {
            prop_assert_eq!(landed.get(&p.op), Some(&p.data()), "read {} landed whole", p.op);
        }
    }
}

#[test]
fn closing_gives_back_the_gathered_writes_then_the_backlog() {
    let mut ob = Outbox::<P>::default();
    let p = |op, write| P { op, write, len: 8 };
    ob.queue(vec![p(1, true), p(2, true), p(3, false)]);
    let bounds = Bounds {
        parts: 1,
        bytes: 1 << 20,
    };
    let mut yes = |_: &P| true;
    let mut never = |_: P| panic!("nothing is dropped");
    let mut refuse = |p: P| Err(p);
    ob.gather(bounds, &mut yes, &mut never, &mut refuse)
        .expect("writes are not answered yet");
    let back: Vec<u64> = ob.close().iter().map(|p| p.op).collect();
    assert_eq!(back, [1, 2, 3]);
    assert!(ob.is_free());
    // A read is handed to its answers as it is gathered: a closed connection gives it back.
    ob.queue(vec![p(4, false)]);
    let e = ob
        .gather(bounds, &mut yes, &mut never, &mut refuse)
        .unwrap_err();
    assert_eq!(e.op, 4);
}
