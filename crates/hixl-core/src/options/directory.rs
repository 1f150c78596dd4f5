//! `hixl.Directory` and its companion keys: where an engine publishes itself and finds peers
//! by name (an etcd cluster), under which prefix, with which credentials and lease.

/// Default `hixl.DirectoryPrefix`.
pub const DEFAULT_PREFIX: &str = "/hixl/engines/";
/// Default `hixl.DirectoryTtlSec`: how long a killed engine's entry outlives it at most.
pub const DEFAULT_TTL_SEC: u64 = 10;
/// Longest engine name, in bytes.
pub const MAX_NAME: usize = 128;

/// The directory settings of an engine. `endpoints` empty (the default): no directory, peers
/// are found by address only.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct DirectoryOptions {
    /// `hixl.Directory=etcd://h1:2379,h2:2379`: the etcd members, as `host:port`.
    pub endpoints: Vec<String>,
    /// `hixl.DirectoryPrefix`: the key prefix entries live under; ends with `/`.
    pub prefix: String,
    /// `hixl.Name`: the name this engine publishes (a server engine only).
    pub name: Option<String>,
    /// `hixl.DirectoryUser`: etcd user name (with `hixl.DirectoryPassword`).
    pub user: Option<String>,
    /// `hixl.DirectoryPassword` (never shown by `Debug` nor in errors).
    pub password: Option<String>,
    /// `hixl.DirectoryTtlSec`: the TTL of the lease the entry lives under, 2–3600 s.
    pub ttl_sec: u64,
}

impl std::fmt::Debug for DirectoryOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectoryOptions")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .field("name", &self.name)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("ttl_sec", &self.ttl_sec)
            .finish()
    }
}

impl DirectoryOptions {
    /// The defaults: no directory, prefix [`DEFAULT_PREFIX`], TTL [`DEFAULT_TTL_SEC`].
    pub fn new() -> DirectoryOptions {
        DirectoryOptions {
            prefix: DEFAULT_PREFIX.to_owned(),
            ttl_sec: DEFAULT_TTL_SEC,
            ..DirectoryOptions::default()
        }
    }

    /// Whether a directory is configured.
    pub fn is_enabled(&self) -> bool {
        !self.endpoints.is_empty()
    }
}

impl super::Options {
    /// Sets one of the directory's string keys (`canon`, given as `key`) to `v` (trimmed;
    /// `raw` as given).
    pub(super) fn set_directory(
        &mut self,
        key: &str,
        canon: &str,
        v: &str,
        raw: &str,
    ) -> crate::Result<()> {
        let d = &mut self.directory;
        let err = |reason: String| super::invalid(key, v, reason);
        let opt = |v: &str| (!v.is_empty()).then(|| v.to_owned());
        match canon {
            "hixl.Directory" => d.endpoints = parse_url(v).map_err(err)?,
            "hixl.DirectoryPrefix" => {
                check_prefix(v).map_err(err)?;
                d.prefix = v.to_owned();
            }
            // A name is used exactly as given or refused: never trimmed into another name.
            // Only the empty value means "no name".
            "hixl.Name" => {
                if !raw.is_empty() {
                    check_name(raw).map_err(|r| super::invalid(key, raw, r))?;
                }
                d.name = opt(raw);
            }
            "hixl.DirectoryUser" => {
                if v.contains(':') {
                    return Err(err("an etcd user name cannot contain ':'".into()));
                }
                d.user = opt(v);
            }
            // The value is a secret: errors must not echo it (there are none to give).
            _ => d.password = opt(v),
        }
        Ok(())
    }
}

/// Parses `etcd://host:port[,host:port...]` into its endpoints. Empty: no directory.
pub fn parse_url(v: &str) -> Result<Vec<String>, String> {
    if v.is_empty() {
        return Ok(Vec::new());
    }
    let rest = v.strip_prefix("etcd://").ok_or_else(|| {
        "expected etcd://host:port[,host:port...] (etcd is the directory hixl speaks)".to_owned()
    })?;
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let mut out: Vec<String> = Vec::new();
    for ep in rest.split(',').map(str::trim) {
        if ep.is_empty() {
            return Err("an empty endpoint".to_owned());
        }
        if ep.contains('/') || ep.contains('@') {
            return Err(format!(
                "endpoint {ep:?}: expected host:port (set the prefix with hixl.DirectoryPrefix \
                 and credentials with hixl.DirectoryUser/hixl.DirectoryPassword)"
            ));
        }
        let (host, port) = ep
            .rsplit_once(':')
            .ok_or_else(|| format!("endpoint {ep:?} has no port (etcd's is 2379)"))?;
        let host_ok = !host.is_empty()
            && (host.starts_with('[') && host.ends_with(']')
                || host
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-'));
        if !host_ok {
            return Err(format!(
                "endpoint {ep:?}: {host:?} is not a host name or IP"
            ));
        }
        match port.parse::<u16>() {
            Ok(p) if p > 0 => {}
            _ => return Err(format!("endpoint {ep:?}: port {port:?} is not in 1-65535")),
        }
        if out.iter().any(|e| e == ep) {
            return Err(format!("endpoint {ep:?} given twice"));
        }
        out.push(ep.to_owned());
    }
    Ok(out)
}

/// Checks an engine name: 1–[`MAX_NAME`] bytes of `A-Z a-z 0-9 . _ -`, not starting with `.`.
pub fn check_name(v: &str) -> Result<(), String> {
    if v.is_empty() {
        return Err("an engine name cannot be empty".to_owned());
    }
    if v.len() > MAX_NAME {
        return Err(format!(
            "a name of {} bytes is too long (at most {MAX_NAME})",
            v.len()
        ));
    }
    if let Some(c) = v
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "{c:?} is not allowed in a name (letters, digits, '.', '_' and '-')"
        ));
    }
    if v.starts_with('.') {
        return Err("a name cannot start with '.'".to_owned());
    }
    Ok(())
}

/// Checks a key prefix: starts and ends with `/`, printable ASCII, at most 256 bytes.
pub fn check_prefix(v: &str) -> Result<(), String> {
    if !(v.starts_with('/') && v.ends_with('/')) {
        return Err("a prefix starts and ends with '/', e.g. /hixl/engines/".to_owned());
    }
    if v.len() > 256 || !v.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("a prefix is at most 256 printable ASCII bytes".to_owned());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys() {
        let o = crate::Options::from_pairs([
            ("hixl.Directory", "etcd://a:1,b:2"),
            ("hixl.Name", "prefill-0"),
            ("hixl.DirectoryPassword", "hunter2"),
            ("hixl.DirectoryTtlSec", "3"),
        ])
        .unwrap();
        let d = &o.directory;
        assert_eq!(
            (d.endpoints.len(), d.ttl_sec, d.prefix.as_str()),
            (2, 3, DEFAULT_PREFIX)
        );
        assert_eq!(d.name.as_deref(), Some("prefill-0"));
        assert!(!format!("{d:?}").contains("hunter2"));
        let e = crate::Options::from_pairs([("hixl.Name", "a/b")]).unwrap_err();
        assert!(
            e.to_string().contains("hixl.Name") && e.to_string().contains("a/b"),
            "{e}"
        );
        // A name is used as given or refused naming it: never trimmed into another one.
        for (bad, says) in [
            ("  ", "' '"),
            ("prefill-0\t", "'\\t'"),
            ("prefill-0\u{85}", "'\\u{85}'"),
            (" prefill-0", "' '"),
        ] {
            let e = crate::Options::from_pairs([("hixl.Name", bad)]).unwrap_err();
            let m = e.to_string();
            assert!(m.contains("hixl.Name") && m.contains(says), "{bad:?}: {m}");
            assert!(
                m.contains(&format!("{bad:?}")) || m.contains(bad),
                "{bad:?}: {m}"
            );
        }
        let e = crate::Options::from_pairs([("hixl.DirectoryTtlSec", "1")]).unwrap_err();
        assert!(e.to_string().contains("out of range"), "{e}");
        let e = crate::Options::from_pairs([
            ("hixl.DirectoryPassword", "hunter2"),
            ("hixl.DirectoryPassword", "hunter3"),
        ])
        .unwrap_err();
        assert!(!e.to_string().contains("hunter"), "{e}");
        assert!(!crate::Options::default().directory.is_enabled());
    }

    #[test]
    fn urls() {
        assert_eq!(
            parse_url("etcd://h1:2379,10.0.0.2:2379").unwrap(),
            ["h1:2379", "10.0.0.2:2379"]
        );
        assert_eq!(parse_url("etcd://[::1]:2379/").unwrap(), ["[::1]:2379"]);
        assert!(parse_url("").unwrap().is_empty());
        for (bad, says) in [
            ("http://h:2379", "etcd://"),
            ("etcd://h", "no port"),
            ("etcd://h:0", "port \"0\""),
            ("etcd://h:2379,,g:1", "empty endpoint"),
            ("etcd://h:2379/pfx", "hixl.DirectoryPrefix"),
            ("etcd://u:p@h:2379", "hixl.DirectoryUser"),
            ("etcd://h:1,h:1", "twice"),
            ("etcd://h h:1", "not a host"),
        ] {
            let e = parse_url(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn names_and_prefixes() {
        check_name("prefill-3").unwrap();
        check_name("decode_0.rack2").unwrap();
        for bad in ["", ".x", "a/b", "a b", &"n".repeat(129)] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
        check_prefix("/hixl/engines/").unwrap();
        for bad in ["hixl/", "/hixl", "/a b/"] {
            assert!(check_prefix(bad).is_err(), "{bad}");
        }
    }
}
