//! Parquet inputs (`datasets` exports: the_cauldron, FineVision, TRL's `messages` sets): one
//! file, or every `*.parquet` directly in a folder (sorted by name), local or in object storage
//! (`s3://`, `gs://`, `az://`, through `tessera-remote`). Files are read one row group at a
//! time, [`BATCH_ROWS`] rows per decoded batch, only the columns the layout needs: a local file
//! page by page, a remote one by fetching the row group's projected column chunks in one batch
//! of ranged requests. So memory holds about one row group's worth of compressed chunks
//! (remote) or pages (local) however large the input (these files run to gigabytes).
use super::columns::id_at;
use crate::error::IngestError;
use arrow_array::RecordBatch;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
};
use parquet::arrow::ProjectionMask;
use parquet::file::reader::ChunkReader;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tessera_shards::{FetchedRanges, RemoteFiles, ShardInfo};

/// Rows per decoded batch: a few MB of images.
pub(crate) const BATCH_ROWS: usize = 64;
/// Tail fetched from a remote file to read its footer (a longer footer costs one more request).
const FOOTER_PREFETCH: u64 = 64 * 1024;

/// Where a file's bytes come from.
enum FileSource {
    Local(PathBuf),
    Remote {
        files: Arc<dyn RemoteFiles>,
        info: Arc<ShardInfo>,
    },
}

/// One parquet file of the input, its footer parsed.
pub(crate) struct ParquetFile {
    /// The file's name (relative to the input folder), without `.parquet`: the prefix of the
    /// ids of its rows (`train-00000-of-00002:17`).
    pub stem: String,
    /// Where it is, for messages: a path or URL.
    pub location: String,
    pub bytes: u64,
    pub metadata: ArrowReaderMetadata,
    source: FileSource,
    /// First record (input order) of each row group, plus the total at the end.
    group_starts: Vec<u64>,
}

impl ParquetFile {
    fn new(
        stem: String,
        location: String,
        bytes: u64,
        metadata: ArrowReaderMetadata,
        source: FileSource,
        first: u64,
    ) -> Self {
        let mut group_starts = vec![first];
        for rg in metadata.metadata().row_groups() {
            let last = group_starts.last().copied().unwrap_or(first);
            group_starts.push(last + rg.num_rows().max(0) as u64);
        }
        ParquetFile {
            stem,
            location,
            bytes,
            metadata,
            source,
            group_starts,
        }
    }

    fn parquet_error(&self, source: parquet::errors::ParquetError) -> IngestError {
        IngestError::Parquet {
            file: self.location.clone(),
            source,
        }
    }

    /// Names of the top-level columns.
    pub(crate) fn columns(&self) -> Vec<String> {
        self.metadata
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect()
    }

    pub(crate) fn has_column(&self, name: &str) -> bool {
        self.metadata.schema().field_with_name(name).is_ok()
    }

    /// First record of row group `g` (and, for `g` = the group count, the end of the file).
    pub(crate) fn group_start(&self, g: usize) -> u64 {
        self.group_starts[g]
    }

    pub(crate) fn row_groups(&self) -> usize {
        self.group_starts.len() - 1
    }

    /// Decodes row group `g`'s columns `columns` in batches of [`BATCH_ROWS`] rows, handing each
    /// to `each` (which returns false to stop early).
    pub(crate) fn read_group(
        &self,
        g: usize,
        columns: &[&str],
        each: &mut dyn FnMut(RecordBatch) -> Result<bool, IngestError>,
    ) -> Result<(), IngestError> {
        let schema = self.metadata.metadata().file_metadata().schema_descr();
        let mask = ProjectionMask::columns(schema, columns.iter().copied());
        match &self.source {
            FileSource::Local(path) => {
                let file = std::fs::File::open(path).map_err(|e| IngestError::io(path, e))?;
                self.decode(file, g, mask, each)
            }
            FileSource::Remote { files, info } => {
                let rg = &self.metadata.metadata().row_groups()[g];
                let ranges = rg
                    .columns()
                    .iter()
                    .enumerate()
                    .filter(|(c, _)| mask.leaf_included(*c))
                    .map(|(_, chunk)| {
                        let (start, len) = chunk.byte_range();
                        start..start + len
                    })
                    .collect();
                let fetched = FetchedRanges::fetch(files.clone(), info.clone(), ranges)?;
                self.decode(fetched, g, mask, each)
            }
        }
    }

    fn decode<R: ChunkReader + 'static>(
        &self,
        reader: R,
        g: usize,
        mask: ProjectionMask,
        each: &mut dyn FnMut(RecordBatch) -> Result<bool, IngestError>,
    ) -> Result<(), IngestError> {
        let batches =
            ParquetRecordBatchReaderBuilder::new_with_metadata(reader, self.metadata.clone())
                .with_row_groups(vec![g])
                .with_projection(mask)
                .with_batch_size(BATCH_ROWS)
                .build()
                .map_err(|e| self.parquet_error(e))?;
        for batch in batches {
            let batch = batch.map_err(|e| IngestError::Arrow {
                file: self.location.clone(),
                source: e,
            })?;
            if !each(batch)? {
                break;
            }
        }
        Ok(())
    }

    /// The ids of row group `g` from its `id` column (for duplicates before a resume point).
    pub(crate) fn ids_of_group(&self, g: usize, out: &mut Vec<String>) -> Result<(), IngestError> {
        self.read_group(g, &["id"], &mut |batch| {
            if let Some(ids) = batch.column_by_name("id") {
                for row in 0..batch.num_rows() {
                    if let Some(id) = id_at(ids.as_ref(), row) {
                        out.push(id);
                    }
                }
            }
            Ok(true)
        })
    }

    /// What a resume checks the file against without reading it whole: its name, size,
    /// modification time (local) and footer bytes (the schema, and every row group's column
    /// chunk offsets, sizes and statistics).
    fn fingerprint(&self, hasher: &mut Sha256) -> Result<(), IngestError> {
        hasher.update(format!("{}\t{}\n", self.stem, self.bytes).as_bytes());
        let footer = match &self.source {
            FileSource::Local(path) => {
                let meta = std::fs::metadata(path).map_err(|e| IngestError::io(path, e))?;
                let modified = meta.modified().map_err(|e| IngestError::io(path, e))?;
                let ns = modified
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos());
                hasher.update(format!("mtime {ns}\n").as_bytes());
                let file = std::fs::File::open(path).map_err(|e| IngestError::io(path, e))?;
                footer_bytes(&file, self.bytes)
            }
            FileSource::Remote { files, info } => {
                let tail = self.bytes.saturating_sub(FOOTER_PREFETCH)..self.bytes;
                let fetched = FetchedRanges::fetch(files.clone(), info.clone(), vec![tail])?;
                footer_bytes(&fetched, self.bytes)
            }
        };
        hasher.update(&footer.map_err(|e| self.parquet_error(e))?);
        Ok(())
    }
}

/// The footer of a parquet file of `len` bytes: metadata, its length and the magic.
fn footer_bytes<R: ChunkReader>(reader: &R, len: u64) -> parquet::errors::Result<bytes::Bytes> {
    if len < 8 {
        return Err(parquet::errors::ParquetError::General(format!(
            "{len} bytes is too short for a parquet file"
        )));
    }
    let tail = reader.get_bytes(len - 8, 8)?;
    let meta_len = u64::from(u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]));
    let start = len.saturating_sub(8 + meta_len);
    reader.get_bytes(start, (len - start) as usize)
}

/// The parquet files of an input, in order.
pub(crate) struct ParquetInput {
    pub files: Vec<ParquetFile>,
}

impl ParquetInput {
    /// Opens `spec`: a local file or folder, or a URL of a file or a folder (`s3://b/p/` or
    /// `s3://b/p/train.parquet`). Reads every file's footer.
    pub(crate) fn open(spec: &str) -> Result<ParquetInput, IngestError> {
        let files = if tessera_remote::is_remote(spec) {
            open_remote(spec)?
        } else {
            open_local(Path::new(spec))?
        };
        if files.is_empty() {
            return Err(IngestError::Input {
                input: spec.to_string(),
                detail: "is a folder with no *.parquet file in it (--input takes a LLaVA json \
                         file, a parquet file, or a folder of *.parquet files)"
                    .into(),
            });
        }
        Ok(ParquetInput { files })
    }

    /// Rows of all files.
    pub(crate) fn rows(&self) -> u64 {
        self.files
            .last()
            .map_or(0, |f| f.group_start(f.row_groups()))
    }

    /// Bytes of all files.
    pub(crate) fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.bytes).sum()
    }

    /// Hex sha256 over every file's [`ParquetFile::fingerprint`].
    pub(crate) fn fingerprint(&self) -> Result<String, IngestError> {
        let mut hasher = Sha256::new();
        hasher.update(b"parquet\n");
        for file in &self.files {
            file.fingerprint(&mut hasher)?;
        }
        Ok(hex::encode(hasher.finalize()))
    }
}

fn load_metadata<R: ChunkReader>(
    reader: &R,
    location: &str,
) -> Result<ArrowReaderMetadata, IngestError> {
    ArrowReaderMetadata::load(reader, ArrowReaderOptions::new()).map_err(|source| {
        IngestError::Parquet {
            file: location.to_string(),
            source,
        }
    })
}

/// `path` itself, or the `*.parquet` files directly in it, by name.
fn open_local(path: &Path) -> Result<Vec<ParquetFile>, IngestError> {
    let meta = std::fs::metadata(path).map_err(|e| IngestError::io(path, e))?;
    let mut paths = Vec::new();
    if meta.is_dir() {
        for entry in std::fs::read_dir(path).map_err(|e| IngestError::io(path, e))? {
            let entry = entry.map_err(|e| IngestError::io(path, e))?;
            let p = entry.path();
            if p.extension().is_some_and(|e| e == "parquet") && p.is_file() {
                paths.push(p);
            }
        }
        paths.sort();
    } else {
        paths.push(path.to_path_buf());
    }
    let mut files = Vec::with_capacity(paths.len());
    let mut first = 0;
    for p in paths {
        let location = p.display().to_string();
        let file = std::fs::File::open(&p).map_err(|e| IngestError::io(&p, e))?;
        let bytes = file.metadata().map_err(|e| IngestError::io(&p, e))?.len();
        let metadata = load_metadata(&file, &location)?;
        let stem = stem_of(&p.file_name().unwrap_or_default().to_string_lossy());
        let opened = ParquetFile::new(stem, location, bytes, metadata, FileSource::Local(p), first);
        first = opened.group_start(opened.row_groups());
        files.push(opened);
    }
    Ok(files)
}

/// A URL of one `.parquet` object, or of a folder whose `*.parquet` objects are read by name.
fn open_remote(spec: &str) -> Result<Vec<ParquetFile>, IngestError> {
    let trimmed = spec.trim_end_matches('/');
    let (dir, names) = match trimmed.rsplit_once('/') {
        Some((dir, name)) if name.ends_with(".parquet") => {
            (dir.to_string(), Some(vec![name.to_string()]))
        }
        _ => (trimmed.to_string(), None),
    };
    let files: Arc<dyn RemoteFiles> =
        tessera_remote::open_remote(&dir, None, &[]).map_err(|e| IngestError::Shards(e.into()))?;
    let mut names = match names {
        Some(names) => names,
        None => files
            .list()?
            .into_iter()
            .filter(|n| n.ends_with(".parquet"))
            .collect(),
    };
    names.sort();
    let mut out = Vec::with_capacity(names.len());
    let mut first = 0;
    for name in names {
        let bytes = files.size(&name)?;
        let info = Arc::new(ShardInfo {
            file: name.clone(),
            rows: 0,
            bytes,
            sha256: String::new(),
            num_text_tokens: 0,
            num_supervised_tokens: 0,
            num_image_samples: 0,
            row_groups: Vec::new(),
        });
        let location = format!("{dir}/{name}");
        let tail = bytes.saturating_sub(FOOTER_PREFETCH)..bytes;
        let fetched = FetchedRanges::fetch(files.clone(), info.clone(), vec![tail])?;
        let metadata = load_metadata(&fetched, &location)?;
        let source = FileSource::Remote {
            files: files.clone(),
            info,
        };
        let opened = ParquetFile::new(stem_of(&name), location, bytes, metadata, source, first);
        first = opened.group_start(opened.row_groups());
        out.push(opened);
    }
    Ok(out)
}

/// `train-00000-of-00002.parquet` -> `train-00000-of-00002`.
fn stem_of(name: &str) -> String {
    name.strip_suffix(".parquet").unwrap_or(name).to_string()
}
