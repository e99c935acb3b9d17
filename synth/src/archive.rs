//! `images.zip` as LLaVA-Pretrain ships it: no root folder (entries `00453/004539375.jpg`), the
//! same bytes as the files under `images/`. JPEGs do not compress, so entries are stored; the
//! timestamps are fixed (1980-01-01) so the archive is byte-identical for a seed.
use crate::SynthError;
use std::io::Write;
use std::path::Path;
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, DateTime, ZipWriter};

/// Writes `zip_path` from the files `images_dir/ENTRY` for each entry, in the given order,
/// through `tessera_shards::write_atomically_with` (a synced temporary file, renamed).
pub(crate) fn write_zip(
    zip_path: &Path,
    images_dir: &Path,
    entries: &[&str],
) -> Result<(), SynthError> {
    tessera_shards::write_atomically_with(zip_path, |file, tmp| {
        let mut zip = ZipWriter::new(file);
        let zip_err = |entry: &str, source| SynthError::Zip {
            path: tmp.to_path_buf(),
            entry: entry.to_string(),
            source,
        };
        for &entry in entries {
            let source = images_dir.join(entry);
            let bytes = std::fs::read(&source).map_err(|e| SynthError::io(&source, e))?;
            let options = SimpleFileOptions::default()
                .compression_method(CompressionMethod::Stored)
                .last_modified_time(DateTime::default())
                .large_file(bytes.len() as u64 >= u32::MAX as u64);
            zip.start_file(entry, options)
                .map_err(|e| zip_err(entry, e))?;
            zip.write_all(&bytes).map_err(|e| SynthError::io(tmp, e))?;
        }
        zip.finish()
            .map_err(|e| zip_err("(central directory)", e))?;
        Ok(())
    })
}
