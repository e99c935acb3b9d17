//! The checkpoint an export (or `tessera generate --run`) reads: the run's newest complete one,
//! its trained tensors and the training config it was written under.
use super::error::ExportError;
use crate::checkpoint::format::Checkpoint;
use crate::checkpoint::trained::TrainedTensors;
use crate::config::TrainConfig;
use crate::run_dir::RunDir;
use std::path::Path;

/// The run's newest complete checkpoint (see [`RunDir::newest_complete_checkpoint`]); each
/// newer folder passed over is logged with its reason, and with none usable the error names
/// them all.
pub(crate) fn newest_complete(run: &Path) -> Result<Checkpoint, ExportError> {
    let pick = RunDir::new(run).newest_complete_checkpoint()?;
    let Some(checkpoint) = pick.checkpoint else {
        let why = if pick.skipped.is_empty() {
            "train first, or wait for the first checkpoint".to_string()
        } else {
            format!("skipped {}", pick.skipped_list())
        };
        return Err(ExportError::NoCheckpoint {
            run: run.to_path_buf(),
            why,
        });
    };
    let shown = run.display();
    for s in &pick.skipped {
        tracing::warn!("run {shown}: skipped {}: {}", s.checkpoint, s.reason);
    }
    Ok(checkpoint)
}

/// The trained tensors of the run's newest complete checkpoint, and that checkpoint.
pub fn newest_complete_trained(run: &Path) -> Result<(Checkpoint, TrainedTensors), ExportError> {
    let ckpt = newest_complete(run)?;
    let trained = TrainedTensors::open(&ckpt)?;
    Ok((ckpt, trained))
}

/// The training config `ckpt` (of `run`) was written under.
pub(crate) fn stored_config(run: &Path, ckpt: &Checkpoint) -> Result<TrainConfig, ExportError> {
    TrainConfig::from_stored(ckpt.meta.config.clone()).map_err(|e| ExportError::Unreadable {
        run: run.to_path_buf(),
        what: format!(
            "checkpoint {} holds an unreadable config",
            ckpt.dir.display()
        ),
        source: e.into(),
    })
}
