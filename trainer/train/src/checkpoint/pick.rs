//! Which checkpoint a resume continues from (and export, generation and `--init-projector`
//! read): the newest COMPLETE one. A folder still named `step-N.tmp` is a write that never
//! committed (the run stopped inside it); a committed one whose `meta.json` is unreadable, or
//! whose files do not hash as their rank's manifest says, is damaged. Both are passed over,
//! newest first, and each one skipped is reported (the log, and for a resume `resumes.jsonl`
//! in the run folder: one line per resume). A checkpoint of another format stops the search
//! with its refusal.
use crate::checkpoint::format::{rank_dir_name, Checkpoint, CheckpointError};
use crate::run_dir::RunDir;
use serde::{Deserialize, Serialize};

/// A checkpoint folder a resume passed over, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Skipped {
    /// The folder, e.g. `checkpoints/step-00000010.tmp`.
    pub checkpoint: String,
    pub reason: String,
}

/// The newest complete checkpoint under `RUN/checkpoints` and the newer folders skipped.
pub struct Pick {
    pub checkpoint: Option<Checkpoint>,
    pub skipped: Vec<Skipped>,
}

impl Pick {
    /// The skipped folders with their reasons, `; `-joined, for messages.
    pub fn skipped_list(&self) -> String {
        let list: Vec<String> = self
            .skipped
            .iter()
            .map(|s| format!("{} ({})", s.checkpoint, s.reason))
            .collect();
        list.join("; ")
    }
}

impl RunDir {
    /// The committed checkpoint with the highest step whose files all verify, passing over
    /// (and listing) newer uncommitted or damaged folders. Resume, export, generation and
    /// `--init-projector` all take this one. Every rank may call it: it only reads, and all
    /// reach the same answer.
    pub fn newest_complete_checkpoint(&self) -> Result<Pick, CheckpointError> {
        let mut skipped = Vec::new();
        let folders = self
            .checkpoint_folders()
            .map_err(|source| CheckpointError::Io {
                path: self.checkpoints(),
                source,
            })?;
        for folder in folders {
            let checkpoint = self.shown(&folder.path);
            if !folder.committed {
                let ranks = (0..)
                    .map(|r| folder.path.join(rank_dir_name(r)))
                    .take_while(|d| d.is_dir())
                    .count();
                skipped.push(Skipped {
                    checkpoint,
                    reason: format!(
                        "never committed: the run stopped while writing it ({ranks} of its rank \
                         folders begun; not renamed from .tmp)"
                    ),
                });
                continue;
            }
            let opened = Checkpoint::open(&folder.path).and_then(|mut c| c.verify().map(|()| c));
            match opened {
                Ok(c) => {
                    return Ok(Pick {
                        checkpoint: Some(c),
                        skipped,
                    })
                }
                // Another format is not damage: every older checkpoint of the run is older
                // still, so say so now instead of listing them all.
                Err(e @ CheckpointError::Format { .. }) => return Err(e),
                Err(e) => skipped.push(Skipped {
                    checkpoint,
                    reason: tessera_errors::with_causes(&e),
                }),
            }
        }
        Ok(Pick {
            checkpoint: None,
            skipped,
        })
    }
}
