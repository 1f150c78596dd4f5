//! The target process of `hixl soak` (`hixl soak-serve`): exports a pool region and a heap
//! region, and checks what the initiator's notifies ask it to check.

use std::collections::HashMap;
use std::io::Write as _;
use std::time::Duration;

use futures::StreamExt;
use hixl::{Access, HostBuffer, Region};
use hixl_cli::fail;

use super::pattern::{check, fill};
use super::{hex, touch, MAX_CHECK, REGIONS};
use crate::util::{parse_size, CliResult};

/// Arguments of the hidden `hixl soak-serve` (the target of `hixl soak`).
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Bytes of each of the two regions.
    #[arg(long, value_parser = parse_size)]
    pub mem: u64,
    /// Largest range one check covers (its buffer is allocated up front).
    #[arg(long, value_parser = parse_size)]
    pub max_check: u64,
}

#[derive(Default)]
struct SeqState {
    last: u64,
    received: u64,
    out_of_order: u64,
}

#[derive(Default)]
struct LaneCheck {
    verified: u64,
    verified_bytes: u64,
    mismatches: u64,
}

/// At most this many distinct sequence tags are tracked (the peer chooses them).
const MAX_TAGS: usize = 1024;

fn say(line: String) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn valid_tag(t: &str) -> bool {
    !t.is_empty()
        && t.len() <= 32
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_')
}

struct Serve {
    regions: [Region; 2],
    seqs: HashMap<String, SeqState>,
    checks: HashMap<String, LaneCheck>,
    bad: u64,
    buf: Vec<u8>,
}

impl Serve {
    fn bad(&mut self, what: String) {
        self.bad += 1;
        say(format!("SOAK tag=? BAD {what}"));
    }

    fn seq(&mut self, msg: &str) {
        let f: Vec<&str> = msg.split_whitespace().collect();
        let (Some(&tag), Some(Ok(seq))) = (f.first(), f.get(1).map(|s| s.parse::<u64>())) else {
            return self.bad(format!("sequence notify {msg:?}"));
        };
        if !valid_tag(tag) || (!self.seqs.contains_key(tag) && self.seqs.len() >= MAX_TAGS) {
            return self.bad(format!("sequence tag {tag:?}"));
        }
        let lane = tag.split('.').next().unwrap_or(tag).to_string();
        let s = self.seqs.entry(tag.to_string()).or_default();
        s.received += 1;
        if seq <= s.last {
            s.out_of_order += 1;
            say(format!(
                "SOAK tag={lane} SEQ-ORDER {tag} sent {seq} arrived after {}",
                s.last
            ));
        }
        s.last = s.last.max(seq);
    }

    fn verify(&mut self, msg: &str) {
        let f: Vec<&str> = msg.split_whitespace().collect();
        let nums: Vec<u64> = f.iter().skip(1).filter_map(|x| x.parse().ok()).collect();
        let (Some(&lane), &[region, pos, len, gen]) = (f.first(), &nums[..]) else {
            return self.bad(format!("verify notify {msg:?}"));
        };
        if !valid_tag(lane) || region > 1 || len == 0 || len > self.buf.len() as u64 {
            return self.bad(format!("verify notify {msg:?}"));
        }
        if !self.checks.contains_key(lane) && self.checks.len() >= MAX_TAGS {
            return self.bad(format!("verify tag {lane:?}"));
        }
        let r = region as u8;
        let buf = &mut self.buf[..len as usize];
        if let Err(e) = self.regions[r as usize].read_at(pos, buf) {
            return self.bad(format!("verify range {msg:?}: {e}"));
        }
        let buf = &self.buf[..len as usize];
        let c = self.checks.entry(lane.to_string()).or_default();
        c.verified += 1;
        match check(buf, gen, r, pos) {
            None => c.verified_bytes += len,
            Some(i) => {
                c.mismatches += 1;
                let at = pos + i as u64;
                let got = &buf[i..(i + 8).min(buf.len())];
                let mut want = vec![0u8; got.len()];
                fill(&mut want, gen, r, at);
                say(format!(
                    "SOAK tag={lane} MISMATCH {} bytes at {}+{pos:#x} written by generation {gen}: first bad byte at +{at:#x}: got {} want {} (a notify sent after the WRITE completed arrived before its bytes, or they were overwritten)",
                    len,
                    REGIONS[r as usize],
                    hex(got),
                    hex(&want)
                ));
            }
        }
    }

    fn sync(&mut self, msg: &str) {
        let f: Vec<&str> = msg.split_whitespace().collect();
        let (Some(&lane), Some(Ok(n))) = (f.first(), f.get(1).map(|s| s.parse::<u64>())) else {
            return self.bad(format!("sync notify {msg:?}"));
        };
        if !valid_tag(lane) {
            return self.bad(format!("sync tag {lane:?}"));
        }
        let prefix = format!("{lane}.");
        let (mut received, mut out_of_order) = (0, 0);
        for (_, s) in self.seqs.iter().filter(|(t, _)| t.starts_with(&prefix)) {
            received += s.received;
            out_of_order += s.out_of_order;
        }
        let c = self.checks.get(lane);
        say(format!(
            "SOAK tag={lane} SYNC n={n} seq_received={received} seq_out_of_order={out_of_order} verified={} verified_bytes={} mismatches={} bad={}",
            c.map_or(0, |c| c.verified),
            c.map_or(0, |c| c.verified_bytes),
            c.map_or(0, |c| c.mismatches),
            self.bad
        ));
    }
}

/// Runs the target of `hixl soak` until its standard input closes.
pub async fn serve(a: ServeArgs) -> CliResult {
    if a.mem == 0 || a.mem > (16 << 30) {
        return Err(fail!("--mem must be 1..=16G, got {}", a.mem));
    }
    if a.max_check == 0 || a.max_check > MAX_CHECK {
        return Err(fail!("--max-check must be 1..=64M, got {}", a.max_check));
    }
    let mut stop = crate::stop::Stop::install()?;
    let engine = crate::serve::builder_for("127.0.0.1:0").build().await?;
    let pool = engine.register_pooled(a.mem, Access::REMOTE_RW, Some(REGIONS[0]))?;
    let heap = engine.register_with(
        HostBuffer::zeroed(a.mem as usize)?,
        Access::REMOTE_RW,
        Some(REGIONS[1]),
    )?;
    touch(&pool)?;
    touch(&heap)?;
    say(format!(
        "READY engine={} pid={}",
        engine.local_engine(),
        std::process::id()
    ));
    let (quit_tx, mut quit) = tokio::sync::mpsc::channel::<()>(1);
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
        let _ = quit_tx.blocking_send(());
    });
    let mut s = Serve {
        regions: [pool, heap],
        seqs: HashMap::new(),
        checks: HashMap::new(),
        bad: 0,
        buf: vec![0x5A; a.max_check as usize],
    };
    let mut notes = engine.notifications();
    loop {
        tokio::select! {
            n = notes.next() => {
                let Some(n) = n else { break };
                let msg = String::from_utf8_lossy(&n.msg);
                match &n.name[..] {
                    b"soak.seq" => s.seq(&msg),
                    b"soak.verify" => s.verify(&msg),
                    b"soak.sync" => s.sync(&msg),
                    other => {
                        let other = String::from_utf8_lossy(other).to_string();
                        s.bad(format!("notify name {other:?}"));
                    }
                }
            }
            _ = quit.recv() => break,
            _ = stop.recv() => break,
        }
    }
    engine.shutdown(Duration::from_secs(1)).await;
    Ok(())
}
