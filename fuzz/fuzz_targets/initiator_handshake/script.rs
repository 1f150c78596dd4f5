//! Scripts: what the fake target does, as the input describes it.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use hixl_core::wire::{FabricRegion, Message, NO_FD};
use hixl_core::{Access, MemKind, RemoteRegion};
use hixl_fuzz::{encode, generic_step, In, Step, GENERIC_TAGS};

use crate::Ctx;

/// One action of the fake on the control connection.
#[derive(Debug, Clone)]
pub(crate) enum Act {
    Step(Step),
    /// Wait for the engine's `AuthResponse`, then send a proof for it: valid, or forged.
    Proof {
        valid: bool,
    },
}

/// How the fake answers one data connection.
#[derive(Debug, Clone)]
pub(crate) enum DataReply {
    Welcome,
    Bytes(Vec<u8>),
    /// A welcome with bytes after it.
    WelcomeTrailing(Vec<u8>),
    /// Close without answering.
    Close,
}

/// One action of the fake on the fabric channel.
#[derive(Debug)]
pub(crate) enum FAct {
    Step(Step),
    /// A fabric table with the memfds it names (created for the input).
    Table(Vec<FabricRegion>, Vec<OwnedFd>),
}

pub(crate) struct Script {
    pub(crate) engine: usize,
    pub(crate) control: Vec<Act>,
    pub(crate) data: Vec<DataReply>,
    pub(crate) fabric: Vec<FAct>,
}

fn region(i: &mut In) -> RemoteRegion {
    let addr = match i.u8() % 3 {
        0 => u64::from(i.u16()) << 12,
        1 => 0x7f00_0000_0000 + (u64::from(i.u16()) << 16),
        _ => i.u64(),
    };
    let len = match i.u8() % 3 {
        0 => u64::from(i.u16()) + 1,
        1 => u64::from(i.u16()),
        _ => i.u64(),
    };
    let rkey = i.u64();
    let access = Access::from_bits(i.u8());
    let kind = if i.u8() & 1 == 0 {
        MemKind::Host
    } else {
        MemKind::Device
    };
    let name = match i.u8() % 3 {
        0 => None,
        _ => Some(String::from_utf8_lossy(i.blob8()).into_owned()),
    };
    RemoteRegion {
        addr,
        len,
        rkey,
        access,
        kind,
        name,
    }
}

fn memfd(size: u64, sealed: bool) -> Option<OwnedFd> {
    // SAFETY: plain syscalls; the name is a NUL-terminated literal and the returned fd is
    // owned by the OwnedFd from here on.
    unsafe {
        let fd = libc::memfd_create(
            c"hixl-fuzz".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        );
        if fd < 0 {
            return None;
        }
        let fd = OwnedFd::from_raw_fd(fd);
        if libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) != 0 {
            return None;
        }
        if sealed && libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) != 0 {
            return None;
        }
        Some(fd)
    }
}

pub(crate) fn script(ctx: &Ctx, data: &[u8]) -> Script {
    let mut top = In(data);
    let engine = usize::from(top.u8() % 3);
    let mut c = In(top.blob16());
    let mut d = In(top.blob16());
    let mut f = In(top.0);

    let fake_name = ctx.key.clone();
    let mut control = Vec::new();
    let mut first_table: Vec<RemoteRegion> = Vec::new();
    while !c.is_empty() && control.len() < 64 {
        let tag = c.u8() % (GENERIC_TAGS + 6);
        let act = match tag {
            t if t < GENERIC_TAGS => generic_step(t, &mut c).map(Act::Step),
            6 => Some(Act::Step(Step::Bytes(encode(&Message::Welcome {
                engine: fake_name.clone(),
                session: c.u64(),
                incarnation: 0x1ca7,
                features: hixl_core::wire::FEATURES,
            })))),
            7 => {
                let n = c.u8() % 6;
                let t: Vec<RemoteRegion> = (0..n).map(|_| region(&mut c)).collect();
                if first_table.is_empty() {
                    first_table = t.clone();
                }
                Some(Act::Step(Step::Bytes(encode(&Message::MemTable(t)))))
            }
            8 => {
                let sel = c.u8();
                let id = &ctx.identity;
                Some(Act::Step(Step::Bytes(encode(&Message::FabricInfo {
                    boot_id: id.boot_id.clone(),
                    mnt_ns: id.mnt_ns,
                    pid: if sel & 2 == 0 {
                        id.pid as u32
                    } else {
                        u32::MAX
                    },
                    uid: id.uid,
                    socket: if sel & 1 == 0 {
                        ctx.fabric_name.clone()
                    } else {
                        "hixl-fuzz-no-such-socket".into()
                    },
                }))))
            }
            9 => {
                let seed = c.u8();
                let nonce = (0..32).map(|k| seed.wrapping_add(k)).collect();
                Some(Act::Step(Step::Bytes(encode(&Message::AuthChallenge {
                    nonce,
                }))))
            }
            10 => Some(Act::Proof {
                valid: c.u8() & 1 == 0,
            }),
            _ => Some(Act::Step(Step::Bytes(encode(&Message::Refuse {
                status: c.u32(),
                reason: String::from_utf8_lossy(c.blob8()).into_owned(),
            })))),
        };
        control.extend(act);
    }

    let mut data_replies = Vec::new();
    while !d.is_empty() && data_replies.len() < 8 {
        data_replies.push(match d.u8() % 5 {
            0 => DataReply::Welcome,
            1 => DataReply::Bytes(d.blob8().to_vec()),
            2 => DataReply::Bytes(d.msg().map(|m| encode(&m)).unwrap_or_default()),
            3 => DataReply::WelcomeTrailing(d.blob8().to_vec()),
            _ => DataReply::Close,
        });
    }

    let mut fabric = Vec::new();
    while !f.is_empty() && fabric.len() < 32 {
        let tag = f.u8() % (GENERIC_TAGS + 3);
        let act = match tag {
            t if t < GENERIC_TAGS => generic_step(t, &mut f).map(FAct::Step),
            6 => {
                let n = f.u8() % 4;
                let mut regions = Vec::new();
                let mut fds = Vec::new();
                for _ in 0..n {
                    let base = if first_table.is_empty() {
                        None
                    } else {
                        Some(first_table[usize::from(f.u8()) % first_table.len()].clone())
                    };
                    let (rkey, addr, len) = match (f.u8() % 2, &base) {
                        (0, Some(b)) => (b.rkey, b.addr, b.len.clamp(1, 1 << 20)),
                        _ => (f.u64(), u64::from(f.u16()) << 12, u64::from(f.u16()) + 1),
                    };
                    let fd_index = match f.u8() % 4 {
                        0 => NO_FD,
                        1 => f.u32(),
                        _ => {
                            let size = match f.u8() % 3 {
                                0 => len,
                                1 => len.saturating_sub(1).max(1),
                                _ => u64::from(f.u16()) * 16,
                            }
                            .min(1 << 20);
                            match memfd(size, f.u8() % 4 != 0) {
                                Some(fd) => {
                                    fds.push(fd);
                                    (fds.len() - 1) as u32
                                }
                                None => NO_FD,
                            }
                        }
                    };
                    regions.push(FabricRegion {
                        rkey,
                        addr,
                        len,
                        fd_index,
                    });
                }
                Some(FAct::Table(regions, fds))
            }
            7 => {
                let rkey = match first_table.first() {
                    Some(r) if f.u8() & 1 == 0 => r.rkey,
                    _ => f.u64(),
                };
                Some(FAct::Step(Step::Bytes(encode(&Message::Revoke { rkey }))))
            }
            _ => Some(FAct::Step(Step::Bytes(encode(&Message::NotifyAck {
                seq: f.u64(),
                status: f.u32(),
            })))),
        };
        fabric.extend(act);
    }
    Script {
        engine,
        control,
        data: data_replies,
        fabric,
    }
}
