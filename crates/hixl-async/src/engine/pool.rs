//! The channel pool: link-count waterlines and eviction of idle links.

use std::collections::HashMap;

use hixl_core::{Error, Result};

use super::{Engine, LinkSlot};

impl Engine {
    /// Link-count marks of the channel pool: `(max, high, low)` with HIXL's rounding,
    /// `max(1, ⌊max·waterline⌋)`.
    fn pool_marks(&self) -> (usize, usize, usize) {
        let cp = &self.inner.options.global.channel_pool;
        (cp.max_channel as usize, cp.high_mark(), cp.low_mark())
    }

    /// Before a new link: when the table is full (`channel_pool.max_channel`), evict idle
    /// links; refuse with RESOURCE_EXHAUSTED if every link is busy.
    pub(super) fn make_room(&self, links: &mut HashMap<String, LinkSlot>, key: &str) -> Result<()> {
        let (max, _, low) = self.pool_marks();
        if links.len() < max {
            return Ok(());
        }
        self.evict_down_to(links, key, low.min(max - 1));
        if links.len() >= max {
            return Err(Error::ResourceExhausted {
                what: format!(
                    "{} links are open (channel_pool.max_channel = {max}) and none is idle",
                    links.len()
                ),
            });
        }
        Ok(())
    }

    /// After a new link: once the count reaches the high waterline, idle links are evicted
    /// (least recently used first) down to the low waterline. A link with an op in flight,
    /// abandoned or not, or a notify awaiting its ack, is never evicted; nor is `keep`.
    pub(super) fn evict_idle(&self, links: &mut HashMap<String, LinkSlot>, keep: &str) {
        let (_, high, low) = self.pool_marks();
        if links.len() >= high {
            self.evict_down_to(links, keep, low);
        }
    }

    fn evict_down_to(&self, links: &mut HashMap<String, LinkSlot>, keep: &str, target: usize) {
        // Dead links go first, then idle ones by age. Each link's check takes its token log
        // and then the op table, the order recording an op takes them in (holding the op table
        // across the scan would invert it).
        let mut idle: Vec<(bool, u64, String)> = links
            .iter()
            .filter_map(|(k, v)| match v {
                LinkSlot::Up(l) if k != keep && (l.state.is_dead() || !l.in_flight()) => {
                    Some((!l.state.is_dead(), l.last_used(), k.clone()))
                }
                _ => None,
            })
            .collect();
        idle.sort();
        for (_, _, k) in idle {
            if links.len() <= target {
                break;
            }
            if let Some(LinkSlot::Up(l)) = links.remove(&k) {
                tracing::info!(peer = %k, "channel pool: closing an idle link");
                l.close_because(
                    "evicted by the channel pool (idle)",
                    Error::Evicted { peer: k.clone() },
                );
            }
        }
    }
}
