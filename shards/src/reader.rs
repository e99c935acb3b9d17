//! [`Dataset`]: an opened shard directory. Shard files are memory-mapped; a read decodes only
//! the row groups that hold the requested samples, and the metadata scan decodes only the
//! `kind` and token-count columns.
use crate::error::ShardError;
use crate::location::{DatasetLocation, FetchedRanges, RemoteFiles, FOOTER_PREFETCH};
use crate::manifest::Manifest;
use crate::sample::{Sample, SampleMeta};
use crate::schema::{batch_to_meta, batch_to_samples, RowOrigin, META_COLUMNS};
use crate::shard_info::ShardInfo;
use bytes::Bytes;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReader,
    ParquetRecordBatchReaderBuilder, RowSelection,
};
use parquet::arrow::ProjectionMask;
use parquet::file::reader::ChunkReader;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// Rows of a read by (shard, row group): (position in the read, row within the group).
pub(crate) type GroupedRows = BTreeMap<(usize, usize), Vec<(usize, usize)>>;

/// One shard with its parsed footer: memory-mapped, or remote (read in byte ranges).
pub(crate) struct OpenShard {
    pub name: String,
    pub(crate) bytes: ShardBytes,
    pub metadata: ArrowReaderMetadata,
    /// First global sample index of this shard.
    pub first_sample: u64,
    /// First row (within the shard) of each row group, plus the row count at the end.
    pub group_starts: Vec<u64>,
}

pub(crate) enum ShardBytes {
    /// The whole file: memory-mapped, or downloaded whole (verify).
    Local(Bytes),
    /// Object storage: each read fetches the pages it needs.
    Remote {
        files: Arc<dyn RemoteFiles>,
        info: Arc<ShardInfo>,
    },
}

/// What one read of a shard decodes: row groups, rows within them, columns.
#[derive(Default)]
pub(crate) struct ReadSpec {
    pub(crate) row_groups: Option<Vec<usize>>,
    pub(crate) selection: Option<RowSelection>,
    pub(crate) projection: Option<ProjectionMask>,
    pub(crate) batch_size: usize,
}

impl ReadSpec {
    fn apply<T: ChunkReader + 'static>(
        self,
        mut builder: ParquetRecordBatchReaderBuilder<T>,
    ) -> ParquetRecordBatchReaderBuilder<T> {
        if let Some(groups) = self.row_groups {
            builder = builder.with_row_groups(groups);
        }
        if let Some(selection) = self.selection {
            builder = builder.with_row_selection(selection);
        }
        if let Some(mask) = self.projection {
            builder = builder.with_projection(mask);
        }
        builder.with_batch_size(self.batch_size)
    }
}

impl OpenShard {
    pub(crate) fn open(dir: &Path, name: &str, first_sample: u64) -> Result<Self, ShardError> {
        let path = dir.join(name);
        let file = std::fs::File::open(&path).map_err(|e| ShardError::io(&path, e))?;
        // SAFETY: shards are immutable once renamed to their final name; tessera never writes
        // to a final-named file, so the mapping's contents do not change under us.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| ShardError::io(&path, e))?;
        OpenShard::from_bytes(name, Bytes::from_owner(map), first_sample)
    }

    /// A shard whose whole file is in `bytes`.
    pub(crate) fn from_bytes(
        name: &str,
        bytes: Bytes,
        first_sample: u64,
    ) -> Result<Self, ShardError> {
        // The page index lets a row selection skip whole pages of the image column.
        let options = ArrowReaderOptions::new().with_page_index(true);
        let metadata =
            ArrowReaderMetadata::load(&bytes, options).map_err(|e| ShardError::parquet(name, e))?;
        Ok(OpenShard::new(
            name,
            ShardBytes::Local(bytes),
            metadata,
            first_sample,
        ))
    }

    /// A remote shard: fetches its tail (footer and page index), nothing else.
    pub(crate) fn open_remote(
        files: Arc<dyn RemoteFiles>,
        info: &ShardInfo,
        first_sample: u64,
    ) -> Result<Self, ShardError> {
        let info = Arc::new(info.clone());
        let tail = info.bytes.saturating_sub(FOOTER_PREFETCH)..info.bytes;
        let fetched = FetchedRanges::fetch(files.clone(), info.clone(), vec![tail])?;
        let options = ArrowReaderOptions::new().with_page_index(true);
        let metadata = ArrowReaderMetadata::load(&fetched, options)
            .map_err(|e| ShardError::parquet(&info.file, e))?;
        let name = info.file.clone();
        Ok(OpenShard::new(
            &name,
            ShardBytes::Remote { files, info },
            metadata,
            first_sample,
        ))
    }

    fn new(name: &str, bytes: ShardBytes, metadata: ArrowReaderMetadata, first: u64) -> Self {
        let mut group_starts = vec![0u64];
        for rg in metadata.metadata().row_groups() {
            let last = *group_starts.last().unwrap_or(&0);
            group_starts.push(last + rg.num_rows() as u64);
        }
        OpenShard {
            name: name.to_string(),
            bytes,
            metadata,
            first_sample: first,
            group_starts,
        }
    }

    pub(crate) fn rows(&self) -> u64 {
        *self.group_starts.last().unwrap_or(&0)
    }

    fn reader(
        &self,
        spec: ReadSpec,
        prefetched: Option<&FetchedRanges>,
    ) -> Result<ParquetRecordBatchReader, ShardError> {
        let metadata = self.metadata.clone();
        let built = match &self.bytes {
            ShardBytes::Local(bytes) => spec
                .apply(ParquetRecordBatchReaderBuilder::new_with_metadata(
                    bytes.clone(),
                    metadata,
                ))
                .build(),
            ShardBytes::Remote { files, info } => {
                let fetched = match prefetched {
                    Some(fetched) => fetched.clone(),
                    None => {
                        FetchedRanges::fetch(files.clone(), info.clone(), self.ranges_for(&spec))?
                    }
                };
                spec.apply(ParquetRecordBatchReaderBuilder::new_with_metadata(
                    fetched, metadata,
                ))
                .build()
            }
        };
        built.map_err(|e| ShardError::parquet(&self.name, e))
    }

    /// Returns the rows of row group `group` asked for, in that order (repeats allowed).
    /// Only those rows are decoded: a `RowSelection` over the page index skips the pages and
    /// values of every other row, so reading one sample of a 256-row group does not copy the
    /// other 255 images.
    pub(crate) fn read_rows(
        &self,
        group: usize,
        rows_in_group: &[usize],
        prefetched: Option<&FetchedRanges>,
    ) -> Result<Vec<Sample>, ShardError> {
        let (distinct, spec) = self.row_spec(group, rows_in_group)?;
        let reader = self.reader(spec, prefetched)?;
        // Selected rows arrive in ascending order: `decoded[i]` is row `distinct[i]`.
        let mut decoded: Vec<Option<Sample>> = Vec::with_capacity(distinct.len());
        for batch in reader {
            let batch = batch.map_err(|e| ShardError::arrow(&self.name, e))?;
            for i in 0..batch.num_rows() {
                let Some(&row) = distinct.get(decoded.len()) else {
                    break;
                };
                let origin = RowOrigin {
                    shard: &self.name,
                    first_row: self.group_starts[group] + row as u64,
                };
                let sample = batch_to_samples(&batch.slice(i, 1), &[0], &origin)?;
                decoded.push(sample.into_iter().next());
            }
        }
        if decoded.len() != distinct.len() {
            return Err(ShardError::Mismatch {
                shard: self.name.clone(),
                detail: format!(
                    "row group {group} gave {} of the {} selected rows",
                    decoded.len(),
                    distinct.len()
                ),
            });
        }
        // Each decoded sample moves out once; only a repeated row is copied (from its first
        // place in the output), so the image bytes are not cloned on the loader's path.
        let mut first_place: Vec<Option<usize>> = vec![None; distinct.len()];
        let mut out: Vec<Sample> = Vec::with_capacity(rows_in_group.len());
        for row in rows_in_group {
            let missing = || ShardError::Mismatch {
                shard: self.name.clone(),
                detail: format!("row group {group} row {row} was not decoded"),
            };
            let slot = distinct.binary_search(row).map_err(|_| missing())?;
            let sample = match first_place[slot] {
                Some(place) => out[place].clone(),
                None => {
                    first_place[slot] = Some(out.len());
                    decoded[slot].take().ok_or_else(missing)?
                }
            };
            out.push(sample);
        }
        Ok(out)
    }

    /// The distinct rows (ascending) and the read that decodes just them.
    pub(crate) fn row_spec(
        &self,
        group: usize,
        rows_in_group: &[usize],
    ) -> Result<(Vec<usize>, ReadSpec), ShardError> {
        let group_rows = self
            .metadata
            .metadata()
            .row_groups()
            .get(group)
            .map_or(0, |rg| rg.num_rows().max(0) as usize);
        let mut distinct = rows_in_group.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        if let Some(&last) = distinct.last() {
            if last >= group_rows {
                return Err(ShardError::Mismatch {
                    shard: self.name.clone(),
                    detail: format!(
                        "row group {group} holds {group_rows} rows, row {last} asked for"
                    ),
                });
            }
        }
        let ranges = consecutive_ranges(&distinct);
        let selection = RowSelection::from_consecutive_ranges(ranges.into_iter(), group_rows);
        let spec = ReadSpec {
            row_groups: Some(vec![group]),
            selection: Some(selection),
            projection: None,
            batch_size: distinct.len().max(1),
        };
        Ok((distinct, spec))
    }

    /// Reads only the named top-level columns of every row group.
    pub(crate) fn read_columns(
        &self,
        columns: &[&str],
    ) -> Result<Vec<arrow_array::RecordBatch>, ShardError> {
        let schema = self.metadata.metadata().file_metadata().schema_descr();
        let mask = ProjectionMask::columns(schema, columns.iter().copied());
        let reader = self.reader(
            ReadSpec {
                projection: Some(mask),
                batch_size: 8192,
                ..ReadSpec::default()
            },
            None,
        )?;
        reader
            .map(|b| b.map_err(|e| ShardError::arrow(&self.name, e)))
            .collect()
    }
}

/// An opened shard directory: `index.json` plus its shard files (memory-mapped, or remote and
/// read in byte ranges). Global sample index = shards in order, rows in order.
pub struct Dataset {
    location: DatasetLocation,
    manifest: Manifest,
    shards: Vec<OpenShard>,
    fingerprint: String,
}

impl Dataset {
    /// Opens `dir`: reads index.json, maps every shard, checks row counts against the footers.
    pub fn open(dir: &Path) -> Result<Dataset, ShardError> {
        Dataset::open_at(&DatasetLocation::Dir(dir.to_path_buf()))
    }

    /// Opens a local or remote shard directory. A remote one fetches index.json and each
    /// shard's footer (a few shards at a time), no sample data.
    pub fn open_at(location: &DatasetLocation) -> Result<Dataset, ShardError> {
        let manifest = Manifest::load_from(location)?;
        let mut firsts = Vec::with_capacity(manifest.shards.len());
        let mut first = 0u64;
        for info in &manifest.shards {
            firsts.push(first);
            first += info.rows;
        }
        let shards = match location {
            DatasetLocation::Dir(dir) => manifest
                .shards
                .iter()
                .zip(&firsts)
                .map(|(info, &first)| OpenShard::open(dir, &info.file, first))
                .collect::<Result<Vec<_>, _>>()?,
            DatasetLocation::Remote(files) => open_remote_shards(files, &manifest, &firsts)?,
        };
        for (shard, info) in shards.iter().zip(&manifest.shards) {
            if shard.rows() != info.rows {
                return Err(ShardError::Mismatch {
                    shard: info.file.clone(),
                    detail: format!(
                        "index.json says {} rows, the file holds {}",
                        info.rows,
                        shard.rows()
                    ),
                });
            }
        }
        let fingerprint = fingerprint_of(&manifest);
        Ok(Dataset {
            location: location.clone(),
            manifest,
            shards,
            fingerprint,
        })
    }

    /// Where the dataset lives.
    pub fn source(&self) -> &DatasetLocation {
        &self.location
    }

    /// Total samples.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.rows()).sum::<u64>() as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// sha256 over the shards' sha256s, the tokenizer fingerprint and the template: equal for
    /// byte-identical shard sets made with the same tokenizer and template.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// The parsed index.json.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Kind, image count and token counts of every sample in global index order; reads only
    /// those columns.
    pub fn metadata(&self) -> Result<Vec<SampleMeta>, ShardError> {
        let mut out = Vec::with_capacity(self.len());
        for shard in &self.shards {
            let mut first_row = 0;
            for batch in shard.read_columns(&META_COLUMNS)? {
                let origin = RowOrigin {
                    shard: &shard.name,
                    first_row,
                };
                batch_to_meta(&batch, &origin, &mut out)?;
                first_row += batch.num_rows() as u64;
            }
        }
        Ok(out)
    }

    /// Where global sample `index` lives: (shard, row group, row within the group).
    fn locate(&self, index: u64) -> Result<(usize, usize, usize), ShardError> {
        let out_of_range = || ShardError::OutOfRange {
            index,
            len: self.len(),
        };
        let shard_idx = self
            .shards
            .partition_point(|s| s.first_sample <= index)
            .checked_sub(1)
            .ok_or_else(out_of_range)?;
        let shard = &self.shards[shard_idx];
        let row = index - shard.first_sample;
        if row >= shard.rows() {
            return Err(out_of_range());
        }
        let group = shard.group_starts.partition_point(|&s| s <= row) - 1;
        Ok((shard_idx, group, (row - shard.group_starts[group]) as usize))
    }

    /// `indices` by (shard, row group): (position in `indices`, row within the group).
    pub(crate) fn group_indices(&self, indices: &[u64]) -> Result<GroupedRows, ShardError> {
        let mut groups: GroupedRows = BTreeMap::new();
        for (pos, &index) in indices.iter().enumerate() {
            let (shard, group, row) = self.locate(index)?;
            groups.entry((shard, group)).or_default().push((pos, row));
        }
        Ok(groups)
    }

    /// The shard file and row (within it) that hold global sample `index`.
    pub fn location(&self, index: u64) -> Option<(&str, u64)> {
        let (shard, group, row) = self.locate(index).ok()?;
        let shard = &self.shards[shard];
        Some((&shard.name, shard.group_starts[group] + row as u64))
    }

    /// Full samples for `indices`, returned in the given order (repeats allowed). Each needed
    /// row group is decoded once. Safe to call from many threads at once.
    pub fn read(&self, indices: &[u64]) -> Result<Vec<Sample>, ShardError> {
        let groups = self.group_indices(indices)?;
        // Remote shards: every page of the read fetched in one batch per shard.
        let fetched = self.fetch_remote(&groups)?;
        let mut slots: Vec<Option<Sample>> = vec![None; indices.len()];
        for ((shard, group), wanted) in groups {
            let rows: Vec<usize> = wanted.iter().map(|&(_, row)| row).collect();
            let samples = self.shards[shard].read_rows(group, &rows, fetched.get(&shard))?;
            for ((pos, _), sample) in wanted.into_iter().zip(samples) {
                slots[pos] = Some(sample);
            }
        }
        slots
            .into_iter()
            .zip(indices)
            .map(|(s, &index)| {
                s.ok_or(ShardError::OutOfRange {
                    index,
                    len: self.len(),
                })
            })
            .collect()
    }
}

/// Footers of remote shards, fetched by up to 16 threads at a time (one round trip each).
fn open_remote_shards(
    files: &Arc<dyn RemoteFiles>,
    manifest: &Manifest,
    firsts: &[u64],
) -> Result<Vec<OpenShard>, ShardError> {
    let jobs: Vec<(&ShardInfo, u64)> = manifest.shards.iter().zip(firsts.iter().copied()).collect();
    let mut shards = Vec::with_capacity(jobs.len());
    for chunk in jobs.chunks(16) {
        let opened: Vec<Result<OpenShard, ShardError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = chunk
                .iter()
                .map(|&(info, first)| {
                    scope.spawn(move || OpenShard::open_remote(files.clone(), info, first))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(ShardError::Remote(
                            "a footer-fetching thread panicked".into(),
                        ))
                    })
                })
                .collect()
        });
        for shard in opened {
            shards.push(shard?);
        }
    }
    Ok(shards)
}

/// Sorted, distinct rows -> maximal runs of consecutive rows.
fn consecutive_ranges(sorted: &[usize]) -> Vec<std::ops::Range<usize>> {
    let mut ranges: Vec<std::ops::Range<usize>> = Vec::new();
    for &row in sorted {
        match ranges.last_mut() {
            Some(last) if last.end == row => last.end += 1,
            _ => ranges.push(row..row + 1),
        }
    }
    ranges
}

/// See [`Dataset::fingerprint`].
pub(crate) fn fingerprint_of(manifest: &Manifest) -> String {
    let mut hasher = Sha256::new();
    for shard in &manifest.shards {
        hasher.update(shard.sha256.as_bytes());
        hasher.update(b"\n");
    }
    hasher.update(manifest.tokenizer_fingerprint.as_bytes());
    hasher.update(b"\n");
    hasher.update(manifest.template.as_bytes());
    hex::encode(hasher.finalize())
}

impl Dataset {
    pub(crate) fn shards(&self) -> &[OpenShard] {
        &self.shards
    }
}

#[cfg(test)]
mod tests {
    use super::consecutive_ranges;

    #[test]
    fn sorted_rows_group_into_maximal_runs() {
        assert_eq!(
            consecutive_ranges(&[0, 1, 2, 5, 7, 8]),
            vec![0..3, 5..6, 7..9]
        );
        assert!(consecutive_ranges(&[]).is_empty());
    }
}
