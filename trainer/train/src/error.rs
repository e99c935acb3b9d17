//! `TrainError`: everything `tessera train` can fail with, each message naming what failed.
//! A wrapped error is either `transparent` (its message is the whole story) or its message
//! names only what this layer adds (a path): the cause is the `source`, so `{:#}` prints it once.
use crate::checkpoint::format::CheckpointError;
use crate::config::ConfigError;
use crate::export::error::ExportError;
use crate::report::event_file::EventFileError;
use crate::report::metrics::MetricsError;
use crate::report::plot::PlotError;
use std::path::PathBuf;
use tessera_fsdp::dist::DistError;
use tessera_fsdp::FsdpError;
use tessera_model::ModelError;

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Dist(#[from] DistError),
    #[error(transparent)]
    Fsdp(#[from] FsdpError),
    #[error(transparent)]
    Shards(#[from] tessera_shards::ShardError),
    #[error(transparent)]
    Plan(#[from] tessera_pipeline::plan::PlanError),
    #[error(transparent)]
    Mix(#[from] tessera_pipeline::mix::MixError),
    #[error(transparent)]
    Loader(#[from] tessera_pipeline::loader::LoaderError),
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    #[error(transparent)]
    Plot(#[from] PlotError),
    #[error(transparent)]
    Events(#[from] EventFileError),
    #[error(transparent)]
    Export(#[from] ExportError),
    #[error("{path}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("torch")]
    Torch(#[from] tch::TchError),
    /// JSON the run writes (summary.json, a checkpoint's planner position and config) or reads
    /// back; `what` names the file or the record.
    #[error("{what}")]
    Json {
        what: String,
        source: serde_json::Error,
    },
    /// The validation shards cannot be planned.
    #[error("--val-shards {dir}")]
    ValidationPlan {
        dir: PathBuf,
        source: tessera_pipeline::plan::PlanError,
    },
    /// A refusal of tessera's own (no underlying error).
    #[error("{0}")]
    Invalid(String),
    /// A collective failed and these ranks' heartbeats have stopped: their node or process died.
    #[error("ranks {ranks:?} stopped sending heartbeats: their machine or process is gone (resume from the last checkpoint, on fewer nodes if need be)")]
    RanksLost {
        ranks: Vec<usize>,
        source: Box<TrainError>,
    },
    /// The profiler shim failed (starting, or stopping and writing the trace to `path`).
    #[error("profiler{}", path.as_ref().map(|p| format!(", trace {}", p.display())).unwrap_or_default())]
    Profiler {
        path: Option<std::path::PathBuf>,
        source: tessera_sys::ShimError,
    },
}

pub(crate) fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    }
}
