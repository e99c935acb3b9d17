//! `TrainError`: everything `tessera train` can fail with, each message naming what failed.
use super::checkpoint::CheckpointError;
use super::config::ConfigError;
use super::export::ExportError;
use super::metrics::MetricsError;
use super::plot::PlotError;
use crate::dist::DistError;
use crate::model::ModelError;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error("model: {0}")]
    Model(#[from] ModelError),
    #[error(transparent)]
    Dist(#[from] DistError),
    #[error("shards: {0}")]
    Shards(#[from] shards::ShardError),
    #[error("planner: {0}")]
    Plan(#[from] pipeline::plan::PlanError),
    #[error("loader: {0}")]
    Loader(#[from] pipeline::loader::LoaderError),
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    #[error(transparent)]
    Plot(#[from] PlotError),
    #[error(transparent)]
    Export(#[from] ExportError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("torch: {0}")]
    Torch(#[from] tch::TchError),
    #[error("{0}")]
    Invalid(String),
}

pub(crate) fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    }
}
