//! The full-stream JPEG check: libjpeg-turbo's 1/8-scale decode (`csrc/jpeg_check.c`), which
//! reads every entropy-coded bit and skips most of the inverse DCT and all but a sliver of
//! the colour conversion. Truncated or corrupt data fails it, including damage libjpeg only
//! warns about and papers over (data cut short, a bad Huffman code, a marker inside the
//! entropy-coded data).
use std::ffi::{c_char, c_int, c_ulong, CStr};

extern "C" {
    fn tessera_jpeg_check(data: *const u8, len: c_ulong, message: *mut c_char, cap: usize)
        -> c_int;
}

/// `Ok` when `bytes` decode whole and undamaged; else libjpeg's reason.
pub(crate) fn check_jpeg(bytes: &[u8]) -> Result<(), String> {
    let mut message = [0 as c_char; 200];
    // SAFETY: the C function reads exactly `bytes.len()` bytes from `bytes` and writes at most
    // `message.len()` bytes (NUL included) into `message`; it keeps no pointer after returning
    // and calls back into no Rust code (libjpeg's errors longjmp inside the C function).
    let status = unsafe {
        tessera_jpeg_check(
            bytes.as_ptr(),
            bytes.len() as c_ulong,
            message.as_mut_ptr(),
            message.len(),
        )
    };
    if status == 0 {
        return Ok(());
    }
    // SAFETY: on failure the function left a NUL-terminated string within `message`.
    let text = unsafe { CStr::from_ptr(message.as_ptr()) };
    Err(text.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jpeg(width: u32, height: u32) -> Vec<u8> {
        let img = image::RgbImage::from_fn(width, height, |x, y| {
            image::Rgb([(x * 7) as u8, (y * 5) as u8, ((x ^ y) * 3) as u8])
        });
        let mut out = std::io::Cursor::new(Vec::new());
        image::DynamicImage::ImageRgb8(img)
            .write_to(&mut out, image::ImageFormat::Jpeg)
            .expect("encoding a test JPEG");
        out.into_inner()
    }

    #[test]
    fn a_whole_jpeg_passes_and_a_damaged_one_fails_saying_why() {
        let good = jpeg(120, 90);
        assert_eq!(check_jpeg(&good), Ok(()));
        let cut = check_jpeg(&good[..good.len() / 2]).expect_err("truncated");
        assert!(
            cut.contains("Premature end") || cut.contains("premature end"),
            "{cut}"
        );
        let mut flipped = good.clone();
        let mid = flipped.len() * 2 / 3;
        for b in &mut flipped[mid..mid + 64] {
            *b = 0xFF;
        }
        assert!(
            check_jpeg(&flipped).is_err(),
            "a run of 0xFF bytes in the entropy data"
        );
        assert!(check_jpeg(b"\xFF\xD8\xFF\xE0 not a jpeg").is_err());
        assert!(check_jpeg(&[]).is_err());
    }
}
