//! FSDP's tests, one binary (libtorch links once): a toy VLM-shaped chain and the real tiny VLM
//! at W=2 against W=1, bf16 mixed precision, per-rank memory (sharded loading, gathered
//! bytes), and the (ignored) communication measurement.
#[path = "../support/mod.rs"]
mod support;

mod bench;
mod memory;
mod precision;
mod sharded_load;
mod toy_chain;
mod vlm;
