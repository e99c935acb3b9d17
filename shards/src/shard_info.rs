//! One shard file as `index.json` lists it (`crate::manifest`) and its readers, local or
//! remote (`crate::location`), find its bytes and row groups.
use serde::{Deserialize, Serialize};

/// One row group of a shard, as parquet's footer records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowGroupInfo {
    /// Byte offset of the row group's first column chunk in the file.
    pub offset: u64,
    /// Compressed bytes of the row group's column chunks.
    pub bytes: u64,
    pub rows: u64,
    /// Row index (within the shard) of the group's first row.
    pub first_row: u64,
}

/// One shard file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardInfo {
    pub file: String,
    pub rows: u64,
    pub bytes: u64,
    /// Hex sha256 of the whole file.
    pub sha256: String,
    pub num_text_tokens: u64,
    pub num_supervised_tokens: u64,
    pub num_image_samples: u64,
    pub row_groups: Vec<RowGroupInfo>,
}
