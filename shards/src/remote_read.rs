//! Reads of remote shards: which byte ranges a read decodes (from parquet's offset index), and
//! fetching them for a whole read, one batch of concurrent requests per shard, before any
//! decoding; `Dataset::read_ahead` does the fetching alone, to warm the remote cache.
use crate::error::ShardError;
use crate::location::{DatasetLocation, FetchedRanges};
use crate::reader::{Dataset, GroupedRows, OpenShard, ReadSpec, ShardBytes};
use std::collections::BTreeMap;
use std::ops::Range;

impl OpenShard {
    /// The byte ranges a read decodes: for each row group and projected column, its dictionary
    /// page and the data pages holding selected rows (the whole chunk without a page index).
    pub(crate) fn ranges_for(&self, spec: &ReadSpec) -> Vec<std::ops::Range<u64>> {
        let meta = self.metadata.metadata();
        let all: Vec<usize> = (0..meta.num_row_groups()).collect();
        let groups = spec.row_groups.as_ref().unwrap_or(&all);
        let mut ranges = Vec::new();
        for &g in groups {
            let Some(rg) = meta.row_groups().get(g) else {
                continue;
            };
            for (c, column) in rg.columns().iter().enumerate() {
                if spec
                    .projection
                    .as_ref()
                    .is_some_and(|m| !m.leaf_included(c))
                {
                    continue;
                }
                let (start, len) = column.byte_range();
                let pages = meta
                    .offset_index()
                    .and_then(|index| index.get(g))
                    .and_then(|columns| columns.get(c))
                    .map(|column| column.page_locations())
                    .filter(|pages| !pages.is_empty());
                match (pages, &spec.selection) {
                    (Some(pages), Some(selection)) => {
                        let first = pages[0].offset as u64;
                        if first > start {
                            ranges.push(start..first);
                        }
                        ranges.extend(selection.scan_ranges(pages));
                    }
                    _ => ranges.push(start..start + len),
                }
            }
        }
        ranges
    }
}

impl Dataset {
    /// Whether [`Dataset::read_ahead`] does anything: remote shards with a local cache.
    pub fn reads_ahead(&self) -> bool {
        matches!(self.source(), DatasetLocation::Remote(files) if files.keeps_ranges())
    }

    /// Fetches what `read(indices)` will need into the remote cache, decoding nothing (the
    /// loader calls this a few micro-batches ahead of its workers).
    pub fn read_ahead(&self, indices: &[u64]) -> Result<(), ShardError> {
        if self.reads_ahead() {
            self.fetch_remote(&self.group_indices(indices)?)?;
        }
        Ok(())
    }

    /// For each remote shard a read touches, its pages for the read, fetched in one batch.
    pub(crate) fn fetch_remote(
        &self,
        groups: &GroupedRows,
    ) -> Result<BTreeMap<usize, FetchedRanges>, ShardError> {
        let mut ranges: BTreeMap<usize, Vec<Range<u64>>> = BTreeMap::new();
        for ((shard, group), wanted) in groups {
            let open = &self.shards()[*shard];
            if !matches!(open.bytes, ShardBytes::Remote { .. }) {
                continue;
            }
            let rows: Vec<usize> = wanted.iter().map(|&(_, row)| row).collect();
            let (_, spec): (_, ReadSpec) = open.row_spec(*group, &rows)?;
            ranges
                .entry(*shard)
                .or_default()
                .extend(open.ranges_for(&spec));
        }
        let mut fetched = BTreeMap::new();
        for (shard, ranges) in ranges {
            if let ShardBytes::Remote { files, info } = &self.shards()[shard].bytes {
                let got = FetchedRanges::fetch(files.clone(), info.clone(), ranges)?;
                fetched.insert(shard, got);
            }
        }
        Ok(fetched)
    }
}
