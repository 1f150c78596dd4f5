//! `hixl kv-serve`: the peer cluster `bench kv` starts, one prefill group of TP ranks or one
//! cluster, serving its caches until stdin closes.

use std::io::Write;
use std::time::Duration;

use hixl::datadist::models::{by_name, ModelGeometry};
use hixl::datadist::{BlocksCacheKey, Cache, LlmDataDist, LlmRole};

use super::common::{allocate, cli, layout, ServeArgs};
use crate::util::CliResult;

/// Runs the peer cluster until its standard input closes.
pub async fn serve(a: ServeArgs) -> CliResult {
    let m = by_name(&a.model).map_err(cli)?;
    if let Some(tp) = a.tp {
        return serve_group(&a, &m, tp).await;
    }
    let mut dd = LlmDataDist::new(1, LlmRole::Decoder);
    dd.initialize(&[
        ("llm.ListenIpInfo", "127.0.0.1:0"),
        ("hixl.Transport", &a.transport),
    ])
    .await
    .map_err(cli)?;
    let caches = allocate(
        &dd,
        &m,
        1,
        a.blocks,
        a.block_tokens.unwrap_or(m.block_tokens),
    )
    .await?;
    // Ended leases are only drained here: the bench's puller reports done.
    let mut ended = dd.lease_events().map_err(cli)?;
    tokio::spawn(async move { while futures::StreamExt::next(&mut ended).await.is_some() {} });
    println!(
        "READY engine={} pid={}",
        dd.listen_addr().map_err(cli)?,
        std::process::id()
    );
    std::io::stdout().flush()?;
    // Commands on stdin, one per line, until it closes: `lease <request> <ttl_ms>` leases
    // every block of every cache and answers `GRANT <json>`.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for l in std::io::BufRead::lines(std::io::stdin().lock()) {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let all: Vec<u64> = (0..a.blocks).collect();
    let refs: Vec<&Cache> = caches.iter().map(|(c, _)| c).collect();
    while let Some(l) = rx.recv().await {
        let mut w = l.split_whitespace();
        let answer = match (
            w.next(),
            w.next().map(str::parse::<u64>),
            w.next().map(str::parse::<u64>),
        ) {
            (Some("lease"), Some(Ok(req)), Some(Ok(ttl))) => {
                match dd.lease_blocks(req, &refs, &all, Duration::from_millis(ttl)) {
                    Ok(g) => format!("GRANT {}", serde_json::to_string(&g).map_err(cli)?),
                    Err(e) => format!("ERROR {e}"),
                }
            }
            _ => format!("ERROR unknown command {l:?}"),
        };
        println!("{answer}");
        std::io::stdout().flush()?;
    }
    dd.finalize().await;
    Ok(())
}

/// `kv-serve --tp N`: the N ranks of a prefill group in this process, until stdin closes.
pub(super) async fn serve_group(a: &ServeArgs, m: &ModelGeometry, tp: u32) -> CliResult {
    let bt = a.block_tokens.unwrap_or(m.block_tokens);
    let mut ranks = Vec::new();
    let mut addrs = Vec::new();
    for r in 0..tp {
        let cluster = a.cluster_base + u64::from(r);
        let mut dd = LlmDataDist::new(cluster, LlmRole::Prompt);
        dd.initialize(&[
            ("llm.ListenIpInfo", "127.0.0.1:0"),
            ("hixl.Transport", &a.transport),
        ])
        .await
        .map_err(cli)?;
        let (desc, shard) = m
            .sharded_cache(a.blocks, bt, r, tp, layout(&a.layout)?)
            .map_err(cli)?;
        let key = BlocksCacheKey {
            cluster_id: cluster,
            model_id: 0,
        };
        let c = dd.allocate_kv_cache(desc, Some(key)).await.map_err(cli)?;
        dd.set_kv_shard(c.cache_id, shard).await.map_err(cli)?;
        addrs.push(dd.listen_addr().map_err(cli)?);
        ranks.push((dd, c));
    }
    println!("READY engine={} pid={}", addrs[0], std::process::id());
    println!("RANKS {}", addrs.join(" "));
    std::io::stdout().flush()?;
    tokio::task::spawn_blocking(|| std::io::stdin().lines().count())
        .await
        .map_err(cli)?;
    for (mut dd, _) in ranks {
        dd.finalize().await;
    }
    Ok(())
}
