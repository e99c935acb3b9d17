//! The language model's two ends over its vocabulary: the token embedding
//! (`model.embed_tokens.weight`) and the head (final RMSNorm `model.norm.weight`, then the
//! output projection: `lm_head.weight`, or the embedding itself when tied).
//!
//! A dataset whose tokenizer had no image token got `<image>` added after its last id (see
//! `tessera_text::SpecialTokens::added`). When that id is past the checkpoint's `vocab_size` (SmolLM2:
//! 49,152 ids for 49,152 rows), the model appends rows for the added tokens, as LLaVA resizes
//! its embeddings for the tokens it adds: [`ADDED_EMBED`] (and [`ADDED_HEAD`] for an untied
//! head), initialised to the mean of the rows they extend and trained with the projector. The
//! embedding looks ids past the checkpoint's rows up in them, the head scores them after the
//! checkpoint's tokens, and exports write them appended to the checkpoint's matrices.
use super::decoder::rms_norm;
use super::gemm;
use super::lm_config::LmConfig;
use super::param;
use tch::{Kind, Tensor};
use tessera_fsdp::{ComputeError, ParamMap, ParamSpec};

pub(super) const EMBED: &str = "model.embed_tokens.weight";
pub(super) const NORM: &str = "model.norm.weight";
pub(super) const LM_HEAD: &str = "lm_head.weight";
/// Embedding rows of the tokens ingest added, `[added, hidden]`.
pub const ADDED_EMBED: &str = "added_tokens.embed_tokens";
/// Output rows of the added tokens for an untied head, `[added, hidden]`.
pub const ADDED_HEAD: &str = "added_tokens.lm_head";

fn spec(name: &str, shape: Vec<i64>, trainable: bool) -> ParamSpec {
    ParamSpec {
        name: name.into(),
        shape,
        trainable,
        expert: None,
    }
}

/// The embedding, and the added tokens' rows (always trained) when there are any.
pub(super) fn embed_specs(cfg: &LmConfig, added: i64) -> Vec<ParamSpec> {
    let d = cfg.hidden_size;
    let mut specs = vec![spec(EMBED, vec![cfg.vocab_size, d], false)];
    if added > 0 {
        specs.push(spec(ADDED_EMBED, vec![added, d], true));
    }
    specs
}

/// Final norm + output projection (with tied embeddings `EMBED` itself), and the added
/// tokens' output rows when there are any (tied: the embedding's added rows).
pub(super) fn head_specs(cfg: &LmConfig, tied: bool, added: i64) -> Vec<ParamSpec> {
    let d = cfg.hidden_size;
    let mut specs = vec![
        spec(NORM, vec![d], false),
        spec(output_weight(tied), vec![cfg.vocab_size, d], false),
    ];
    if added > 0 {
        specs.push(spec(added_output(tied), vec![added, d], true));
    }
    specs
}

/// Name of the output projection the head reads.
pub(super) fn output_weight(tied: bool) -> &'static str {
    if tied {
        EMBED
    } else {
        LM_HEAD
    }
}

/// Name of the added tokens' output rows.
pub(super) fn added_output(tied: bool) -> &'static str {
    if tied {
        ADDED_EMBED
    } else {
        ADDED_HEAD
    }
}

/// The output projection over the whole vocabulary, `[vocab + added, D]`: the checkpoint's rows,
/// then the added tokens' (a concatenation only when there are added rows).
pub(super) fn output_matrix(params: &ParamMap, tied: bool) -> Result<Tensor, ComputeError> {
    let w = param(params, output_weight(tied))?;
    Ok(match params.get(added_output(tied)) {
        Some(added) => Tensor::cat(&[w, &added.to_kind(w.kind())], 0),
        None => w.shallow_clone(),
    })
}

/// Token embeddings `[rows, len, D]` for `input_ids` `[rows, len]`; ids past the checkpoint's
/// rows read the added rows.
pub(super) fn embed(params: &ParamMap, input_ids: &Tensor) -> Result<Tensor, ComputeError> {
    let w = param(params, EMBED)?;
    let Some(added) = params.get(ADDED_EMBED) else {
        return Ok(Tensor::embedding(w, input_ids, -1, false, false));
    };
    let vocab = w.size()[0];
    let is_added = input_ids.ge(vocab);
    let base = Tensor::embedding(w, &input_ids.clamp_max(vocab - 1), -1, false, false);
    let extra = Tensor::embedding(
        &added.to_kind(w.kind()),
        &(input_ids - vocab).clamp_min(0),
        -1,
        false,
        false,
    );
    Ok(extra.where_self(&is_added.unsqueeze(-1), &base))
}

/// Full logits `[.., vocab + added]` of final hidden states (for evaluation, generation and
/// tests; training uses the chunked loss in [`super::loss`]).
pub(super) fn logits(
    cfg: &LmConfig,
    params: &ParamMap,
    tied: bool,
    hidden: &Tensor,
) -> Result<Tensor, ComputeError> {
    let h = rms_norm(hidden, param(params, NORM)?, cfg.rms_norm_eps);
    Ok(gemm::matmul(&h, &output_matrix(params, tied)?.tr()))
}

/// Initial rows for `added` new tokens: each the mean of `matrix`'s rows (LLaVA's
/// initialisation of the tokens it adds), f32.
pub(super) fn mean_rows(matrix: &Tensor, added: i64) -> Tensor {
    matrix
        .to_kind(Kind::Float)
        .mean_dim(0, true, Kind::Float)
        .repeat([added, 1])
}
