//! The cycle of a lane: pause, cut, drain, check at the target, reconnect; and the running of
//! every lane's workers and controller.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hixl::Error;
use tokio::sync::mpsc;

use super::args::{Args, Plan};
use super::lane::{Lane, Phase};
use super::pattern::{mix, Rng};
use super::state::{get, inc, lock, Violations};
use super::worker::Worker;
use super::{
    CONNECT_TIMEOUT, DRAIN, LOCAL_SLOTS, NOTIFY_HANG, NOTIFY_TIMEOUT, PARK, REGIONS, SYNC_WAIT,
    TARGET_CHECKS,
};

#[derive(Clone, Copy, Debug)]
pub(super) enum Cut {
    /// Disconnect under the workers' feet, wait for them, drain, reconnect.
    Abrupt,
    /// Disconnect under the workers' feet and reconnect at once, then wait and drain.
    AbruptFast,
    /// Wait for the workers, drain, check, then disconnect and reconnect an idle link.
    Graceful,
}

pub(super) async fn connect(lane: &Lane) -> bool {
    let mut last = String::new();
    for attempt in 0..3 {
        if attempt > 0 {
            inc(&lane.stats.connect_retries, 1);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        match lane.engine.connect(&lane.target, CONNECT_TIMEOUT).await {
            Ok(p) => {
                inc(&lane.stats.connects, 1);
                let now: Vec<Option<u64>> = REGIONS
                    .iter()
                    .map(|n| p.region(n).map(|r| r.addr))
                    .collect();
                if now != lane.remote.map(Some) {
                    lane.violation(format!(
                        "the target's table changed across a reconnect: {now:?} vs {:?}",
                        lane.remote
                    ));
                }
                if !p.transport().starts_with(lane.name) {
                    lane.violation(format!("reconnected over {}", p.transport()));
                }
                *lock(&lane.route) = p.transport().to_string();
                if let Ok(mut g) = lane.peer.write() {
                    *g = Some(p);
                }
                return true;
            }
            Err(e) => last = format!("{e} [{}]", e.status()),
        }
    }
    lane.violation(format!("cannot reconnect to the target: {last}"));
    false
}

pub(super) async fn disconnect(lane: &Lane) {
    if let Ok(mut g) = lane.peer.write() {
        *g = None;
    }
    if let Err(e) = lane.engine.disconnect(&lane.target).await {
        lane.violation(format!("disconnect failed: {e}"));
    }
}

/// Waits until the engine has no op in flight.
pub(super) async fn drain(lane: &Lane, after: &str) {
    let start = Instant::now();
    loop {
        let n = lane.engine.ops_in_flight();
        if n == 0 {
            let us = start.elapsed().as_micros() as u64;
            lane.stats.max_drain_us.fetch_max(us, Ordering::Relaxed);
            return;
        }
        if start.elapsed() > DRAIN {
            lane.violation(format!(
                "{n} ops still in flight {DRAIN:?} after {after} with nothing new submitted"
            ));
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

pub(super) fn field(line: &str, key: &str) -> Option<u64> {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
}

/// Asks the target to check ranges of known content and to report the sequence notifies it
/// saw, then checks its answer. The workers are parked and nothing is in flight.
pub(super) async fn target_check(lane: &Lane, lines: &mut mpsc::UnboundedReceiver<String>, n: u64) {
    let Some(peer) = lane.peer() else {
        lane.violation("no link for the target check".into());
        return;
    };
    let mut ranges = Vec::new();
    for w in 0..lane.workers {
        let m = lane.model(w);
        let mut known: Vec<(u8, u64, u64, u64)> = m
            .remote
            .iter()
            .flat_map(|s| {
                s.segs
                    .known()
                    .map(|(a, b, g)| (s.region, s.base + a, b - a, g))
            })
            .collect();
        known.sort_by_key(|r| std::cmp::Reverse(r.2));
        ranges.extend(known.into_iter().take(TARGET_CHECKS));
    }
    let send = |name: &'static str, msg: String| {
        let peer = peer.clone();
        async move {
            match tokio::time::timeout(NOTIFY_HANG, peer.notify_timeout(name, msg, NOTIFY_TIMEOUT))
                .await
            {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(format!("{e} [{}]", e.status())),
                Err(_) => Err(format!("no answer within {NOTIFY_HANG:?}")),
            }
        }
    };
    for (region, pos, len, gen) in &ranges {
        let len = (*len).min(lane.slot_len);
        let msg = format!("{} {region} {pos} {len} {gen}", lane.name);
        if let Err(e) = send("soak.verify", msg).await {
            lane.violation(format!("verify notify failed on an idle link: {e}"));
            return;
        }
        inc(&lane.stats.target_checks, 1);
    }
    if let Err(e) = send("soak.sync", format!("{} {n}", lane.name)).await {
        lane.violation(format!("sync notify failed on an idle link: {e}"));
        return;
    }
    let deadline = tokio::time::Instant::now() + SYNC_WAIT;
    let line = loop {
        match tokio::time::timeout_at(deadline, lines.recv()).await {
            Ok(Some(l)) if l.contains(" SYNC ") && field(&l, "n") == Some(n) => break l,
            Ok(Some(l)) if l.contains(" SYNC ") => {}
            Ok(Some(l)) => lane.violation(format!("target: {l}")),
            Ok(None) => {
                lane.violation("the target exited".into());
                return;
            }
            Err(_) => {
                lane.violation(format!(
                    "the target did not answer sync {n} in {SYNC_WAIT:?}"
                ));
                return;
            }
        }
    };
    let s = &lane.stats;
    let received = field(&line, "seq_received").unwrap_or(0);
    let (acked, sent) = (get(&s.notifies_acked), get(&s.notifies_sent));
    if received < acked || received > sent {
        lane.violation(format!(
            "the target received {received} sequence notifies, but {acked} were acked and {sent} sent"
        ));
    }
    s.target_seq_received.store(received, Ordering::Relaxed);
    let bad = field(&line, "bad").unwrap_or(0);
    if bad > s.target_bad.swap(bad, Ordering::Relaxed) {
        lane.violation(format!(
            "the target could not use {bad} soak notifies so far (see its BAD lines)"
        ));
    }
    s.target_seq_out_of_order.store(
        field(&line, "seq_out_of_order").unwrap_or(0),
        Ordering::Relaxed,
    );
    s.target_verified
        .store(field(&line, "verified").unwrap_or(0), Ordering::Relaxed);
    s.target_verified_bytes.store(
        field(&line, "verified_bytes").unwrap_or(0),
        Ordering::Relaxed,
    );
}

pub(super) async fn wait_parked(
    lane: &Lane,
    parked: &mut mpsc::UnboundedReceiver<u64>,
    cycle: u64,
) {
    let deadline = tokio::time::Instant::now() + PARK;
    let mut n = 0;
    while n < lane.workers {
        match tokio::time::timeout_at(deadline, parked.recv()).await {
            Ok(Some(c)) if c == cycle => n += 1,
            Ok(Some(_)) => {}
            Ok(None) => return,
            Err(_) => {
                lane.violation(format!(
                    "{} of {} workers did not finish their step within {PARK:?} of the pause",
                    lane.workers - n,
                    lane.workers
                ));
                return;
            }
        }
    }
}

pub(super) async fn controller(
    lane: Arc<Lane>,
    mut parked: mpsc::UnboundedReceiver<u64>,
    mut lines: mpsc::UnboundedReceiver<String>,
    mut rng: Rng,
    stop_at: tokio::time::Instant,
    cycle: Duration,
    gone: Arc<AtomicBool>,
) {
    let mut n = 0u64;
    loop {
        let wait = cycle.mul_f64(0.5 + rng.below(1000) as f64 / 1000.0);
        let until = (tokio::time::Instant::now() + wait).min(stop_at);
        tokio::time::sleep_until(until).await;
        let stopping = until >= stop_at || gone.load(Ordering::SeqCst);
        let cut = match (stopping, rng.below(3)) {
            (true, _) => Cut::Graceful,
            (false, 0) => Cut::Abrupt,
            (false, 1) => Cut::AbruptFast,
            _ => Cut::Graceful,
        };
        lane.phase.send_replace(Phase::Pause(n));
        let mut up = true;
        match cut {
            Cut::Abrupt | Cut::AbruptFast => {
                lane.cutting.store(true, Ordering::SeqCst);
                disconnect(&lane).await;
                if let Cut::AbruptFast = cut {
                    inc(&lane.stats.cut_abrupt_fast, 1);
                    up = connect(&lane).await;
                } else {
                    inc(&lane.stats.cut_abrupt, 1);
                }
                if let Cut::Abrupt = cut {
                    // Without a link nothing new is posted: time how long the engine takes
                    // to resolve what was in flight.
                    tokio::join!(
                        wait_parked(&lane, &mut parked, n),
                        drain(&lane, "a disconnect under load")
                    );
                } else {
                    wait_parked(&lane, &mut parked, n).await;
                }
                drain(&lane, "a disconnect under load").await;
                if let Cut::Abrupt = cut {
                    up = connect(&lane).await;
                }
            }
            Cut::Graceful => {
                wait_parked(&lane, &mut parked, n).await;
                drain(&lane, "the workers paused").await;
            }
        }
        if up {
            target_check(&lane, &mut lines, n).await;
        }
        if gone.load(Ordering::SeqCst) {
            up = false;
        }
        if let (Cut::Graceful, false, true) = (cut, stopping, up) {
            inc(&lane.stats.cut_graceful, 1);
            // A second connect to a linked peer is refused and leaves the link as it was.
            match lane.engine.connect(&lane.target, CONNECT_TIMEOUT).await {
                Err(Error::AlreadyConnected { .. }) => {}
                Ok(_) => lane.violation("a second connect to a linked peer succeeded".into()),
                Err(e) => lane.violation(format!(
                    "a second connect to a linked peer failed with {e} instead of ALREADY_CONNECTED"
                )),
            }
            if lane.peer().is_some_and(|p| !p.is_connected()) {
                lane.violation("a refused second connect took the link down".into());
            }
            disconnect(&lane).await;
            up = connect(&lane).await;
        }
        for w in 0..lane.workers {
            let mut m = lane.model(w);
            for s in &mut m.remote {
                s.segs.settle();
            }
            m.local_tainted = [false; LOCAL_SLOTS];
        }
        lane.epoch.fetch_add(1, Ordering::Relaxed);
        lane.cutting.store(false, Ordering::SeqCst);
        if stopping || !up {
            lane.phase.send_replace(Phase::Stop);
            return;
        }
        n += 1;
        lane.phase.send_replace(Phase::Run(n));
    }
}

/// Runs every lane: spawns its workers and its cycle controller, and waits until they end.
/// Returns the workers' scratch buffers, so that the memory figures at the end are not
/// lowered by their release.
pub(super) async fn drive(
    a: &Args,
    plan: &Plan,
    lanes: &[Arc<Lane>],
    receivers: Vec<mpsc::UnboundedReceiver<String>>,
    stop_at: tokio::time::Instant,
    gone: &Arc<AtomicBool>,
    v: &Violations,
) -> Vec<Vec<u8>> {
    let seed = plan.seed;
    let mut controllers = Vec::new();
    let mut workers = Vec::new();
    for (lane, lines) in lanes.iter().zip(receivers) {
        let (ptx, prx) = mpsc::unbounded_channel();
        for id in 0..a.workers {
            let w = Worker {
                lane: lane.clone(),
                id,
                rng: Rng::new(seed ^ mix((lane.index * 1000 + id + 1) as u64)),
                // Non-zero, so that every page is resident before the warm-up ends.
                scratch: vec![0x5Au8; plan.slot_len as usize],
                junk: 0x5A,
                seq: 0,
                steps: 0,
            };
            workers.push(tokio::spawn(w.run(ptx.clone())));
        }
        controllers.push(tokio::spawn(controller(
            lane.clone(),
            prx,
            lines,
            Rng::new(seed ^ mix(0xC0DE + lane.index as u64)),
            stop_at,
            Duration::from_secs_f64(a.cycle),
            gone.clone(),
        )));
    }
    // Each controller's waits are bounded; this only guards against a bug in this command.
    let bound = Duration::from_secs_f64(a.duration) + Duration::from_secs(600);
    for c in controllers {
        if tokio::time::timeout(bound, c).await.is_err() {
            v.add(format!("a cycle controller did not end within {bound:?}"));
        }
    }
    let mut scratch = Vec::new();
    for (i, w) in workers.into_iter().enumerate() {
        match tokio::time::timeout(PARK, w).await {
            Ok(Ok(buf)) => scratch.push(buf),
            Ok(Err(e)) => v.add(format!("worker {i} failed: {e}")),
            Err(_) => v.add(format!("worker {i} did not stop within {PARK:?}")),
        }
    }
    scratch
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_parse() {
        let l = "SOAK tag=tcp SYNC n=3 seq_received=10 verified=2";
        assert_eq!(field(l, "n"), Some(3));
        assert_eq!(field(l, "seq_received"), Some(10));
        assert_eq!(field(l, "missing"), None);
    }
}
