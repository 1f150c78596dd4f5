//! Raw ranges, pieces and sockets against real socket pairs.

use super::*;
use crate::stage::{recv_exact, recv_staged, Stage};
use std::time::Duration;

const ZERO: Duration = Duration::ZERO;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u8)
                .wrapping_mul(31)
                .wrapping_add(seed ^ (i >> 12) as u8)
        })
        .collect()
}

/// A range over a vector the test keeps alive and does not reference meanwhile.
fn range(v: &mut [u8]) -> RawRange<'_> {
    // SAFETY: the slice's memory lives for the borrow, which the range's lifetime carries;
    // the exclusive borrow keeps every other reference away while the range is used.
    unsafe { RawRange::new(v.as_mut_ptr(), v.len()) }
}

fn sock(s: TcpStream) -> Sock {
    Sock::new(s).unwrap()
}

/// A connected pair; `small` gives the sender a small send buffer, which forces partial
/// sends (and, on the other side, partial receives). The receive buffer keeps its default:
/// a tiny window would make loopback crawl at the delayed-ack pace.
async fn pair(small: bool) -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
    let (b, _) = l.accept().await.unwrap();
    if small {
        socket2::SockRef::from(&a)
            .set_send_buffer_size(16 << 10)
            .unwrap();
    }
    (a, b)
}

#[tokio::test]
async fn large_ranges_through_small_buffers() {
    let (a, mut b) = pair(true).await;
    let len = 8 << 20;
    let src = pattern(len, 7);
    let mut sbuf = src.clone();
    let head = pattern(40, 3);
    let mut dst = vec![0u8; len];
    let send = async {
        send_all(&mut sock(a), &head, range(&mut sbuf))
            .await
            .unwrap();
    };
    let recv = async {
        let mut h = [0u8; 40];
        b.read_exact(&mut h).await.unwrap();
        assert_eq!(&h[..], &head[..]);
        recv_exact(&mut sock(b), &mut Stage::default(), range(&mut dst), ZERO)
            .await
            .unwrap();
    };
    tokio::join!(send, recv);
    assert!(dst == src, "payload differs");
}

/// More pieces than one syscall carries, of every size, through a small send buffer:
/// partial sends end inside headers and payloads, and every byte arrives in order.
#[tokio::test]
async fn many_pieces_through_small_buffers() {
    let (a, mut b) = pair(true).await;
    let sizes: Vec<usize> = (0..300).map(|i| [0, 1, 24, 4096, 65_537][i % 5]).collect();
    let mut bodies: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| pattern(n, i as u8))
        .collect();
    let heads: Vec<Vec<u8>> = (0..sizes.len()).map(|i| pattern(7 + i % 3, 99)).collect();
    let mut want = Vec::new();
    for (h, body) in heads.iter().zip(&bodies) {
        want.extend_from_slice(h);
        want.extend_from_slice(body);
    }
    let mut got = vec![0u8; want.len()];
    let send = async {
        let ranges: Vec<RawRange<'_>> = bodies.iter_mut().map(|v| range(v)).collect();
        let pieces: Vec<Piece<'_>> = heads
            .iter()
            .zip(ranges)
            .flat_map(|(h, r)| [Piece::Head(h), Piece::Body(r)])
            .collect();
        send_pieces(&mut sock(a), &pieces).await.unwrap();
    };
    let recv = async {
        b.read_exact(&mut got).await.unwrap();
    };
    tokio::join!(send, recv);
    assert!(got == want, "bytes differ");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_ranges_across_threads() {
    let (a, b) = pair(true).await;
    let mut b = sock(b);
    let len = 8 << 20;
    let want = pattern(len, 9);
    let src = want.clone();
    let t = tokio::spawn(async move {
        let mut src = src;
        let mut a = sock(a);
        send_all(&mut a, &[], range(&mut src)).await.unwrap();
        a
    });
    let mut dst = vec![0u8; len];
    let mut stage = Stage::default();
    // Odd piece sizes: ranges that end mid-segment.
    let mut off = 0;
    for piece in [1usize, 4095, 65_537, 1 << 20].iter().cycle() {
        if off == len {
            break;
        }
        let n = (*piece).min(len - off);
        // Alternately spinning and waiting on readiness.
        let spin = std::time::Duration::from_micros(if n % 2 == 1 { 50 } else { 0 });
        recv_exact(&mut b, &mut stage, range(&mut dst[off..off + n]), spin)
            .await
            .unwrap();
        off += n;
    }
    let a = t.await.unwrap();
    assert!(dst == want, "payload differs");
    assert!(stage.is_empty(), "bytes staged past the ranges");
    drop(a);
    let g = recv_staged(&mut b, &mut stage, None, ZERO).await.unwrap();
    assert!(g.is_eof(), "bytes past the ranges");
}

#[tokio::test]
async fn header_and_payload_sizes() {
    for (hlen, plen) in [
        (0, 1),
        (40, 0),
        (40, 1),
        (40, 4096),
        (1, 3 << 20),
        (64 * 40, 16),
    ] {
        let (a, b) = pair(false).await;
        let head = pattern(hlen, 1);
        let payload = pattern(plen, 2);
        let mut p = payload.clone();
        let reader = tokio::spawn(async move {
            let mut b = b;
            let mut got = Vec::new();
            b.read_to_end(&mut got).await.unwrap();
            got
        });
        let mut a = sock(a);
        if plen == 0 {
            send_all(&mut a, &head, RawRange::empty()).await.unwrap();
        } else {
            send_all(&mut a, &head, range(&mut p)).await.unwrap();
        }
        drop(a);
        let got = reader.await.unwrap();
        assert_eq!(got.len(), hlen + plen, "{hlen}+{plen}");
        assert!(
            got[..hlen] == head[..] && got[hlen..] == payload[..],
            "{hlen}+{plen}"
        );
    }
}

#[tokio::test]
async fn eof_mid_range() {
    let (mut a, b) = pair(false).await;
    a.write_all(&pattern(100, 4)).await.unwrap();
    drop(a);
    let mut dst = vec![0u8; 1000];
    let e = recv_exact(&mut sock(b), &mut Stage::default(), range(&mut dst), ZERO)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    assert_eq!(&dst[..100], &pattern(100, 4)[..]);
    // EOF before any byte is the same error (the caller expected a payload).
    let (a, b) = pair(false).await;
    drop(a);
    let e = recv_exact(&mut sock(b), &mut Stage::default(), range(&mut dst), ZERO)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
}

#[tokio::test]
async fn peer_closing_mid_send() {
    let (a, mut b) = pair(true).await;
    let mut src = pattern(32 << 20, 5);
    let reader = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 << 10];
        b.read_exact(&mut buf).await.unwrap();
        // Closing with unread data makes the kernel reset the connection.
        drop(b);
    });
    let e = send_all(&mut sock(a), b"header", range(&mut src))
        .await
        .unwrap_err();
    assert!(
        matches!(
            e.kind(),
            io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
        ),
        "{e:?}"
    );
    reader.await.unwrap();
}

#[tokio::test]
async fn zero_length_ops_do_nothing() {
    let (a, b) = pair(false).await;
    recv_exact(&mut sock(b), &mut Stage::default(), RawRange::empty(), ZERO)
        .await
        .unwrap();
    send_all(&mut sock(a), &[], RawRange::empty())
        .await
        .unwrap();
}

#[test]
fn copies() {
    let mut mem = pattern(64, 6);
    let r = range(&mut mem[8..24]);
    let mut out = [0u8; 16];
    r.copy_out(&mut out);
    assert_eq!(&out[..], &pattern(64, 6)[8..24]);
    r.copy_in(&[0xEE; 16]);
    assert!(mem[8..24].iter().all(|&b| b == 0xEE));
    assert_eq!(mem[..8], pattern(64, 6)[..8]);
    assert_eq!(mem[24..], pattern(64, 6)[24..]);
}
