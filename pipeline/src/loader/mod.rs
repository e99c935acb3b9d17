//! The loader: one rank's `MicroBatchPlan`s in, `MicroBatch`es out, in the same order.
//!
//! 1. `source`: read the plan's samples by global index (`tessera_shards::Dataset`, memory-mapped).
//! 2. `decode`: each image's bytes -> RGB (every image of a sample, in placeholder order),
//!    DCT-scaled where a JPEG is much larger than needed.
//! 3. `resize`: `squash` or `pad` to `S x S`, bicubic, SIMD, written as u8 CHW (the kernels
//!    live under `resize/`); `anyres_views` cuts an image's base view and tiles under
//!    `anyres_max_N` from the same resizer.
//! 4. `assemble`: placeholders expanded, labels shifted per sample, positions restarting per
//!    packed sample, rows padded to the longest.
//! 5. `pool`: steps 1-4 for whole micro-batches on N threads, bounded channels, reorder buffer.
//!
//! ```
//! use tessera_pipeline::loader::{Loader, LoaderConfig, SampleSource};
//! use tessera_pipeline::MicroBatchPlan;
//! use tessera_shards::{Kind, Sample};
//! use std::sync::Arc;
//!
//! let sample = Sample {
//!     id: "t0".into(), kind: Kind::Text, images: vec![], conversation: vec![],
//!     input_ids: vec![10, 11, 12], label_mask: vec![false, true, true],
//!     num_text_tokens: 3, num_supervised_tokens: 2, input_ids_crc32c: None,
//! };
//! let source: Arc<dyn SampleSource> = Arc::new(vec![sample]);
//! let plan = MicroBatchPlan { kind: Kind::Text, rows: vec![vec![0]], zero_loss: false };
//! let config = LoaderConfig::builder().threads(1).placeholder_id(9).pad_id(0).build().unwrap();
//! let batch = Loader::new(source, vec![plan], config).next().unwrap().unwrap();
//! assert_eq!(batch.input_ids, vec![10, 11, 12]);
//! assert_eq!(batch.labels, vec![11, 12, -100]);
//! ```
pub mod anyres_views;
mod assemble;
mod config;
pub mod decode;
mod error;
mod pool;
pub mod resize;
mod source;
mod stats;
mod worker;

pub use config::{BadImagePolicy, LoaderConfig, LoaderConfigBuilder, ResizePolicy};
pub use error::LoaderError;
pub use pool::Loader;
pub use source::SampleSource;
pub use stats::LoaderStats;
