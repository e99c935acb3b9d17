//! Writes one shard: samples go into row groups bounded by rows and by bytes, the file is
//! written under a temporary name (`.shard-00000.parquet.tmp`), hashed while it is written
//! (on the sink thread of [`crate::sink`]), synced, renamed, and its folder synced
//! (`crate::atomic::rename_durably`). The metadata parquet's footer returns feeds
//! [`ShardInfo`]. A shard that fails or is dropped unfinished removes its temporary file; one
//! that finds the disk full says so ([`crate::NoSpace`]).
use crate::disk_space::{caused_by_full_disk, NoSpace};
use crate::error::ShardError;
use crate::manifest::shard_file_name;
use crate::sample::{Kind, Sample};
use crate::schema::{image_bytes_leaf, samples_to_batch, schema_v3};
use crate::shard_info::{RowGroupInfo, ShardInfo};
use crate::sink::ShardSink;
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;
use std::fs::File;
use std::path::{Path, PathBuf};

/// Row-group bounds. A row group is the unit of random access: reading one sample decodes its
/// whole group, so groups stay small (hundreds of rows, a few MiB).
#[derive(Clone, Copy, Debug)]
pub struct RowGroupLimits {
    pub max_rows: usize,
    pub max_bytes: u64,
}

impl Default for RowGroupLimits {
    fn default() -> Self {
        RowGroupLimits {
            max_rows: 256,
            max_bytes: 16 << 20,
        }
    }
}

/// Approximate bytes a sample takes in a shard (image bytes + 4 per token + text). Shard and
/// row-group boundaries use this estimate, so they depend only on the samples themselves.
pub(crate) fn estimated_sample_bytes(sample: &Sample) -> u64 {
    let image: usize = sample.images.iter().map(|i| i.bytes.len() + 24).sum();
    let text: usize = sample
        .conversation
        .iter()
        .map(|t| t.role.len() + t.text.len() + 8)
        .sum();
    (image + text + sample.id.len() + sample.input_ids.len() * 5 + 64) as u64
}

/// Rows per data page (best effort). Small pages are what make a row selection cheap: a read
/// of one sample touches its own page of the image column, not the row group's whole image
/// data (one page per row group, parquet's default for few large values). Over object storage
/// that is the difference between fetching ~one image and fetching up to 16 MB per sample.
const PAGE_ROWS: usize = 8;

/// Properties shared by every shard (set once): images are stored as-is (they are already
/// compressed), everything else is snappy-compressed; pages of [`PAGE_ROWS`] rows.
fn writer_properties(limits: RowGroupLimits) -> WriterProperties {
    let image = ColumnPath::new(image_bytes_leaf());
    WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_write_batch_size(PAGE_ROWS)
        .set_data_page_row_count_limit(PAGE_ROWS)
        .set_max_row_group_size(limits.max_rows.max(1))
        .set_column_compression(image.clone(), Compression::UNCOMPRESSED)
        .set_column_dictionary_enabled(image.clone(), false)
        .set_column_statistics_enabled(image, EnabledStatistics::None)
        .build()
}

/// Writes `shard-NNNNN.parquet` in a directory.
pub struct ShardWriter {
    name: String,
    final_path: PathBuf,
    tmp_path: PathBuf,
    writer: ArrowWriter<ShardSink>,
    limits: RowGroupLimits,
    pending: Vec<Sample>,
    pending_bytes: u64,
    estimated_bytes: u64,
    rows: u64,
    num_text_tokens: u64,
    num_supervised_tokens: u64,
    num_image_samples: u64,
    /// What the finished shard is expected to take (the caller's shard size), for the message
    /// of a full disk.
    expected_bytes: u64,
    /// Renamed to its final name: nothing to remove on drop.
    finished: bool,
}

impl ShardWriter {
    /// Starts shard number `index` in `dir` (under its temporary name).
    pub fn create(dir: &Path, index: usize, limits: RowGroupLimits) -> Result<Self, ShardError> {
        let name = shard_file_name(index);
        let final_path = dir.join(&name);
        let tmp_path = dir.join(format!(".{name}.tmp"));
        let file = File::create(&tmp_path).map_err(|e| ShardError::io(&tmp_path, e))?;
        let sink =
            ShardSink::new(file, tmp_path.clone()).map_err(|e| ShardError::io(&tmp_path, e))?;
        let props = writer_properties(limits);
        let writer = ArrowWriter::try_new(sink, schema_v3(), Some(props))
            .map_err(|e| ShardError::parquet(&name, e))?;
        Ok(ShardWriter {
            name,
            final_path,
            tmp_path,
            writer,
            limits,
            pending: Vec::new(),
            pending_bytes: 0,
            estimated_bytes: 0,
            rows: 0,
            num_text_tokens: 0,
            num_supervised_tokens: 0,
            num_image_samples: 0,
            expected_bytes: 0,
            finished: false,
        })
    }

    /// The size the finished shard is expected to reach (the ingest's `--shard-size`): what a
    /// full disk's message says the write needs.
    pub fn expect_bytes(&mut self, bytes: u64) {
        self.expected_bytes = bytes;
    }

    /// `error`, or when it comes from a full disk a [`NoSpace`] naming this shard, measured
    /// after its temporary file is removed.
    fn explain(&self, error: ShardError) -> ShardError {
        if !caused_by_full_disk(&error) {
            return error;
        }
        let _ = std::fs::remove_file(&self.tmp_path);
        let needed = self.expected_bytes.max(self.estimated_bytes);
        NoSpace::measure(&self.final_path, needed).into()
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Samples appended so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Sum of [`estimated_sample_bytes`] over the samples appended so far.
    pub fn estimated_bytes(&self) -> u64 {
        self.estimated_bytes
    }

    /// Appends one sample; a row group is written when it reaches its row or byte bound.
    pub fn append(&mut self, sample: Sample) -> Result<(), ShardError> {
        let bytes = estimated_sample_bytes(&sample);
        self.rows += 1;
        self.estimated_bytes += bytes;
        self.pending_bytes += bytes;
        self.num_text_tokens += u64::from(sample.num_text_tokens);
        self.num_supervised_tokens += u64::from(sample.num_supervised_tokens);
        self.num_image_samples += u64::from(sample.kind == Kind::Image);
        self.pending.push(sample);
        if self.pending.len() >= self.limits.max_rows || self.pending_bytes >= self.limits.max_bytes
        {
            self.write_row_group().map_err(|e| self.explain(e))?;
        }
        Ok(())
    }

    fn write_row_group(&mut self) -> Result<(), ShardError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let batch = samples_to_batch(&self.pending)?;
        self.writer
            .write(&batch)
            .map_err(|e| ShardError::parquet(&self.name, e))?;
        self.writer
            .flush()
            .map_err(|e| ShardError::parquet(&self.name, e))?;
        self.pending.clear();
        self.pending_bytes = 0;
        Ok(())
    }

    /// Writes the last row group and the footer, syncs, renames to the final name.
    pub fn finish(mut self) -> Result<ShardInfo, ShardError> {
        self.write_row_group().map_err(|e| self.explain(e))?;
        let metadata = match self.writer.finish() {
            Ok(m) => m,
            Err(e) => return Err(self.explain(ShardError::parquet(&self.name, e))),
        };
        let done = match self.writer.inner_mut().finish() {
            Ok(done) => done,
            Err(e) => return Err(self.explain(ShardError::io(&self.tmp_path, e))),
        };
        let mut row_groups = Vec::with_capacity(metadata.num_row_groups());
        let mut first_row = 0u64;
        for rg in metadata.row_groups() {
            let rows = rg.num_rows() as u64;
            row_groups.push(RowGroupInfo {
                offset: rg.column(0).byte_range().0,
                bytes: rg.compressed_size() as u64,
                rows,
                first_row,
            });
            first_row += rows;
        }
        crate::atomic::rename_durably(&self.tmp_path, &self.final_path)?;
        self.finished = true;
        Ok(ShardInfo {
            file: self.name.clone(),
            rows: self.rows,
            bytes: done.bytes,
            sha256: done.sha256,
            num_text_tokens: self.num_text_tokens,
            num_supervised_tokens: self.num_supervised_tokens,
            num_image_samples: self.num_image_samples,
            row_groups,
        })
    }
}

impl Drop for ShardWriter {
    /// An unfinished shard (an error, or an ingest that stopped) leaves no temporary file.
    fn drop(&mut self) {
        if !self.finished {
            let _ = std::fs::remove_file(&self.tmp_path);
        }
    }
}
