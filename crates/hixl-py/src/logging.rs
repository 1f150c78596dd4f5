//! Rust's log records into Python's `logging`.
//!
//! The wheel sets no tracing subscriber, so tracing's `log` feature turns each event into a
//! `log` record; pyo3-log passes those to the Python logger named after the record's target
//! under `hixl`: `hixl_async::server` logs to `hixl.hixl_async.server`, so configuring the
//! `hixl` logger covers them all. A logger's effective level is read when it first logs and
//! then cached; `hixl.reset_log_cache()` rereads it after a level change.
//!
//! Handing a record to Python takes the GIL, which a runtime thread must never wait for: it
//! may hold a lock that a thread holding the GIL waits for. So a record that passes the cached
//! levels is copied onto a bounded queue, and one thread of this module's own (which holds
//! nothing else) logs it in Python. When the queue is full, records are dropped.
//!
//! At interpreter exit (`_stop_logging`, the last `atexit` hook: it is registered first, when
//! the package is imported, and the engines' closing hooks after it), that thread logs what
//! is queued, then ends, and later records are dropped. No Rust thread then waits for the GIL
//! while Python finalizes, which ends such a thread with `pthread_exit`: unwinding Rust frames
//! that way is undefined, and crashes where the unwinder linked in is not the system's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use log::{Level, LevelFilter, Log, Metadata, Record};
use pyo3::prelude::*;
use pyo3_log::{Caching, Logger, ResetHandle};

/// Records waiting for the logging thread.
const QUEUE: usize = 4096;

static RESET: OnceLock<ResetHandle> = OnceLock::new();

/// Set at interpreter exit: records are dropped from then on.
static STOPPED: AtomicBool = AtomicBool::new(false);

/// The logging thread's queue and the process it was made in (a forked child starts a thread
/// of its own).
static LOG_QUEUE: Mutex<Option<(u32, SyncSender<Msg>)>> = Mutex::new(None);

/// What the logging thread is sent: a record, or the word to end once all before it are
/// logged (with where to say it has).
enum Msg {
    Record(Owned),
    Stop(SyncSender<()>),
}

/// A record copied off the logging thread's stack.
struct Owned {
    level: Level,
    target: String,
    message: String,
    module_path: Option<String>,
    file: Option<String>,
    line: Option<u32>,
}

/// The global logger: filters with pyo3-log's cached levels, queues what passes.
struct Deferred {
    inner: Arc<Logger>,
}

impl Deferred {
    fn sender(&self) -> Option<SyncSender<Msg>> {
        if STOPPED.load(Ordering::Acquire) {
            return None;
        }
        let mut q = LOG_QUEUE.lock().unwrap_or_else(|p| p.into_inner());
        let pid = std::process::id();
        if let Some((p, tx)) = &*q {
            if *p == pid {
                return Some(tx.clone());
            }
        }
        let (tx, rx) = sync_channel(QUEUE);
        let inner = Arc::clone(&self.inner);
        std::thread::Builder::new()
            .name("hixl-log".into())
            .spawn(move || drain(&inner, rx))
            .ok()?;
        *q = Some((pid, tx.clone()));
        Some(tx)
    }
}

/// The logging thread: each record into Python, in order, until told to stop.
fn drain(inner: &Logger, rx: Receiver<Msg>) {
    for m in rx {
        let o = match m {
            Msg::Record(o) => o,
            Msg::Stop(done) => {
                let _ = done.send(());
                return;
            }
        };
        inner.log(
            &Record::builder()
                .level(o.level)
                .target(&o.target)
                .args(format_args!("{}", o.message))
                .module_path(o.module_path.as_deref())
                .file(o.file.as_deref())
                .line(o.line)
                .build(),
        );
    }
}

impl Log for Deferred {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        // Reads pyo3-log's cache only: never the GIL.
        self.inner.enabled(metadata)
    }

    fn log(&self, record: &Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let o = Owned {
            level: record.level(),
            target: record.target().to_owned(),
            message: record.args().to_string(),
            module_path: record.module_path().map(str::to_owned),
            file: record.file().map(str::to_owned),
            line: record.line(),
        };
        if let Some(tx) = self.sender() {
            let _ = tx.try_send(Msg::Record(o));
        }
    }

    fn flush(&self) {}
}

/// Installs the bridge (once per process: `log` takes one global logger) and adds
/// `_reset_log_cache` to the module.
pub(crate) fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
    if RESET.get().is_none() {
        let logger = Logger::new(m.py(), Caching::LoggersAndLevels)?
            .filter(LevelFilter::Debug)
            .set_prefix("hixl");
        let reset = logger.reset_handle();
        let deferred = Deferred {
            inner: Arc::new(logger),
        };
        // Another extension in the process may have installed its logger first; Rust's records
        // then go there, and ours is not needed.
        if log::set_boxed_logger(Box::new(deferred)).is_ok() {
            log::set_max_level(LevelFilter::Debug);
            let _ = RESET.set(reset);
        }
    }
    m.add_function(wrap_pyfunction!(_stop_logging, m)?)?;
    m.add_function(wrap_pyfunction!(_reset_log_cache, m)?)
}

/// Ends the logging thread once it has logged what is queued (waiting at most 1 s, without
/// the GIL, which it needs), and drops later records. Called at interpreter exit.
#[pyfunction]
fn _stop_logging(py: Python<'_>) {
    STOPPED.store(true, Ordering::Release);
    let tx = {
        let mut g = LOG_QUEUE.lock().unwrap_or_else(|p| p.into_inner());
        match g.take() {
            Some((pid, tx)) if pid == std::process::id() => tx,
            _ => return,
        }
    };
    let (done_tx, done_rx) = sync_channel(1);
    py.detach(move || {
        // Blocks while the queue is full (the thread is draining it); fails if it is gone.
        if tx.send(Msg::Stop(done_tx)).is_ok() {
            let _ = done_rx.recv_timeout(Duration::from_secs(1));
        }
    });
}

/// Forgets the cached Python loggers and levels (after `setLevel` on a `hixl` logger).
#[pyfunction]
fn _reset_log_cache() {
    if let Some(h) = RESET.get() {
        h.reset();
    }
}
