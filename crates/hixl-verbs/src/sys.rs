//! The FFI boundary: the only module that names `rdma-sys`, re-exporting exactly the items the
//! safe layer uses.
//!
//! Types, constants and the verbs `verbs.h` implements inline over the provider's ops table
//! (`ibv_post_send`, `ibv_poll_cq`, `ibv_req_notify_cq`: rdma-sys re-implements them in Rust
//! and they name no libibverbs symbol) come from rdma-sys. Every exported libibverbs function
//! comes from [`libibverbs`], which loads the library at run time, so nothing links it; the
//! inline extended `ibv_query_port` is [`ibv_query_port_ex`] here, because rdma-sys's version
//! falls back to the exported symbol directly.
#![allow(non_camel_case_types)]

mod libibverbs;

use std::mem::{offset_of, size_of};

pub(crate) use libibverbs::{
    _ibv_query_gid_ex, ibv_ack_cq_events, ibv_alloc_pd, ibv_close_device, ibv_create_comp_channel,
    ibv_create_cq, ibv_create_qp, ibv_dealloc_pd, ibv_dereg_mr, ibv_destroy_comp_channel,
    ibv_destroy_cq, ibv_destroy_qp, ibv_free_device_list, ibv_get_cq_event, ibv_get_device_list,
    ibv_get_device_name, ibv_modify_qp, ibv_open_device, ibv_query_device, ibv_query_qp,
    ibv_reg_mr, ibv_wc_status_str, library,
};
pub(crate) use rdma_sys::{
    ibv_access_flags, ibv_comp_channel, ibv_context, ibv_cq, ibv_device, ibv_device_attr,
    ibv_gid_entry, ibv_mr, ibv_pd, ibv_poll_cq, ibv_port_attr, ibv_port_state, ibv_post_send,
    ibv_qp, ibv_qp_attr, ibv_qp_attr_mask, ibv_qp_init_attr, ibv_qp_state, ibv_qp_type,
    ibv_req_notify_cq, ibv_send_flags, ibv_send_wr, ibv_sge, ibv_wc, ibv_wc_status, ibv_wr_opcode,
};

/// `verbs.h`'s inline `ibv_query_port`: the provider's extended `query_port` when the context
/// has one (every current provider), else the exported compatibility entry point.
///
/// # Safety
/// `context` is an open device context; `port_attr` points to a writable `ibv_port_attr`.
pub(crate) unsafe fn ibv_query_port_ex(
    context: *mut ibv_context,
    port_num: u8,
    port_attr: *mut ibv_port_attr,
) -> libc::c_int {
    // SAFETY: the caller guarantees the context is open. An extended context (abi_compat is
    // verbs.h's __VERBS_ABI_IS_EXTENDED) is the `context` member of a `verbs_context`, whose
    // `sz` says how many bytes before that member the provider filled in; query_port is read
    // only when it lies inside them, as verbs.h's verbs_get_ctx_op does.
    unsafe {
        if (*context).abi_compat as usize == u32::MAX as usize {
            let vc = context
                .byte_sub(offset_of!(rdma_sys::verbs_context, context))
                .cast::<rdma_sys::verbs_context>();
            let needed = size_of::<rdma_sys::verbs_context>()
                - offset_of!(rdma_sys::verbs_context, query_port);
            if (*vc).sz >= needed {
                if let Some(query) = (*vc).query_port {
                    return query(context, port_num, port_attr, size_of::<ibv_port_attr>());
                }
            }
        }
        libibverbs::ibv_query_port(context, port_num, port_attr.cast())
    }
}

/// `IBV_LINK_LAYER_INFINIBAND` (an anonymous enum in `verbs.h` that rdma-sys does not bind).
pub(crate) const LINK_LAYER_INFINIBAND: u8 = 1;
/// `IBV_LINK_LAYER_ETHERNET`.
pub(crate) const LINK_LAYER_ETHERNET: u8 = 2;
/// `IBV_GID_TYPE_IB`.
pub(crate) const GID_TYPE_IB: u32 = rdma_sys::IBV_GID_TYPE_IB;
/// `IBV_GID_TYPE_ROCE_V1`.
pub(crate) const GID_TYPE_ROCE_V1: u32 = rdma_sys::IBV_GID_TYPE_ROCE_V1;
/// `IBV_GID_TYPE_ROCE_V2`.
pub(crate) const GID_TYPE_ROCE_V2: u32 = rdma_sys::IBV_GID_TYPE_ROCE_V2;

/// The calling thread's `errno` as an `io::Error` (libibverbs reports most failures there).
pub(crate) fn last_error() -> std::io::Error {
    std::io::Error::last_os_error()
}

/// An `io::Error` from a verb that returns the errno value itself (`ibv_modify_qp`,
/// `ibv_post_send`, `ibv_req_notify_cq`).
pub(crate) fn error_from_rc(rc: libc::c_int) -> std::io::Error {
    std::io::Error::from_raw_os_error(rc.abs())
}
