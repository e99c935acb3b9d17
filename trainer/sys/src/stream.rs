//! CUDA side-stream uploads (`csrc/stream_shim.cpp`; tch has no stream API).
use std::ffi::c_char;
use torch_sys::C_tensor;

/// Opaque handle: the side stream, the stream it replaced, the end event.
#[repr(C)]
pub struct RawSideUpload {
    _private: [u8; 0],
}

extern "C" {
    pub fn tc_side_upload_begin(device: i8, out: *mut *mut RawSideUpload) -> *mut c_char;
    pub fn tc_side_upload_end(upload: *mut RawSideUpload) -> *mut c_char;
    pub fn tc_side_upload_wait(
        upload: *mut RawSideUpload,
        tensors: *const *mut C_tensor,
        n: i64,
    ) -> *mut c_char;
    pub fn tc_side_upload_free(upload: *mut RawSideUpload);
    /// A pinned copy of `host`, owned by the caller (wrap it with `Tensor::from_ptr`).
    pub fn tc_pin_memory(host: *const C_tensor, out: *mut *mut C_tensor) -> *mut c_char;
}
