//! Criterion benches of the op table (`hixl_core::OpTable`): the per-transfer bookkeeping of
//! the engine's hot path, without any I/O.
//!
//! - `churn/N`: one op's whole life, `insert` → `post(N)` → `poll_result` (registers the
//!   waiter) → N × `complete` → `poll_result` (takes the result and frees the slot), on a table
//!   that already holds 1024 live ops so the slab is not trivially small;
//! - `stale_completion`: a completion for an op that was already reaped, which must be
//!   rejected by the generation check.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use hixl_core::{Completed, OpTable, Token};

/// Live ops kept in the table during the churn benches.
const BACKGROUND_OPS: usize = 1024;

/// A table holding `n` posted ops that nobody completes.
fn table_with_live_ops(n: usize) -> OpTable<u32, u64> {
    let mut t = OpTable::new();
    for _ in 0..n {
        let tok = t.insert();
        t.post(tok, 1, [0], &mut Vec::new()).unwrap();
    }
    t
}

/// One op's whole life with `parts` parts and one keep-alive item (handed back into the
/// reused `reaped`, as the reactor does); returns whether its result was Ok.
fn one_op(t: &mut OpTable<u32, u64>, parts: u32, reaped: &mut Vec<u64>) -> bool {
    let tok = t.insert();
    t.post(tok, parts, [1], reaped).unwrap();
    assert!(t.poll_result(tok, 7).is_none());
    for _ in 1..parts {
        assert!(matches!(
            t.complete(tok, Ok(()), reaped),
            Completed::Pending
        ));
    }
    assert!(matches!(
        t.complete(tok, Ok(()), reaped),
        Completed::Finished(Some(7))
    ));
    reaped.clear();
    matches!(t.poll_result(tok, 0), Some(Ok(())))
}

fn churn(c: &mut Criterion) {
    let mut g = c.benchmark_group("op_table/churn");
    for parts in [1u32, 64] {
        g.throughput(Throughput::Elements(u64::from(parts)));
        g.bench_with_input(BenchmarkId::from_parameter(parts), &parts, |b, &parts| {
            let mut t = table_with_live_ops(BACKGROUND_OPS);
            let mut reaped = Vec::new();
            b.iter(|| black_box(one_op(&mut t, black_box(parts), &mut reaped)));
            assert_eq!(t.live(), BACKGROUND_OPS);
        });
    }
    g.finish();
}

fn stale_completion(c: &mut Criterion) {
    let mut t = table_with_live_ops(BACKGROUND_OPS);
    // Reap one op, then reuse its slot so the stale token names a live slot of a newer
    // generation: the check that matters, not a plain out-of-range slot.
    let stale: Token = t.insert();
    let mut reaped = Vec::new();
    t.post(stale, 1, [0], &mut reaped).unwrap();
    let _ = t.complete(stale, Ok(()), &mut reaped);
    let _ = t.poll_result(stale, 0);
    let reused = t.insert();
    t.post(reused, 1, [0], &mut reaped).unwrap();
    assert_eq!(reused.slot(), stale.slot());
    c.bench_function("op_table/stale_completion", |b| {
        b.iter(|| {
            matches!(
                t.complete(black_box(stale), Ok(()), &mut reaped),
                Completed::Stale
            )
        })
    });
    assert!(matches!(
        t.complete(stale, Ok(()), &mut reaped),
        Completed::Stale
    ));
    assert!(t.is_wanted(reused));
}

criterion_group! {
    name = benches;
    // No HTML plots: drawing them takes longer than measuring. Numbers print to stdout.
    config = Criterion::default()
        .without_plots()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = churn, stale_completion
}
criterion_main!(benches);
