//! Shared pieces of the live-engine fuzz targets (`target_control`, `target_data`,
//! `initiator_handshake`, `auth_handshake`):
//!
//! - one multi-threaded tokio runtime per fuzzing process ([`runtime`]);
//! - a small, hand-writable input format ([`In`] to read it, [`Out`] to write seeds): most
//!   steps are raw wire bytes (so a seed is just encoded frames), others are frames built by
//!   `arbitrary` from a length-prefixed slice of the input;
//! - [`FMsg`], an `Arbitrary` mirror of every [`Message`] variant;
//! - a mirror of a stream reader ([`decode_all`]), so a harness knows which frames an engine
//!   decodes from the bytes it was sent;
//! - [`Prober`], a real client `Engine` that checks a target engine still serves a normal
//!   initiator (connect, write, read back, compare);
//! - [`open_fds`], for the file-descriptor leak check.
//!
//! Every panic raised here or in the targets names the invariant that failed; harness setup
//! failures say "harness setup".

use std::sync::OnceLock;
use std::time::Duration;

use bytes::BytesMut;
use hixl_async::{Engine, HostBuffer, Region};
use hixl_core::wire::{Channel, DataReq, FabricRegion, Message, WireError};
use hixl_core::{Access, MemKind, OpDesc, RemoteRegion};
use libfuzzer_sys::arbitrary::{self, Arbitrary, Unstructured};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::runtime::Runtime;

/// The process's runtime: two workers, like a small server; created on first use. With
/// `HIXL_FUZZ_LOG` set (to anything), the engines' logs go to stderr at debug level.
pub fn runtime() -> &'static Runtime {
    static RT: OnceLock<Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        // libFuzzer's `main` is C++, so Rust's start-up code that ignores SIGPIPE never ran:
        // a write to a socket the peer closed (tokio's vectored writes are plain `writev`)
        // would kill the process instead of failing with EPIPE, as it does in any Rust binary.
        // SAFETY: setting a signal's disposition to SIG_IGN has no preconditions.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_IGN);
        }
        if std::env::var_os("HIXL_FUZZ_LOG").is_some() {
            let _ = tracing_subscriber::fmt()
                .with_max_level(tracing::Level::DEBUG)
                .with_writer(std::io::stderr)
                .try_init();
        }
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("harness setup: building the tokio runtime")
    })
}

// ---------------------------------------------------------------------------------------------
// Input format.

/// Reads a fuzz input. Past its end every read yields zeros / empty slices, so any byte string
/// is a valid input.
pub struct In<'a>(pub &'a [u8]);

impl<'a> In<'a> {
    /// Whether the input is used up.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// Up to `n` bytes.
    pub fn take(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.0.len());
        let (h, t) = self.0.split_at(n);
        self.0 = t;
        h
    }
    /// One byte (0 past the end).
    pub fn u8(&mut self) -> u8 {
        self.take(1).first().copied().unwrap_or(0)
    }
    /// Little-endian u16.
    pub fn u16(&mut self) -> u16 {
        let mut b = [0u8; 2];
        let t = self.take(2);
        b[..t.len()].copy_from_slice(t);
        u16::from_le_bytes(b)
    }
    /// Little-endian u32.
    pub fn u32(&mut self) -> u32 {
        let mut b = [0u8; 4];
        let t = self.take(4);
        b[..t.len()].copy_from_slice(t);
        u32::from_le_bytes(b)
    }
    /// Little-endian u64.
    pub fn u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        let t = self.take(8);
        b[..t.len()].copy_from_slice(t);
        u64::from_le_bytes(b)
    }
    /// A u16 length, then that many bytes.
    pub fn blob16(&mut self) -> &'a [u8] {
        let n = self.u16() as usize;
        self.take(n)
    }
    /// A u8 length, then that many bytes.
    pub fn blob8(&mut self) -> &'a [u8] {
        let n = self.u8() as usize;
        self.take(n)
    }
    /// A value built by `arbitrary` from a u8-length-prefixed slice (so it never eats the
    /// rest of the input). `None` when `arbitrary` refuses the bytes.
    pub fn arb<T: for<'x> Arbitrary<'x>>(&mut self) -> Option<T> {
        let b = self.blob8();
        T::arbitrary(&mut Unstructured::new(b)).ok()
    }
    /// An [`FMsg`] turned into a [`Message`].
    pub fn msg(&mut self) -> Option<Message> {
        self.arb::<FMsg>().map(FMsg::into_message)
    }
}

/// Writes inputs in the format [`In`] reads (for the seed corpus).
#[derive(Default)]
pub struct Out(pub Vec<u8>);

impl Out {
    /// One byte.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    /// Little-endian u16.
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Little-endian u32.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Little-endian u64.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A u16 length and the bytes.
    pub fn blob16(&mut self, b: &[u8]) -> &mut Self {
        let n = b.len().min(u16::MAX as usize);
        self.u16(n as u16);
        self.0.extend_from_slice(&b[..n]);
        self
    }
    /// A u8 length and the bytes.
    pub fn blob8(&mut self, b: &[u8]) -> &mut Self {
        let n = b.len().min(u8::MAX as usize);
        self.u8(n as u8);
        self.0.extend_from_slice(&b[..n]);
        self
    }
    /// The encoded frames of `msgs`, back to back.
    pub fn frames(msgs: &[Message]) -> Vec<u8> {
        let mut b = BytesMut::new();
        for m in msgs {
            m.encode(&mut b);
        }
        b.to_vec()
    }
}

// ---------------------------------------------------------------------------------------------
// Arbitrary messages.

/// A region of a memory table, from arbitrary fields (invalid ones included: zero length,
/// wrapping ranges, unknown access bits or kinds, over-long names).
#[derive(Arbitrary, Debug, Clone)]
pub struct FRegion {
    /// Start.
    pub addr: u64,
    /// Length.
    pub len: u64,
    /// Key.
    pub rkey: u64,
    /// Access bits.
    pub access: u8,
    /// Kind code.
    pub kind: bool,
    /// Name.
    pub name: Option<String>,
}

impl FRegion {
    /// As a [`RemoteRegion`].
    pub fn region(&self) -> RemoteRegion {
        RemoteRegion {
            addr: self.addr,
            len: self.len,
            rkey: self.rkey,
            access: Access::from_bits(self.access),
            kind: if self.kind {
                MemKind::Device
            } else {
                MemKind::Host
            },
            name: self.name.clone(),
        }
    }
}

/// A data request's fields.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub struct FReq {
    /// Request id.
    pub id: u64,
    /// Region key.
    pub rkey: u64,
    /// Address.
    pub addr: u64,
    /// Length.
    pub len: u64,
}

impl From<FReq> for DataReq {
    fn from(r: FReq) -> DataReq {
        DataReq {
            id: r.id,
            rkey: r.rkey,
            addr: r.addr,
            len: r.len,
        }
    }
}

/// Every message of the protocol with arbitrary field values. Encoding one gives a
/// well-framed message; its body may still be invalid (e.g. a name over the limit).
#[derive(Arbitrary, Debug, Clone)]
#[allow(missing_docs)]
pub enum FMsg {
    Hello {
        engine: String,
        channel: u8,
        session: u64,
    },
    Welcome {
        engine: String,
        session: u64,
        incarnation: u64,
    },
    Refuse {
        status: u32,
        reason: String,
    },
    MemTable(Vec<FRegion>),
    Notify {
        seq: u64,
        name: Vec<u8>,
        msg: Vec<u8>,
    },
    NotifyAck {
        seq: u64,
        status: u32,
    },
    Heartbeat {
        seq: u64,
    },
    Disconnect {
        reason: String,
    },
    WriteReq(FReq),
    ReadReq(FReq),
    ReadResp {
        id: u64,
        status: u32,
        len: u64,
    },
    Ack {
        id: u64,
        status: u32,
    },
    FabricInfo {
        boot_id: String,
        mnt_ns: u64,
        pid: u32,
        uid: u32,
        socket: String,
    },
    FabricTable(Vec<(u64, u64, u64, u32)>),
    Revoke {
        rkey: u64,
    },
    RevokeAck {
        rkey: u64,
    },
    VerbsInfo {
        device: String,
    },
    VerbsConnect {
        endpoint: Vec<u8>,
    },
    VerbsAccept {
        status: u32,
        endpoint: Vec<u8>,
        reason: String,
    },
    VerbsKeys(Vec<(u64, u32)>),
    AuthChallenge {
        nonce: Vec<u8>,
    },
    AuthResponse {
        nonce: Vec<u8>,
        mac: Vec<u8>,
    },
    AuthProof {
        mac: Vec<u8>,
    },
}

impl FMsg {
    /// The message.
    pub fn into_message(self) -> Message {
        match self {
            FMsg::Hello {
                engine,
                channel,
                session,
            } => Message::Hello {
                engine,
                channel: match channel % 3 {
                    0 => Channel::Control,
                    1 => Channel::Data,
                    _ => Channel::Fabric,
                },
                session,
            },
            FMsg::Welcome {
                engine,
                session,
                incarnation,
            } => Message::Welcome {
                engine,
                session,
                incarnation,
            },
            FMsg::Refuse { status, reason } => Message::Refuse { status, reason },
            FMsg::MemTable(v) => Message::MemTable(v.iter().map(FRegion::region).collect()),
            FMsg::Notify { seq, name, msg } => Message::Notify { seq, name, msg },
            FMsg::NotifyAck { seq, status } => Message::NotifyAck { seq, status },
            FMsg::Heartbeat { seq } => Message::Heartbeat { seq },
            FMsg::Disconnect { reason } => Message::Disconnect { reason },
            FMsg::WriteReq(r) => Message::WriteReq(r.into()),
            FMsg::ReadReq(r) => Message::ReadReq(r.into()),
            FMsg::ReadResp { id, status, len } => Message::ReadResp { id, status, len },
            FMsg::Ack { id, status } => Message::Ack { id, status },
            FMsg::FabricInfo {
                boot_id,
                mnt_ns,
                pid,
                uid,
                socket,
            } => Message::FabricInfo {
                boot_id,
                mnt_ns,
                pid,
                uid,
                socket,
            },
            FMsg::FabricTable(v) => Message::FabricTable(
                v.into_iter()
                    .map(|(rkey, addr, len, fd_index)| FabricRegion {
                        rkey,
                        addr,
                        len,
                        fd_index,
                    })
                    .collect(),
            ),
            FMsg::Revoke { rkey } => Message::Revoke { rkey },
            FMsg::RevokeAck { rkey } => Message::RevokeAck { rkey },
            FMsg::VerbsInfo { device } => Message::VerbsInfo { device },
            FMsg::VerbsConnect { endpoint } => Message::VerbsConnect { endpoint },
            FMsg::VerbsAccept {
                status,
                endpoint,
                reason,
            } => Message::VerbsAccept {
                status,
                endpoint,
                reason,
            },
            FMsg::VerbsKeys(v) => Message::VerbsKeys(v),
            FMsg::AuthChallenge { nonce } => Message::AuthChallenge { nonce },
            FMsg::AuthResponse { nonce, mac } => Message::AuthResponse { nonce, mac },
            FMsg::AuthProof { mac } => Message::AuthProof { mac },
        }
    }
}

/// The frame of `m`.
pub fn encode(m: &Message) -> Vec<u8> {
    let mut b = BytesMut::new();
    m.encode(&mut b);
    b.to_vec()
}

// ---------------------------------------------------------------------------------------------
// Byte streams.

/// One piece of what a harness sends on a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Bytes, written with one `write_all`.
    Bytes(Vec<u8>),
    /// Let the peer run before the next bytes (so it sees them in a separate read).
    Pause,
    /// Attach this many file descriptors to the next bytes (Unix sockets only).
    Fds(u8),
}

/// Tags of the generic steps; targets number their own after [`GENERIC_TAGS`].
pub const TAG_RAW: u8 = 0;
/// A frame built by `arbitrary`.
pub const TAG_MSG: u8 = 1;
/// A frame built by `arbitrary`, cut short.
pub const TAG_CUT: u8 = 2;
/// A frame built by `arbitrary`, with one byte changed.
pub const TAG_FLIP: u8 = 3;
/// A pause.
pub const TAG_PAUSE: u8 = 4;
/// File descriptors for the next bytes.
pub const TAG_FDS: u8 = 5;
/// How many generic tags there are.
pub const GENERIC_TAGS: u8 = 6;

/// Reads the generic step with tag `tag` (< [`GENERIC_TAGS`]).
pub fn generic_step(tag: u8, i: &mut In) -> Option<Step> {
    match tag {
        TAG_RAW => Some(Step::Bytes(i.blob16().to_vec())),
        TAG_MSG => i.msg().map(|m| Step::Bytes(encode(&m))),
        TAG_CUT => {
            let m = i.msg();
            let keep = i.u16() as usize;
            m.map(|m| {
                let b = encode(&m);
                let keep = keep % b.len().max(1);
                Step::Bytes(b[..keep].to_vec())
            })
        }
        TAG_FLIP => {
            let m = i.msg();
            let (at, x) = (i.u16() as usize, i.u8());
            m.map(|m| {
                let mut b = encode(&m);
                let n = b.len();
                if n > 0 {
                    b[at % n] ^= x.max(1);
                }
                Step::Bytes(b)
            })
        }
        TAG_PAUSE => Some(Step::Pause),
        TAG_FDS => Some(Step::Fds(i.u8() % 8)),
        _ => None,
    }
}

/// Concatenation of the bytes of `steps`.
pub fn stream_bytes(steps: &[Step]) -> Vec<u8> {
    let mut v = Vec::new();
    for s in steps {
        if let Step::Bytes(b) = s {
            v.extend_from_slice(b);
        }
    }
    v
}

/// How a reader's frame loop over a byte stream ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// Every byte was consumed by whole frames.
    Clean,
    /// The stream ended inside a frame.
    Partial,
    /// A malformed frame: the reader gives up.
    Broken(WireError),
}

/// The frames a `read_frame` loop decodes from `bytes` (with each frame's end offset), and
/// how the loop ends. Data-request payloads are not skipped (control readers do not).
pub fn decode_all(bytes: &[u8]) -> (Vec<(Message, usize)>, End) {
    let mut buf = BytesMut::from(bytes);
    let mut out = Vec::new();
    loop {
        match Message::decode(&mut buf) {
            Ok(Some(m)) => out.push((m, bytes.len() - buf.len())),
            Ok(None) if buf.is_empty() => return (out, End::Clean),
            Ok(None) => return (out, End::Partial),
            Err(e) => return (out, End::Broken(e)),
        }
    }
}

/// Writes `steps` to `w` and then shuts the write side down. Fds steps are ignored (TCP).
/// Returns false when a write failed (the peer closed first). Then the connection was reset,
/// and the reset may have been reported to the write, not to the reads: a reader then sees
/// what looks like an orderly EOF although bytes the peer sent last may be lost.
pub async fn write_steps<W: tokio::io::AsyncWrite + Unpin>(w: &mut W, steps: &[Step]) -> bool {
    for s in steps {
        match s {
            Step::Bytes(b) => {
                if !b.is_empty() && w.write_all(b).await.is_err() {
                    return false;
                }
            }
            Step::Pause => tokio::task::yield_now().await,
            Step::Fds(_) => {}
        }
    }
    let _ = w.shutdown().await;
    true
}

/// How reading ended, given whether all writes went through (see [`write_steps`]).
pub fn read_end(end: ReadEnd, wrote_all: bool) -> ReadEnd {
    match end {
        ReadEnd::Eof if !wrote_all => ReadEnd::Reset,
        e => e,
    }
}

/// How reading a connection to its end went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadEnd {
    /// An orderly EOF: the peer closed (or shut down) its side; everything it sent arrived.
    Eof,
    /// A reset or other error: bytes the peer sent may be missing at the end.
    Reset,
    /// The deadline passed with the connection still open.
    Timeout,
}

/// Reads until EOF or error, at most `limit` bytes (a longer answer is an invariant
/// violation: the caller's model bounds what the peer may send), for at most `within`.
pub async fn read_to_end<R: tokio::io::AsyncRead + Unpin>(
    r: &mut R,
    limit: usize,
    within: Duration,
) -> (Vec<u8>, ReadEnd) {
    let mut v = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, r.read(&mut buf)).await {
            Err(_) => return (v, ReadEnd::Timeout),
            Ok(Ok(0)) => return (v, ReadEnd::Eof),
            Ok(Ok(n)) => {
                v.extend_from_slice(&buf[..n]);
                assert!(
                    v.len() <= limit,
                    "invariant violated: the engine sent more than {limit} bytes on one connection (answers are bounded by the input)"
                );
            }
            Ok(Err(_)) => return (v, ReadEnd::Reset),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The "still serves a normal initiator" check.

/// A real client engine that connects to a target engine, writes a pattern into one of its
/// regions, reads it back and compares, then disconnects.
pub struct Prober {
    /// The client engine.
    pub engine: Engine,
    local: Region,
    round: u64,
}

impl Prober {
    /// A client engine with these options (e.g. `hixl.Transport=tcp`).
    pub async fn new(options: &[(&str, &str)]) -> Prober {
        let mut b = Engine::builder("127.0.0.1");
        for (k, v) in options {
            b = b.option(*k, *v);
        }
        let engine = b.build().await.expect("harness setup: prober engine");
        let local = engine
            .register(HostBuffer::zeroed(64 << 10).expect("harness setup: prober buffer"))
            .expect("harness setup: prober registration");
        Prober {
            engine,
            local,
            round: 0,
        }
    }

    /// Connects to `remote`, moves 1 KiB into its region `region` at an offset that changes
    /// every round and back, compares, disconnects. Returns the remote address written and
    /// the bytes, so the caller can check them in the target's memory too.
    ///
    /// # Panics
    /// When any step fails: the target engine no longer serves a normal initiator.
    pub async fn check(&mut self, remote: &str, region: &str) -> (u64, Vec<u8>) {
        self.round += 1;
        let r = self.round;
        let peer = match self.engine.connect(remote, Duration::from_secs(10)).await {
            Ok(p) => p,
            Err(e) => panic!(
                "invariant violated: the engine at {remote} no longer accepts a normal initiator: {e}"
            ),
        };
        let Some(reg) = peer.region(region) else {
            panic!(
                "invariant violated: the engine's memory table lost region {region}: {:?}",
                peer.regions()
            )
        };
        const N: u64 = 1024;
        let slots = (reg.len / N).max(1);
        let remote_addr = reg.addr + (r % slots) * N;
        let pattern: Vec<u8> = (0..N)
            .map(|i| (i as u8) ^ (r as u8).wrapping_mul(31))
            .collect();
        self.local
            .write_at(0, &pattern)
            .expect("harness setup: prober local write");
        let w = peer
            .write(&[OpDesc::new(self.local.addr(), remote_addr, N)])
            .timeout(Duration::from_secs(10))
            .await;
        if let Err(e) = w {
            panic!(
                "invariant violated: a normal write to {remote} failed ({}): {e}",
                peer.transport()
            );
        }
        let rd = peer
            .read(&[OpDesc::new(self.local.addr() + 4096, remote_addr, N)])
            .timeout(Duration::from_secs(10))
            .await;
        if let Err(e) = rd {
            panic!(
                "invariant violated: a normal read from {remote} failed ({}): {e}",
                peer.transport()
            );
        }
        let mut back = vec![0u8; N as usize];
        self.local
            .read_at(4096, &mut back)
            .expect("harness setup: prober local read");
        assert!(
            back == pattern,
            "invariant violated: bytes written to {remote} and read back differ ({})",
            peer.transport()
        );
        drop(peer);
        let _ = self.engine.disconnect(remote).await;
        (remote_addr, pattern)
    }
}

// ---------------------------------------------------------------------------------------------
// File descriptors.

/// Open file descriptors of this process.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Tracks the process's fd count at the periodic checks: after a warm-up it must not keep
/// growing (a leak of one fd per input would pass the bound within a few hundred inputs).
#[derive(Default)]
pub struct FdWatch {
    baseline: Option<usize>,
    checks: u32,
}

/// How many fds above the baseline are tolerated (sockets still closing, runtime growth).
pub const FD_SLACK: usize = 256;

impl FdWatch {
    /// Checks the fd count; the baseline is taken at the third call (after warm-up).
    ///
    /// # Panics
    /// When the count exceeds the baseline by more than [`FD_SLACK`].
    pub fn check(&mut self) {
        self.checks += 1;
        let n = open_fds();
        match self.baseline {
            None if self.checks >= 3 => self.baseline = Some(n),
            Some(b) => assert!(
                n <= b + FD_SLACK,
                "invariant violated: file descriptors leak: {n} open now, {b} after warm-up"
            ),
            None => {}
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Unix sockets (the fabric channel), where frames may carry file descriptors.

/// A descriptor to pass around in `Fds` steps: `/dev/null`, opened once.
pub fn spare_fd() -> std::os::fd::BorrowedFd<'static> {
    use std::os::fd::AsFd;
    static F: OnceLock<std::fs::File> = OnceLock::new();
    F.get_or_init(|| std::fs::File::open("/dev/null").expect("harness setup: /dev/null"))
        .as_fd()
}

/// Sends `b` with `fds` attached to its first byte.
pub async fn send_with_fds(
    s: &tokio::net::UnixStream,
    b: &[u8],
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> std::io::Result<()> {
    use std::os::fd::AsFd;
    let mut off = 0;
    let mut fds = fds;
    while off < b.len() {
        s.writable().await?;
        match s.try_io(tokio::io::Interest::WRITABLE, || {
            hixl_fabric::send_fds(s.as_fd(), &b[off..], fds)
        }) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                off += n;
                fds = &[];
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes `steps` to a Unix stream (an `Fds(n)` step attaches `n` copies of [`spare_fd`] to
/// the next bytes), then shuts the write side down. Returns false when a write failed.
pub async fn write_steps_unix(s: &tokio::net::UnixStream, steps: &[Step]) -> bool {
    let mut nfds = 0usize;
    for st in steps {
        match st {
            Step::Bytes(b) if !b.is_empty() => {
                let fds = vec![spare_fd(); nfds];
                nfds = 0;
                if send_with_fds(s, b, &fds).await.is_err() {
                    return false;
                }
            }
            Step::Bytes(_) => {}
            Step::Pause => tokio::task::yield_now().await,
            Step::Fds(n) => nfds = usize::from(*n),
        }
    }
    shutdown_write(s);
    true
}

/// `shutdown(SHUT_WR)` on a socket.
pub fn shutdown_write(s: &impl std::os::fd::AsRawFd) {
    // SAFETY: plain syscall on a live descriptor.
    unsafe {
        libc::shutdown(s.as_raw_fd(), libc::SHUT_WR);
    }
}

/// Reads a Unix stream until EOF or error (at most `limit` bytes), keeping the descriptors
/// that arrive (in arrival order) so they can be checked and then closed.
pub async fn read_to_end_unix(
    s: &tokio::net::UnixStream,
    limit: usize,
    within: Duration,
) -> (Vec<u8>, ReadEnd, Vec<std::os::fd::OwnedFd>) {
    use std::os::fd::AsFd;
    let mut v = Vec::new();
    let mut fds = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, s.readable()).await {
            Err(_) => return (v, ReadEnd::Timeout, fds),
            Ok(Err(_)) => return (v, ReadEnd::Reset, fds),
            Ok(Ok(())) => {}
        }
        match s.try_io(tokio::io::Interest::READABLE, || {
            hixl_fabric::recv_fds(s.as_fd(), &mut buf, hixl_fabric::SCM_MAX_FD)
        }) {
            Ok((0, _)) => return (v, ReadEnd::Eof, fds),
            Ok((n, got)) => {
                v.extend_from_slice(&buf[..n]);
                fds.extend(got);
                assert!(
                    v.len() <= limit,
                    "invariant violated: the engine sent more than {limit} bytes on one fabric channel"
                );
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return (v, ReadEnd::Reset, fds),
        }
    }
}

/// Connects to an abstract Unix socket.
pub fn connect_abstract(name: &str) -> std::io::Result<tokio::net::UnixStream> {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
    let s = std::os::unix::net::UnixStream::connect_addr(&addr)?;
    s.set_nonblocking(true)?;
    tokio::net::UnixStream::from_std(s)
}

/// Binds an abstract Unix socket.
pub fn listen_abstract(name: &str) -> std::io::Result<tokio::net::UnixListener> {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
    let l = std::os::unix::net::UnixListener::bind_addr(&addr)?;
    l.set_nonblocking(true)?;
    tokio::net::UnixListener::from_std(l)
}

// ---------------------------------------------------------------------------------------------
// A raw initiator's control handshake.

/// What a target engine told a raw initiator in its handshake.
#[derive(Debug)]
pub struct Handshake {
    /// The control connection (kept open: closing it ends the session).
    pub stream: tokio::net::TcpStream,
    /// The session data and fabric channels must present.
    pub session: u64,
    /// The target's fabric socket, if it offered one.
    pub fabric_socket: Option<String>,
    /// The memory table.
    pub table: Vec<RemoteRegion>,
    /// Bytes read past the memory table.
    pub rest: BytesMut,
}

/// Connects to `addr` as initiator `engine` with raw frames: Hello, then Welcome, FabricInfo /
/// VerbsInfo and the memory table.
///
/// # Panics
/// When the target does not complete a valid handshake (an invariant: it must serve one).
pub async fn handshake(addr: &str, engine: &str) -> Handshake {
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| {
            panic!("invariant violated: the engine at {addr} does not accept connections: {e}")
        });
    let _ = s.set_nodelay(true);
    let hello = Message::Hello {
        engine: engine.to_string(),
        channel: Channel::Control,
        session: 1,
    };
    s.write_all(&encode(&hello))
        .await
        .unwrap_or_else(|e| panic!("invariant violated: writing a hello to {addr}: {e}"));
    let mut buf = BytesMut::new();
    let mut session = None;
    let mut fabric_socket = None;
    let table = loop {
        match Message::decode(&mut buf) {
            Ok(Some(Message::Welcome { session: s, .. })) if session.is_none() => session = Some(s),
            Ok(Some(Message::FabricInfo { socket, .. })) if session.is_some() => {
                fabric_socket = Some(socket)
            }
            Ok(Some(Message::VerbsInfo { .. })) if session.is_some() => {}
            Ok(Some(Message::Heartbeat { .. })) if session.is_some() => {}
            Ok(Some(Message::MemTable(t))) if session.is_some() => break t,
            Ok(Some(m)) => {
                panic!("invariant violated: a valid hello to {addr} was answered with {m:?}")
            }
            Err(e) => panic!("invariant violated: {addr} sent a malformed handshake frame: {e}"),
            Ok(None) => {
                let r = tokio::time::timeout(Duration::from_secs(10), s.read_buf(&mut buf)).await;
                match r {
                    Ok(Ok(n)) if n > 0 => {}
                    other => panic!(
                        "invariant violated: {addr} did not complete a valid handshake: {other:?}"
                    ),
                }
            }
        }
    };
    Handshake {
        stream: s,
        session: session.unwrap_or_default(),
        fabric_socket,
        table,
        rest: buf,
    }
}
