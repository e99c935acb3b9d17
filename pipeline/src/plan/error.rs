//! `PlanError`: everything the planner rejects, each message naming the setting or the sample.
use tessera_shards::Kind;

/// Why a planner could not be built or a plan could not be resumed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    #[error("token budget 0 is not a budget")]
    ZeroBudget,
    #[error("{images} samples' image counts for {samples} samples")]
    ImagesPerSample { images: usize, samples: usize },
    #[error("world size 0: at least one rank must run")]
    ZeroWorldSize,
    #[error("sequence length 0: a row must hold at least one token")]
    ZeroSeqLen,
    #[error("micro-steps per step 0: a step needs at least one micro-step")]
    ZeroMicroSteps,
    #[error("fixed mode: 0 samples per micro-batch")]
    ZeroFixedSamples,
    #[error(
        "fixed mode: {samples} samples per micro-batch x sequence length {seq_len} exceeds the \
         token budget {budget} (a padded micro-batch could not fit)"
    )]
    FixedOverBudget {
        samples: usize,
        seq_len: u64,
        budget: u64,
    },
    #[error("cost model: {0}")]
    InvalidCost(String),
    #[error("{count} samples: the planner numbers samples with u32 (at most {max})", max = u32::MAX)]
    TooManySamples { count: usize },
    #[error(
        "sample {index}: {kind:?} sample with {num_images} images and {num_text_tokens} text \
         tokens (an image sample needs at least one image and a placeholder for each, a text \
         sample no image and at least one token)"
    )]
    EmptySample {
        index: u64,
        kind: Kind,
        num_images: u32,
        num_text_tokens: u32,
    },
    #[error(
        "sample {index}: {len} tokens exceed the {limit_name} ({limit}); over-long samples are \
         rejected, not truncated (raise the limit or drop the sample at ingest)"
    )]
    SampleTooLong {
        index: u64,
        len: u64,
        limit: u64,
        limit_name: &'static str,
    },
    #[error("resume position is for epoch {found}, this planner plans epoch {expected}")]
    EpochMismatch { expected: u64, found: u64 },
    #[error(
        "resume position was made for sample order {found}, this planner's order is {expected} \
         (a different dataset fingerprint, seed or epoch)"
    )]
    OrderMismatch { expected: String, found: String },
    #[error(
        "resume position has consumed {consumed} {kind:?} samples, the dataset has {available}"
    )]
    PositionOutOfRange {
        kind: Kind,
        consumed: u64,
        available: u64,
    },
    #[error(
        "resume position is not a prefix of the shuffled order, which `fixed` mode consumes \
         front to back (it was made by `pack` or `bucket`)"
    )]
    NotAPrefix,
    #[error("a draw names sample {index}, the planner was given {samples} samples")]
    DrawOutOfRange { index: u64, samples: usize },
    #[error("step {step} is past the end of a plan of {steps} steps")]
    StepOutOfRange { step: usize, steps: usize },
}
