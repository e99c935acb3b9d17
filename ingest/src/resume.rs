//! The resume journal, `DIR/ingest.journal.json`, rewritten atomically after every completed
//! shard. Shard boundaries depend only on the records (see the ordered writer), so a run that
//! restarts at `next_record` with shard number `shards.len()` writes the same bytes an
//! uninterrupted run would have written.
//!
//! Each kept shard's sha256 was computed while it was written; on resume a shard whose size
//! and modification time still equal the ones recorded right after its rename is trusted
//! without reading it again (a renamed, synced shard is not touched by a kill). A shard whose
//! stamp differs is hashed and must match its sha256. `tessera shards verify` always hashes.
//!
//! The inputs are fingerprinted too (the json's sha256, or each parquet file's name, size,
//! modification time and footer; the images' zip central directory, or the folder's names,
//! sizes and modification times): a resume whose inputs changed since the
//! interrupted run is refused, naming what changed. A finished run records the same
//! fingerprint in index.json, so a resume into a finished directory is checked the same way
//! ([`check_finished`]).
use crate::error::IngestError;
use serde::{Deserialize, Serialize};
use std::path::Path;
use tessera_shards::{IngestReport, ShardInfo};

pub(crate) const JOURNAL_FILE: &str = "ingest.journal.json";
pub(crate) const REJECTED_FILE: &str = "rejected.jsonl";

/// Everything that changes the output bytes; a resume must use the same. Recorded in the
/// journal while the run goes on and in index.json once it finished.
pub(crate) use tessera_shards::IngestSettings as Settings;

/// State after the last completed shard.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Journal {
    pub settings: Settings,
    pub shards: Vec<ShardInfo>,
    /// First record (json order) not yet covered by `shards` and `rejected.jsonl`.
    pub next_record: u64,
    /// Length of `rejected.jsonl` at this point.
    pub rejected_bytes: u64,
    pub report: IngestReport,
    /// Size and modification time of each shard in `shards`, taken after its rename.
    #[serde(default)]
    pub stamps: Vec<FileStamp>,
    /// Seconds of ingest work up to this journal, summed over the runs of a resumed ingest.
    #[serde(default)]
    pub elapsed_s: f64,
}

/// A file's size and modification time (nanoseconds since the epoch).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct FileStamp {
    pub bytes: u64,
    pub modified_ns: u128,
}

impl FileStamp {
    /// The stamp of `path` now.
    pub(crate) fn of(path: &Path) -> Result<FileStamp, IngestError> {
        let meta = std::fs::metadata(path).map_err(|e| IngestError::io(path, e))?;
        let modified = meta.modified().map_err(|e| IngestError::io(path, e))?;
        Ok(FileStamp {
            bytes: meta.len(),
            modified_ns: modified
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        })
    }
}

/// One line per field of `now` that differs from `recorded`: `what (field): old -> new`.
fn changes(recorded: &Settings, now: &Settings) -> Vec<String> {
    // Hashes are shown by their first 16 hex digits.
    let short = |s: &str| s.chars().take(16).collect::<String>();
    let limit = |s: &Settings| match (s.max_tokens, s.max_tokens_image_tokens) {
        (Some(n), Some(t)) => format!("{n} ({t} per image)"),
        (Some(n), None) => n.to_string(),
        _ => "none".to_string(),
    };
    let shown = |s: &Settings| -> [String; 11] {
        [
            s.format.clone(),
            short(&s.json_sha256),
            s.json_bytes.to_string(),
            s.json_records.to_string(),
            short(&s.images_fingerprint),
            short(&s.tokenizer_fingerprint),
            s.template.clone(),
            s.shard_size.to_string(),
            (!s.verify).to_string(),
            s.max_pixels.to_string(),
            limit(s),
        ]
    };
    // (what the user gave, the field recorded), in the order of `shown`.
    const FIELDS: [(&str, &str); 11] = [
        ("--format", "format"),
        ("the --input content", "json_sha256"),
        ("the --input size", "json_bytes"),
        ("the --input record count", "json_records"),
        (
            "the --images zip directory or folder listing",
            "images_fingerprint",
        ),
        ("the --tokenizer", "tokenizer_fingerprint"),
        ("--template", "template"),
        ("--shard-size", "shard_size"),
        ("--no-verify", "verify"),
        ("--max-pixels", "max_pixels"),
        ("--max-tokens / --image-tokens", "max_tokens"),
    ];
    FIELDS
        .iter()
        .zip(shown(recorded).into_iter().zip(shown(now)))
        .filter(|(_, (old, new))| old != new)
        .map(|((what, field), (old, new))| format!("{what} ({field}): {old} -> {new}"))
        .collect()
}

/// Refuses when the inputs or settings given now differ from the ones `since` (the interrupted
/// run, the finished run) recorded, naming each difference.
fn refuse_changes(
    dir: &Path,
    recorded: &Settings,
    now: &Settings,
    since: &str,
) -> Result<(), IngestError> {
    let changes = changes(recorded, now);
    if changes.is_empty() {
        return Ok(());
    }
    Err(IngestError::Resume {
        dir: dir.to_path_buf(),
        detail: format!(
            "the inputs or settings changed since {since}: {}; restore them, or start over in \
             an empty directory",
            changes.join("; ")
        ),
    })
}

/// `--resume` into a directory whose ingest finished (index.json present): nothing is left to
/// do, but the inputs and settings must still be the ones the shards were made from, checked
/// as for an interrupted run.
///
/// An index.json written before ingest recorded its settings there has none. Such a directory
/// is checked on what its index.json does record (tokenizer, template, record count, whether
/// images were verified); the input's content, the images, `--shard-size` and `--max-pixels`
/// cannot be checked, which is logged as a warning, and the directory is still reported
/// complete. Refusing instead would turn every re-run of an older ingest command into an error
/// whose only remedy is to ingest again from scratch, and such directories were accepted
/// unchecked before.
pub(crate) fn check_finished(
    dir: &Path,
    manifest: &tessera_shards::Manifest,
    now: &Settings,
) -> Result<(), IngestError> {
    if let Some(recorded) = &manifest.ingest_settings {
        return refuse_changes(dir, recorded, now, "the finished run");
    }
    let recorded = Settings {
        tokenizer_fingerprint: manifest.source_tokenizer_fingerprint().to_string(),
        template: manifest.template.clone(),
        json_records: manifest.ingest.records_read,
        verify: manifest.ingest.images_verified,
        ..now.clone()
    };
    refuse_changes(dir, &recorded, now, "the finished run")?;
    tracing::warn!(
        "{}/{} predates recorded ingest inputs: the --input content, the --images, \
         --shard-size and --max-pixels cannot be checked against it (tokenizer, template and \
         record count match)",
        dir.display(),
        tessera_shards::INDEX_FILE
    );
    Ok(())
}

impl Journal {
    pub(crate) fn save(&self, dir: &Path) -> Result<(), IngestError> {
        let text = serde_json::to_vec_pretty(self).map_err(|source| IngestError::Journal {
            dir: dir.to_path_buf(),
            file: JOURNAL_FILE,
            source,
        })?;
        Ok(tessera_shards::write_atomically(
            &dir.join(JOURNAL_FILE),
            &text,
        )?)
    }

    /// Loads the journal, or `None` when there is none.
    pub(crate) fn load(dir: &Path) -> Result<Option<Journal>, IngestError> {
        let path = dir.join(JOURNAL_FILE);
        match std::fs::read(&path) {
            Ok(text) => {
                serde_json::from_slice(&text)
                    .map(Some)
                    .map_err(|source| IngestError::Journal {
                        dir: dir.to_path_buf(),
                        file: JOURNAL_FILE,
                        source,
                    })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(IngestError::io(path, e)),
        }
    }

    /// Checks the journal against the settings and the files on disk: each listed shard must
    /// still carry its recorded stamp, or else hash to its sha256; leftovers of the interrupted run (later shards, temporary files,
    /// rejected lines past the checkpoint) are removed.
    pub(crate) fn restore(&self, dir: &Path, settings: &Settings) -> Result<(), IngestError> {
        let fail = |detail: String| IngestError::Resume {
            dir: dir.to_path_buf(),
            detail,
        };
        refuse_changes(dir, &self.settings, settings, "the interrupted run")?;
        for (n, shard) in self.shards.iter().enumerate() {
            let path = dir.join(&shard.file);
            if self
                .stamps
                .get(n)
                .is_some_and(|s| FileStamp::of(&path).ok().as_ref() == Some(s))
            {
                continue;
            }
            let (sha, _) = tessera_shards::sha256_file(&path)?;
            if sha != shard.sha256 {
                return Err(fail(format!(
                    "{} changed since it was written (sha256 {sha}, journal {})",
                    shard.file, shard.sha256
                )));
            }
        }
        remove_leftovers(dir, self.shards.len())?;
        let rejected = dir.join(REJECTED_FILE);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&rejected)
            .map_err(|e| IngestError::io(&rejected, e))?;
        file.set_len(self.rejected_bytes)
            .map_err(|e| IngestError::io(&rejected, e))?;
        Ok(())
    }
}

/// Removes temporary files and shard files numbered `keep` or above.
pub(crate) fn remove_leftovers(dir: &Path, keep: usize) -> Result<(), IngestError> {
    let entries = std::fs::read_dir(dir).map_err(|e| IngestError::io(dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| IngestError::io(dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let stale_shard = name
            .strip_prefix("shard-")
            .and_then(|n| n.strip_suffix(".parquet"))
            .and_then(|n| n.parse::<usize>().ok())
            .is_some_and(|n| n >= keep);
        if stale_shard || (name.starts_with('.') && name.ends_with(".tmp")) {
            std::fs::remove_file(entry.path()).map_err(|e| IngestError::io(entry.path(), e))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn journal_for(dir: &Path, content: &[u8]) -> anyhow::Result<(Journal, Settings)> {
        let file = tessera_shards::shard_file_name(0);
        std::fs::write(dir.join(&file), content)?;
        let (sha256, bytes) = tessera_shards::sha256_file(&dir.join(&file))?;
        let settings = Settings {
            format: "llava".into(),
            json_bytes: 1,
            json_records: 1,
            json_sha256: "j".into(),
            images_fingerprint: "i".into(),
            tokenizer_fingerprint: "t".into(),
            template: "plain".into(),
            shard_size: 1,
            verify: true,
            max_pixels: 1,
            max_tokens: None,
            max_tokens_image_tokens: None,
        };
        let journal = Journal {
            settings: settings.clone(),
            shards: vec![ShardInfo {
                file: file.clone(),
                rows: 1,
                bytes,
                sha256,
                num_text_tokens: 0,
                num_supervised_tokens: 0,
                num_image_samples: 0,
                row_groups: Vec::new(),
            }],
            next_record: 1,
            rejected_bytes: 0,
            report: IngestReport::default(),
            stamps: vec![FileStamp::of(&dir.join(&file))?],
            elapsed_s: 0.0,
        };
        Ok((journal, settings))
    }

    #[test]
    fn resume_refuses_a_kept_shard_whose_bytes_changed() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let (journal, settings) = journal_for(dir.path(), b"shard bytes")?;
        journal.restore(dir.path(), &settings)?;
        // Same length, one byte flipped: the stamp (mtime) no longer matches, so the shard is
        // hashed and its sha256 differs.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(dir.path().join(&journal.shards[0].file), b"shard bytez")?;
        let err = journal
            .restore(dir.path(), &settings)
            .expect_err("a changed shard must stop the resume");
        assert!(
            err.to_string().contains("changed since it was written"),
            "{err}"
        );
        Ok(())
    }

    #[test]
    fn journal_without_stamps_still_checks_by_hash() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let (mut journal, settings) = journal_for(dir.path(), b"shard bytes")?;
        journal.stamps.clear();
        journal.restore(dir.path(), &settings)?;
        std::fs::write(dir.path().join(&journal.shards[0].file), b"other bytes")?;
        assert!(journal.restore(dir.path(), &settings).is_err());
        Ok(())
    }
}
