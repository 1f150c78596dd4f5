//! `GlobalResourceConfig`: the JSON object of dotted keys that HIXL's `GlobalResourceConfig`
//! option carries, parsed into typed sections with HIXL's ranges and defaults.

use serde_json::Value;

use super::invalid;
use crate::error::Result;

/// `GlobalResourceConfig`: a JSON object whose keys are dotted (`"channel_pool.max_channel"`).
///
/// Values may be JSON numbers, booleans, or strings holding them (HIXL's docs show both). A
/// section may also be written as a nested object (`{"fabric_memory": {"max_capacity": 16}}`),
/// as HIXL accepts for `fabric_memory`. Unknown keys are refused.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GlobalResourceConfig {
    /// `fabric_memory.*`.
    pub fabric_memory: FabricMemory,
    /// `connect_pool.*`.
    pub connect_pool: ConnectPool,
    /// `channel_pool.*`.
    pub channel_pool: ChannelPool,
    /// `comm_resource_config.*`.
    pub comm_resource_config: CommResourceConfig,
    /// `local_comm_res_path`: a file holding `LocalCommRes` (the inline option wins). Non-empty.
    pub local_comm_res_path: Option<String>,
    /// `topo_file_path`: hardware topology file for auto-generated `LocalCommRes`; empty is unset.
    pub topo_file_path: Option<String>,
}

/// `fabric_memory.*`: the FabricMem VA window and copy streams.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FabricMemory {
    /// `fabric_memory.max_capacity`: window size in TB, (0, 1024], default 32.
    pub max_capacity_tb: u32,
    /// `fabric_memory.start_address`: window start in TB, [0, 1024], default 40.
    pub start_address_tb: u32,
    /// `fabric_memory.task_stream_num`: streams per task, [1, 8], default 1; must be 1 while
    /// `enable_aicpu_unfold` is on (HIXL's rule).
    pub task_stream_num: u32,
    /// `fabric_memory.enable_aicpu_unfold`: AICPU unfolds the copies, default true.
    pub enable_aicpu_unfold: bool,
}

impl Default for FabricMemory {
    fn default() -> Self {
        FabricMemory {
            max_capacity_tb: 32,
            start_address_tb: 40,
            task_stream_num: 1,
            enable_aicpu_unfold: true,
        }
    }
}

/// `connect_pool.*`: the background connect executor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectPool {
    /// `connect_pool.thread_num`: [1, 64], default 2.
    pub thread_num: u32,
    /// `connect_pool.task_queue_capacity`: [1, 65535], default 128.
    pub task_queue_capacity: u32,
}

impl Default for ConnectPool {
    fn default() -> Self {
        ConnectPool {
            thread_num: 2,
            task_queue_capacity: 128,
        }
    }
}

/// `channel_pool.*`: link count limit and eviction waterlines.
#[derive(Clone, Debug, PartialEq)]
pub struct ChannelPool {
    /// `channel_pool.max_channel`: (0, 512], default 512.
    pub max_channel: u32,
    /// `channel_pool.high_waterline`: in (0, 1). HIXL documents no default; hixl uses 0.9.
    /// Must be given together with `low_waterline`.
    pub high_waterline: f64,
    /// `channel_pool.low_waterline`: in (0, 1), below `high_waterline`. HIXL documents no
    /// default; hixl uses 0.7.
    pub low_waterline: f64,
    /// Whether any `channel_pool.*` key was given. As in HIXL, a configured channel pool also
    /// connects lazily inside transfers (like `AutoConnect`). The link limit applies always.
    pub configured: bool,
}

impl Default for ChannelPool {
    fn default() -> Self {
        ChannelPool {
            max_channel: 512,
            high_waterline: 0.9,
            low_waterline: 0.7,
            configured: false,
        }
    }
}

impl ChannelPool {
    /// Link count at which eviction starts: `max(1, floor(max_channel * high_waterline))`.
    pub fn high_mark(&self) -> usize {
        mark(self.max_channel, self.high_waterline)
    }

    /// Link count eviction goes down to: `max(1, floor(max_channel * low_waterline))`.
    pub fn low_mark(&self) -> usize {
        mark(self.max_channel, self.low_waterline)
    }
}

fn mark(max: u32, fraction: f64) -> usize {
    let m = (f64::from(max) * fraction).floor();
    if m >= 1.0 {
        m as usize
    } else {
        1
    }
}

/// `comm_resource_config.*`: device communication resources (HIXL-CS mode).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommResourceConfig {
    /// `comm_resource_config.listen_port`: device NIC listen port, [1, 65535]. `None`: HIXL uses
    /// 16666 on A2/A3 and picks one on 950.
    pub listen_port: Option<u16>,
    /// `comm_resource_config.max_active_channels`: [1, 8192] (HIXL's limit), default 128.
    pub max_active_channels: u32,
    /// `comm_resource_config.protocol_desc`: `"protocol:placement"` entries, each one of
    /// [`PROTOCOL_DESCS`]. Empty when not configured.
    pub protocol_desc: Vec<String>,
    /// `comm_resource_config.qos`: 0–7.
    pub qos: Option<u8>,
}

impl Default for CommResourceConfig {
    fn default() -> Self {
        CommResourceConfig {
            listen_port: None,
            max_active_channels: 128,
            protocol_desc: Vec::new(),
            qos: None,
        }
    }
}

/// The `comm_resource_config.protocol_desc` entries HIXL accepts.
#[rustfmt::skip]
pub const PROTOCOL_DESCS: &[&str] = &[
    "roce:device", "hccs:device", "ub_ctp:device", "uboe:device", "ub_rtp:device",
    "roce:host", "ub_ctp:host",
];

const PROTOCOLS: &[&str] = &["roce", "hccs", "ub_ctp", "uboe", "ub_rtp"];
const SECTIONS: &[&str] = &[
    "fabric_memory",
    "connect_pool",
    "channel_pool",
    "comm_resource_config",
];

/// An integer key inside `GlobalResourceConfig`.
struct JsonUint {
    key: &'static str,
    min: u64,
    max: u64,
    store: fn(&mut GlobalResourceConfig, u64),
}

#[rustfmt::skip]
const JSON_UINTS: &[JsonUint] = &[
    JsonUint { key: "fabric_memory.max_capacity", min: 1, max: 1024,
        store: |g, v| g.fabric_memory.max_capacity_tb = v as u32 },
    JsonUint { key: "fabric_memory.start_address", min: 0, max: 1024,
        store: |g, v| g.fabric_memory.start_address_tb = v as u32 },
    JsonUint { key: "fabric_memory.task_stream_num", min: 1, max: 8,
        store: |g, v| g.fabric_memory.task_stream_num = v as u32 },
    JsonUint { key: "connect_pool.thread_num", min: 1, max: 64,
        store: |g, v| g.connect_pool.thread_num = v as u32 },
    JsonUint { key: "connect_pool.task_queue_capacity", min: 1, max: 65535,
        store: |g, v| g.connect_pool.task_queue_capacity = v as u32 },
    JsonUint { key: "channel_pool.max_channel", min: 1, max: 512,
        store: |g, v| g.channel_pool.max_channel = v as u32 },
    JsonUint { key: "comm_resource_config.listen_port", min: 1, max: 65535,
        store: |g, v| g.comm_resource_config.listen_port = Some(v as u16) },
    JsonUint { key: "comm_resource_config.max_active_channels", min: 1, max: 8192,
        store: |g, v| g.comm_resource_config.max_active_channels = v as u32 },
    JsonUint { key: "comm_resource_config.qos", min: 0, max: 7,
        store: |g, v| g.comm_resource_config.qos = Some(v as u8) },
];

impl GlobalResourceConfig {
    /// Parses the `GlobalResourceConfig` option value. Empty (or blank) gives the defaults.
    ///
    /// # Errors
    /// [`Error::InvalidOption`](crate::error::Error::InvalidOption) with key
    /// `GlobalResourceConfig`, whose reason names the inner key and value: bad JSON, a non-object,
    /// an unknown key, a wrong type, a value out of range.
    pub fn parse(s: &str) -> Result<Self> {
        Self::parse_str(s.trim()).map_err(|reason| invalid("GlobalResourceConfig", s, reason))
    }

    pub(super) fn parse_str(s: &str) -> Result<Self, String> {
        let mut cfg = Self::default();
        if s.is_empty() {
            return Ok(cfg);
        }
        let json: Value = serde_json::from_str(s).map_err(|e| format!("not valid JSON: {e}"))?;
        let Value::Object(top) = json else {
            return Err(format!("must be a JSON object, got {}", kind(&json)));
        };
        let mut flat: Vec<(String, &Value)> = Vec::new();
        for (k, v) in &top {
            match v {
                Value::Object(inner) if SECTIONS.contains(&k.as_str()) => {
                    flat.extend(inner.iter().map(|(ik, iv)| (format!("{k}.{ik}"), iv)));
                }
                _ => flat.push((k.clone(), v)),
            }
        }
        let (mut high, mut low) = (None, None);
        cfg.channel_pool.configured = flat.iter().any(|(k, _)| k.starts_with("channel_pool."));
        for (i, (k, v)) in flat.iter().enumerate() {
            if flat.iter().take(i).any(|(p, _)| p == k) {
                return Err(format!("key {k:?} given more than once"));
            }
            if let Some(spec) = JSON_UINTS.iter().find(|s| s.key == k) {
                (spec.store)(&mut cfg, json_uint(k, v, spec.min, spec.max)?);
                continue;
            }
            match k.as_str() {
                "fabric_memory.enable_aicpu_unfold" => {
                    cfg.fabric_memory.enable_aicpu_unfold = json_bool(k, v)?;
                }
                "channel_pool.high_waterline" => high = Some(json_fraction(k, v)?),
                "channel_pool.low_waterline" => low = Some(json_fraction(k, v)?),
                "comm_resource_config.protocol_desc" => {
                    cfg.comm_resource_config.protocol_desc = protocol_desc(k, v)?;
                }
                "local_comm_res_path" => {
                    let path = json_string(k, v)?;
                    if path.is_empty() {
                        return Err(format!("{k:?} must be a non-empty file path"));
                    }
                    cfg.local_comm_res_path = Some(path);
                }
                "topo_file_path" => {
                    cfg.topo_file_path = Some(json_string(k, v)?).filter(|p| !p.is_empty())
                }
                _ => return Err(format!("unknown key {k:?}")),
            }
        }
        match (high, low) {
            (None, None) => {}
            (Some(h), Some(l)) if l < h => {
                cfg.channel_pool.high_waterline = h;
                cfg.channel_pool.low_waterline = l;
            }
            (Some(h), Some(l)) => {
                let (lk, hk) = ("channel_pool.low_waterline", "channel_pool.high_waterline");
                return Err(format!("{lk:?} = {l} must be less than {hk:?} = {h}"));
            }
            _ => {
                let msg = "\"channel_pool.high_waterline\" and \"channel_pool.low_waterline\"";
                return Err(format!("{msg} must be given together"));
            }
        }
        let fm = &cfg.fabric_memory;
        if fm.enable_aicpu_unfold && fm.task_stream_num != 1 {
            let n = fm.task_stream_num;
            return Err(format!(
                "\"fabric_memory.task_stream_num\" = {n} needs \
                 \"fabric_memory.enable_aicpu_unfold\" = false (AICPU unfold uses one stream)"
            ));
        }
        Ok(cfg)
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn json_uint(k: &str, v: &Value, min: u64, max: u64) -> Result<u64, String> {
    let n: Option<i128> = match v {
        Value::Number(n) => n
            .as_u64()
            .map(i128::from)
            .or_else(|| n.as_i64().map(i128::from)),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    };
    let n = n.ok_or_else(|| format!("{k:?} must be an integer, got {v}"))?;
    if n < i128::from(min) || n > i128::from(max) {
        return Err(format!("{k:?} = {v} is out of range [{min}, {max}]"));
    }
    u64::try_from(n).map_err(|_| format!("{k:?} = {v} is out of range [{min}, {max}]"))
}

fn json_bool(k: &str, v: &Value) -> Result<bool, String> {
    match v {
        Value::Bool(b) => return Ok(*b),
        Value::Number(n) if n.as_u64() == Some(0) => return Ok(false),
        Value::Number(n) if n.as_u64() == Some(1) => return Ok(true),
        Value::String(s) => match s.trim().to_ascii_lowercase().as_str() {
            "true" | "1" => return Ok(true),
            "false" | "0" => return Ok(false),
            _ => {}
        },
        _ => {}
    }
    Err(format!("{k:?} must be a boolean, got {v}"))
}

fn json_fraction(k: &str, v: &Value) -> Result<f64, String> {
    let x = match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse::<f64>().ok(),
        _ => None,
    };
    match x {
        Some(x) if x > 0.0 && x < 1.0 => Ok(x),
        _ => Err(format!("{k:?} must be a number in (0, 1), got {v}")),
    }
}

fn json_string(k: &str, v: &Value) -> Result<String, String> {
    match v {
        Value::String(s) => Ok(s.trim().to_owned()),
        _ => Err(format!("{k:?} must be a string, got {v}")),
    }
}

fn protocol_desc(k: &str, v: &Value) -> Result<Vec<String>, String> {
    let items: Vec<&Value> = match v {
        Value::String(_) => vec![v],
        Value::Array(a) => a.iter().collect(),
        _ => {
            return Err(format!(
                "{k:?} must be a string or a list of strings, got {v}"
            ))
        }
    };
    items
        .into_iter()
        .map(|item| {
            let p = json_string(k, item)?;
            if PROTOCOL_DESCS.contains(&p.as_str()) {
                return Ok(p);
            }
            let why = match p.split_once(':') {
                None => "expected \"protocol:placement\"",
                Some((proto, _)) if !PROTOCOLS.contains(&proto) => "unknown protocol",
                Some((_, "device" | "host")) => {
                    "this protocol/placement combination is not supported"
                }
                Some(_) => "placement must be device or host",
            };
            Err(format!(
                "{k:?} entry {p:?}: {why}; allowed: {}",
                PROTOCOL_DESCS.join(", ")
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use proptest::prelude::*;

    fn global(json: &str) -> GlobalResourceConfig {
        GlobalResourceConfig::parse(json).unwrap()
    }

    /// The reason of the `InvalidOption` that parsing `json` gives.
    fn reason(json: &str) -> String {
        match GlobalResourceConfig::parse(json) {
            Err(Error::InvalidOption { key, value, reason }) => {
                assert_eq!(
                    (key.as_str(), value.as_str()),
                    ("GlobalResourceConfig", json)
                );
                reason
            }
            other => panic!("{json}: expected InvalidOption, got {other:?}"),
        }
    }

    #[test]
    fn defaults_match_hixl() {
        let g = GlobalResourceConfig::default();
        let fm = FabricMemory {
            max_capacity_tb: 32,
            start_address_tb: 40,
            task_stream_num: 1,
            enable_aicpu_unfold: true,
        };
        assert_eq!(g.fabric_memory, fm);
        assert_eq!(
            g.connect_pool,
            ConnectPool {
                thread_num: 2,
                task_queue_capacity: 128
            }
        );
        assert_eq!(g.channel_pool.max_channel, 512);
        let c = &g.comm_resource_config;
        assert_eq!(
            (c.listen_port, c.max_active_channels, c.qos),
            (None, 128, None)
        );
        assert!(c.protocol_desc.is_empty());
        assert_eq!(
            (
                g.local_comm_res_path.as_deref(),
                g.topo_file_path.as_deref()
            ),
            (None, None)
        );
        assert_eq!(global(""), g);
        assert_eq!(global("  {}  "), g);
    }

    #[test]
    fn dotted_keys_numbers_and_strings() {
        let g = global(
            r#"{"fabric_memory.max_capacity": 16, "fabric_memory.start_address": "0",
            "fabric_memory.enable_aicpu_unfold": "false", "fabric_memory.task_stream_num": 8,
            "connect_pool.thread_num": "64", "connect_pool.task_queue_capacity": 65535,
            "channel_pool.max_channel": "10", "channel_pool.high_waterline": "0.3",
            "channel_pool.low_waterline": 0.1, "comm_resource_config.listen_port": 26666,
            "comm_resource_config.max_active_channels": "8192", "comm_resource_config.qos": 7,
            "comm_resource_config.protocol_desc": ["roce:device", "ub_ctp:host"],
            "local_comm_res_path": "/tmp/lcr.json", "topo_file_path": ""}"#,
        );
        let fm = FabricMemory {
            max_capacity_tb: 16,
            start_address_tb: 0,
            task_stream_num: 8,
            enable_aicpu_unfold: false,
        };
        assert_eq!(g.fabric_memory, fm);
        assert_eq!(
            g.connect_pool,
            ConnectPool {
                thread_num: 64,
                task_queue_capacity: 65535
            }
        );
        let cp = ChannelPool {
            max_channel: 10,
            high_waterline: 0.3,
            low_waterline: 0.1,
            configured: true,
        };
        assert_eq!(g.channel_pool, cp);
        let c = &g.comm_resource_config;
        assert_eq!(
            (c.listen_port, c.max_active_channels, c.qos),
            (Some(26666), 8192, Some(7))
        );
        assert_eq!(c.protocol_desc, ["roce:device", "ub_ctp:host"]);
        assert_eq!(g.local_comm_res_path.as_deref(), Some("/tmp/lcr.json"));
        assert_eq!(g.topo_file_path, None);
        let nested = r#"{"fabric_memory": {"max_capacity": 64, "enable_aicpu_unfold": true},
            "comm_resource_config.protocol_desc": "hccs:device", "topo_file_path": "/t.json"}"#;
        let g = global(nested);
        assert_eq!(g.fabric_memory.max_capacity_tb, 64);
        assert_eq!(g.comm_resource_config.protocol_desc, ["hccs:device"]);
        assert_eq!(g.topo_file_path.as_deref(), Some("/t.json"));
    }

    #[test]
    fn bad_values_name_the_inner_key_and_value() {
        #[rustfmt::skip]
        let cases = [
            (r#"{"fabric_memory.foo": 1}"#, r#"unknown key "fabric_memory.foo""#),
            (r#"{"fabric_memory": {"foo": 1}}"#, r#"unknown key "fabric_memory.foo""#),
            (r#"{"fabric_memory.max_capacity": 0}"#, r#""fabric_memory.max_capacity" = 0 is out of range"#),
            (r#"{"fabric_memory.max_capacity": "1025"}"#, r#""fabric_memory.max_capacity" = "1025" is out"#),
            (r#"{"connect_pool.thread_num": -1}"#, r#""connect_pool.thread_num" = -1 is out of range"#),
            (r#"{"channel_pool.max_channel": 8.5}"#, r#""channel_pool.max_channel" must be an integer, got 8.5"#),
            (r#"{"channel_pool.max_channel": "a"}"#, r#""channel_pool.max_channel" must be an integer"#),
            (r#"{"channel_pool.max_channel": [1]}"#, r#""channel_pool.max_channel" must be an integer"#),
            (r#"{"comm_resource_config.listen_port": 65536}"#, "out of range [1, 65535]"),
            (r#"{"comm_resource_config.qos": 8}"#, r#""comm_resource_config.qos" = 8"#),
            (r#"{"comm_resource_config.max_active_channels": 8193}"#, "out of range [1, 8192]"),
            (r#"{"fabric_memory.enable_aicpu_unfold": "yes"}"#, r#"must be a boolean, got "yes""#),
            (r#"{"fabric_memory.task_stream_num": 2}"#, "enable_aicpu_unfold"),
            (r#"{"channel_pool.high_waterline": 1, "channel_pool.low_waterline": 0.1}"#, "(0, 1), got 1"),
            (r#"{"channel_pool.high_waterline": 0.5, "channel_pool.low_waterline": "0"}"#, r#"got "0""#),
            (r#"{"channel_pool.high_waterline": 0.5, "channel_pool.low_waterline": 0.5}"#, "less than"),
            (r#"{"channel_pool.high_waterline": "NaN", "channel_pool.low_waterline": 0.1}"#, "(0, 1)"),
            (r#"{"channel_pool.high_waterline": 0.5}"#, "given together"),
            (r#"{"comm_resource_config.protocol_desc": "hccs:host"}"#, r#""hccs:host": this protocol/"#),
            (r#"{"comm_resource_config.protocol_desc": ["roce:device", "tcp:host"]}"#, "unknown protocol"),
            (r#"{"comm_resource_config.protocol_desc": "roce:nic"}"#, "placement must be"),
            (r#"{"comm_resource_config.protocol_desc": "roce"}"#, "protocol:placement"),
            (r#"{"comm_resource_config.protocol_desc": 5}"#, "string or a list"),
            (r#"{"local_comm_res_path": ""}"#, "non-empty"),
            (r#"{"local_comm_res_path": 1}"#, "must be a string"),
            (r#"{"fabric_memory.max_capacity": 1, "fabric_memory": {"max_capacity": 2}}"#, "more than once"),
            ("[1, 2]", "must be a JSON object, got an array"),
            ("{", "not valid JSON"),
        ];
        for (json, want) in cases {
            let reason = reason(json);
            assert!(reason.contains(want), "{json}: {reason}");
        }
    }

    #[test]
    fn waterline_marks() {
        let pool = |max, high, low| ChannelPool {
            max_channel: max,
            high_waterline: high,
            low_waterline: low,
            configured: true,
        };
        let p = pool(10, 0.3, 0.1);
        assert_eq!(
            (p.high_mark(), p.low_mark()),
            (3, 1),
            "HIXL's documented example"
        );
        let p = pool(10, 0.05, 0.01);
        assert_eq!((p.high_mark(), p.low_mark()), (1, 1));
        let p = ChannelPool::default();
        assert_eq!((p.high_mark(), p.low_mark()), (460, 358));
        assert_eq!(pool(1, 0.99, 0.5).high_mark(), 1);
    }

    fn inner_keys() -> Vec<&'static str> {
        let others = [
            "fabric_memory.enable_aicpu_unfold",
            "channel_pool.high_waterline",
            "channel_pool.low_waterline",
            "comm_resource_config.protocol_desc",
            "local_comm_res_path",
            "topo_file_path",
            "fabric_memory",
            "channel_pool",
        ];
        JSON_UINTS.iter().map(|s| s.key).chain(others).collect()
    }

    proptest! {
        #[test]
        fn never_panics(s in any::<String>()) {
            let _ = GlobalResourceConfig::parse(&s);
        }

        #[test]
        fn never_panics_on_json_like_values(
            key in prop::sample::select(inner_keys()),
            value in concat!(
                "-?[0-9]{1,25}(\\.[0-9]{0,3})?(e-?[0-9]{1,3})?|\"[ -~]{0,12}\"|true|false|null",
                "|\\[\\]|\\{\"[a-z_]{0,12}\": ?[0-9]{0,3}\\}|\\[\"[a-z_:]{0,12}\"\\]",
            ),
        ) {
            let _ = GlobalResourceConfig::parse(&format!("{{\"{key}\": {value}}}"));
        }
    }
}
