//! The FFI boundary: the only module that names `rdma-sys`, re-exporting exactly the items the
//! safe layer uses, plus the few libibverbs symbols rdma-sys does not bind.
//!
//! libibverbs implements several verbs as `static inline` functions or macros in `verbs.h`
//! (`ibv_post_send`, `ibv_poll_cq`, `ibv_req_notify_cq`, the extended `ibv_query_port`,
//! `ibv_query_gid_ex`); rdma-sys re-implements the first ones in Rust over the provider's ops
//! table, and this module declares the exported entry point behind the last one.
#![allow(non_camel_case_types)]

pub(crate) use rdma_sys::{
    ___ibv_query_port as ibv_query_port_ex, ibv_access_flags, ibv_ack_cq_events, ibv_alloc_pd,
    ibv_close_device, ibv_comp_channel, ibv_context, ibv_cq, ibv_create_comp_channel,
    ibv_create_cq, ibv_create_qp, ibv_dealloc_pd, ibv_dereg_mr, ibv_destroy_comp_channel,
    ibv_destroy_cq, ibv_destroy_qp, ibv_device, ibv_device_attr, ibv_free_device_list,
    ibv_get_cq_event, ibv_get_device_list, ibv_get_device_name, ibv_gid_entry, ibv_modify_qp,
    ibv_mr, ibv_open_device, ibv_pd, ibv_poll_cq, ibv_port_attr, ibv_port_state, ibv_post_send,
    ibv_qp, ibv_qp_attr, ibv_qp_attr_mask, ibv_qp_init_attr, ibv_qp_state, ibv_qp_type,
    ibv_query_device, ibv_query_qp, ibv_reg_mr, ibv_req_notify_cq, ibv_send_flags, ibv_send_wr,
    ibv_sge, ibv_wc, ibv_wc_status, ibv_wc_status_str, ibv_wr_opcode,
};

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

extern "C" {
    /// The exported function behind the `static inline ibv_query_gid_ex` (rdma-core >= v32).
    pub(crate) fn _ibv_query_gid_ex(
        context: *mut ibv_context,
        port_num: u32,
        gid_index: u32,
        entry: *mut ibv_gid_entry,
        flags: u32,
        entry_size: usize,
    ) -> libc::c_int;
}

/// The calling thread's `errno` as an `io::Error` (libibverbs reports most failures there).
pub(crate) fn last_error() -> std::io::Error {
    std::io::Error::last_os_error()
}

/// An `io::Error` from a verb that returns the errno value itself (`ibv_modify_qp`,
/// `ibv_post_send`, `ibv_req_notify_cq`).
pub(crate) fn error_from_rc(rc: libc::c_int) -> std::io::Error {
    std::io::Error::from_raw_os_error(rc.abs())
}
