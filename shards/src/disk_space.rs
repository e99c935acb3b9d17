//! A full disk, said plainly. Every tessera crate that writes files (shards, the ingest journal,
//! checkpoints, `metrics.jsonl`) turns a write that failed with ENOSPC (or EDQUOT, a full
//! quota) into a [`NoSpace`]: the file, the bytes the write needed and the bytes its
//! filesystem has free, measured after the writer removed what it had half written. The
//! same module answers "is there room for N bytes here?" for the checks made before a large
//! write ([`free_bytes`]).
use std::io;
use std::path::{Path, PathBuf};

/// A write that ran out of disk space.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{path}: the disk is full: writing it needs {} and its filesystem has {} free; \
     free some space (or write elsewhere), then run again with --resume",
    shown_bytes(*needed),
    shown_bytes(*free)
)]
pub struct NoSpace {
    /// The file being written (its final name).
    pub path: PathBuf,
    /// Bytes the write needed (the whole file, or what it was to add).
    pub needed: u64,
    /// Bytes free on the file's filesystem for an unprivileged writer, after clean-up.
    pub free: u64,
}

impl NoSpace {
    /// `Some` when `error` is a full disk or quota: the [`NoSpace`] for a write of `needed`
    /// bytes to `path`, with the free bytes measured now (so remove partial files first).
    pub fn from_io(path: &Path, error: &io::Error, needed: u64) -> Option<NoSpace> {
        is_out_of_space(error).then(|| NoSpace::measure(path, needed))
    }

    /// The [`NoSpace`] of a write of `needed` bytes to `path`, free bytes measured now.
    pub fn measure(path: &Path, needed: u64) -> NoSpace {
        NoSpace {
            path: path.to_path_buf(),
            needed,
            free: free_bytes(path).unwrap_or(0),
        }
    }
}

/// Whether `error` says the disk (or the user's quota) is full.
pub(crate) fn is_out_of_space(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::ENOSPC) | Some(libc::EDQUOT)
    ) || error.kind() == io::ErrorKind::StorageFull
        || error.kind() == io::ErrorKind::QuotaExceeded
}

/// Whether `error` or any of its causes is an [`io::Error`] that says the disk is full
/// (parquet and the shard sink wrap the writer's error a few levels down).
pub(crate) fn caused_by_full_disk(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if e.downcast_ref::<io::Error>().is_some_and(is_out_of_space) {
            return true;
        }
        // io::Error::other(inner) hides `inner` behind get_ref, not always behind source().
        if let Some(inner) = e.downcast_ref::<io::Error>().and_then(|io| io.get_ref()) {
            if caused_by_full_disk(inner) {
                return true;
            }
        }
        cause = e.source();
    }
    false
}

/// Bytes free for an unprivileged writer on the filesystem holding `path` (or, when `path`
/// does not exist yet, its nearest existing ancestor).
pub fn free_bytes(path: &Path) -> io::Result<u64> {
    let mut at = path;
    while !at.exists() {
        match at.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => at = parent,
            _ => {
                at = Path::new(".");
                break;
            }
        }
    }
    statvfs_free(at)
}

#[cfg(unix)]
fn statvfs_free(path: &Path) -> io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::other("a path with a NUL byte"))?;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `c_path` is a valid C string and `stat` points to writable memory of the right
    // type; statvfs fills it on success.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), stat.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it initialised the struct.
    let stat = unsafe { stat.assume_init() };
    // fsblkcnt_t and c_ulong are u64 on 64-bit Linux but narrower on some targets.
    #[allow(clippy::useless_conversion)]
    let (blocks, size) = (u64::from(stat.f_bavail), u64::from(stat.f_frsize));
    Ok(blocks.saturating_mul(size))
}

#[cfg(not(unix))]
fn statvfs_free(_path: &Path) -> io::Result<u64> {
    Err(io::Error::other("free space is measured on unix only"))
}

/// `31,457,280 bytes (30.0 MiB)`: exact for the user to compare, readable at a glance.
pub fn shown_bytes(bytes: u64) -> String {
    let digits = bytes.to_string();
    let mut grouped = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(c);
    }
    let units = ["KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = None;
    for u in units {
        if value < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = Some(u);
    }
    match unit {
        Some(u) => format!("{grouped} bytes ({value:.1} {u})"),
        None => format!("{grouped} bytes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_names_the_file_and_both_sizes_plainly() {
        let full = NoSpace {
            path: "/mnt/run/checkpoints/step-00000004.tmp/rank-00000/shards.safetensors".into(),
            needed: 31_457_280,
            free: 6_291_456,
        };
        let text = full.to_string();
        assert!(
            text.starts_with("/mnt/run/checkpoints/step-00000004.tmp/rank-00000/shards.safetensors: the disk is full: writing it needs 31,457,280 bytes (30.0 MiB) and its filesystem has 6,291,456 bytes (6.0 MiB) free"),
            "{text}"
        );
        assert!(!text.contains("Os {"), "{text}");
    }

    #[test]
    fn a_full_disk_is_recognised_through_wrapping_errors() {
        let enospc = io::Error::from_raw_os_error(libc::ENOSPC);
        assert!(is_out_of_space(&enospc));
        let wrapped = io::Error::other(io::Error::from_raw_os_error(libc::ENOSPC));
        assert!(caused_by_full_disk(&wrapped));
        let parquet = parquet::errors::ParquetError::External(Box::new(enospc));
        assert!(caused_by_full_disk(&parquet));
        let other = io::Error::from_raw_os_error(libc::EACCES);
        assert!(!caused_by_full_disk(&other));
    }

    #[test]
    fn free_bytes_of_a_path_not_yet_made_is_its_folders() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let free = free_bytes(&dir.path().join("not/yet/made.bin"))?;
        assert!(free > 0);
        assert_eq!(shown_bytes(999), "999 bytes");
        assert_eq!(shown_bytes(1_048_576), "1,048,576 bytes (1.0 MiB)");
        Ok(())
    }
}
