//! The LLaVA-architecture model in tch, written in the functional style FSDP needs: no layer
//! owns storage; every forward reads full tensors from a [`ParamMap`](tessera_fsdp::ParamMap)
//! keyed by Hugging Face checkpoint names. Each
//! unit of the chain implements `tessera-fsdp`'s [`Unit`](tessera_fsdp::Unit), the only thing FSDP
//! knows of the model.
//!
//! 1. `config.rs`: `config.json` structs (HF field names, HF defaults for sparse Hub configs).
//! 2. `weights.rs`: safetensors loading (single file or sharded index) and writing;
//!    `source.rs`: [`VlmInit`], the checkpoints as FSDP's per-rank, slice-by-slice source.
//! 3. `siglip.rs` (vision tower), `projector.rs` (`mlp2x_gelu`), `decoder.rs` (the LM: one
//!    decoder for Qwen2, Qwen3, Qwen3-MoE and Llama, switched by `lm_config.rs`; `moe.rs`, the
//!    sparse MLP and its balance loss; with `rope.rs`,
//!    `attention.rs` and `lora.rs` adapters), `loss.rs` (chunked cross-entropy);
//!    `keys.rs` builds their checkpoint keys as paths, each spelled once.
//! 4. `vlm.rs`: the unit chain (`vision.embeddings`, `vision.layers.{i}`, `projector`, `embed`,
//!    `layers.{i}`, `head`; `vlm_units.rs`) that FSDP runs over the per-micro-batch context
//!    [`VlmCtx`] (`ctx.rs`), and [`Vlm::loss`], the plain composition.
//! 5. `generator.rs`: [`Generator`], inference with a KV cache (greedy or top-p) over weights
//!    held in one dtype (tessera-train's `export/caption.rs` puts the tokenizer, the chat
//!    template and the image loader around it for `tessera generate`); `llava.rs` and `hub_files.rs`:
//!    transformers' `LlavaForConditionalGeneration` config, keys and streamed, sharded
//!    checkpoints.
//! 6. `init.rs`: random-weight checkpoints for `tessera init-model`; `throughput.rs` (feature
//!    `bench`): the forward+backward measurement of `benches/model.rs`.
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
mod anyres;
mod attention;
mod config;
mod ctx;
mod decoder;
mod dinov2;
mod dtype;
mod error;
mod feature_layers;
mod feature_stats;
mod gemm;
mod generator;
mod hub_files;
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
mod init;
mod keys;
pub mod llava;
mod lm_config;
mod lm_dir;
mod lora;
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
mod loss;
mod moe;
mod projector;
mod rope;
mod selective;
mod side_stream;
mod siglip;
mod source;
#[cfg(feature = "bench")]
mod throughput;
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
mod varlen;
mod vision;
mod vlm;
mod vlm_units;
mod vocab;
mod weights;

pub use anyres::pack_image_features;
pub use config::read_json as read_config_json;
pub use config::{LoraConfig, VisionArch, VisionConfig};
pub use ctx::{BatchSpec, VlmCtx};
pub use dtype::Dtype;
pub use error::ModelError;
pub use feature_layers::FeatureLayers;
pub use feature_stats::{fold_into_projector, FeatureMeter, FeatureStats, FOLDED_KEYS};
pub use gemm::{CpuBf16Gemm, GemmTiming};
pub use generator::{GenerateOptions, Generation, Generator};
pub use hub_files::{write_hub_files, HUB_SHARD_BYTES};
pub use init::{write_preset, Preset};
pub use lm_config::{LmConfig, LmFamily, MoeConfig, RopeParameters};
pub use lora::{
    adapter_keys, init_adapters, load_adapter, merge_adapters, merge_weight, save_adapter,
    save_adapter_as, ADAPTER_CONFIG, ADAPTER_WEIGHTS,
};
pub use moe::{ExpertGroup, MoeTimes, RouterLog, RouterStats};
pub use projector::IMAGE_NEWLINE;
pub use source::VlmInit;
#[cfg(feature = "bench")]
pub use throughput::{measure_throughput, ThroughputReport};
pub use vlm::{VisionTraining, Vlm, VlmOptions};
pub use vocab::{ADDED_EMBED, ADDED_HEAD};
pub use weights::{
    load_safetensors, read_exact_into, save_safetensors, save_safetensors_as, HfCheckpoint,
};

/// What the tests compare the model's kernels with and build their fixtures from (the dense
/// and per-span attention references, the varlen emulation, the unchunked loss, random
/// checkpoints); not part of the training API. Feature `testing`, which the workspace's own
/// tests turn on through their dev-dependencies.
#[cfg(feature = "testing")]
pub mod testing {
    pub use super::attention::{attend, attend_spans, block_causal_mask, row_spans, Span};
    pub use super::init::{lm_checkpoint_specs, random_params, write_checkpoints, INIT_STD};
    pub use super::loss::{chunked_cross_entropy_sum, full_cross_entropy_sum};
    pub use super::varlen::{attend_varlen, emulate_varlen, Varlen};
}

/// Reads a parameter a unit needs; a missing key (the unit names a key it was not given) is
/// an error naming the key.
pub(crate) fn param<'a>(
    params: &'a tessera_fsdp::ParamMap,
    key: &str,
) -> Result<&'a tch::Tensor, tessera_fsdp::ComputeError> {
    params
        .get(key)
        .ok_or_else(|| tessera_fsdp::ComputeError::MissingParam {
            key: key.to_string(),
        })
}
