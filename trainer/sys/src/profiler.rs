//! libtorch's Kineto profiler (`csrc/profiler_shim.cpp`).
use std::ffi::{c_char, c_int};

extern "C" {
    pub fn tc_profiler_start(cuda: c_int) -> *mut c_char;
    pub fn tc_profiler_stop(path: *const c_char) -> *mut c_char;
}
