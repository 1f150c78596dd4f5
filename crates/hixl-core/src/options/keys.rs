//! The keys of the options: each key's parsing and validation, and the building of options
//! from key/value pairs.

use serde_json::Value;

use super::size::{parse_size, parse_uint};
use super::{
    invalid, BufferPool, GlobalResourceConfig, Options, TcpIo, TransportChoice,
    DEFAULT_SERVICE_LEVEL, DEFAULT_TRAFFIC_CLASS, GIB, MIN_SECRET,
};
use crate::error::{Error, Result};

/// An integer-valued top-level key: its range, how it is parsed and where the value goes.
struct UintKey {
    key: &'static str,
    min: u64,
    max: u64,
    multiple_of: u64,
    /// Accepts `K`/`M`/`G` suffixes ([`parse_size`]).
    size: bool,
    /// What an empty value means (HIXL treats an empty RDMA value as unset).
    empty: Option<u64>,
    store: fn(&mut Options, u64),
}

#[rustfmt::skip]
const UINT_KEYS: &[UintKey] = &[
    UintKey { key: "RdmaTrafficClass", min: 0, max: 255, multiple_of: 4, size: false,
        empty: Some(DEFAULT_TRAFFIC_CLASS), store: |o, v| o.rdma_traffic_class = v as u8 },
    UintKey { key: "RdmaServiceLevel", min: 0, max: 7, multiple_of: 1, size: false,
        empty: Some(DEFAULT_SERVICE_LEVEL), store: |o, v| o.rdma_service_level = v as u8 },
    UintKey { key: "hixl.TcpStreams", min: 1, max: 16, multiple_of: 1, size: false,
        empty: None, store: |o, v| o.tcp_streams = v as usize },
    UintKey { key: "hixl.TcpChunkBytes", min: 4096, max: GIB, multiple_of: 1, size: true,
        empty: None, store: |o, v| o.tcp_chunk_bytes = v },
    UintKey { key: "hixl.HeartbeatIntervalMs", min: 10, max: 600_000, multiple_of: 1, size: false,
        empty: None, store: |o, v| o.heartbeat_interval_ms = v },
    UintKey { key: "hixl.HeartbeatMissLimit", min: 1, max: 100, multiple_of: 1, size: false,
        empty: None, store: |o, v| o.heartbeat_miss_limit = v as u32 },
    UintKey { key: "hixl.HeartbeatIdleMs", min: 0, max: 3_600_000, multiple_of: 1, size: false,
        empty: None, store: |o, v| o.heartbeat_idle_ms = v },
    UintKey { key: "hixl.FabricBusyPollUs", min: 0, max: 10_000, multiple_of: 1, size: false,
        empty: None, store: |o, v| o.fabric_busy_poll_us = v },
    UintKey { key: "hixl.SpinUs", min: 0, max: 1_000_000, multiple_of: 1, size: false,
        empty: None, store: |o, v| o.spin_us = v },
    UintKey { key: "hixl.VerbsPort", min: 1, max: 255, multiple_of: 1, size: false,
        empty: None, store: |o, v| o.verbs_port = v as u8 },
    UintKey { key: "hixl.VerbsTimeout", min: 1, max: 31, multiple_of: 1, size: false,
        empty: None, store: |o, v| o.verbs_timeout = v as u8 },
    UintKey { key: "hixl.VerbsQpsPerRail", min: 1, max: 16, multiple_of: 1, size: false,
        empty: None, store: |o, v| o.verbs_qps_per_rail = v as u8 },
    UintKey { key: "hixl.VerbsSliceBytes", min: 4096, max: GIB, multiple_of: 1, size: true,
        empty: None, store: |o, v| o.verbs_slice_bytes = v },
    UintKey { key: "hixl.DirectoryTtlSec", min: 2, max: 3600, multiple_of: 1, size: false,
        empty: None, store: |o, v| o.directory.ttl_sec = v },
    UintKey { key: "hixl.VerbsRetryCount", min: 0, max: 7, multiple_of: 1, size: false,
        empty: None, store: |o, v| o.verbs_retry_count = v as u8 },
];

/// ADXL spellings and the HIXL key each one stands for.
const ALIASES: &[(&str, &str)] = &[
    ("adxl.BufferPool", "BufferPool"),
    ("adxl.RdmaTrafficClass", "RdmaTrafficClass"),
    ("adxl.RdmaServiceLevel", "RdmaServiceLevel"),
    ("adxl.LocalCommRes", "LocalCommRes"),
];

/// The key `key` stands for (itself, or the HIXL key of an ADXL alias); `None` if unknown.
fn canonical(key: &str) -> Option<&'static str> {
    if let Some(&(_, hixl)) = ALIASES.iter().find(|(alias, _)| *alias == key) {
        return Some(hixl);
    }
    Options::KEYS
        .iter()
        .copied()
        .find(|k| *k == key && !k.starts_with("adxl."))
}

impl Options {
    /// Every key [`Options::set`] accepts: HIXL's, the ADXL aliases, and hixl's `hixl.` keys.
    #[rustfmt::skip]
    pub const KEYS: &'static [&'static str] = &[
        "EnableUseFabricMem", "BufferPool", "RdmaTrafficClass", "RdmaServiceLevel",
        "GlobalResourceConfig", "AutoConnect", "LocalCommRes",
        "adxl.BufferPool", "adxl.RdmaTrafficClass", "adxl.RdmaServiceLevel", "adxl.LocalCommRes",
        "hixl.Transport", "hixl.TcpStreams", "hixl.TcpChunkBytes", "hixl.TcpIo", "hixl.HeartbeatIntervalMs",
        "hixl.HeartbeatMissLimit", "hixl.HeartbeatIdleMs", "hixl.FabricBusyPollUs", "hixl.SpinUs", "hixl.VerbsDevice", "hixl.VerbsDevices",
        "hixl.VerbsPort", "hixl.VerbsQpsPerRail", "hixl.VerbsSliceBytes", "hixl.VerbsGidIndex", "hixl.VerbsTimeout", "hixl.VerbsRetryCount", "hixl.AuthSecret",
        "hixl.Directory", "hixl.DirectoryPrefix", "hixl.Name", "hixl.DirectoryUser", "hixl.DirectoryPassword", "hixl.DirectoryTtlSec",
    ];

    /// Parses and stores one option. Only this key's own value is checked; the cross-key check
    /// (`EnableUseFabricMem` vs `BufferPool`) is done by [`Options::from_pairs`].
    ///
    /// # Errors
    /// [`Error::UnknownOption`] for a key not in [`Options::KEYS`]; [`Error::InvalidOption`]
    /// naming the key, the value and the reason for a bad value. `self` is unchanged on error.
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        let canon = canonical(key).ok_or_else(|| Error::UnknownOption {
            key: key.to_owned(),
        })?;
        let v = value.trim();
        let err = |reason: String| invalid(key, value, reason);
        if let Some(spec) = UINT_KEYS.iter().find(|s| s.key == canon) {
            let n = match spec.empty {
                Some(default) if v.is_empty() => default,
                _ => check_uint(spec, v).map_err(err)?,
            };
            (spec.store)(self, n);
            return Ok(());
        }
        match canon {
            "EnableUseFabricMem" => {
                self.enable_use_fabric_mem = !v.is_empty() && parse_flag(v).map_err(err)?;
            }
            "AutoConnect" => self.auto_connect = parse_flag(v).map_err(err)?,
            "BufferPool" => self.buffer_pool = BufferPool::parse(v).map_err(err)?,
            "GlobalResourceConfig" => {
                self.global = GlobalResourceConfig::parse_str(v).map_err(err)?
            }
            "LocalCommRes" => self.local_comm_res = parse_local_comm_res(v).map_err(err)?,
            "hixl.Transport" => {
                self.transport = TransportChoice::from_name(v)
                    .ok_or_else(|| err("expected one of auto, tcp, fabric, verbs".to_owned()))?;
            }
            "hixl.TcpIo" => {
                self.tcp_io =
                    TcpIo::from_name(v).ok_or_else(|| err("expected epoll or uring".to_owned()))?;
            }
            "hixl.AuthSecret" => {
                if v.is_empty() {
                    self.auth_secret = None;
                } else if v.len() < MIN_SECRET {
                    // The value is a secret: the error must not echo it.
                    return Err(invalid(
                        key,
                        "<redacted>",
                        format!(
                            "a secret of {} bytes is too short (at least {MIN_SECRET})",
                            v.len()
                        ),
                    ));
                } else {
                    self.auth_secret = Some(crate::auth::Secret::new(v.as_bytes()));
                }
            }
            "hixl.Directory"
            | "hixl.DirectoryPrefix"
            | "hixl.Name"
            | "hixl.DirectoryUser"
            | "hixl.DirectoryPassword" => return self.set_directory(key, canon, v, value),
            "hixl.VerbsDevice" | "hixl.VerbsDevices" => {
                self.verbs_devices = parse_devices(v).map_err(err)?;
            }
            "hixl.VerbsGidIndex" => {
                self.verbs_gid_index = if v.is_empty() {
                    None
                } else {
                    let n = parse_uint(v).filter(|n| *n <= 255).ok_or_else(|| {
                        err("expected an integer in 0..=255, or empty for auto".into())
                    })?;
                    Some(n as u8)
                };
            }
            _ => {
                return Err(Error::UnknownOption {
                    key: key.to_owned(),
                })
            }
        }
        Ok(())
    }

    /// Builds options from HIXL-style key/value pairs, starting from the defaults.
    ///
    /// Unlike HIXL, which silently keeps one value, a key given twice (or given both as a HIXL key
    /// and as its `adxl.` alias) is refused. After all pairs are applied, `EnableUseFabricMem=1`
    /// together with an explicitly given, enabled `BufferPool` is refused: HIXL documents that
    /// the two cannot be combined.
    ///
    /// # Errors
    /// Those of [`Options::set`], and [`Error::InvalidOption`] with reason "given more than once"
    /// for a repeated key, or naming both keys for the FabricMem/BufferPool conflict.
    pub fn from_pairs<I, K, V>(pairs: I) -> Result<Options>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut opts = Options::default();
        let mut seen: Vec<(&'static str, String)> = Vec::new();
        let (mut fabric, mut pool) = (None, None);
        for (k, v) in pairs {
            let (k, v) = (k.as_ref(), v.as_ref());
            let canon = canonical(k).ok_or_else(|| Error::UnknownOption { key: k.to_owned() })?;
            if let Some((_, first)) = seen.iter().find(|(c, _)| *c == canon) {
                let reason = if first == k {
                    "given more than once".to_owned()
                } else {
                    format!("given more than once (also as {first:?})")
                };
                let shown = if matches!(canon, "hixl.AuthSecret" | "hixl.DirectoryPassword") {
                    "<redacted>"
                } else {
                    v
                };
                return Err(invalid(k, shown, reason));
            }
            seen.push((canon, k.to_owned()));
            opts.set(k, v)?;
            match canon {
                "EnableUseFabricMem" => fabric = Some(v.to_owned()),
                "BufferPool" => pool = Some((k.to_owned(), v.to_owned())),
                _ => {}
            }
        }
        if let (true, Some(fabric), Some((pk, pv))) = (opts.enable_use_fabric_mem, fabric, pool) {
            if opts.buffer_pool.is_enabled() {
                let reason = format!(
                    "cannot be combined with {pk}={pv:?}; set {pk} to \"0:0\" or leave it unset"
                );
                return Err(invalid("EnableUseFabricMem", &fabric, reason));
            }
        }
        Ok(opts)
    }
}

fn check_uint(spec: &UintKey, v: &str) -> Result<u64, String> {
    let (min, max) = (spec.min, spec.max);
    let parsed = if spec.size {
        parse_size(v)
    } else {
        parse_uint(v)
    };
    let what = if spec.size {
        "a size such as 4M"
    } else {
        "an integer"
    };
    let n = parsed.ok_or_else(|| format!("expected {what} in [{min}, {max}]"))?;
    if n < min || n > max {
        return Err(format!("{n} is out of range [{min}, {max}]"));
    }
    if n % spec.multiple_of != 0 {
        return Err(format!("must be a multiple of {}", spec.multiple_of));
    }
    Ok(n)
}

fn parse_flag(v: &str) -> Result<bool, String> {
    match v {
        "0" => Ok(false),
        "1" => Ok(true),
        _ => Err("expected \"0\" or \"1\"".to_owned()),
    }
}

fn parse_local_comm_res(v: &str) -> Result<Option<String>, String> {
    if v.is_empty() {
        return Ok(None);
    }
    let json: Value = serde_json::from_str(v).map_err(|e| format!("not valid JSON: {e}"))?;
    match json.get("version") {
        Some(Value::String(_)) => Ok(Some(v.to_owned())),
        Some(other) => Err(format!("\"version\" must be a string, got {other}")),
        None => Err("must be a JSON object with a string \"version\" field".to_owned()),
    }
}

/// A comma-separated list of RDMA device names (`mlx5_0,mlx5_1`), at most 32, none twice.
fn parse_devices(v: &str) -> std::result::Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    for d in v.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        if d.len() > 64 || !d.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(format!(
                "{d:?} is not a device name (expected names such as mlx5_0 or rxe0, comma-separated)"
            ));
        }
        if out.iter().any(|x| x == d) {
            return Err(format!("device {d} is named twice"));
        }
        out.push(d.to_owned());
    }
    if out.len() > 32 {
        return Err(format!("{} devices; at most 32", out.len()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::options::tests::{invalid_parts, opts, set_err};

    #[test]
    fn keys_are_exact() {
        for key in Options::KEYS {
            assert!(canonical(key).is_some(), "{key}");
        }
        for key in [
            "bufferpool",
            "adxl.AutoConnect",
            "hixl.transport",
            "",
            " BufferPool",
        ] {
            let e = Options::default().set(key, "0:0").unwrap_err();
            assert!(
                matches!(e, Error::UnknownOption { key: ref k } if k == key),
                "{key}"
            );
        }
    }

    #[test]
    fn integer_keys() {
        #[rustfmt::skip]
        let o = opts(&[("RdmaTrafficClass", " 0 "), ("RdmaServiceLevel", "7"),
            ("hixl.TcpStreams", "16"), ("hixl.HeartbeatIntervalMs", "10"),
            ("hixl.HeartbeatMissLimit", "100"), ("hixl.HeartbeatIdleMs", "0"),
            ("hixl.TcpChunkBytes", "512K")]).unwrap();
        assert_eq!(
            (o.rdma_traffic_class, o.rdma_service_level, o.tcp_streams),
            (0, 7, 16)
        );
        assert_eq!((o.heartbeat_interval_ms, o.heartbeat_miss_limit), (10, 100));
        assert_eq!(o.heartbeat_idle_ms, 0);
        assert_eq!(
            opts(&[("hixl.HeartbeatIdleMs", "3600000")])
                .unwrap()
                .heartbeat_idle_ms,
            3_600_000
        );
        assert_eq!(o.tcp_chunk_bytes, 512 << 10);
        assert_eq!(
            opts(&[("RdmaTrafficClass", "252")])
                .unwrap()
                .rdma_traffic_class,
            252
        );
        assert_eq!(
            opts(&[("hixl.TcpChunkBytes", "1G")])
                .unwrap()
                .tcp_chunk_bytes,
            GIB
        );
        let mut o = opts(&[("RdmaTrafficClass", "8")]).unwrap();
        o.set("RdmaTrafficClass", "").unwrap();
        assert_eq!(o.rdma_traffic_class, 132, "empty means the HIXL default");
        #[rustfmt::skip]
        let bad = [
            ("RdmaTrafficClass", "130", "multiple of 4"), ("RdmaTrafficClass", "256", "range"),
            ("RdmaTrafficClass", "-4", "integer"), ("RdmaServiceLevel", "8", "out of range"),
            ("RdmaServiceLevel", "x", "integer"), ("RdmaServiceLevel", "+1", "integer"),
            ("hixl.TcpStreams", "0", "out of range"), ("hixl.TcpStreams", "17", "out of range"),
            ("hixl.TcpStreams", "", "integer"), ("hixl.HeartbeatIntervalMs", "9", "out of range"),
            ("hixl.HeartbeatIntervalMs", "600001", "range"), ("hixl.HeartbeatMissLimit", "101", "range"),
            ("hixl.HeartbeatMissLimit", "99999999999999999999999", "integer"),
            ("hixl.HeartbeatIdleMs", "3600001", "range"), ("hixl.HeartbeatIdleMs", "-1", "integer"),
            ("hixl.TcpChunkBytes", "4095", "range"), ("hixl.TcpChunkBytes", "2G", "range"),
            ("hixl.TcpChunkBytes", "2X", "size"),
        ];
        for (k, v, why) in bad {
            let reason = set_err(k, v);
            assert!(reason.contains(why), "{k}={v}: {reason}");
        }
    }

    #[test]
    fn flags_transport_and_local_comm_res() {
        let pairs = [
            ("EnableUseFabricMem", "1"),
            ("AutoConnect", " 1"),
            ("hixl.Transport", "TCP"),
        ];
        let o = opts(&pairs).unwrap();
        assert!(o.enable_use_fabric_mem && o.auto_connect);
        assert_eq!(o.transport, TransportChoice::Tcp);
        assert!(
            !opts(&[("EnableUseFabricMem", "")])
                .unwrap()
                .enable_use_fabric_mem
        );
        assert!(set_err("EnableUseFabricMem", "2").contains("\"0\" or \"1\""));
        assert!(set_err("AutoConnect", "").contains("\"0\" or \"1\""));
        assert!(set_err("AutoConnect", "true").contains("\"0\" or \"1\""));
        assert!(set_err("hixl.Transport", "udp").contains("auto, tcp, fabric, verbs"));
        use TransportChoice::*;
        for t in [Auto, Tcp, Fabric, Verbs] {
            assert_eq!(
                TransportChoice::from_name(&t.as_str().to_uppercase()),
                Some(t)
            );
        }
        let lcr = r#"{"version":"1.3","endpoint_list":[]}"#;
        assert_eq!(
            opts(&[("LocalCommRes", lcr)])
                .unwrap()
                .local_comm_res
                .as_deref(),
            Some(lcr)
        );
        assert_eq!(
            opts(&[("LocalCommRes", "  ")]).unwrap().local_comm_res,
            None
        );
        assert!(set_err("LocalCommRes", "{").contains("not valid JSON"));
        assert!(set_err("LocalCommRes", r#"{"version":1.3}"#).contains("must be a string"));
        for v in ["[]", r#"{"net":"x"}"#, "\"1.3\""] {
            assert!(
                set_err("LocalCommRes", v).contains("\"version\" field"),
                "{v}"
            );
        }
    }

    #[test]
    fn adxl_aliases_and_duplicates() {
        #[rustfmt::skip]
        let o = opts(&[("adxl.BufferPool", "0:0"), ("adxl.RdmaTrafficClass", "4"),
            ("adxl.RdmaServiceLevel", "1"), ("adxl.LocalCommRes", r#"{"version":"1.0"}"#)]);
        let o = o.unwrap();
        assert_eq!(o.buffer_pool, BufferPool::DISABLED);
        assert_eq!((o.rdma_traffic_class, o.rdma_service_level), (4, 1));
        assert!(o.local_comm_res.is_some());
        let e = opts(&[("AutoConnect", "1"), ("AutoConnect", "0")]).unwrap_err();
        let (key, value, reason) = invalid_parts(e);
        assert_eq!((key.as_str(), value.as_str()), ("AutoConnect", "0"));
        assert_eq!(reason, "given more than once");
        let e = opts(&[("BufferPool", "0:0"), ("adxl.BufferPool", "0:0")]).unwrap_err();
        let (key, _, reason) = invalid_parts(e);
        assert_eq!(key, "adxl.BufferPool");
        assert!(reason.contains("given more than once") && reason.contains("\"BufferPool\""));
        assert!(matches!(
            opts(&[("Nope", "1")]),
            Err(Error::UnknownOption { .. })
        ));
    }

    #[test]
    fn fabric_mem_conflicts_with_explicit_buffer_pool() {
        for pool in ["4:8", "2:16"] {
            let e = opts(&[("EnableUseFabricMem", "1"), ("adxl.BufferPool", pool)]).unwrap_err();
            let (key, value, reason) = invalid_parts(e);
            assert_eq!((key.as_str(), value.as_str()), ("EnableUseFabricMem", "1"));
            assert!(
                reason.contains("adxl.BufferPool") && reason.contains(pool),
                "{reason}"
            );
        }
        assert!(opts(&[("BufferPool", "0:0"), ("EnableUseFabricMem", "1")]).is_ok());
        assert!(
            opts(&[("EnableUseFabricMem", "1")]).is_ok(),
            "the default pool is no conflict"
        );
        assert!(opts(&[("EnableUseFabricMem", "0"), ("BufferPool", "4:8")]).is_ok());
    }

    #[test]
    fn global_resource_config_through_set() {
        let o = opts(&[("GlobalResourceConfig", r#"{"connect_pool.thread_num": 3}"#)]).unwrap();
        assert_eq!(o.global.connect_pool.thread_num, 3);
        assert_eq!(
            set_err("GlobalResourceConfig", r#"{"x":1}"#),
            "unknown key \"x\""
        );
        assert_eq!(
            opts(&[("GlobalResourceConfig", " ")]).unwrap(),
            Options::default()
        );
    }

    #[test]
    fn auth_secret_is_validated_and_never_echoed() {
        let o = opts(&[("hixl.AuthSecret", "0123456789abcdef")]).unwrap();
        assert_eq!(o.auth_secret.as_ref().map(|s| s.len()), Some(16));
        assert!(!format!("{o:?}").contains("0123456789abcdef"));
        let e = Options::default()
            .set("hixl.AuthSecret", "short-secret")
            .unwrap_err();
        let m = e.to_string();
        assert!(
            m.contains("too short") && !m.contains("short-secret"),
            "{m}"
        );
        let e = opts(&[
            ("hixl.AuthSecret", "0123456789abcdef"),
            ("hixl.AuthSecret", "0123456789abcdef"),
        ])
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("more than once") && !e.contains("0123456789abcdef"),
            "{e}"
        );
        assert_eq!(opts(&[("hixl.AuthSecret", "")]).unwrap().auth_secret, None);
    }

    #[test]
    fn verbs_keys() {
        let o = opts(&[
            ("hixl.VerbsDevice", "rxe0"),
            ("hixl.VerbsGidIndex", "1"),
            ("hixl.VerbsPort", "2"),
            ("hixl.VerbsTimeout", "18"),
            ("hixl.VerbsRetryCount", "3"),
        ])
        .unwrap();
        assert_eq!(o.verbs_devices, ["rxe0"]);
        assert_eq!(
            (
                o.verbs_gid_index,
                o.verbs_port,
                o.verbs_timeout,
                o.verbs_retry_count
            ),
            (Some(1), 2, 18, 3)
        );
        let d = Options::default();
        assert_eq!(
            (d.verbs_devices.clone(), d.verbs_gid_index, d.verbs_timeout),
            (Vec::new(), None, 14)
        );
        let o = opts(&[
            ("hixl.VerbsDevices", " mlx5_0, mlx5_1 ,"),
            ("hixl.VerbsQpsPerRail", "4"),
            ("hixl.VerbsSliceBytes", "128K"),
        ])
        .unwrap();
        assert_eq!(o.verbs_devices, ["mlx5_0", "mlx5_1"]);
        assert_eq!((o.verbs_qps_per_rail, o.verbs_slice_bytes), (4, 128 << 10));
        assert!(set_err("hixl.VerbsDevices", "a,a").contains("named twice"));
        assert!(set_err("hixl.VerbsDevices", "mlx5_0,b c").contains("\"b c\""));
        assert!(set_err("hixl.VerbsQpsPerRail", "0").contains("range"));
        assert!(set_err("hixl.VerbsSliceBytes", "1K").contains("range"));
        assert_eq!(
            opts(&[("hixl.VerbsGidIndex", "")]).unwrap().verbs_gid_index,
            None
        );
        assert!(set_err("hixl.VerbsGidIndex", "256").contains("0..=255"));
        assert!(set_err("hixl.VerbsDevice", "a b").contains("device name"));
        assert!(set_err("hixl.VerbsTimeout", "0").contains("range"));
        assert!(set_err("hixl.VerbsRetryCount", "8").contains("range"));
        assert!(set_err("hixl.VerbsPort", "0").contains("range"));
    }

    proptest! {
        #[test]
        fn set_never_panics(key in "\\PC{0,24}", value in "\\PC{0,64}") {
            let _ = Options::default().set(&key, &value);
        }

        #[test]
        fn set_known_key_never_panics(idx in 0..Options::KEYS.len(), value in any::<String>()) {
            let _ = Options::default().set(Options::KEYS[idx], &value);
        }
    }
}
