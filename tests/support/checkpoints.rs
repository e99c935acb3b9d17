//! A run's committed checkpoints as the tests read them: which is the newest, and which
//! parameters it trained (from its `layout.json`, JSON alone).
use anyhow::{ensure, Context, Result};
use std::path::{Path, PathBuf};

use super::read_json;

/// The newest committed checkpoint folder of a run (`checkpoints/step-N`, not `.tmp`).
pub(crate) fn newest_checkpoint(run: &Path) -> Result<PathBuf> {
    let dir = run.join("checkpoints");
    let mut steps: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("{} has no checkpoints/", run.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<Vec<_>>>()?
        .into_iter()
        .filter(|p| {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
            name.is_some_and(|n| n.starts_with("step-") && !n.ends_with(".tmp"))
        })
        .collect();
    steps.sort();
    let newest = steps
        .pop()
        .with_context(|| format!("{} holds no committed checkpoint", dir.display()))?;
    ensure!(
        newest.join("meta.json").is_file(),
        "{} has no meta.json",
        newest.display()
    );
    Ok(newest)
}

/// Names of the parameters a checkpoint trained (its `layout.json`).
pub(crate) fn trained_parameters(checkpoint: &Path) -> Result<Vec<String>> {
    let layout = read_json(&checkpoint.join("rank-00000").join("layout.json"))?;
    let buffers = layout["buffers"]
        .as_array()
        .context("layout.json without buffers")?;
    Ok(buffers
        .iter()
        .flat_map(|b| b["params"].as_array().into_iter().flatten())
        .filter_map(|p| p["name"].as_str().map(str::to_string))
        .collect())
}
