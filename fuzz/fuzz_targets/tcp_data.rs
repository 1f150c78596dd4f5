//! Fuzz target for the TCP data path's answer matching (`hixl_core::answers::Answers`, the
//! sans-io core of a data connection's receiving half): arbitrary requests in flight, and
//! answer bytes that are correct answers, arbitrary frames or raw bytes, received in arbitrary
//! pieces, with requests pushed at any point before the receive that brings their answer.
//!
//! Invariants checked:
//! - nothing panics;
//! - requests resolve in the order they were pushed, each at most once, and every pushed one
//!   is resolved or given back by `close` (to be failed with the connection);
//! - a payload is asked for only within its length (`got < len`), and every byte of it lands
//!   at most once; a request that resolved `Ok` as a read had every byte land exactly once;
//! - `take` consumes only staged bytes, and at least one answer whenever a whole answer of
//!   the front request is staged (or fails);
//! - when every answer step is a correct answer, every request resolves as its answer said
//!   and every payload holds the bytes sent.
#![no_main]

use hixl_core::answers::{Answers, Awaited, Next};
use hixl_core::wire::{encode_ack, encode_read_resp};
use hixl_core::Error;
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Clone)]
struct Req {
    id: u64,
    write: bool,
    len: u64,
}

impl Awaited for Req {
    fn id(&self) -> u64 {
        self.id
    }
    fn is_write(&self) -> bool {
        self.write
    }
    fn bytes(&self) -> u64 {
        self.len
    }
    fn target(&self) -> (u64, u64) {
        (1, 2)
    }
}

/// One piece of the answer stream.
#[derive(Arbitrary, Debug)]
enum Step {
    /// The next request's correct answer (refused or not).
    Answer { refuse: bool },
    /// An answer for the next request with a wrong id, kind or length.
    Wrong {
        id: u64,
        status: u32,
        len: u16,
        ack: bool,
    },
    /// Raw bytes.
    Raw(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
struct Input {
    /// Requests: write or read, and a length of 1..=4096.
    reqs: Vec<(bool, u16)>,
    steps: Vec<Step>,
    /// Receive sizes (cycled; 0 counts as 1).
    cuts: Vec<u8>,
    /// Requests pushed ahead of their answers.
    early: u8,
}

fn payload(id: u64, len: u64) -> Vec<u8> {
    (0..len)
        .map(|i| (id as u8) ^ (i as u8).rotate_left(3))
        .collect()
}

fuzz_target!(|input: Input| {
    let reqs: Vec<Req> = input
        .reqs
        .iter()
        .take(64)
        .enumerate()
        .map(|(i, &(write, len))| Req {
            id: i as u64 + 1,
            write,
            len: u64::from(len % 4096) + 1,
        })
        .collect();
    if reqs.is_empty() {
        return;
    }
    // The stream, and where each request's answer starts (a request is pushed before then).
    let (mut stream, mut starts, mut told) = (Vec::new(), Vec::new(), Vec::new());
    let mut correct = true;
    let mut next = 0;
    for st in input.steps.iter().take(128) {
        if next == reqs.len() {
            break;
        }
        let r = &reqs[next];
        starts.push(stream.len());
        match st {
            Step::Answer { refuse } => {
                let status = if *refuse { 103_900 } else { 0 };
                if r.write {
                    stream.extend_from_slice(&encode_ack(r.id, status));
                } else if *refuse {
                    stream.extend_from_slice(&encode_read_resp(r.id, status, 0));
                } else {
                    stream.extend_from_slice(&encode_read_resp(r.id, 0, r.len));
                    stream.extend_from_slice(&payload(r.id, r.len));
                }
                told.push(!refuse);
            }
            Step::Wrong {
                id,
                status,
                len,
                ack,
            } => {
                correct = false;
                if *ack {
                    stream.extend_from_slice(&encode_ack(*id, *status));
                } else {
                    stream.extend_from_slice(&encode_read_resp(*id, *status, u64::from(*len)));
                }
            }
            Step::Raw(b) => {
                correct = false;
                stream.extend_from_slice(b);
            }
        }
        next += 1;
    }
    starts.resize(reqs.len(), usize::MAX);

    let mut a = Answers::<Req>::default();
    let mut landed: Vec<Vec<u8>> = reqs.iter().map(|r| vec![0; r.len as usize]).collect();
    let mut memory: Vec<Vec<u8>> = landed.clone();
    let mut resolved: Vec<(u64, bool)> = Vec::new();
    let (mut pushed, mut at, mut cut) = (0usize, 0usize, 0usize);
    let mut stage: Vec<u8> = Vec::new();
    let early = usize::from(input.early % 8);
    let mut failed = false;
    let mut done = |p: Req, r: Result<(), Error>| resolved.push((p.id, r.is_ok()));
    // Each turn: push what must be pushed, then one step of the connection.
    for _turn in 0..100_000 {
        let size = input
            .cuts
            .get(cut % input.cuts.len().max(1))
            .map_or(4096, |&c| usize::from(c).max(1));
        let end = (at + size).min(stream.len());
        while pushed < reqs.len() && (pushed < early || starts[pushed] < end.max(at + 1)) {
            assert!(
                a.push(reqs[pushed].clone()).is_ok(),
                "invariant violated: push refused"
            );
            pushed += 1;
        }
        // One receive: the next `size` bytes of the stream.
        let mut recv = || -> Option<Vec<u8>> {
            if at >= stream.len() {
                return None;
            }
            let chunk = stream[at..end].to_vec();
            at = end;
            cut += 1;
            Some(chunk)
        };
        match a.next() {
            // Nothing awaited: the bytes wait in the socket for the next push (staged here).
            Next::Idle if pushed == reqs.len() => break,
            Next::Idle => {
                let Some(c) = recv() else { break };
                stage.extend_from_slice(&c);
            }
            Next::Frames { need } if stage.len() < need => {
                let Some(c) = recv() else { break };
                stage.extend_from_slice(&c);
            }
            Next::Frames { .. } => match a.take(&stage, "fuzz", &mut done) {
                Ok(n) => {
                    assert!(n <= stage.len(), "invariant violated: took unstaged bytes");
                    assert!(
                        n > 0,
                        "invariant violated: a whole answer staged and no progress"
                    );
                    stage.drain(..n);
                }
                Err(_) => {
                    failed = true;
                    break;
                }
            },
            Next::Payload { got, len } => {
                assert!(got < len, "invariant violated: payload asked past its end");
                let id = a
                    .front()
                    .expect("invariant violated: a payload without its read")
                    .id;
                let i = (id - 1) as usize;
                assert_eq!(len, reqs[i].len, "invariant violated: payload length");
                let src = if stage.is_empty() {
                    match recv() {
                        Some(c) => c,
                        None => break,
                    }
                } else {
                    std::mem::take(&mut stage)
                };
                let k = src.len().min((len - got) as usize);
                for (j, &b) in src[..k].iter().enumerate() {
                    memory[i][got as usize + j] = b;
                    landed[i][got as usize + j] += 1;
                    assert!(
                        landed[i][got as usize + j] == 1,
                        "invariant violated: a byte landed twice"
                    );
                }
                stage.splice(0..0, src[k..].iter().copied());
                a.landed(k as u64, &mut done);
            }
        }
    }
    let given_back = a.close();
    let ids: Vec<u64> = resolved.iter().map(|r| r.0).collect();
    assert_eq!(
        ids,
        (1..=ids.len() as u64).collect::<Vec<_>>(),
        "invariant violated: resolved out of order or twice"
    );
    assert_eq!(
        resolved.len() + given_back.len(),
        pushed,
        "invariant violated: a pushed request neither resolved nor given back"
    );
    for &(id, ok) in &resolved {
        let i = (id - 1) as usize;
        if ok && !reqs[i].write {
            assert!(
                landed[i].iter().all(|&n| n == 1),
                "invariant violated: read {id} resolved before its payload landed"
            );
        }
    }
    if correct && next == reqs.len() {
        assert!(!failed, "invariant violated: a correct stream failed");
        assert_eq!(
            resolved.len(),
            reqs.len(),
            "invariant violated: a correct stream left requests"
        );
        for (i, &ok) in told.iter().enumerate() {
            assert_eq!(
                resolved[i].1, ok,
                "invariant violated: resolved otherwise than answered"
            );
            if ok && !reqs[i].write {
                assert_eq!(
                    memory[i],
                    payload(reqs[i].id, reqs[i].len),
                    "invariant violated: payload bytes"
                );
            }
        }
    }
});
