//! What a run reports: `metrics.jsonl`, the progress line and `summary.json` (`metrics.rs`),
//! the same scalars for TensorBoard (`tensorboard.rs`, written by `event_file.rs`), `loss.png`
//! (`plot.rs`) and libtorch's profiler traces (`profile.rs`).
pub(crate) mod event_file;
pub(crate) mod metrics;
pub(crate) mod plot;
pub(crate) mod profile;
pub(crate) mod tensorboard;
