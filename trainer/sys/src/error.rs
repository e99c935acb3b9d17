//! The C++ shims' error convention (`csrc/shim_error.h`): an entry point returns null on
//! success, else a malloc'd message, which [`take_error`] turns into a [`ShimError`] naming
//! the operation, and frees.
use std::ffi::{c_char, CStr};
use std::fmt;

extern "C" {
    fn tc_free_error(err: *mut c_char);
}

/// A shim call that failed: which operation, and libtorch's (or c10d's) message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShimError {
    /// What was asked of the shim, as a reader names it ("widened bf16 linear",
    /// "varlen attention", "store set", ...).
    pub op: &'static str,
    /// The message the C++ side caught.
    pub message: String,
}

impl fmt::Display for ShimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.op, self.message)
    }
}

impl std::error::Error for ShimError {}

/// `Ok(())` for null, else the message (freed here) as the failure of `op`.
///
/// # Safety
/// `err` must be null or a string returned by one of the shims' functions, not yet freed.
pub unsafe fn take_error(err: *mut c_char, op: &'static str) -> Result<(), ShimError> {
    if err.is_null() {
        return Ok(());
    }
    // SAFETY: non-null shim errors are NUL-terminated strings from malloc, freed once here.
    let message = unsafe { CStr::from_ptr(err) }
        .to_string_lossy()
        .into_owned();
    unsafe { tc_free_error(err) };
    Err(ShimError { op, message })
}
