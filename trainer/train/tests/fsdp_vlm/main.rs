//! The model under FSDP, one binary (libtorch links once): the real tiny VLM at W=2 against
//! W=1, bf16 mixed precision, per-rank memory (sharded loading, gathered bytes), the llava-hf
//! export and generation against transformers, expert parallelism. The communication
//! measurements are benches (trainer/train/benches/).
#[path = "../../../model/tests/support/mod.rs"]
mod support;

mod expert_parallel;
mod golden_train;
mod llava;
mod memory;
mod precision;
mod sharded_load;
mod vlm;
