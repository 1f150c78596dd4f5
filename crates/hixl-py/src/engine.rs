//! `hixl._hixl.Engine`, `Peer`, `Region`: the engine API. The Python package wraps them
//! (`hixl.Engine`...) with buffer handling, awaitables and typed results.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use hixl_async::{Engine as RsEngine, Peer as RsPeer, Region as RsRegion};
use hixl_core::{Access, Error, MemDesc, MemKind, Notify, TransferOp};
use pyo3::exceptions::{PyStopAsyncIteration, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::descs::{op_of, plain, read_u64s, strided};
use crate::op::{none, ErrOut, Fut, Op, OutFn};
use crate::waker::lock;
use crate::{py_result, runtime};

/// Posts a transfer: `submit` runs with the GIL released (a same-host copy runs there) and
/// inside the runtime's context (a deadline's timer needs it).
fn post(
    py: Python<'_>,
    op: u8,
    timeout: Option<f64>,
    submit: impl FnOnce(TransferOp) -> hixl_async::Transfer + Send,
) -> PyResult<Op> {
    let _rt = runtime().enter();
    let op = op_of(op)?;
    transfer_op(py.detach(|| submit(op)), timeout)
}

fn transfer_op(t: hixl_async::Transfer, timeout: Option<f64>) -> PyResult<Op> {
    let t = match timeout {
        Some(s) => t.timeout(crate::seconds(s)?),
        None => t,
    };
    Ok(Op::new(Fut::Transfer(t)))
}

/// `hixl._hixl.Engine`.
#[pyclass(module = "hixl._hixl", frozen)]
pub(crate) struct Engine {
    engine: Mutex<Option<RsEngine>>,
    name: String,
}

impl Engine {
    pub(crate) fn get(&self) -> PyResult<RsEngine> {
        lock(&self.engine).clone().ok_or_else(|| {
            crate::hixl_err(Error::ShutDown {
                engine: self.name.clone(),
                what: "the engine was closed",
            })
        })
    }
}

fn notify_tuple(py: Python<'_>, n: Notify) -> PyResult<Py<PyAny>> {
    let t = (
        n.from,
        n.link,
        PyBytes::new(py, &n.name),
        PyBytes::new(py, &n.msg),
    );
    Ok(t.into_pyobject(py)?.into_any().unbind())
}

#[pymethods]
impl Engine {
    /// Starts an engine at `local_engine` (`ip` for a client, `ip:port` to listen, `ip:0` for a
    /// free port) with HIXL options.
    #[new]
    #[pyo3(signature = (local_engine, options=None))]
    fn new(
        py: Python<'_>,
        local_engine: &str,
        options: Option<Vec<(String, String)>>,
    ) -> PyResult<Engine> {
        let (addr, ephemeral) = match local_engine.strip_suffix(":0") {
            Some(a) => (a.to_string(), true),
            None => (local_engine.to_string(), false),
        };
        let mut b = RsEngine::builder(addr);
        for (k, v) in options.unwrap_or_default() {
            b = b.option(k, v);
        }
        if ephemeral {
            b = b.ephemeral_port();
        }
        let engine = py.detach(|| runtime().block_on(b.build()));
        let engine = py_result(engine)?;
        Ok(Engine {
            name: engine.local_engine().to_string(),
            engine: Mutex::new(Some(engine)),
        })
    }

    /// The engine's address (`ip:port` once listening).
    #[getter]
    fn local_engine(&self) -> String {
        self.name.clone()
    }

    /// Whether it is closed.
    #[getter]
    fn closed(&self) -> bool {
        lock(&self.engine).is_none()
    }

    /// Registers `len` bytes at `addr` (host memory the caller keeps valid until deregistered).
    #[pyo3(signature = (addr, len, access, name=None))]
    fn register_raw(
        &self,
        addr: u64,
        len: u64,
        access: u8,
        name: Option<&str>,
    ) -> PyResult<Region> {
        if access > 3 {
            return Err(crate::hixl_err(Error::InvalidParam {
                what: format!("access {access}: 0 local, 1 remote read, 2 remote write, 3 both"),
            }));
        }
        let e = self.get()?;
        // SAFETY: the Python side keeps the object owning this memory (or the caller of
        // `register_raw`, who promised it) alive and in place until `deregister` returns; it
        // never forms a Rust reference to it.
        let r = unsafe {
            e.register_raw(
                MemDesc::new(addr, len),
                MemKind::Host,
                Access::from_bits(access),
                name,
            )
        };
        Ok(Region::new(py_result(r)?))
    }

    /// Registers `len` bytes of the engine's shared-memory pool (same-host peers map it).
    #[pyo3(signature = (len, access, name=None))]
    fn register_pooled(&self, len: u64, access: u8, name: Option<&str>) -> PyResult<Region> {
        let e = self.get()?;
        Ok(Region::new(py_result(e.register_pooled(
            len,
            Access::from_bits(access & 3),
            name,
        ))?))
    }

    /// Deregisters: waits until no op can touch the region any more.
    fn deregister(&self, region: &Region) -> PyResult<Op> {
        let e = self.get()?;
        let r = lock(&region.region).clone();
        let Some(r) = r else {
            return Ok(Op::other(async { Ok(none()) }));
        };
        Ok(Op::other(async move {
            match e.deregister(&r).await {
                Ok(_) => Ok(none()),
                Err(err) => Err(ErrOut::Hixl(err)),
            }
        }))
    }

    /// Connects to `remote`; the op yields a `Peer`.
    fn connect(&self, remote: String, timeout: f64) -> PyResult<Op> {
        let e = self.get()?;
        let d = crate::seconds(timeout)?;
        Ok(Op::other(async move {
            match e.connect(&remote, d).await {
                Ok(p) => {
                    let out: OutFn =
                        Box::new(move |py| Ok(Py::new(py, Peer { peer: p })?.into_any()));
                    Ok(out)
                }
                Err(err) => Err(ErrOut::Hixl(err)),
            }
        }))
    }

    /// Closes the link to `remote`.
    fn disconnect(&self, remote: String) -> PyResult<Op> {
        let e = self.get()?;
        Ok(Op::other(async move {
            match e.disconnect(&remote).await {
                Ok(()) => Ok(none()),
                Err(err) => Err(ErrOut::Hixl(err)),
            }
        }))
    }

    /// The linked peer `remote`.
    fn peer(&self, remote: &str) -> PyResult<Peer> {
        Ok(Peer {
            peer: py_result(self.get()?.peer(remote))?,
        })
    }

    /// Names of the linked peers.
    fn peers(&self) -> PyResult<Vec<String>> {
        Ok(self.get()?.peers())
    }

    /// A transfer to `remote` by name (AutoConnect connects first when enabled).
    #[pyo3(signature = (remote, op, descs, timeout=None))]
    fn transfer(
        &self,
        py: Python<'_>,
        remote: &str,
        op: u8,
        descs: Vec<(u64, u64, u64)>,
        timeout: Option<f64>,
    ) -> PyResult<Op> {
        let e = self.get()?;
        let descs = plain(descs.into_iter().map(|(l, r, n)| [l, r, n]));
        post(py, op, timeout, |op| e.transfer(remote, op, &descs))
    }

    /// [`Engine::transfer`] of `n` descriptors from a C-contiguous `uint64` array of `n`×3 at
    /// `ptr` (the caller holds the array).
    #[pyo3(signature = (remote, op, ptr, n, timeout=None))]
    fn transfer_array(
        &self,
        py: Python<'_>,
        remote: &str,
        op: u8,
        ptr: u64,
        n: usize,
        timeout: Option<f64>,
    ) -> PyResult<Op> {
        let e = self.get()?;
        let descs = plain(read_u64s::<3>(ptr, n)?);
        post(py, op, timeout, |op| e.transfer(remote, op, &descs))
    }

    /// Notifies received since the last call (HIXL `GetNotifies`), as
    /// `(from, link, name, msg)` tuples.
    fn take_notifies(&self, py: Python<'_>) -> PyResult<Vec<Py<PyAny>>> {
        self.get()?
            .take_notifies()
            .into_iter()
            .map(|n| notify_tuple(py, n))
            .collect()
    }

    /// A stream of received notifies.
    fn notifications(&self) -> PyResult<Notifications> {
        Ok(Notifications {
            stream: Arc::new(tokio::sync::Mutex::new(self.get()?.notifications())),
        })
    }

    /// Ops posted and not yet finished.
    fn ops_in_flight(&self) -> PyResult<usize> {
        Ok(self.get()?.ops_in_flight())
    }

    /// The engine's telemetry as Prometheus text.
    fn metrics_text(&self) -> PyResult<String> {
        Ok(self.get()?.metrics_text())
    }

    /// The transfers that ended since the last call: `(peer, transport, op, bytes,
    /// descriptors, post_s, duration_s, outcome)`.
    #[allow(clippy::type_complexity)]
    fn take_transfer_records(
        &self,
    ) -> PyResult<
        Vec<(
            String,
            &'static str,
            &'static str,
            u64,
            u64,
            f64,
            f64,
            &'static str,
        )>,
    > {
        Ok(self
            .get()?
            .take_transfer_records()
            .into_iter()
            .map(|r| {
                (
                    r.peer.to_string(),
                    r.transport,
                    if matches!(r.op, TransferOp::Read) {
                        "read"
                    } else {
                        "write"
                    },
                    r.bytes,
                    r.descriptors,
                    r.post.as_secs_f64(),
                    r.duration.as_secs_f64(),
                    r.outcome.as_str(),
                )
            })
            .collect())
    }

    /// The engine's options, as given and defaulted, and what its transports can use.
    fn info(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let e = self.get()?;
        let d = PyDict::new(py);
        d.set_item("local_engine", e.local_engine())?;
        d.set_item("listen", e.listen_addr().map(|a| a.to_string()))?;
        let (io, why) = e.tcp_io();
        d.set_item("tcp_io", io.as_str())?;
        d.set_item("tcp_io_reason", why)?;
        // The RDMA device, or (None and) why verbs is off: `hixl.Transport`, no device, or no
        // libibverbs on this host (the wheel loads it at run time).
        let (device, why) = match e.verbs_status() {
            Ok(dev) => (Some(dev), None),
            Err(why) => (None, Some(why)),
        };
        d.set_item("verbs_device", device)?;
        d.set_item("verbs_reason", why)?;
        d.set_item("auto_connect", e.auto_connects())?;
        Ok(d.into_any().unbind())
    }

    /// Closes every link and the listener; in-flight ops fail. Waits up to `grace` seconds
    /// for them to drain. Idempotent.
    #[pyo3(signature = (grace=1.0))]
    fn close(&self, py: Python<'_>, grace: f64) {
        let e = lock(&self.engine).take();
        if let Some(e) = e {
            // Not positive or not a number: no wait; past a `Duration`: no bound.
            let grace = if grace > 0.0 {
                Duration::try_from_secs_f64(grace).unwrap_or(Duration::MAX)
            } else {
                Duration::ZERO
            };
            py.detach(|| {
                runtime().block_on(e.shutdown(grace));
                drop(e);
            });
        }
    }
}

/// `hixl._hixl.Notifications`: the engine's notify stream.
#[pyclass(module = "hixl._hixl", frozen)]
pub(crate) struct Notifications {
    stream: Arc<tokio::sync::Mutex<hixl_async::NotifyStream>>,
}

#[pymethods]
impl Notifications {
    /// An op yielding the next notify `(from, link, name, msg)`; it raises
    /// `StopAsyncIteration` when the engine closes.
    fn next(&self) -> Op {
        let s = self.stream.clone();
        Op::other(async move {
            let n = s.lock().await.next().await;
            match n {
                Some(n) => {
                    let out: OutFn = Box::new(move |py| notify_tuple(py, n));
                    Ok(out)
                }
                None => Err(ErrOut::Other(Box::new(|_| {
                    PyStopAsyncIteration::new_err("the engine closed")
                }))),
            }
        })
    }
}

/// `hixl._hixl.Peer`: a link.
#[pyclass(module = "hixl._hixl", frozen)]
pub(crate) struct Peer {
    pub(crate) peer: RsPeer,
}

#[pymethods]
impl Peer {
    /// The peer's engine address.
    #[getter]
    fn name(&self) -> String {
        self.peer.name().to_string()
    }

    /// How the link moves data (e.g. `"fabric (...)"`, `"tcp (...)"`).
    #[getter]
    fn transport(&self) -> String {
        self.peer.transport().to_string()
    }

    /// Whether the link is up.
    #[getter]
    fn is_connected(&self) -> bool {
        self.peer.is_connected()
    }

    /// The peer's registered regions as `(addr, len, rkey, access, name)`.
    fn regions(&self) -> Vec<(u64, u64, u64, u8, Option<String>)> {
        self.peer
            .regions()
            .into_iter()
            .map(|r| (r.addr, r.len, r.rkey, r.access.bits(), r.name))
            .collect()
    }

    /// Posts a transfer of `descs` (`(local, remote, len)` tuples).
    #[pyo3(signature = (op, descs, timeout=None))]
    fn transfer(
        &self,
        py: Python<'_>,
        op: u8,
        descs: Vec<(u64, u64, u64)>,
        timeout: Option<f64>,
    ) -> PyResult<Op> {
        let descs = plain(descs.into_iter().map(|(l, r, n)| [l, r, n]));
        post(py, op, timeout, |op| self.peer.transfer(op, &descs))
    }

    /// Posts a transfer of `n` descriptors read from a C-contiguous `uint64` array of `n`×3
    /// at `ptr` (the caller holds the array).
    #[pyo3(signature = (op, ptr, n, timeout=None))]
    fn transfer_array(
        &self,
        py: Python<'_>,
        op: u8,
        ptr: u64,
        n: usize,
        timeout: Option<f64>,
    ) -> PyResult<Op> {
        let descs = plain(read_u64s::<3>(ptr, n)?);
        post(py, op, timeout, |op| self.peer.transfer(op, &descs))
    }

    /// Posts a strided transfer: `n` descriptors `(local, remote, len, local_stride,
    /// remote_stride, count)` from a C-contiguous `uint64` array of `n`×6 at `ptr`.
    #[pyo3(signature = (op, ptr, n, timeout=None))]
    fn transfer_strided_array(
        &self,
        py: Python<'_>,
        op: u8,
        ptr: u64,
        n: usize,
        timeout: Option<f64>,
    ) -> PyResult<Op> {
        let descs = strided(read_u64s::<6>(ptr, n)?);
        post(py, op, timeout, |op| self.peer.transfer_strided(op, &descs))
    }

    /// Posts a strided transfer of `(local, remote, len, local_stride, remote_stride, count)`
    /// tuples.
    #[pyo3(signature = (op, descs, timeout=None))]
    fn transfer_strided(
        &self,
        py: Python<'_>,
        op: u8,
        descs: Vec<(u64, u64, u64, u64, u64, u64)>,
        timeout: Option<f64>,
    ) -> PyResult<Op> {
        let descs = strided(
            descs
                .into_iter()
                .map(|(l, r, len, ls, rs, count)| [l, r, len, ls, rs, count]),
        );
        post(py, op, timeout, |op| self.peer.transfer_strided(op, &descs))
    }

    /// Sends a notify (name and message of at most 1024 bytes each).
    #[pyo3(signature = (name, msg, timeout=1.0))]
    fn notify(&self, name: Vec<u8>, msg: Vec<u8>, timeout: f64) -> PyResult<Op> {
        let d = crate::seconds(timeout)?;
        let p = self.peer.clone();
        Ok(Op::other(async move {
            match p.notify_timeout(name, msg, d).await {
                Ok(()) => Ok(none()),
                Err(e) => Err(ErrOut::Hixl(e)),
            }
        }))
    }
}

/// `hixl._hixl.Region`: a registered region.
#[pyclass(module = "hixl._hixl", frozen)]
pub(crate) struct Region {
    pub(crate) region: Mutex<Option<RsRegion>>,
    addr: u64,
    len: u64,
}

impl Region {
    fn new(r: RsRegion) -> Region {
        Region {
            addr: r.addr(),
            len: r.len(),
            region: Mutex::new(Some(r)),
        }
    }

    pub(crate) fn get(&self) -> PyResult<RsRegion> {
        lock(&self.region)
            .clone()
            .ok_or_else(|| crate::hixl_err(Error::Deregistered { addr: self.addr }))
    }
}

#[pymethods]
impl Region {
    /// Start address.
    #[getter]
    fn addr(&self) -> u64 {
        self.addr
    }

    /// Length in bytes.
    #[getter]
    fn len(&self) -> u64 {
        self.len
    }

    /// The access bits it grants peers.
    #[getter]
    fn access(&self) -> PyResult<u8> {
        Ok(self.get()?.access().bits())
    }

    /// The key peers present.
    #[getter]
    fn rkey(&self) -> PyResult<u64> {
        Ok(self.get()?.rkey())
    }

    /// Copies `len` bytes at `offset` out of the region (GIL released).
    fn read(&self, py: Python<'_>, offset: u64, len: usize) -> PyResult<Py<PyBytes>> {
        let r = self.get()?;
        let mut buf = vec![0u8; len];
        py_result(py.detach(|| r.read_at(offset, &mut buf)))?;
        Ok(PyBytes::new(py, &buf).unbind())
    }

    /// Copies `data` into the region at `offset` (GIL released).
    fn write(&self, py: Python<'_>, offset: u64, data: Vec<u8>) -> PyResult<()> {
        let r = self.get()?;
        py_result(py.detach(|| r.write_at(offset, &data)))
    }

    /// Forgets the Rust handle (after deregistration).
    fn _forget(&self) {
        lock(&self.region).take();
    }

    /// The absolute address of `offset` (checked against the region).
    fn addr_at(&self, offset: u64) -> PyResult<u64> {
        if offset > self.len {
            return Err(PyValueError::new_err(format!(
                "offset {offset} is past the region's {} bytes",
                self.len
            )));
        }
        py_result(self.get()?.addr_at(offset))
    }
}

pub(crate) fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Engine>()?;
    m.add_class::<Peer>()?;
    m.add_class::<Region>()?;
    m.add_class::<Notifications>()?;
    Ok(())
}
