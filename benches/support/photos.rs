//! The real photographs the benches read.
use std::path::{Path, PathBuf};

/// Every `.jpg` under `dir`, recursively (unreadable folders are skipped).
pub(crate) fn jpegs_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            jpegs_under(&path, out);
        } else if path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("jpg"))
        {
            out.push(path);
        }
    }
}
