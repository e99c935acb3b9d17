//! The C++ shims' error convention (`csrc/shim_error.h`): an entry point returns null on
//! success, else a malloc'd message, which [`take_error`] turns into a `String` and frees.
use std::ffi::{c_char, CStr};

extern "C" {
    fn tc_free_error(err: *mut c_char);
}

/// `Ok(())` for null, else the message (freed here).
///
/// # Safety
/// `err` must be null or a string returned by one of the shims' functions, not yet freed.
pub unsafe fn take_error(err: *mut c_char) -> Result<(), String> {
    if err.is_null() {
        return Ok(());
    }
    // SAFETY: non-null shim errors are NUL-terminated strings from malloc, freed once here.
    let message = unsafe { CStr::from_ptr(err) }
        .to_string_lossy()
        .into_owned();
    unsafe { tc_free_error(err) };
    Err(message)
}
