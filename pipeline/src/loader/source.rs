//! Where the loader's samples come from: `tessera_shards::Dataset` in production, a `Vec<Sample>` in
//! tests and benchmarks. Reads are by global sample index and come back in the asked order.
use super::LoaderError;
use tessera_shards::Sample;

/// Random access to samples by global index; shared by all worker threads.
pub trait SampleSource: Send + Sync {
    /// The samples at `indices`, in that order.
    fn read(&self, indices: &[u64]) -> Result<Vec<Sample>, LoaderError>;

    /// Under a mixture, the source that holds sample `index` (its place among the mixture's
    /// sources); `None` when the samples come from one shard set.
    fn mixture_source(&self, _index: u64) -> Option<usize> {
        None
    }

    /// Where sample `index` is stored, for error messages (shards: file and row).
    fn locate(&self, index: u64) -> String {
        format!("sample index {index}")
    }

    /// Whether [`SampleSource::read_ahead`] does anything (a remote source with a cache).
    fn reads_ahead(&self) -> bool {
        false
    }

    /// Fetches what a later `read(indices)` will need into a local cache; decodes nothing.
    fn read_ahead(&self, _indices: &[u64]) -> Result<(), LoaderError> {
        Ok(())
    }
}

impl SampleSource for Vec<Sample> {
    fn read(&self, indices: &[u64]) -> Result<Vec<Sample>, LoaderError> {
        indices
            .iter()
            .map(|&i| {
                usize::try_from(i)
                    .ok()
                    .and_then(|i| self.get(i))
                    .cloned()
                    .ok_or_else(|| LoaderError::Read {
                        indices: vec![i],
                        source: tessera_shards::ShardError::OutOfRange {
                            index: i,
                            len: self.len(),
                        },
                    })
            })
            .collect()
    }
}

impl SampleSource for tessera_shards::Dataset {
    fn read(&self, indices: &[u64]) -> Result<Vec<Sample>, LoaderError> {
        tessera_shards::Dataset::read(self, indices).map_err(|source| LoaderError::Read {
            indices: indices.to_vec(),
            source,
        })
    }

    fn reads_ahead(&self) -> bool {
        tessera_shards::Dataset::reads_ahead(self)
    }

    fn read_ahead(&self, indices: &[u64]) -> Result<(), LoaderError> {
        tessera_shards::Dataset::read_ahead(self, indices).map_err(|source| LoaderError::Read {
            indices: indices.to_vec(),
            source,
        })
    }

    fn locate(&self, index: u64) -> String {
        let url = match self.source() {
            tessera_shards::DatasetLocation::Remote(files) => format!("{}/", files.url()),
            tessera_shards::DatasetLocation::Dir(_) => String::new(),
        };
        match self.location(index) {
            Some((shard, row)) => format!("{url}{shard} row {row}"),
            None => format!("sample index {index}"),
        }
    }
}
