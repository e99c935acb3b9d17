//! The C++ boundary of tessera's trainer: every shim in `csrc/` (compiled by `build.rs` against
//! libtorch's and gloo's headers) and every `extern "C"` declaration that reaches it. Nothing
//! else in the workspace declares a foreign function.
//!
//! Each fallible entry point returns null on success or a malloc'd message, which
//! [`take_error`] turns into a [`ShimError`] naming the operation, and frees (the convention of
//! `csrc/shim_error.h`).
//! Callers wrap these raw functions in safe types ([`c10d`] in `tessera-fsdp`'s `dist`,
//! [`kernels`], [`stream`] in `tessera-model`, [`profiler`] in `tessera-train`).
pub mod c10d;
mod error;
pub mod kernels;
pub mod profiler;
pub mod stream;

pub use error::{take_error, ShimError};
pub use torch_sys::C_tensor;
