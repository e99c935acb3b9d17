//! Before a run starts: what its `--out` folder may already hold. A run folder belongs to one
//! run: without `--resume`, a non-empty folder is refused unless `--overwrite`, which clears it
//! first (and only a folder that looks like a run's).
use crate::config::ConfigError;
use crate::run_dir::{CHECKPOINTS_DIR, LOSS_PLOT_FILE, METRICS_FILE, SUMMARY_FILE, VLM_FILE};
use std::path::Path;

/// How a run treats what its `--out` folder already holds, and how it reports progress
/// (command-line only, like `--resume`: none of it is part of the run's settings).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunStart {
    /// Continue from the newest complete checkpoint in the folder.
    pub resume: bool,
    /// Clear a non-empty folder and start afresh.
    pub overwrite: bool,
    /// Run-record keys allowed to differ from the checkpoint's on `--resume`.
    pub resume_changing: Vec<String>,
    /// Show every step on one overwritten stderr line (the CLI: on a terminal, without
    /// `--quiet` or NO_PROGRESS); otherwise about 50 log lines a run.
    pub progress: bool,
}

/// What only a tessera run folder holds; `--overwrite` clears a folder holding one of these,
/// and refuses any other (a mistyped `--out $HOME` must not be emptied).
const RUN_MARKERS: [&str; 5] = [
    CHECKPOINTS_DIR,
    METRICS_FILE,
    SUMMARY_FILE,
    LOSS_PLOT_FILE,
    VLM_FILE,
];

fn invalid(reason: String) -> ConfigError {
    ConfigError::Invalid {
        field: "out",
        reason,
    }
}

/// Checks (and with `--overwrite` clears) `out` before a run starts. Call it once, before any
/// rank writes: the CLI before launching ranks, and rank 0 before joining the job.
pub fn prepare(out: &Path, start: &RunStart) -> Result<(), ConfigError> {
    if start.resume && start.overwrite {
        return Err(invalid(
            "--resume continues the run in the folder and --overwrite clears it: pass one".into(),
        ));
    }
    if !start.resume && !start.resume_changing.is_empty() {
        return Err(invalid(
            "--resume-changing applies only with --resume".into(),
        ));
    }
    if start.resume || !out.exists() {
        return Ok(());
    }
    let io = |source| ConfigError::OutFolder {
        path: out.to_path_buf(),
        source,
    };
    let mut names: Vec<String> = std::fs::read_dir(out)
        .and_then(|entries| {
            entries
                .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
                .collect::<Result<_, _>>()
        })
        .map_err(io)?;
    if names.is_empty() {
        return Ok(());
    }
    names.sort();
    if !start.overwrite {
        let shown: Vec<&str> = names.iter().take(4).map(String::as_str).collect();
        return Err(invalid(format!(
            "{} is not empty (it holds {}{}): pass --resume to continue the run in it, \
             --overwrite to clear it, or choose another --out",
            out.display(),
            shown.join(", "),
            if names.len() > shown.len() {
                ", ..."
            } else {
                ""
            }
        )));
    }
    if !names.iter().any(|n| RUN_MARKERS.contains(&n.as_str())) {
        return Err(invalid(format!(
            "--overwrite: {} does not look like a tessera run folder (no {}); clear it by hand \
             or choose another --out",
            out.display(),
            RUN_MARKERS.join(", ")
        )));
    }
    tracing::info!("--overwrite: clearing {}", out.display());
    for name in names {
        let path = out.join(&name);
        let removed = if path.is_dir() && !path.is_symlink() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        removed.map_err(|source| ConfigError::OutFolder { path, source })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_used_folder_is_refused_unless_resumed_or_overwritten() -> anyhow::Result<()> {
        let tmp = tempfile::tempdir()?;
        let out = tmp.path().join("run");
        let fresh = RunStart::default();
        prepare(&out, &fresh)?;
        std::fs::create_dir_all(out.join("checkpoints/step-00000040"))?;
        std::fs::write(out.join("metrics.jsonl"), b"{}\n")?;
        let msg = prepare(&out, &fresh).expect_err("used folder").to_string();
        assert!(
            msg.contains("not empty") && msg.contains("checkpoints") && msg.contains("--overwrite"),
            "{msg}"
        );
        let resume = RunStart {
            resume: true,
            ..RunStart::default()
        };
        prepare(&out, &resume)?;
        let overwrite = RunStart {
            overwrite: true,
            ..RunStart::default()
        };
        prepare(&out, &overwrite)?;
        assert_eq!(std::fs::read_dir(&out)?.count(), 0, "--overwrite clears it");
        Ok(())
    }

    #[test]
    fn overwrite_refuses_a_folder_that_is_not_a_run() -> anyhow::Result<()> {
        let tmp = tempfile::tempdir()?;
        std::fs::write(tmp.path().join("thesis.tex"), b"...")?;
        let overwrite = RunStart {
            overwrite: true,
            ..RunStart::default()
        };
        let msg = prepare(tmp.path(), &overwrite)
            .expect_err("not a run")
            .to_string();
        assert!(msg.contains("does not look like a tessera run"), "{msg}");
        assert!(tmp.path().join("thesis.tex").is_file());
        Ok(())
    }
}
