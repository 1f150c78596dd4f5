//! Region table: registered memory with HIXL's registration rules, rkeys and bounds-checked lookup.

use std::collections::{BTreeMap, HashMap};

use crate::error::{Error, Result, Side};
use crate::types::{Access, MemDesc, MemKind, RemoteRegion};

/// Handle of a registered region (HIXL `MemHandle`). Never reused within one table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RegionId(pub u64);

/// One registered region and the data the owner attached to it.
#[derive(Debug)]
pub struct RegionEntry<T> {
    /// Handle.
    pub id: RegionId,
    /// Start address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Memory kind.
    pub kind: MemKind,
    /// Accesses granted to peers.
    pub access: Access,
    /// Random key peers must present.
    pub rkey: u64,
    /// Optional name, exported to peers.
    pub name: Option<String>,
    /// The owner's data (a lease, a mapping...).
    pub data: T,
}

impl<T> RegionEntry<T> {
    /// Whether `[addr, addr+len)` lies inside this region. Overflow-safe.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        match addr.checked_add(len) {
            Some(end) => addr >= self.addr && end <= self.addr + self.len,
            None => false,
        }
    }

    /// How peers see this region.
    pub fn to_remote(&self) -> RemoteRegion {
        RemoteRegion {
            addr: self.addr,
            len: self.len,
            rkey: self.rkey,
            access: self.access,
            kind: self.kind,
            name: self.name.clone(),
        }
    }
}

/// What a registration did.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum Registered {
    /// A new region.
    New(RegionId),
    /// The identical range was registered before; HIXL returns the same handle.
    Existing(RegionId),
}

impl Registered {
    /// The handle either way.
    pub fn id(self) -> RegionId {
        match self {
            Registered::New(id) | Registered::Existing(id) => id,
        }
    }
}

/// Source of fresh rkeys: the engine draws them from the OS CSPRNG (the core never touches
/// the OS); tests may use a counter.
pub trait RkeySource {
    /// A new 64-bit key.
    fn next_rkey(&mut self) -> u64;
}

/// Registered regions of one engine, indexed by address (per kind), handle and rkey.
#[derive(Debug)]
pub struct RegionTable<T> {
    by_addr: [BTreeMap<u64, RegionId>; 2],
    entries: HashMap<RegionId, RegionEntry<T>>,
    by_rkey: HashMap<u64, RegionId>,
    next_id: u64,
}

impl<T> Default for RegionTable<T> {
    fn default() -> Self {
        RegionTable {
            by_addr: [BTreeMap::new(), BTreeMap::new()],
            entries: HashMap::new(),
            by_rkey: HashMap::new(),
            next_id: 1,
        }
    }
}

fn kind_index(kind: MemKind) -> usize {
    match kind {
        MemKind::Device => 0,
        MemKind::Host => 1,
    }
}

/// Checks a registration or transfer range: non-null, non-empty, no overflow.
///
/// # Errors
/// [`Error::NullAddress`], [`Error::ZeroLength`] or [`Error::RangeOverflow`].
pub fn check_range(side: Side, index: usize, addr: u64, len: u64) -> Result<u64> {
    if addr == 0 {
        return Err(Error::NullAddress { side, index });
    }
    if len == 0 {
        return Err(Error::ZeroLength { index });
    }
    addr.checked_add(len)
        .ok_or(Error::RangeOverflow { addr, len })
}

impl<T> RegionTable<T> {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of regions.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no region is registered.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Registers `desc` with HIXL's rules. `make` builds the attached data for a new region only, from its handle and rkey.
    ///
    /// The identical range of the same kind again returns the existing handle (and `make` is
    /// not called); any other overlap with a region of the same kind is refused.
    ///
    /// # Errors
    /// [`Error::NullAddress`], [`Error::ZeroLength`], [`Error::RangeOverflow`],
    /// [`Error::Overlap`].
    pub fn register(
        &mut self,
        desc: MemDesc,
        kind: MemKind,
        access: Access,
        name: Option<String>,
        rkeys: &mut dyn RkeySource,
        make: impl FnOnce(RegionId, u64) -> T,
    ) -> Result<Registered> {
        let end = check_range(Side::Local, 0, desc.addr, desc.len)?;
        let map = &self.by_addr[kind_index(kind)];
        // The only candidates for overlap: the last region starting at or before `addr`, and
        // the first starting after it (regions of one kind never overlap each other).
        let before = map.range(..=desc.addr).next_back();
        let after = map.range(desc.addr.saturating_add(1)..).next();
        for (_, id) in before.into_iter().chain(after) {
            let Some(e) = self.entries.get(id) else {
                continue;
            };
            if e.addr == desc.addr && e.len == desc.len {
                return Ok(Registered::Existing(e.id));
            }
            let e_end = e.addr + e.len;
            if desc.addr < e_end && e.addr < end {
                return Err(Error::Overlap {
                    addr: desc.addr,
                    len: desc.len,
                    existing_addr: e.addr,
                    existing_len: e.len,
                });
            }
        }
        let id = RegionId(self.next_id);
        self.next_id += 1;
        let mut rkey = rkeys.next_rkey();
        while rkey == 0 || self.by_rkey.contains_key(&rkey) {
            rkey = rkeys.next_rkey();
        }
        self.by_addr[kind_index(kind)].insert(desc.addr, id);
        self.by_rkey.insert(rkey, id);
        self.entries.insert(
            id,
            RegionEntry {
                id,
                addr: desc.addr,
                len: desc.len,
                kind,
                access,
                rkey,
                name,
                data: make(id, rkey),
            },
        );
        Ok(Registered::New(id))
    }

    /// Removes a region. An unknown handle is not an error (HIXL: SUCCESS, no effect).
    pub fn deregister(&mut self, id: RegionId) -> Option<RegionEntry<T>> {
        let e = self.entries.remove(&id)?;
        self.by_addr[kind_index(e.kind)].remove(&e.addr);
        self.by_rkey.remove(&e.rkey);
        Some(e)
    }

    /// The region with this handle.
    pub fn get(&self, id: RegionId) -> Option<&RegionEntry<T>> {
        self.entries.get(&id)
    }

    /// The region of any kind that wholly contains `[addr, addr+len)`. O(log n).
    pub fn find(&self, addr: u64, len: u64) -> Option<&RegionEntry<T>> {
        self.by_addr.iter().find_map(|map| {
            let (_, id) = map.range(..=addr).next_back()?;
            let e = self.entries.get(id)?;
            e.contains(addr, len).then_some(e)
        })
    }

    /// Checks a local transfer range (descriptor `index`) and returns its region.
    ///
    /// # Errors
    /// [`Error::NullAddress`], [`Error::ZeroLength`], [`Error::RangeOverflow`] or
    /// [`Error::LocalUnregistered`].
    pub fn lookup_local(&self, index: usize, addr: u64, len: u64) -> Result<&RegionEntry<T>> {
        check_range(Side::Local, index, addr, len)?;
        self.find(addr, len)
            .ok_or(Error::LocalUnregistered { addr, len, index })
    }

    /// Validates a peer's request the way a target must before a byte moves: the rkey names a
    /// live region, the range lies inside it, and the region grants `need`.
    ///
    /// # Errors
    /// [`Error::UnknownRkey`] for an unknown rkey, [`Error::OutsideRegion`] for an
    /// out-of-bounds range,
    /// [`Error::AccessDenied`] when the access is not granted.
    pub fn check_remote(
        &self,
        rkey: u64,
        addr: u64,
        len: u64,
        need: Access,
    ) -> Result<&RegionEntry<T>> {
        let e = self
            .by_rkey
            .get(&rkey)
            .and_then(|id| self.entries.get(id))
            .ok_or(Error::UnknownRkey { rkey })?;
        if len == 0 || !e.contains(addr, len) {
            return Err(Error::OutsideRegion {
                addr,
                len,
                region_addr: e.addr,
                region_len: e.len,
            });
        }
        if !e.access.contains(need) || !need.is_remote() {
            return Err(Error::AccessDenied {
                addr,
                len,
                need: need.describe(),
            });
        }
        Ok(e)
    }

    /// Regions peers may access, in address order, as exported at connect.
    pub fn exported(&self) -> Vec<RemoteRegion> {
        let mut v: Vec<RemoteRegion> = self
            .entries
            .values()
            .filter(|e| e.access.is_remote())
            .map(RegionEntry::to_remote)
            .collect();
        v.sort_by_key(|r| (r.addr, r.kind.code()));
        v
    }

    /// Iterates over all regions, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &RegionEntry<T>> {
        self.entries.values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    struct Counter(u64);
    impl RkeySource for Counter {
        fn next_rkey(&mut self) -> u64 {
            self.0 += 1;
            self.0 / 2 // yields duplicates and a zero to exercise retry
        }
    }

    /// Distinct, well-spread keys (the engine's come from the OS).
    struct Spread(u64);
    impl RkeySource for Spread {
        fn next_rkey(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            self.0
        }
    }

    fn reg(t: &mut RegionTable<()>, addr: u64, len: u64) -> Result<Registered> {
        t.register(
            MemDesc::new(addr, len),
            MemKind::Host,
            Access::REMOTE_RW,
            None,
            &mut Spread(7),
            |_, _| (),
        )
    }

    #[test]
    fn same_range_twice_returns_same_handle() {
        let mut t = RegionTable::new();
        let a = reg(&mut t, 0x1000, 0x1000).unwrap();
        let b = reg(&mut t, 0x1000, 0x1000).unwrap();
        assert!(matches!(a, Registered::New(_)));
        assert_eq!(b, Registered::Existing(a.id()));
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn overlaps_are_refused_and_named() {
        let mut t = RegionTable::new();
        reg(&mut t, 0x1000, 0x1000).unwrap();
        for (a, l) in [
            (0x800, 0x1000),
            (0x1800, 0x1000),
            (0x1100, 0x10),
            (0x800, 0x4000),
        ] {
            let e = reg(&mut t, a, l).unwrap_err();
            assert!(matches!(e, Error::Overlap { .. }), "{a:#x}+{l}: {e}");
            assert!(e.to_string().contains("0x1000"));
        }
        // adjacent is fine
        reg(&mut t, 0x2000, 0x1000).unwrap();
        reg(&mut t, 0x800, 0x800).unwrap();
        // another kind may overlap
        t.register(
            MemDesc::new(0x1000, 0x10),
            MemKind::Device,
            Access::REMOTE_RW,
            None,
            &mut Spread(7),
            |_, _| (),
        )
        .unwrap();
    }

    #[test]
    fn bad_ranges() {
        let mut t = RegionTable::new();
        assert!(matches!(reg(&mut t, 0, 10), Err(Error::NullAddress { .. })));
        assert!(matches!(reg(&mut t, 10, 0), Err(Error::ZeroLength { .. })));
        assert!(matches!(
            reg(&mut t, u64::MAX, 2),
            Err(Error::RangeOverflow { .. })
        ));
    }

    #[test]
    fn deregister_unknown_is_noop() {
        let mut t = RegionTable::<()>::new();
        assert!(t.deregister(RegionId(42)).is_none());
        let id = reg(&mut t, 0x1000, 16).unwrap().id();
        assert!(t.deregister(id).is_some());
        assert!(t.deregister(id).is_none());
        assert!(t.find(0x1000, 1).is_none());
    }

    #[test]
    fn rkeys_are_unique_and_nonzero() {
        let mut t = RegionTable::new();
        let mut c = Counter(0);
        for i in 0..50u64 {
            t.register(
                MemDesc::new(0x1000 + i * 0x100, 0x100),
                MemKind::Host,
                Access::REMOTE_RW,
                None,
                &mut c,
                |_, _| (),
            )
            .unwrap();
        }
        let mut keys: Vec<u64> = t.iter().map(|e| e.rkey).collect();
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), 50);
        assert!(!keys.contains(&0));
    }

    #[test]
    fn check_remote_enforces_rkey_bounds_access() {
        let mut t = RegionTable::new();
        let id = t
            .register(
                MemDesc::new(0x1000, 0x1000),
                MemKind::Host,
                Access::REMOTE_READ,
                Some("kv".into()),
                &mut Spread(7),
                |_, _| (),
            )
            .unwrap()
            .id();
        let rkey = t.get(id).unwrap().rkey;
        assert!(t
            .check_remote(rkey, 0x1000, 0x1000, Access::REMOTE_READ)
            .is_ok());
        assert!(matches!(
            t.check_remote(rkey ^ 1, 0x1000, 1, Access::REMOTE_READ),
            Err(Error::UnknownRkey { rkey: r }) if r == rkey ^ 1
        ));
        assert!(matches!(
            t.check_remote(rkey, 0x1fff, 2, Access::REMOTE_READ),
            Err(Error::OutsideRegion {
                addr: 0x1fff,
                len: 2,
                region_addr: 0x1000,
                region_len: 0x1000
            })
        ));
        assert!(t
            .check_remote(rkey, u64::MAX, 2, Access::REMOTE_READ)
            .is_err());
        assert!(t
            .check_remote(rkey, 0x1000, 0, Access::REMOTE_READ)
            .is_err());
        assert!(matches!(
            t.check_remote(rkey, 0x1000, 1, Access::REMOTE_WRITE),
            Err(Error::AccessDenied { .. })
        ));
        assert_eq!(t.exported()[0].name.as_deref(), Some("kv"));
    }

    #[test]
    fn local_regions_are_not_exported() {
        let mut t = RegionTable::new();
        t.register(
            MemDesc::new(0x1000, 0x10),
            MemKind::Host,
            Access::LOCAL,
            None,
            &mut Spread(7),
            |_, _| (),
        )
        .unwrap();
        assert!(t.exported().is_empty());
        assert!(t.lookup_local(0, 0x1000, 0x10).is_ok());
        assert!(matches!(
            t.lookup_local(3, 0x1000, 0x11),
            Err(Error::LocalUnregistered { index: 3, .. })
        ));
    }

    proptest! {
        // The table agrees with a direct model: a linear scan over registered ranges.
        #[test]
        fn matches_linear_model(ops in proptest::collection::vec((0u64..64, 1u64..16, any::<bool>()), 1..60),
                                probes in proptest::collection::vec((0u64..80, 0u64..20), 1..40)) {
            let mut t = RegionTable::new();
            let mut model: Vec<(u64, u64, RegionId)> = Vec::new();
            for (a, l, del) in ops {
                let addr = 0x1000 + a * 8;
                let len = l * 8;
                if del && !model.is_empty() {
                    let (_, _, id) = model.remove((a as usize) % model.len());
                    prop_assert!(t.deregister(id).is_some());
                    continue;
                }
                let same = model.iter().find(|m| m.0 == addr && m.1 == len).map(|m| m.2);
                let overlap = model.iter().any(|m| addr < m.0 + m.1 && m.0 < addr + len);
                match reg(&mut t, addr, len) {
                    Ok(Registered::Existing(id)) => prop_assert_eq!(Some(id), same),
                    Ok(Registered::New(id)) => { prop_assert!(!overlap); model.push((addr, len, id)); }
                    Err(_) => prop_assert!(overlap && same.is_none()),
                }
            }
            for (a, l) in probes {
                let addr = 0x1000 + a * 4;
                let want = model.iter().find(|m| l > 0 && addr >= m.0 && addr + l <= m.0 + m.1).map(|m| m.2);
                prop_assert_eq!(t.find(addr, l).filter(|_| l > 0).map(|e| e.id), want);
            }
        }
    }
}
