//! The watched cache of the directory (sans-io): entries by name, fed by etcd's list and watch
//! events, and the changes each event makes for the engine to act on.

use std::collections::BTreeMap;

use crate::entry::{Entry, Malformed};

/// What an event changed for one name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A name appeared.
    Added(Entry),
    /// The same incarnation republished (its addresses or memory table changed).
    Updated(Entry),
    /// A new incarnation took the name: the old engine is gone (restarted or replaced).
    Replaced {
        /// The entry before.
        old: Entry,
        /// The entry now.
        new: Entry,
    },
    /// The name is gone: a clean shutdown deleted it, or its lease expired.
    Removed(Entry),
}

impl Change {
    /// The name the change is about.
    pub fn name(&self) -> &str {
        match self {
            Change::Added(e) | Change::Updated(e) | Change::Removed(e) => &e.name,
            Change::Replaced { new, .. } => &new.name,
        }
    }
}

/// Entries by name, and the keys under the prefix that hold something hixl cannot read.
#[derive(Debug, Default)]
pub struct Cache {
    entries: BTreeMap<String, Entry>,
    malformed: BTreeMap<String, String>,
}

impl Cache {
    /// The live entry of `name`.
    pub fn get(&self, name: &str) -> Option<&Entry> {
        self.entries.get(name)
    }

    /// Why the value under `name`'s key cannot be read, if it cannot.
    pub fn malformed(&self, name: &str) -> Option<&str> {
        self.malformed.get(name).map(String::as_str)
    }

    /// Every key hixl cannot read: name and why.
    pub fn unreadable(&self) -> impl Iterator<Item = (&str, &str)> {
        self.malformed.iter().map(|(n, w)| (n.as_str(), w.as_str()))
    }

    /// Every live entry, by name.
    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.entries.values()
    }

    /// Number of live entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// A put of `value` under the name `name`.
    pub fn put(&mut self, name: &str, value: &[u8]) -> Option<Change> {
        match Entry::decode(name, value) {
            Ok(new) => {
                self.malformed.remove(name);
                match self.entries.insert(name.to_owned(), new.clone()) {
                    None => Some(Change::Added(new)),
                    Some(old) if old == new => None,
                    Some(old) if old.incarnation == new.incarnation => Some(Change::Updated(new)),
                    Some(old) => Some(Change::Replaced { old, new }),
                }
            }
            Err(Malformed(why)) => {
                tracing::warn!(name, "directory: skipping an entry hixl cannot read: {why}");
                self.malformed.insert(name.to_owned(), why);
                self.entries.remove(name).map(Change::Removed)
            }
        }
    }

    /// A value under `name` that could not even be read (`why`): as a malformed one.
    pub fn put_unreadable(&mut self, name: &str, why: String) -> Option<Change> {
        tracing::warn!(name, "directory: skipping an entry hixl cannot read: {why}");
        self.malformed.insert(name.to_owned(), why);
        self.entries.remove(name).map(Change::Removed)
    }

    /// A delete (or lease expiry) of `name`'s key.
    pub fn delete(&mut self, name: &str) -> Option<Change> {
        self.malformed.remove(name);
        self.entries.remove(name).map(Change::Removed)
    }

    /// Replaces everything with a full listing `(name, value)`, as after a (re)connect, and
    /// returns what changed against what was cached.
    pub fn reset<'a>(
        &mut self,
        listing: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    ) -> Vec<Change> {
        let mut seen = std::collections::BTreeSet::new();
        let mut out = Vec::new();
        for (name, value) in listing {
            seen.insert(name.to_owned());
            out.extend(self.put(name, value));
        }
        let gone: Vec<String> = self
            .entries
            .keys()
            .filter(|n| !seen.contains(*n))
            .cloned()
            .collect();
        for n in gone {
            out.extend(self.delete(&n));
        }
        self.malformed.retain(|n, _| seen.contains(n));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::table_digest;
    use crate::entry::tests::sample_with;

    fn entry(name: &str, inc: u64, digest: &str) -> Vec<u8> {
        sample_with(name, inc, digest).encode()
    }

    #[test]
    fn lifecycle() {
        let mut c = Cache::default();
        let d = table_digest([]);
        assert!(matches!(
            c.put("a", &entry("a", 1, &d)),
            Some(Change::Added(_))
        ));
        assert_eq!(c.put("a", &entry("a", 1, &d)), None);
        assert!(matches!(
            c.put("a", &entry("a", 1, "x")),
            Some(Change::Updated(_))
        ));
        match c.put("a", &entry("a", 2, "x")) {
            Some(Change::Replaced { old, new }) => {
                assert_eq!((old.incarnation_id(), new.incarnation_id()), (1, 2))
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(c.delete("a"), Some(Change::Removed(_))));
        assert_eq!(c.delete("a"), None);
        assert!(c.is_empty());
    }

    #[test]
    fn malformed_values_are_kept_out_and_named() {
        let mut c = Cache::default();
        c.put("a", &entry("a", 1, ""));
        assert!(matches!(c.put("a", b"{oops"), Some(Change::Removed(_))));
        assert!(c.get("a").is_none());
        assert!(c.malformed("a").unwrap().contains("not a hixl entry"));
        c.put("a", &entry("a", 1, ""));
        assert!(c.malformed("a").is_none() && c.get("a").is_some());
    }

    #[test]
    fn reset_diffs_against_the_cache() {
        let mut c = Cache::default();
        c.put("a", &entry("a", 1, ""));
        c.put("b", &entry("b", 1, ""));
        let (a2, cc) = (entry("a", 2, ""), entry("c", 1, ""));
        let changes = c.reset([("a", a2.as_slice()), ("c", cc.as_slice())]);
        let kinds: Vec<_> = changes
            .iter()
            .map(|ch| match ch {
                Change::Added(e) => format!("+{}", e.name),
                Change::Replaced { new, .. } => format!("~{}", new.name),
                Change::Removed(e) => format!("-{}", e.name),
                Change::Updated(e) => format!("={}", e.name),
            })
            .collect();
        assert_eq!(kinds, ["~a", "+c", "-b"]);
        assert_eq!(c.len(), 2);
    }
}
