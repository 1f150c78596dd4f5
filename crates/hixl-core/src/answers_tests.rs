//! The answer matcher driven as a connection would drive it, over any split of the answer
//! stream into receives and any order of pushes that keeps requests before their answers.

use proptest::prelude::*;

use super::*;
use crate::wire::{encode_ack, encode_read_resp};

#[derive(Debug, Clone)]
struct Req {
    id: u64,
    write: bool,
    len: u64,
    refused: bool,
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
        (7, 0x1000)
    }
}

fn payload(r: &Req) -> Vec<u8> {
    (0..r.len).map(|i| (r.id as u8) ^ (i as u8)).collect()
}

/// The answer bytes a correct target sends for `reqs`, and where each answer starts.
fn answers(reqs: &[Req]) -> (Vec<u8>, Vec<usize>) {
    let (mut out, mut starts) = (Vec::new(), Vec::new());
    for r in reqs {
        starts.push(out.len());
        let status = if r.refused { 103_900 } else { 0 };
        if r.write {
            out.extend_from_slice(&encode_ack(r.id, status));
        } else if r.refused {
            out.extend_from_slice(&encode_read_resp(r.id, status, 0));
        } else {
            out.extend_from_slice(&encode_read_resp(r.id, 0, r.len));
            out.extend_from_slice(&payload(r));
        }
    }
    (out, starts)
}

/// What a run resolved: each request's id and whether it succeeded, in order; the bytes each
/// read landed, and how many times each byte was written.
#[derive(Debug, Default)]
struct Run {
    resolved: Vec<(u64, bool)>,
    memory: Vec<Vec<u8>>,
    writes: Vec<Vec<u8>>,
    error: Option<Error>,
    left: usize,
}

/// Drives `reqs` over `stream` cut at `cuts`, pushing request `i` at the latest just before
/// the receive that brings the first byte of its answer (`starts[i]`), and earlier when
/// `early[i]` says so.
fn drive(reqs: &[Req], stream: &[u8], starts: &[usize], cuts: &[usize], early: &[bool]) -> Run {
    let mut a = Answers::<Req>::default();
    let mut run = Run {
        memory: reqs.iter().map(|r| vec![0; r.len as usize]).collect(),
        writes: reqs.iter().map(|r| vec![0; r.len as usize]).collect(),
        ..Run::default()
    };
    let mut bounds: Vec<usize> = cuts.iter().map(|c| c % (stream.len() + 1)).collect();
    bounds.push(stream.len());
    bounds.sort_unstable();
    bounds.dedup();
    let mut chunks = Vec::new();
    let mut at = 0;
    for b in bounds {
        if b > at {
            chunks.push((at, &stream[at..b]));
            at = b;
        }
    }
    let mut chunks = chunks.into_iter().peekable();
    let mut pushed = 0;
    let mut stage: Vec<u8> = Vec::new();
    let index = |id: u64| (id - 1) as usize;
    let mut done = |p: Req, r: Result<(), Error>| run.resolved.push((p.id, r.is_ok()));
    loop {
        // Pushes ahead of answers: the early ones, and every one whose answer is in the next
        // receive.
        let upto = chunks.peek().map(|(o, c)| o + c.len());
        while pushed < reqs.len() && (early[pushed] || upto.is_some_and(|e| starts[pushed] < e)) {
            assert!(a.push(reqs[pushed].clone()).is_ok());
            pushed += 1;
        }
        let step = match a.next() {
            Next::Idle if chunks.peek().is_none() => break,
            Next::Idle => chunks
                .next()
                .map(|(_, c)| stage.extend_from_slice(c))
                .is_some(),
            Next::Frames { need } if stage.len() < need => chunks
                .next()
                .map(|(_, c)| stage.extend_from_slice(c))
                .is_some(),
            Next::Frames { .. } => match a.take(&stage, "peer", &mut done) {
                Ok(n) => {
                    assert!(n > 0, "a whole answer staged, none taken");
                    stage.drain(..n);
                    true
                }
                Err(e) => {
                    run.error = Some(e);
                    break;
                }
            },
            Next::Payload { got, len } => {
                assert!(got < len);
                let front = a.front().expect("a payload has its read").id;
                let dst = index(front);
                // What the stage holds first, then a receive straight into the memory (its
                // overflow into the stage, as a scattered receive would put it).
                let fresh;
                let src: &[u8] = if stage.is_empty() {
                    match chunks.next() {
                        Some((_, c)) => {
                            fresh = c;
                            fresh
                        }
                        None => break,
                    }
                } else {
                    &stage.clone()
                };
                let from_stage = !stage.is_empty();
                let k = src.len().min((len - got) as usize);
                for (i, &b) in src[..k].iter().enumerate() {
                    run.memory[dst][got as usize + i] = b;
                    run.writes[dst][got as usize + i] += 1;
                }
                if from_stage {
                    stage.drain(..k);
                } else {
                    stage.extend_from_slice(&src[k..]);
                }
                a.landed(k as u64, &mut done);
                true
            }
        };
        if !step {
            break;
        }
    }
    run.left = a.close().len() + (reqs.len() - pushed);
    assert!(a.push(reqs[0].clone()).is_err(), "closed: pushes refused");
    run
}

fn reqs() -> impl Strategy<Value = Vec<Req>> {
    proptest::collection::vec(
        (any::<bool>(), 1u64..200, proptest::bool::weighted(0.2)),
        1..24,
    )
    .prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, (write, len, refused))| Req {
                id: i as u64 + 1,
                write,
                len,
                refused,
            })
            .collect()
    })
}

proptest! {
    /// A correct answer stream, received in any pieces: every request resolves once, in
    /// order, as its answer said; every payload byte lands once, where it belongs.
    #[test]
    fn every_request_resolves_once_and_every_byte_lands_once(
        reqs in reqs(),
        cuts in proptest::collection::vec(any::<usize>(), 0..40),
        early in proptest::collection::vec(any::<bool>(), 24),
    ) {
        let (stream, starts) = answers(&reqs);
        let run = drive(&reqs, &stream, &starts, &cuts, &early);
        prop_assert!(run.error.is_none(), "{:?}", run.error);
        prop_assert_eq!(run.left, 0);
        let want: Vec<(u64, bool)> = reqs.iter().map(|r| (r.id, !r.refused)).collect();
        prop_assert_eq!(&run.resolved, &want);
        for (i, r) in reqs.iter().enumerate() {
            if r.write || r.refused {
                prop_assert!(run.writes[i].iter().all(|&w| w == 0), "nothing lands for {:?}", r);
            } else {
                prop_assert_eq!(&run.memory[i], &payload(r));
                prop_assert!(run.writes[i].iter().all(|&w| w == 1), "each byte once: {:?}", r);
            }
        }
    }

    /// Any corruption of the stream: no panic; no request resolves twice or out of order; a
    /// payload never lands past its end; what does not resolve comes back from `close`.
    #[test]
    fn a_corrupt_stream_resolves_each_request_at_most_once(
        reqs in reqs(),
        cuts in proptest::collection::vec(any::<usize>(), 0..40),
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
        cut_short in any::<usize>(),
    ) {
        let (mut stream, starts) = answers(&reqs);
        for (at, v) in flips {
            let n = stream.len();
            stream[at % n] = v;
        }
        stream.truncate(cut_short % (stream.len() + 1));
        let run = drive(&reqs, &stream, &starts, &cuts, &[false; 24]);
        let ids: Vec<u64> = run.resolved.iter().map(|r| r.0).collect();
        prop_assert_eq!(&ids, &(1..=ids.len() as u64).collect::<Vec<_>>(), "in order, once");
        prop_assert_eq!(run.resolved.len() + run.left, reqs.len(), "every request accounted for");
        for w in &run.writes {
            prop_assert!(w.iter().all(|&x| x <= 1));
        }
    }
}

#[test]
fn errors_name_the_peer_and_the_mismatch() {
    let mut a = Answers::<Req>::default();
    let r = Req {
        id: 5,
        write: false,
        len: 8,
        refused: false,
    };
    a.push(r).unwrap();
    let mut none = |_: Req, _: Result<(), Error>| panic!("nothing resolves");
    for (frame, says) in [
        (
            encode_read_resp(6, 0, 8).to_vec(),
            "read response for 0x6, expected 0x5",
        ),
        (
            encode_read_resp(5, 0, 9).to_vec(),
            "read response of 9 bytes, asked 8",
        ),
        (
            encode_read_resp(5, 103_900, 8).to_vec(),
            "refused read carries a payload",
        ),
        (encode_ack(5, 0).to_vec(), "answer frame of unexpected size"),
    ] {
        let mut staged = frame;
        staged.resize(READ_RESP_FRAME, 0);
        let e = a.take(&staged, "10.0.0.2:9", &mut none).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("10.0.0.2:9") && text.contains(says), "{text}");
    }
    assert_eq!(a.close().len(), 1, "the read is given back to be failed");
}
