//! tessera's shard format (schema v1): parquet files `shard-NNNNN.parquet`, one row per sample,
//! plus `index.json` written last. Filled in by the ingest issue; `sample` is the shared contract.
mod sample;

pub use sample::{Kind, Sample, SampleMeta, Turn};
