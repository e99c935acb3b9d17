//! What a run reports: `metrics.jsonl`, the progress line and `summary.json` (`metrics.rs`),
//! `loss.png` (`plot.rs`) and libtorch's profiler traces (`profile.rs`).
pub(crate) mod metrics;
pub(crate) mod plot;
pub(crate) mod profile;
