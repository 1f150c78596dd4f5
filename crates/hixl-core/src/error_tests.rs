//! Tests of the error type: one status per variant, sources kept.

use super::*;

#[test]
fn every_variant_maps_to_one_status() {
    assert_eq!(Error::NotInitialized.status(), Status::Failed);
    assert_eq!(
        Error::InvalidTimeout { millis: 0 }.status(),
        Status::ParamInvalid
    );
    assert_eq!(
        Error::NotConnected { peer: "a".into() }.status(),
        Status::NotConnected
    );
    assert_eq!(
        Error::NotifyQueueFull {
            peer: "a".into(),
            limit: 4096
        }
        .status(),
        Status::ResourceExhausted
    );
    let remote = Error::Remote {
        peer: "p".into(),
        status: Status::Unsupported,
        message: "x".into(),
    };
    assert_eq!(remote.status(), Status::Unsupported);
}

#[test]
fn timeout_check() {
    assert!(Error::check_timeout_ms(0).is_err());
    assert!(Error::check_timeout_ms(-5).is_err());
    assert_eq!(
        Error::check_timeout_ms(1000).ok(),
        Some(Duration::from_secs(1))
    );
    let e = Error::check_timeout_ms(-5).unwrap_err();
    assert!(e.to_string().contains("-5"));
}

#[test]
fn link_losses_keep_their_source_and_status() {
    use std::error::Error as _;
    let io = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
    let e = Error::connection_lost("p", "reading a frame", io);
    assert_eq!(e.status(), Status::Failed);
    assert!(e.is_link_lost());
    assert!(
        e.to_string()
            .starts_with("link to p lost: reading a frame: "),
        "{e}"
    );
    // The source is the shared io error (`Arc` keeps `Error: Clone`).
    let src = e.source().expect("the io error is the source");
    assert_eq!(
        src.downcast_ref::<Arc<std::io::Error>>().map(|e| e.kind()),
        Some(std::io::ErrorKind::ConnectionReset)
    );
    let t = Error::transport("p", "fabric copy", e.clone());
    assert_eq!(t.status(), Status::Failed);
    assert!(t.source().is_some_and(|s| s.to_string() == e.to_string()));
    assert!(matches!(
        t.layer_source().and_then(|s| s.downcast_ref::<Error>()),
        Some(Error::ConnectionLost {
            what: "reading a frame",
            ..
        })
    ));
    let hb = Error::HeartbeatLost {
        peer: "p".into(),
        silent_ms: 200,
        probes: 4,
        interval_ms: 50,
    };
    assert_eq!(hb.status(), Status::Failed);
    assert!(hb.is_link_lost() && hb.to_string().contains("heartbeat"));
    assert!(Error::Evicted { peer: "p".into() }.is_link_lost());
    assert!(!Error::NotConnected { peer: "p".into() }.is_link_lost());
}

#[test]
fn invalid_values_are_param_invalid_and_named() {
    let cases = [
        Error::TooLarge {
            what: "host buffer",
            len: 7,
            max: 5,
        },
        Error::OpTooLarge {
            len: 9,
            work_requests: 3,
            capacity: 2,
        },
        Error::OutsideRegion {
            addr: 0x20,
            len: 8,
            region_addr: 0x10,
            region_len: 4,
        },
        Error::OffsetOutOfBounds {
            offset: 11,
            len: 2,
            region_len: 10,
        },
        Error::Deregistered { addr: 0x10 },
        Error::UnknownRkey { rkey: 0x42 },
        Error::InvalidFeature { feature: -1 },
        Error::InsideRuntime { call: "connect" },
        Error::NoRuntime {
            what: "auto-connect",
        },
        Error::AlreadyFinished { peer: "p".into() },
    ];
    let shown = [
        "7",
        "9",
        "0x20",
        "11",
        "0x10",
        "0x42",
        "-1",
        "connect",
        "auto-connect",
        "p",
    ];
    for (e, v) in cases.iter().zip(shown) {
        assert_eq!(e.status(), Status::ParamInvalid, "{e}");
        assert!(e.to_string().contains(v), "{e} names {v}");
    }
}
