//! Shared pieces of the live-engine fuzz targets (`target_control`, `target_data`,
//! `initiator_handshake`, `auth_handshake`):
//!
//! - one multi-threaded tokio runtime per fuzzing process ([`runtime`]);
//! - a small, hand-writable input format ([`In`] to read it, [`Out`] to write seeds): most
//!   steps are raw wire bytes (so a seed is just encoded frames), others are frames built by
//!   `arbitrary` from a length-prefixed slice of the input;
//! - arbitrary messages of every type ([`In::msg`]), from the `Arbitrary` that hixl-core
//!   derives from its one declaration of the wire (feature `arbitrary`): nothing is mirrored
//!   here by hand;
//! - a mirror of a stream reader ([`decode_all`]), so a harness knows which frames an engine
//!   decodes from the bytes it was sent;
//! - [`Prober`], a real client `Engine` that checks a target engine still serves a normal
//!   initiator (connect, write, read back, compare);
//! - [`open_fds`], for the file-descriptor leak check.
//!
//! Every panic raised here or in the targets names the invariant that failed; harness setup
//! failures say "harness setup".

mod codec;
mod fds;
mod handshake;
mod input;
mod io;
mod prober;
mod steps;
mod unix;

use std::sync::OnceLock;

use tokio::runtime::Runtime;

pub use codec::{decode_all, encode, End};
pub use fds::{open_fds, FdWatch, FD_SLACK};
pub use handshake::{handshake, Handshake};
pub use input::{In, Out};
pub use io::{read_end, read_to_end, write_steps, ReadEnd};
pub use prober::Prober;
pub use steps::{
    generic_step, stream_bytes, Step, GENERIC_TAGS, TAG_CUT, TAG_FDS, TAG_FLIP, TAG_MSG, TAG_PAUSE,
    TAG_RAW,
};
pub use unix::{
    connect_abstract, listen_abstract, read_to_end_unix, send_with_fds, shutdown_write, spare_fd,
    write_steps_unix,
};

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
