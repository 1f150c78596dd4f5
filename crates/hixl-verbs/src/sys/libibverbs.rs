//! libibverbs loaded at run time: the exported verbs this crate calls, resolved once from
//! `libibverbs.so.1` with `dlopen`, behind `unsafe fn`s of the same names and signatures.
//!
//! Nothing links libibverbs, so a binary (or the Python wheel) built with verbs starts on a
//! host without rdma-core; the first verb then finds no library and [`library`] says why.
//! Each wrapper returns its verb's own error value when the library is missing (NULL, `-1`
//! or `ENOSYS`, with `errno` set to `ENOSYS`) and never panics. Only the device list can be
//! reached without the library: every other verb takes an object the library made.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;

use libloading::Library;
use rdma_sys::{
    _compat_ibv_port_attr, ibv_comp_channel, ibv_context, ibv_cq, ibv_device, ibv_device_attr,
    ibv_gid_entry, ibv_mr, ibv_pd, ibv_qp, ibv_qp_attr, ibv_qp_init_attr, ibv_wc_status,
};

/// The soname rdma-core installs (Debian: libibverbs1; RHEL: rdma-core, libibverbs).
pub(crate) const LIBRARY: &str = "libibverbs.so.1";

/// Declares the table of exported verbs: a field per function, the resolver, and the
/// same-named wrapper of each. `fail` is what the wrapper returns without the library;
/// `bound` marks a function rdma-sys declares (its signature is checked against that
/// declaration), `unbound` one it does not.
macro_rules! verbs_table {
    ($(
        $(#[$doc:meta])*
        $bound:ident fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? = $fail:expr;
    )*) => {
        /// The resolved entry points.
        struct Table {
            $($name: unsafe extern "C" fn($($ty),*) $(-> $ret)?,)*
        }

        impl Table {
            fn resolve(lib: &Library) -> Result<Table, String> {
                Ok(Table {
                    // SAFETY: each field's type is the function's C signature: checked against
                    // rdma-sys's bindgen declaration by `same_signatures_as_rdma_sys`, or
                    // (`unbound`) copied from verbs.h.
                    $($name: unsafe { symbol(lib, stringify!($name)) }?,)*
                })
            }
        }

        $(
            $(#[$doc])*
            ///
            /// # Safety
            /// As the C function's contract.
            pub(crate) unsafe fn $name($($arg: $ty),*) $(-> $ret)? {
                match table() {
                    // SAFETY: the caller keeps the verb's contract; the pointer was resolved
                    // from the loaded library, which is never unloaded.
                    Some(t) => unsafe { (t.$name)($($arg),*) },
                    None => {
                        set_errno(libc::ENOSYS);
                        $fail
                    }
                }
            }
        )*

        /// Never instantiated, so never code-generated (no symbol is referenced, no library
        /// linked): it only makes the compiler check that each wrapper has the signature of
        /// rdma-sys's declaration of the same function.
        #[allow(dead_code, clippy::extra_unused_type_parameters)]
        fn same_signatures_as_rdma_sys<NeverInstantiated>() {
            $(same_signature!($bound $name: unsafe extern "C" fn($($ty),*) $(-> $ret)?);)*
        }
    };
}

macro_rules! same_signature {
    (bound $name:ident: $f:ty) => {
        let _: $f = rdma_sys::$name;
    };
    (unbound $name:ident: $f:ty) => {};
}

verbs_table! {
    /// `ibv_get_device_list`.
    bound fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device =
        std::ptr::null_mut();
    /// `ibv_free_device_list`.
    bound fn ibv_free_device_list(list: *mut *mut ibv_device) = ();
    /// `ibv_get_device_name`.
    bound fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char = std::ptr::null();
    /// `ibv_open_device`.
    bound fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context = std::ptr::null_mut();
    /// `ibv_close_device`.
    bound fn ibv_close_device(context: *mut ibv_context) -> c_int = libc::ENOSYS;
    /// `ibv_query_device`.
    bound fn ibv_query_device(context: *mut ibv_context, device_attr: *mut ibv_device_attr) -> c_int =
        libc::ENOSYS;
    /// `ibv_query_port` as exported: the compatibility entry point (a shorter attribute
    /// struct) that `verbs.h`'s inline `ibv_query_port` falls back to.
    bound fn ibv_query_port(
        context: *mut ibv_context,
        port_num: u8,
        port_attr: *mut _compat_ibv_port_attr,
    ) -> c_int = libc::ENOSYS;
    /// The exported function behind the `static inline ibv_query_gid_ex` (rdma-core >= v32;
    /// rdma-sys does not bind it).
    unbound fn _ibv_query_gid_ex(
        context: *mut ibv_context,
        port_num: u32,
        gid_index: u32,
        entry: *mut ibv_gid_entry,
        flags: u32,
        entry_size: usize,
    ) -> c_int = libc::ENOSYS;
    /// `ibv_alloc_pd`.
    bound fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd = std::ptr::null_mut();
    /// `ibv_dealloc_pd`.
    bound fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int = libc::ENOSYS;
    /// `ibv_reg_mr` (the exported function; `verbs.h`'s macro of that name only adds a
    /// compile-time check of the access flags).
    bound fn ibv_reg_mr(pd: *mut ibv_pd, addr: *mut c_void, length: usize, access: c_int) -> *mut ibv_mr =
        std::ptr::null_mut();
    /// `ibv_dereg_mr`.
    bound fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int = libc::ENOSYS;
    /// `ibv_create_comp_channel`.
    bound fn ibv_create_comp_channel(context: *mut ibv_context) -> *mut ibv_comp_channel =
        std::ptr::null_mut();
    /// `ibv_destroy_comp_channel`.
    bound fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int = libc::ENOSYS;
    /// `ibv_create_cq`.
    bound fn ibv_create_cq(
        context: *mut ibv_context,
        cqe: c_int,
        cq_context: *mut c_void,
        channel: *mut ibv_comp_channel,
        comp_vector: c_int,
    ) -> *mut ibv_cq = std::ptr::null_mut();
    /// `ibv_destroy_cq`.
    bound fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int = libc::ENOSYS;
    /// `ibv_get_cq_event`.
    bound fn ibv_get_cq_event(
        channel: *mut ibv_comp_channel,
        cq: *mut *mut ibv_cq,
        cq_context: *mut *mut c_void,
    ) -> c_int = -1;
    /// `ibv_ack_cq_events`.
    bound fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: c_uint) = ();
    /// `ibv_create_qp`.
    bound fn ibv_create_qp(pd: *mut ibv_pd, qp_init_attr: *mut ibv_qp_init_attr) -> *mut ibv_qp =
        std::ptr::null_mut();
    /// `ibv_modify_qp`.
    bound fn ibv_modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, attr_mask: c_int) -> c_int =
        libc::ENOSYS;
    /// `ibv_query_qp`.
    bound fn ibv_query_qp(
        qp: *mut ibv_qp,
        attr: *mut ibv_qp_attr,
        attr_mask: c_int,
        init_attr: *mut ibv_qp_init_attr,
    ) -> c_int = libc::ENOSYS;
    /// `ibv_destroy_qp`.
    bound fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int = libc::ENOSYS;
    /// `ibv_wc_status_str`.
    bound fn ibv_wc_status_str(status: ibv_wc_status::Type) -> *const c_char = std::ptr::null();
}

/// The loaded library and its table; the library is kept for the life of the process.
struct Loaded {
    table: Table,
    _library: Library,
}

static LOADED: OnceLock<Result<Loaded, String>> = OnceLock::new();

/// Loads libibverbs on first use; `Err` says why it cannot be used (the library is absent or
/// lacks a verb), naming the library and the dynamic loader's own words.
pub(crate) fn library() -> Result<(), &'static str> {
    match LOADED.get_or_init(load) {
        Ok(_) => Ok(()),
        Err(why) => Err(why),
    }
}

fn table() -> Option<&'static Table> {
    LOADED.get_or_init(load).as_ref().ok().map(|l| &l.table)
}

fn load() -> Result<Loaded, String> {
    // SAFETY: loading libibverbs runs its ELF constructors, which only initialise the
    // library's own state (rdma-core's verbs library has no constructor side effects on the
    // caller). The library is never unloaded.
    let library = unsafe { Library::new(LIBRARY) }.map_err(|e| {
        let e = e.to_string();
        if e.contains("No such file") {
            format!("{LIBRARY} not found (rdma-core is not installed): {e}")
        } else {
            format!("{LIBRARY} cannot be loaded: {e}")
        }
    })?;
    let table = Table::resolve(&library)?;
    tracing::debug!("loaded {LIBRARY}");
    Ok(Loaded {
        table,
        _library: library,
    })
}

/// # Safety
/// `F` must be the C signature of the function `name` in `lib`.
unsafe fn symbol<F: Copy>(lib: &Library, name: &str) -> Result<F, String> {
    // SAFETY: the caller guarantees F is the function's type.
    match unsafe { lib.get::<F>(name.as_bytes()) } {
        Ok(f) => Ok(*f),
        Err(e) => Err(format!(
            "{LIBRARY} lacks {name} (rdma-core older than v32?): {e}"
        )),
    }
}

fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns the calling thread's errno slot, always valid.
    unsafe { *libc::__errno_location() = e };
}
