//! Fuzz target for hixl-core's `RegionTable`: the input is read as a sequence of register,
//! deregister, lookup and remote-check operations, each checked against a linear-scan model.
//!
//! Invariants checked after every step:
//! - nothing panics;
//! - registration follows HIXL's rules: bad ranges are refused with the named error, the
//!   identical range of the same kind returns the existing handle, any other same-kind overlap
//!   is refused, anything else gets a never-before-seen handle and a unique non-zero rkey;
//! - a successful lookup returns a region that contains the range (and, for non-empty ranges,
//!   the one region the model says does);
//! - `check_remote` succeeds exactly when the rkey is live, the range is non-empty and inside
//!   the region, and the region grants the (remote) access needed;
//! - `len`, `get`, `iter` and `exported` agree with the model.
#![no_main]

use std::cell::Cell;

use hixl_core::region::{RegionId, RegionTable, Registered, RkeySource};
use hixl_core::{Access, Error, MemDesc, MemKind};
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;

/// Deterministic rkeys: `n / 2` for a counter `n`, so zero and duplicates come up and the
/// table's retry loop is exercised.
struct CounterRkeys(u64);

impl RkeySource for CounterRkeys {
    fn next_rkey(&mut self) -> u64 {
        self.0 += 1;
        self.0 / 2
    }
}

/// An address: mostly small ones (so ranges collide), some near the top of the address space.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Addr {
    Small(u16),
    High(u16),
    Raw(u64),
}

impl Addr {
    fn get(self) -> u64 {
        match self {
            Addr::Small(v) => u64::from(v),
            Addr::High(v) => u64::MAX - u64::from(v),
            Addr::Raw(v) => v,
        }
    }
}

/// A length: mostly small, zero included.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Len {
    Small(u8),
    Mid(u16),
    Raw(u64),
}

impl Len {
    fn get(self) -> u64 {
        match self {
            Len::Small(v) => u64::from(v),
            Len::Mid(v) => u64::from(v),
            Len::Raw(v) => v,
        }
    }
}

#[derive(Arbitrary, Debug)]
enum Op {
    Register {
        addr: Addr,
        len: Len,
        device: bool,
        access: u8,
        named: bool,
    },
    /// Deregister the `pick`-th live region of the model.
    Deregister {
        pick: u8,
    },
    /// Deregister a raw handle (mostly unknown ones).
    DeregisterRaw {
        id: u64,
    },
    Lookup {
        addr: Addr,
        len: Len,
    },
    /// Look up a range relative to the `pick`-th live region, so lookups hit often.
    LookupNear {
        pick: u8,
        off: i16,
        len: Len,
    },
    /// Check a remote request against the `pick`-th live region's rkey.
    CheckRemote {
        pick: u8,
        off: i16,
        len: Len,
        need: u8,
    },
    CheckRemoteRaw {
        rkey: u64,
        addr: Addr,
        len: Len,
        need: u8,
    },
}

/// What the model knows about one live region.
#[derive(Debug, Clone)]
struct Model {
    id: RegionId,
    addr: u64,
    len: u64,
    kind: MemKind,
    access: Access,
    rkey: u64,
    name: Option<String>,
}

impl Model {
    fn contains(&self, addr: u64, len: u64) -> bool {
        match addr.checked_add(len) {
            Some(end) => addr >= self.addr && end <= self.addr + self.len,
            None => false,
        }
    }
}

fn pick(model: &[Model], p: u8) -> Option<&Model> {
    (!model.is_empty()).then(|| &model[usize::from(p) % model.len()])
}

fn near(m: Option<&Model>, off: i16) -> u64 {
    match m {
        Some(m) => m.addr.wrapping_add_signed(i64::from(off)),
        None => 0x1000u64.wrapping_add_signed(i64::from(off)),
    }
}

fn check_lookup(t: &RegionTable<()>, model: &[Model], addr: u64, len: u64) {
    let found = t.find(addr, len);
    if let Some(e) = found {
        assert!(
            e.contains(addr, len),
            "find({addr:#x}, {len}) returned {e:?}"
        );
    }
    if len > 0 {
        // Regions of one kind never overlap, so at most one per kind contains a non-empty
        // range; `find` prefers device memory, like its map order.
        let want = model
            .iter()
            .filter(|m| m.contains(addr, len))
            .min_by_key(|m| m.kind.code())
            .map(|m| m.id);
        assert_eq!(found.map(|e| e.id), want, "find({addr:#x}, {len})");
    }
    let local = t.lookup_local(7, addr, len);
    match (addr, len, addr.checked_add(len)) {
        (0, _, _) => assert!(matches!(local, Err(Error::NullAddress { index: 7, .. }))),
        (_, 0, _) => assert!(matches!(local, Err(Error::ZeroLength { index: 7 }))),
        (_, _, None) => assert!(matches!(local, Err(Error::RangeOverflow { .. }))),
        _ => match local {
            Ok(e) => {
                assert!(e.contains(addr, len));
                assert_eq!(Some(e.id), found.map(|f| f.id));
            }
            Err(Error::LocalUnregistered { index: 7, .. }) => assert!(found.is_none()),
            Err(e) => panic!("lookup_local({addr:#x}, {len}): unexpected {e:?}"),
        },
    }
}

fn check_remote(t: &RegionTable<()>, model: &[Model], rkey: u64, addr: u64, len: u64, need: u8) {
    let need = Access::from_bits(need);
    let r = t.check_remote(rkey, addr, len, need);
    let m = model.iter().find(|m| m.rkey == rkey);
    match (m, r) {
        (None, Err(Error::UnknownRkey { rkey: r })) => assert_eq!(r, rkey),
        (None, other) => panic!("rkey {rkey:#x} is not live but check_remote gave {other:?}"),
        (Some(m), Ok(e)) => {
            assert_eq!(e.id, m.id);
            assert_eq!(e.rkey, rkey);
            assert!(
                len > 0 && e.contains(addr, len),
                "{addr:#x}+{len} outside {e:?}"
            );
            assert!(
                need.is_remote() && e.access.contains(need),
                "{need} not granted by {e:?}"
            );
        }
        (
            Some(m),
            Err(Error::OutsideRegion {
                addr: a, len: l, ..
            }),
        ) => {
            assert_eq!((a, l), (addr, len));
            assert!(
                len == 0 || !m.contains(addr, len),
                "in-bounds {addr:#x}+{len} refused"
            )
        }
        (Some(m), Err(Error::AccessDenied { .. })) => {
            assert!(len > 0 && m.contains(addr, len));
            assert!(!need.is_remote() || !m.access.contains(need));
        }
        (Some(_), Err(e)) => panic!("check_remote: unexpected {e:?}"),
    }
}

fn check_table(t: &RegionTable<()>, model: &[Model]) {
    assert_eq!(t.len(), model.len());
    assert_eq!(t.is_empty(), model.is_empty());
    assert_eq!(t.iter().count(), model.len());
    for m in model {
        let e = t.get(m.id).expect("a live region has an entry");
        assert_eq!(
            (e.addr, e.len, e.kind, e.access, e.rkey, &e.name),
            (m.addr, m.len, m.kind, m.access, m.rkey, &m.name)
        );
    }
    let mut want: Vec<_> = model
        .iter()
        .filter(|m| m.access.is_remote())
        .map(|m| (m.addr, m.kind.code(), m.rkey))
        .collect();
    want.sort_unstable();
    let got: Vec<_> = t
        .exported()
        .iter()
        .map(|r| (r.addr, r.kind.code(), r.rkey))
        .collect();
    assert_eq!(
        got, want,
        "exported() is not the remote regions in address order"
    );
}

fuzz_target!(|ops: Vec<Op>| {
    let mut t: RegionTable<()> = RegionTable::new();
    let mut rkeys = CounterRkeys(0);
    let mut model: Vec<Model> = Vec::new();
    let mut max_id_seen = 0u64;

    for op in ops {
        match op {
            Op::Register {
                addr,
                len,
                device,
                access,
                named,
            } => {
                let (addr, len) = (addr.get(), len.get());
                let kind = if device {
                    MemKind::Device
                } else {
                    MemKind::Host
                };
                let access = Access::from_bits(access);
                let name = named.then(|| format!("r{addr:x}"));
                let made = Cell::new(None);
                let r = t.register(
                    MemDesc::new(addr, len),
                    kind,
                    access,
                    name.clone(),
                    &mut rkeys,
                    |id, rkey| made.set(Some((id, rkey))),
                );
                let same_kind = || model.iter().filter(|m| m.kind == kind);
                let identical = same_kind().find(|m| m.addr == addr && m.len == len);
                let overlap = addr
                    .checked_add(len)
                    .is_some_and(|end| same_kind().any(|m| addr < m.addr + m.len && m.addr < end));
                match r {
                    Err(Error::NullAddress { .. }) => assert_eq!(addr, 0),
                    Err(Error::ZeroLength { .. }) => assert!(addr != 0 && len == 0),
                    Err(Error::RangeOverflow { .. }) => {
                        assert!(addr != 0 && len != 0 && addr.checked_add(len).is_none())
                    }
                    Err(Error::Overlap { .. }) => assert!(overlap && identical.is_none()),
                    Err(e) => panic!("register: unexpected {e:?}"),
                    Ok(Registered::Existing(id)) => {
                        assert_eq!(Some(id), identical.map(|m| m.id));
                        assert!(made.get().is_none(), "make called for an existing region");
                    }
                    Ok(Registered::New(id)) => {
                        assert!(
                            addr != 0 && len != 0 && !overlap,
                            "{addr:#x}+{len} accepted"
                        );
                        assert!(id.0 > max_id_seen, "handle {id:?} reused");
                        max_id_seen = id.0;
                        let (mid, rkey) = made.get().expect("make called for a new region");
                        assert_eq!(mid, id);
                        assert_ne!(rkey, 0);
                        assert!(model.iter().all(|m| m.rkey != rkey), "rkey {rkey} reused");
                        model.push(Model {
                            id,
                            addr,
                            len,
                            kind,
                            access,
                            rkey,
                            name,
                        });
                    }
                }
            }
            Op::Deregister { pick: p } => {
                if model.is_empty() {
                    continue;
                }
                let m = model.remove(usize::from(p) % model.len());
                let e = t.deregister(m.id).expect("a live region deregisters");
                assert_eq!((e.id, e.addr, e.len, e.rkey), (m.id, m.addr, m.len, m.rkey));
                assert!(
                    t.deregister(m.id).is_none(),
                    "second deregister had an effect"
                );
                assert!(t.get(m.id).is_none());
                check_remote(&t, &model, m.rkey, m.addr, 1, 3);
            }
            Op::DeregisterRaw { id } => {
                let live = model.iter().position(|m| m.id.0 == id);
                let r = t.deregister(RegionId(id));
                assert_eq!(r.is_some(), live.is_some());
                if let Some(i) = live {
                    model.remove(i);
                }
            }
            Op::Lookup { addr, len } => check_lookup(&t, &model, addr.get(), len.get()),
            Op::LookupNear { pick: p, off, len } => {
                let addr = near(pick(&model, p), off);
                check_lookup(&t, &model, addr, len.get());
            }
            Op::CheckRemote {
                pick: p,
                off,
                len,
                need,
            } => {
                let m = pick(&model, p);
                let rkey = m.map_or(1, |m| m.rkey);
                check_remote(&t, &model, rkey, near(m, off), len.get(), need);
            }
            Op::CheckRemoteRaw {
                rkey,
                addr,
                len,
                need,
            } => check_remote(&t, &model, rkey, addr.get(), len.get(), need),
        }
        check_table(&t, &model);
    }
});
