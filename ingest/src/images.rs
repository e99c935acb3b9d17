//! Where image bytes come from: a folder, or a zip archive read in place (memory-mapped, never
//! extracted; each worker holds its own cheap handle on the shared map). Every path from the
//! json is checked before anything is opened: absolute paths and paths that climb out of the
//! images root (`..`) are refused.
use crate::error::IngestError;
use crate::reason::Reason;
use std::io::{Cursor, Read};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

/// Why an image could not be fetched.
#[derive(Debug)]
pub(crate) struct FetchError {
    pub reason: Reason,
    pub detail: String,
}

/// A memory map shared between workers, readable through a cursor.
#[derive(Clone)]
pub(crate) struct SharedMap(Arc<memmap2::Mmap>);

impl AsRef<[u8]> for SharedMap {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// The images root. Clone it once per worker.
#[derive(Clone)]
pub(crate) enum ImageSource {
    Dir(PathBuf),
    Zip(zip::ZipArchive<Cursor<SharedMap>>),
}

impl ImageSource {
    /// A folder, or a `.zip` file (detected by its name).
    pub(crate) fn open(path: &Path) -> Result<Self, IngestError> {
        let meta = std::fs::metadata(path).map_err(|e| IngestError::io(path, e))?;
        if meta.is_dir() {
            return Ok(ImageSource::Dir(path.to_path_buf()));
        }
        let file = std::fs::File::open(path).map_err(|e| IngestError::io(path, e))?;
        // SAFETY: the archive is only read; it must not be modified while ingest runs.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| IngestError::io(path, e))?;
        let archive =
            zip::ZipArchive::new(Cursor::new(SharedMap(Arc::new(map)))).map_err(|source| {
                IngestError::Zip {
                    path: path.to_path_buf(),
                    source,
                }
            })?;
        Ok(ImageSource::Zip(archive))
    }

    /// Reads the image at `relative` (a path from the json).
    pub(crate) fn fetch(&mut self, relative: &str) -> Result<Vec<u8>, FetchError> {
        let safe = safe_relative_path(relative)?;
        match self {
            ImageSource::Dir(root) => std::fs::read(root.join(&safe)).map_err(|e| FetchError {
                reason: if e.kind() == std::io::ErrorKind::NotFound {
                    Reason::MissingImage
                } else {
                    Reason::UnreadableImage
                },
                detail: format!("{}: {e}", root.join(&safe).display()),
            }),
            ImageSource::Zip(archive) => {
                let mut entry = archive.by_name(&safe).map_err(|e| FetchError {
                    reason: if matches!(e, zip::result::ZipError::FileNotFound) {
                        Reason::MissingImage
                    } else {
                        Reason::UnreadableImage
                    },
                    detail: format!("{safe} in zip: {e}"),
                })?;
                let mut bytes = Vec::with_capacity(entry.size() as usize);
                entry.read_to_end(&mut bytes).map_err(|e| FetchError {
                    reason: Reason::UnreadableImage,
                    detail: format!("{safe} in zip: {e}"),
                })?;
                Ok(bytes)
            }
        }
    }
}

impl ImageSource {
    /// What a resume checks the images against, without reading every image: a zip's central
    /// directory (names, sizes and crc32 of every entry) and end records, hashed; a folder's
    /// sorted relative names with sizes and modification times, hashed.
    pub(crate) fn fingerprint(&self) -> Result<String, IngestError> {
        use sha2::Digest;
        let mut hasher = sha2::Sha256::new();
        match self {
            ImageSource::Zip(archive) => {
                let map = archive.clone().into_inner().into_inner();
                let bytes: &[u8] = map.as_ref();
                let start = (archive.central_directory_start() as usize).min(bytes.len());
                hasher.update(b"zip\n");
                hasher.update(&bytes[start..]);
            }
            ImageSource::Dir(root) => {
                let mut entries = Vec::new();
                list_files(root, root, &mut entries)?;
                entries.sort();
                hasher.update(b"dir\n");
                for (name, bytes, modified_ns) in entries {
                    hasher.update(format!("{name}\t{bytes}\t{modified_ns}\n").as_bytes());
                }
            }
        }
        Ok(hex::encode(hasher.finalize()))
    }
}

/// Every file under `dir` as (path relative to `root`, size, mtime in ns), recursively.
fn list_files(
    root: &Path,
    dir: &Path,
    out: &mut Vec<(String, u64, u128)>,
) -> Result<(), IngestError> {
    for entry in std::fs::read_dir(dir).map_err(|e| IngestError::io(dir, e))? {
        let entry = entry.map_err(|e| IngestError::io(dir, e))?;
        let path = entry.path();
        let meta = std::fs::metadata(&path).map_err(|e| IngestError::io(&path, e))?;
        if meta.is_dir() {
            list_files(root, &path, out)?;
        } else {
            let modified = meta.modified().map_err(|e| IngestError::io(&path, e))?;
            let name = path.strip_prefix(root).unwrap_or(&path);
            out.push((
                name.to_string_lossy().into_owned(),
                meta.len(),
                modified
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos()),
            ));
        }
    }
    Ok(())
}

/// Normalises a json image path to `a/b/c.jpg` form, refusing anything that could leave the
/// images root: absolute paths, drive prefixes, `..` components, backslashes, NUL bytes.
pub(crate) fn safe_relative_path(relative: &str) -> Result<String, FetchError> {
    let unsafe_path = |why: &str| FetchError {
        reason: Reason::UnsafeImagePath,
        detail: format!("{relative:?}: {why}"),
    };
    if relative.is_empty() {
        return Err(unsafe_path("empty path"));
    }
    if relative.contains('\0') || relative.contains('\\') {
        return Err(unsafe_path("NUL or backslash in path"));
    }
    let mut parts = Vec::new();
    for component in Path::new(relative).components() {
        match component {
            Component::Normal(part) => parts.push(part.to_string_lossy().into_owned()),
            Component::CurDir => {}
            Component::ParentDir => return Err(unsafe_path("climbs out of the images root")),
            Component::RootDir | Component::Prefix(_) => return Err(unsafe_path("absolute path")),
        }
    }
    if parts.is_empty() {
        return Err(unsafe_path("names no file"));
    }
    Ok(parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_paths_that_leave_the_root() {
        for bad in [
            "../../etc/passwd",
            "/etc/passwd",
            "a/../../b.jpg",
            "a\\..\\b.jpg",
            "",
            ".",
        ] {
            let err = safe_relative_path(bad).expect_err(bad);
            assert_eq!(err.reason, Reason::UnsafeImagePath, "{bad}");
        }
        assert_eq!(
            safe_relative_path("./00453/004539375.jpg").ok().as_deref(),
            Some("00453/004539375.jpg")
        );
    }
}
