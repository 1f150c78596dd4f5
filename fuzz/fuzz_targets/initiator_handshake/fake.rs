//! The fake target: the control connection, the data connections and the fabric channel.

use std::os::fd::AsFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use hixl_core::auth::Secret;
use hixl_core::wire::Message;
use hixl_fuzz::{decode_all, encode, send_with_fds, Step};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

use crate::script::{Act, DataReply, FAct};
use crate::{CLOSE_BOUND, SECRET};

/// What the fake saw and did.
#[derive(Default, Debug)]
pub(crate) struct Report {
    /// The engine's control hello.
    pub(crate) hello: Option<Message>,
    /// Everything sent on the control connection before `connect` returned.
    pub(crate) before: Vec<u8>,
    /// Everything sent after.
    pub(crate) after: Vec<u8>,
    /// Frames the engine sent on the control connection.
    pub(crate) from_engine: Vec<Message>,
    /// Whether the engine closed the control connection within the bound (after the fake's
    /// close).
    pub(crate) engine_closed: Option<bool>,
    /// Whether the link's writer task visibly started (its first heartbeat came) before the
    /// rest of the script was sent (workaround mode only).
    pub(crate) writer_started: bool,
    /// Data hellos, in order.
    pub(crate) data_hellos: Vec<Option<Message>>,
    /// Fabric hellos.
    pub(crate) fabric_hellos: Vec<Option<Message>>,
}

pub(crate) type Shared = Arc<Mutex<Report>>;

pub(crate) fn lock(r: &Shared) -> std::sync::MutexGuard<'_, Report> {
    r.lock().unwrap_or_else(|e| e.into_inner())
}

async fn read_one(s: &mut (impl AsyncReadExt + Unpin), within: Duration) -> Option<Message> {
    let mut b = BytesMut::new();
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match Message::decode(&mut b) {
            Ok(Some(m)) => return Some(m),
            Ok(None) => {}
            Err(_) => return None,
        }
        match tokio::time::timeout_at(deadline, s.read_buf(&mut b)).await {
            Ok(Ok(n)) if n > 0 => {}
            _ => return None,
        }
    }
}

/// Reads the engine's control frames into the report; signals each `AuthResponse` and each
/// engine heartbeat.
async fn engine_reader(
    mut r: tokio::net::tcp::OwnedReadHalf,
    rep: Shared,
    auth: tokio::sync::mpsc::UnboundedSender<Vec<u8>>,
    beat: tokio::sync::watch::Sender<bool>,
) -> bool {
    let mut b = BytesMut::new();
    loop {
        loop {
            match Message::decode(&mut b) {
                Ok(Some(m)) => {
                    let nonce = match &m {
                        Message::AuthResponse { nonce, .. } => Some(nonce.clone()),
                        _ => None,
                    };
                    let is_beat = matches!(m, Message::Heartbeat { .. });
                    lock(&rep).from_engine.push(m);
                    if let Some(n) = nonce {
                        let _ = auth.send(n);
                    }
                    if is_beat {
                        beat.send_replace(true);
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    panic!("invariant violated: the engine sent a malformed control frame: {e}")
                }
            }
        }
        match r.read_buf(&mut b).await {
            Ok(n) if n > 0 => {}
            // EOF or reset: the engine closed.
            _ => return true,
        }
    }
}

/// Answers data connections in order, then holds them open.
async fn data_server(
    l: Arc<TcpListener>,
    replies: Vec<DataReply>,
    name: String,
    rep: Shared,
    hold: Arc<Mutex<Vec<TcpStream>>>,
) {
    let mut k = 0;
    loop {
        let Ok((mut s, _)) = l.accept().await else {
            return;
        };
        let _ = s.set_nodelay(true);
        // After a failed connect the engine asks once, on a connection of its own, whether
        // the port is an HTTP server (to name one in its error): not a data connection.
        let mut head = [0u8; 4];
        let probe = tokio::time::timeout(Duration::from_secs(1), s.peek(&mut head)).await;
        if matches!(probe, Ok(Ok(4))) && &head == b"GET " {
            continue;
        }
        let hello = read_one(&mut s, Duration::from_secs(1)).await;
        lock(&rep).data_hellos.push(hello.clone());
        let session = match hello {
            Some(Message::Hello { session, .. }) => session,
            _ => 0,
        };
        let welcome = encode(&Message::Welcome {
            engine: name.clone(),
            session,
            incarnation: 0x1ca7,
            features: hixl_core::wire::FEATURES,
        });
        let reply = replies.get(k).cloned().unwrap_or(DataReply::Welcome);
        k += 1;
        match reply {
            DataReply::Welcome => {
                let _ = s.write_all(&welcome).await;
            }
            DataReply::Bytes(b) => {
                let _ = s.write_all(&b).await;
            }
            DataReply::WelcomeTrailing(b) => {
                let mut w = welcome;
                w.extend_from_slice(&b);
                let _ = s.write_all(&w).await;
            }
            DataReply::Close => continue,
        }
        hold.lock().unwrap_or_else(|e| e.into_inner()).push(s);
    }
}

/// Serves fabric channels with the script, then holds them open.
pub(crate) async fn fabric_server(
    l: Arc<UnixListener>,
    acts: Vec<FAct>,
    rep: Shared,
    hold: Arc<Mutex<Vec<UnixStream>>>,
) {
    let mut acts = Some(acts);
    loop {
        let Ok((s, _)) = l.accept().await else {
            return;
        };
        let mut b = BytesMut::new();
        let mut tmp = [0u8; 4096];
        let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
        let hello = loop {
            match Message::decode(&mut b) {
                Ok(Some(m)) => break Some(m),
                Ok(None) => {}
                Err(_) => break None,
            }
            if tokio::time::timeout_at(deadline, s.readable())
                .await
                .is_err()
            {
                break None;
            }
            match s.try_read(&mut tmp) {
                Ok(0) => break None,
                Ok(n) => b.extend_from_slice(&tmp[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => break None,
            }
        };
        lock(&rep).fabric_hellos.push(hello);
        // The script goes to the first channel only.
        let acts = acts.take().unwrap_or_default();
        // With the workaround, a channel whose script holds no whole first frame is closed
        // after it: a connect left waiting for a fabric table would time out, and a connect
        // abandoned after its data connections were opened leaks them (see artifacts-found/).
        let mut all = Vec::new();
        for a in &acts {
            match a {
                FAct::Step(Step::Bytes(b)) => all.extend_from_slice(b),
                FAct::Table(t, _) => all.extend(encode(&Message::FabricTable(t.clone()))),
                FAct::Step(_) => {}
            }
        }
        let close = workaround() && decode_all(&all).0.is_empty();
        for a in acts {
            match a {
                FAct::Step(Step::Bytes(b)) if !b.is_empty() => {
                    if send_with_fds(&s, &b, &[]).await.is_err() {
                        break;
                    }
                }
                FAct::Step(Step::Pause) => tokio::task::yield_now().await,
                FAct::Step(_) => {}
                FAct::Table(t, fds) => {
                    let b = encode(&Message::FabricTable(t));
                    let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
                    if send_with_fds(&s, &b, &borrowed).await.is_err() {
                        break;
                    }
                }
            }
        }
        if close {
            hixl_fuzz::shutdown_write(&s);
        }
        hold.lock().unwrap_or_else(|e| e.into_inner()).push(s);
    }
}

/// Whether the first frame in `bytes` is an auth challenge.
fn challenged(bytes: &[u8]) -> bool {
    matches!(
        decode_all(bytes).0.first(),
        Some((Message::AuthChallenge { .. }, _))
    )
}

/// The index of the end of the first memory table in `bytes`, if one is complete there.
fn first_table_end(bytes: &[u8]) -> Option<usize> {
    let (frames, _) = decode_all(bytes);
    frames
        .iter()
        .find(|(m, _)| matches!(m, Message::MemTable(_)))
        .map(|(_, e)| *e)
}

/// Runs the control script on the engine's control connection: everything up to the end of
/// the first memory table, then (once `connect` returned) the rest, then a close.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn control_server(
    l: Arc<TcpListener>,
    acts: Vec<Act>,
    rep: Shared,
    returned: tokio::sync::oneshot::Receiver<()>,
    data_replies: Vec<DataReply>,
    name: String,
    hold: Arc<Mutex<Vec<TcpStream>>>,
) {
    // The engine's control connection: the first one that says hello.
    let (s, hello) = loop {
        let Ok((mut s, _)) = l.accept().await else {
            return;
        };
        let _ = s.set_nodelay(true);
        if let Some(h) = read_one(&mut s, Duration::from_secs(1)).await {
            break (s, h);
        }
    };
    lock(&rep).hello = Some(hello);
    let data = tokio::spawn(data_server(
        l.clone(),
        data_replies,
        name,
        rep.clone(),
        hold.clone(),
    ));
    let (r, mut w) = s.into_split();
    let (auth_tx, mut auth_rx) = tokio::sync::mpsc::unbounded_channel();
    let (beat_tx, mut beat_rx) = tokio::sync::watch::channel(false);
    let reader = tokio::spawn(engine_reader(r, rep.clone(), auth_tx, beat_tx));

    let mut sent: Vec<u8> = Vec::new();
    let mut rest: Vec<Vec<u8>> = Vec::new();
    let mut cut = false;
    for a in acts {
        let bytes = match a {
            Act::Step(Step::Bytes(b)) => b,
            Act::Step(Step::Pause) => {
                if !cut {
                    tokio::task::yield_now().await;
                }
                continue;
            }
            Act::Step(Step::Fds(_)) => continue,
            Act::Proof { valid } => {
                // The challenge the engine answered is the first frame it read.
                let nt = match decode_all(&sent).0.first() {
                    Some((Message::AuthChallenge { nonce }, _)) => nonce.clone(),
                    _ => Vec::new(),
                };
                // Only a challenged engine answers: wait for it then (it answers at once).
                let ni = if cut || !challenged(&sent) {
                    None
                } else {
                    tokio::time::timeout(Duration::from_millis(300), auth_rx.recv())
                        .await
                        .ok()
                        .flatten()
                };
                let secret = Secret::new(SECRET);
                let mac = match ni {
                    Some(ni) if valid => secret.target_mac(&nt, &ni).to_vec(),
                    // A reflected initiator MAC: the right secret, the wrong label.
                    Some(ni) => secret.initiator_mac(&nt, &ni).to_vec(),
                    None => vec![0; 32],
                };
                encode(&Message::AuthProof { mac })
            }
        };
        if cut {
            rest.push(bytes);
            continue;
        }
        let mut all = sent.clone();
        all.extend_from_slice(&bytes);
        // The report learns of bytes before the engine can read them: `connect` may return
        // as soon as they are written.
        match first_table_end(&all) {
            Some(end) => {
                let k = end - sent.len();
                sent.extend_from_slice(&bytes[..k]);
                lock(&rep).before = sent.clone();
                let _ = w.write_all(&bytes[..k]).await;
                rest.push(bytes[k..].to_vec());
                cut = true;
            }
            None => {
                sent.extend_from_slice(&bytes);
                lock(&rep).before = sent.clone();
                if w.write_all(&bytes).await.is_err() {
                    break;
                }
            }
        }
    }
    if !cut {
        // No memory table: the engine cannot connect. Close so it learns at once.
        let _ = w.shutdown().await;
    }
    let _ = returned.await;
    if cut {
        if workaround() {
            // Let the link's writer task start before anything can end the link (it is the
            // one that sends the engine's heartbeat probes).
            let beat = tokio::time::timeout(Duration::from_secs(1), beat_rx.wait_for(|b| *b)).await;
            lock(&rep).writer_started = matches!(beat, Ok(Ok(_)));
        }
        let mut after = Vec::new();
        for b in rest {
            if w.write_all(&b).await.is_err() {
                break;
            }
            after.extend_from_slice(&b);
        }
        lock(&rep).after = after;
        let _ = w.shutdown().await;
    }
    let closed = tokio::time::timeout(CLOSE_BOUND, reader).await;
    lock(&rep).engine_closed = Some(matches!(closed, Ok(Ok(true))));
    data.abort();
    drop(w);
}

/// `HIXL_FUZZ_WORKAROUND=1`: wait for the link's first heartbeat before ending the link (a
/// known engine race would otherwise leave the control connection open).
pub(crate) fn workaround() -> bool {
    static W: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *W.get_or_init(|| std::env::var_os("HIXL_FUZZ_WORKAROUND").is_some())
}
