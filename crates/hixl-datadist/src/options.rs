//! LLM-DataDist's option keys (`llm.ListenIpInfo`, `llm.SyncKvCacheWaitTime`, ...).

use std::time::Duration;

use crate::status::{DataDistError, Result};

/// Parsed LLM-DataDist options. Keys the transfer engine understands (`llm.GlobalResourceConfig`,
/// `llm.LocalCommRes`) are passed through to it.
#[derive(Clone, Debug, PartialEq)]
pub struct DataDistOptions {
    /// `llm.ListenIpInfo` (also `llm.listenIpInfo`): `ip:port` this instance listens on. Port 0
    /// picks a free port (hixl extension).
    pub listen: String,
    /// `llm.SyncKvCacheWaitTime`: timeout of each pull/push, default 1000 ms.
    pub sync_wait: Duration,
    /// `llm.DeviceId`: accepted (one device per process); unused on hosts.
    pub device_id: Option<u32>,
    /// Options for the transfer engine (`GlobalResourceConfig`, `LocalCommRes`, `hixl.*`).
    pub engine: Vec<(String, String)>,
}

impl DataDistOptions {
    /// Parses `pairs`. Unknown keys, bad values and repeated keys are refused by name.
    ///
    /// # Errors
    /// `LLM_PARAM_INVALID` naming the key and value.
    pub fn parse(pairs: &[(&str, &str)]) -> Result<DataDistOptions> {
        let mut listen = None;
        let mut sync_wait = Duration::from_millis(1000);
        let mut device_id = None;
        let mut engine = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for &(k, v) in pairs {
            let canon = if k == "llm.listenIpInfo" {
                "llm.ListenIpInfo"
            } else {
                k
            };
            if !seen.insert(canon) {
                return Err(DataDistError::param(format!(
                    "option {k:?} given more than once"
                )));
            }
            let bad = |why: &str| DataDistError::param(format!("option {k:?} = {v:?}: {why}"));
            match canon {
                "llm.ListenIpInfo" => listen = Some(v.trim().to_string()),
                "llm.SyncKvCacheWaitTime" => {
                    let ms: i64 = v.trim().parse().map_err(|_| bad("not an integer"))?;
                    if ms <= 0 {
                        return Err(bad("must be > 0 ms"));
                    }
                    sync_wait = Duration::from_millis(ms as u64);
                }
                "llm.DeviceId" => {
                    device_id = Some(v.trim().parse().map_err(|_| bad("not a device id"))?)
                }
                "llm.TransferBackend" => {
                    if v.trim() != "hixl" {
                        return Err(bad("the only transfer backend is \"hixl\""));
                    }
                }
                "llm.GlobalResourceConfig" => {
                    engine.push(("GlobalResourceConfig".into(), v.into()))
                }
                "llm.LocalCommRes" => engine.push(("LocalCommRes".into(), v.into())),
                "llm.BufPoolCfg" | "llm.EnableSwitchRole" => {}
                k if k.starts_with("hixl.") => engine.push((k.into(), v.into())),
                _ => return Err(DataDistError::param(format!("unknown option key {k:?}"))),
            }
        }
        let listen = listen.ok_or_else(|| {
            DataDistError::param(
                "llm.ListenIpInfo is required: the hixl backend listens on both sides",
            )
        })?;
        Ok(DataDistOptions {
            listen,
            sync_wait,
            device_id,
            engine,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys() {
        let o = DataDistOptions::parse(&[
            ("llm.ListenIpInfo", "127.0.0.1:0"),
            ("llm.SyncKvCacheWaitTime", "2500"),
            ("llm.TransferBackend", "hixl"),
            ("llm.GlobalResourceConfig", "{}"),
        ])
        .unwrap();
        assert_eq!(o.sync_wait, Duration::from_millis(2500));
        assert_eq!(o.engine.len(), 1);
        for bad in [
            vec![("llm.ListenIpInfo", "x"), ("llm.SyncKvCacheWaitTime", "0")],
            vec![("llm.ListenIpInfo", "x"), ("llm.TransferBackend", "hccl")],
            vec![("llm.ListenIpInfo", "x"), ("llm.Nope", "1")],
            vec![("llm.ListenIpInfo", "x"), ("llm.listenIpInfo", "y")],
            vec![],
        ] {
            assert!(DataDistOptions::parse(&bad).is_err(), "{bad:?}");
        }
    }
}
