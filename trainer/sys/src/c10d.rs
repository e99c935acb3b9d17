//! c10d (`csrc/c10d_shim.cpp`): the TCPStore, gloo and NCCL process groups, and collectives
//! returning Work handles. Safe wrappers live in `tessera-fsdp`'s `dist` module.
use std::ffi::{c_char, c_int};
use torch_sys::C_tensor;

/// Opaque c10d store (a `PrefixStore` over a `TCPStore`).
#[repr(C)]
pub struct RawStore {
    _private: [u8; 0],
}

/// Opaque c10d backend (ProcessGroupGloo or ProcessGroupNCCL).
#[repr(C)]
pub struct RawProcessGroup {
    _private: [u8; 0],
}

/// Opaque c10d Work handle of one issued collective.
#[repr(C)]
pub struct RawWork {
    _private: [u8; 0],
}

extern "C" {
    pub fn tc_store_new(
        host: *const c_char,
        port: u16,
        is_server: c_int,
        world_size: c_int,
        timeout_ms: i64,
        prefix: *const c_char,
        out: *mut *mut RawStore,
    ) -> *mut c_char;
    pub fn tc_store_port(store: *const RawStore) -> u16;
    pub fn tc_store_free(store: *mut RawStore);
    pub fn tc_store_set(
        store: *mut RawStore,
        key: *const c_char,
        data: *const u8,
        len: i64,
    ) -> *mut c_char;
    pub fn tc_store_get_if_set(
        store: *mut RawStore,
        key: *const c_char,
        buf: *mut u8,
        cap: i64,
        len: *mut i64,
    ) -> *mut c_char;

    pub fn tc_pg_gloo_new(
        store: *mut RawStore,
        rank: c_int,
        world_size: c_int,
        hostname: *const c_char,
        timeout_ms: i64,
        out: *mut *mut RawProcessGroup,
    ) -> *mut c_char;
    pub fn tc_nccl_available() -> c_int;
    pub fn tc_pg_nccl_new(
        store: *mut RawStore,
        rank: c_int,
        world_size: c_int,
        timeout_ms: i64,
        out: *mut *mut RawProcessGroup,
    ) -> *mut c_char;
    pub fn tc_pg_free(pg: *mut RawProcessGroup);

    pub fn tc_all_gather_base(
        pg: *mut RawProcessGroup,
        out_full: *mut C_tensor,
        in_shard: *mut C_tensor,
        work: *mut *mut RawWork,
    ) -> *mut c_char;
    pub fn tc_reduce_scatter_base(
        pg: *mut RawProcessGroup,
        out_shard: *mut C_tensor,
        in_full: *mut C_tensor,
        work: *mut *mut RawWork,
    ) -> *mut c_char;
    pub fn tc_all_reduce_sum(
        pg: *mut RawProcessGroup,
        tensor: *mut C_tensor,
        work: *mut *mut RawWork,
    ) -> *mut c_char;
    pub fn tc_broadcast(
        pg: *mut RawProcessGroup,
        tensor: *mut C_tensor,
        root: c_int,
        work: *mut *mut RawWork,
    ) -> *mut c_char;
    pub fn tc_barrier(pg: *mut RawProcessGroup, work: *mut *mut RawWork) -> *mut c_char;
    /// Differentiable and synchronous (`csrc/all_to_all.cpp`): rows of `input` to the ranks
    /// (`in_splits[j]` to rank j), the rows received in `*out` (`out_splits[j]` from rank j).
    pub fn tc_all_to_all(
        pg: *mut RawProcessGroup,
        input: *const C_tensor,
        out_splits: *const i64,
        in_splits: *const i64,
        n: i64,
        out: *mut *mut C_tensor,
    ) -> *mut c_char;
    pub fn tc_work_wait(work: *mut RawWork, timeout_ms: i64) -> *mut c_char;
    pub fn tc_work_free(work: *mut RawWork);
}
