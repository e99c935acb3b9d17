//! Room for the next checkpoint. Rank 0 compares what a checkpoint of this run takes with what
//! `--out`'s filesystem has free, at the start of the run and again before each checkpoint,
//! and warns when it will not fit: at the start, before the steps up to it are spent. The
//! write itself, if the disk is still full then, fails with the file, the bytes it needed and
//! the bytes free (`tessera_shards::NoSpace`), removes what it half wrote, and leaves the last
//! committed checkpoint as it was.
//!
//! A checkpoint's size is the previous committed one's (its files on disk) or, before the
//! first, the layout's (every writing rank's shards of the trainable buffers with their two
//! AdamW moments, in f32). Older checkpoints are pruned only after a commit, so the room
//! needed is one whole checkpoint.
use crate::run_dir::RunDir;
use std::path::Path;

/// Warns (rank 0) when `--out` has less room than a checkpoint of this run takes; `step` is
/// the checkpoint's, `layout_bytes` the layout's estimate. Returns the size it checked against.
pub(crate) fn warn_if_no_room(run: &RunDir, step: u64, layout_bytes: u64) -> u64 {
    let needed = previous_checkpoint_bytes(run).unwrap_or(layout_bytes);
    let Ok(free) = tessera_shards::free_bytes(run.path()) else {
        return needed;
    };
    if free < needed {
        tracing::warn!(
            "the checkpoint of step {step} needs about {} and {}'s filesystem has {} free: it \
             will not fit; free some space (or lower --keep-checkpoints) before then",
            tessera_shards::shown_bytes(needed),
            run.path().display(),
            tessera_shards::shown_bytes(free)
        );
    }
    needed
}

/// The files of the newest committed checkpoint, in bytes (`None` when there is none).
fn previous_checkpoint_bytes(run: &RunDir) -> Option<u64> {
    let folders = run.checkpoint_folders().ok()?;
    let newest = folders.iter().find(|f| f.committed)?;
    Some(bytes_under(&newest.path))
}

fn bytes_under(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => bytes_under(&e.path()),
            Ok(_) => e.metadata().map_or(0, |m| m.len()),
            Err(_) => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_size_is_the_previous_checkpoints_else_the_layouts() -> anyhow::Result<()> {
        let tmp = tempfile::tempdir()?;
        let run = RunDir::new(tmp.path());
        assert_eq!(warn_if_no_room(&run, 2, 1234), 1234);
        let rank = run.checkpoint(2).join("rank-00000");
        std::fs::create_dir_all(&rank)?;
        std::fs::write(rank.join("shards.safetensors"), vec![0u8; 5000])?;
        std::fs::write(run.checkpoint(2).join("meta.json"), b"{}")?;
        // An uncommitted folder does not count.
        let tmp_rank = run.unfinished_checkpoint(4).join("rank-00000");
        std::fs::create_dir_all(&tmp_rank)?;
        std::fs::write(tmp_rank.join("shards.safetensors"), vec![0u8; 9000])?;
        assert_eq!(warn_if_no_room(&run, 4, 1234), 5002);
        Ok(())
    }
}
