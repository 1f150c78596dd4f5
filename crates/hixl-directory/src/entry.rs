//! A directory entry: what an engine publishes about itself, and its strict decoding (an entry
//! written by someone else is checked, never trusted).

use serde::{Deserialize, Serialize};

use hixl_core::options::directory::check_name;

/// Version of the entry format.
pub const ENTRY_VERSION: u32 = 1;
/// Largest entry hixl reads, in bytes.
pub const MAX_ENTRY: usize = 8192;

/// One engine in the directory. Never carries rkeys nor the shared secret: a peer gets those
/// only over the (authenticated) link.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    /// Entry format version ([`ENTRY_VERSION`]).
    pub v: u32,
    /// The engine's name (the last component of its key).
    pub name: String,
    /// The engine's incarnation: the random id it drew at start, as 16 hex digits (the link
    /// handshake carries the same id).
    pub incarnation: String,
    /// Where it listens, `ip:port` (at least one).
    pub addrs: Vec<String>,
    /// The transports it offers (`tcp`, `fabric`, `verbs`).
    pub transports: Vec<String>,
    /// A digest of its exported memory table (changes when it registers or deregisters).
    pub table_digest: String,
    /// The hixl wire version it speaks.
    pub wire: u16,
}

/// Why an entry could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub String);

impl Entry {
    /// The incarnation as a number.
    pub fn incarnation_id(&self) -> u64 {
        u64::from_str_radix(&self.incarnation, 16).unwrap_or(0)
    }

    /// The entry's JSON.
    pub fn encode(&self) -> Vec<u8> {
        // Serializing plain strings, numbers and vectors cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Decodes and checks the entry stored under `name`'s key.
    ///
    /// # Errors
    /// [`Malformed`] saying what is wrong: not JSON of this shape, another version, a name
    /// that is not the key's, a bad incarnation, no or bad addresses.
    pub fn decode(name: &str, bytes: &[u8]) -> Result<Entry, Malformed> {
        let bad = |s: String| Err(Malformed(s));
        if bytes.len() > MAX_ENTRY {
            return bad(format!(
                "{} bytes, more than an entry's {MAX_ENTRY}",
                bytes.len()
            ));
        }
        let e: Entry = match serde_json::from_slice(bytes) {
            Ok(e) => e,
            Err(err) => return bad(format!("not a hixl entry ({err})")),
        };
        if e.v != ENTRY_VERSION {
            return bad(format!(
                "entry version {} (this hixl reads {ENTRY_VERSION})",
                e.v
            ));
        }
        if e.name != name {
            return bad(format!("its name {:?} is not its key's {name:?}", e.name));
        }
        check_name(&e.name).map_err(Malformed)?;
        if e.incarnation.len() != 16 || u64::from_str_radix(&e.incarnation, 16).is_err() {
            return bad(format!(
                "incarnation {:?} is not 16 hex digits",
                e.incarnation
            ));
        }
        if e.addrs.is_empty() {
            return bad("no address".into());
        }
        for a in &e.addrs {
            match a.parse::<std::net::SocketAddr>() {
                Ok(sa) if sa.port() != 0 && !sa.ip().is_unspecified() => {}
                _ => return bad(format!("address {a:?} is not a reachable ip:port")),
            }
        }
        Ok(e)
    }

    /// One line for people: `incarnation 0123… at 10.0.0.1:26000 (tcp, fabric)`.
    pub fn describe(&self) -> String {
        format!(
            "incarnation {} at {} ({})",
            self.incarnation,
            self.addrs.join(", "),
            self.transports.join(", ")
        )
    }
}

/// Formats an incarnation id as the entry carries it.
pub fn incarnation_hex(id: u64) -> String {
    format!("{id:016x}")
}

/// A digest of a memory table given as `(addr, len)` ranges (FNV-1a over them, in order): a
/// change detector for people and tools, not a security measure.
pub fn table_digest(ranges: impl IntoIterator<Item = (u64, u64)>) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut n = 0u64;
    for (a, l) in ranges {
        n += 1;
        for b in a.to_le_bytes().into_iter().chain(l.to_le_bytes()) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{n}:{h:016x}")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An entry of `name` and incarnation `inc` with the memory-table digest `digest`.
    pub(crate) fn sample_with(name: &str, inc: u64, digest: &str) -> Entry {
        Entry {
            v: ENTRY_VERSION,
            name: name.into(),
            incarnation: incarnation_hex(inc),
            addrs: vec!["10.0.0.1:26000".into()],
            transports: vec!["tcp".into()],
            table_digest: digest.into(),
            wire: 3,
        }
    }

    fn sample(name: &str, inc: u64) -> Entry {
        sample_with(name, inc, &table_digest([(4096, 1 << 20)]))
    }

    #[test]
    fn round_trip() {
        let e = sample("prefill-0", 0xdead_beef);
        assert_eq!(Entry::decode("prefill-0", &e.encode()).unwrap(), e);
        assert_eq!(e.incarnation_id(), 0xdead_beef);
        let text = String::from_utf8(e.encode()).unwrap();
        assert!(!text.contains("rkey") && !text.contains("secret"), "{text}");
    }

    #[test]
    fn malformed_entries_are_named() {
        let e = sample("p", 1);
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (b"garbage".to_vec(), "not a hixl entry"),
            (b"{}".to_vec(), "not a hixl entry"),
            (vec![b' '; MAX_ENTRY + 1], "more than"),
            (
                Entry { v: 9, ..e.clone() }.encode(),
                "version 9",
            ),
            (
                Entry { name: "q".into(), ..e.clone() }.encode(),
                "not its key's",
            ),
            (
                Entry { incarnation: "xyz".into(), ..e.clone() }.encode(),
                "16 hex digits",
            ),
            (Entry { addrs: vec![], ..e.clone() }.encode(), "no address"),
            (
                Entry { addrs: vec!["0.0.0.0:1".into()], ..e.clone() }.encode(),
                "not a reachable",
            ),
            (
                br#"{"v":1,"name":"p","incarnation":"0000000000000001","addrs":["1.2.3.4:5"],"transports":[],"table_digest":"","wire":3,"rkeys":[1]}"#.to_vec(),
                "unknown field",
            ),
        ];
        for (bytes, says) in cases {
            let Malformed(why) = Entry::decode("p", &bytes).unwrap_err();
            assert!(why.contains(says), "{says}: {why}");
        }
    }

    #[test]
    fn digest_tracks_the_table() {
        assert_ne!(table_digest([(1, 2)]), table_digest([(1, 3)]));
        assert_eq!(
            table_digest([]),
            format!("0:{:016x}", 0xcbf2_9ce4_8422_2325u64)
        );
    }
}
