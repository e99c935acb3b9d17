//! Files that are either absent, the old version or the complete new version, also after a
//! power cut: the one way every tessera crate replaces a file.
//!
//! 1. write a temporary sibling `.NAME.tmp` (same folder, so the rename cannot cross devices);
//! 2. flush and fsync it (its bytes are on disk before its name is);
//! 3. rename it over `NAME`;
//! 4. fsync the folder (the rename itself is on disk before the caller goes on).
//!
//! A write that fails removes its temporary file: a full disk is not left fuller. A write of
//! known bytes that fails for lack of space says so ([`crate::NoSpace`]: the file, the bytes it
//! needed, the bytes free once the temporary file is gone).
use crate::disk_space::{is_out_of_space, NoSpace};
use crate::error::ShardError;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// Buffer between the caller's writes and the temporary file.
const BUFFER_BYTES: usize = 1 << 16;

/// Writes `bytes` to `path` atomically and durably (see the module docs).
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), ShardError> {
    let written = write_atomically_with(path, |file, tmp| {
        file.write_all(bytes).map_err(|e| ShardError::io(tmp, e))
    });
    written.map_err(|e| match e {
        ShardError::Io { source, .. } if is_out_of_space(&source) => {
            NoSpace::measure(path, bytes.len() as u64).into()
        }
        other => other,
    })
}

/// [`write_atomically`] for content produced by `write`, which receives the buffered temporary
/// file and its path (to name in its own errors). Nothing is renamed when `write` fails, and
/// the temporary file is removed.
pub fn write_atomically_with<E>(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<File>, &Path) -> Result<(), E>,
) -> Result<(), E>
where
    E: From<ShardError>,
{
    let tmp = temp_path(path);
    let file = File::create(&tmp).map_err(|e| ShardError::io(&tmp, e))?;
    let written = write_and_sync(file, &tmp, write);
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
        return written;
    }
    rename_durably(&tmp, path)?;
    Ok(())
}

/// `write` into `file` (buffered), then flush and fsync it.
fn write_and_sync<E>(
    file: File,
    tmp: &Path,
    write: impl FnOnce(&mut BufWriter<File>, &Path) -> Result<(), E>,
) -> Result<(), E>
where
    E: From<ShardError>,
{
    let mut out = BufWriter::with_capacity(BUFFER_BYTES, file);
    write(&mut out, tmp)?;
    let file = out
        .into_inner()
        .map_err(|e| ShardError::io(tmp, e.into_error()))?;
    file.sync_all().map_err(|e| ShardError::io(tmp, e))?;
    Ok(())
}

/// Renames `from` (already complete and synced) over `to`, then fsyncs `to`'s folder.
pub(crate) fn rename_durably(from: &Path, to: &Path) -> Result<(), ShardError> {
    std::fs::rename(from, to).map_err(|e| ShardError::io(to, e))?;
    sync_parent(to)
}

/// The temporary sibling of `path`: `.NAME.tmp`.
pub fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map_or_else(|| "output".into(), |n| n.to_string_lossy().into_owned());
    path.with_file_name(format!(".{name}.tmp"))
}

/// Fsyncs the folder holding `path`, so a rename or a new file in it survives a power cut.
fn sync_parent(path: &Path) -> Result<(), ShardError> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    sync_dir(dir)
}

#[cfg(unix)]
fn sync_dir(dir: &Path) -> Result<(), ShardError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| ShardError::io(dir, e))
}

/// Windows cannot open a folder as a file; NTFS journals the rename itself.
#[cfg(not(unix))]
fn sync_dir(_dir: &Path) -> Result<(), ShardError> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_file_and_leaves_no_temporary() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("index.json");
        std::fs::write(&path, b"old")?;
        write_atomically(&path, b"new contents")?;
        assert_eq!(std::fs::read(&path)?, b"new contents");
        assert!(!temp_path(&path).exists());
        Ok(())
    }

    #[test]
    fn a_failed_write_keeps_the_old_file() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("data.json");
        std::fs::write(&path, b"old")?;
        let result = write_atomically_with(&path, |file, tmp| {
            file.write_all(b"half")
                .map_err(|e| ShardError::io(tmp, e))?;
            Err(ShardError::Mismatch {
                shard: "data.json".into(),
                detail: "the producer gave up".into(),
            })
        });
        assert!(result.is_err());
        assert_eq!(std::fs::read(&path)?, b"old");
        assert!(!temp_path(&path).exists(), "the temporary file is removed");
        Ok(())
    }

    #[test]
    fn temp_path_is_a_hidden_sibling() {
        let tmp = temp_path(Path::new("out/images.zip"));
        assert_eq!(tmp, Path::new("out/.images.zip.tmp"));
    }
}
