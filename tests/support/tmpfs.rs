//! A small tmpfs for full-disk tests: mounted by the test (only root with CAP_SYS_ADMIN may),
//! resized while it holds files (`remount,size=`: "space freed"), unmounted on drop, also when
//! the test fails. Where this process may not mount, [`Tmpfs::mount`] fails saying so; a
//! machine that cannot give the tests that capability builds them with
//! `TESSERA_TESTS_SKIP=mount` (see build.rs), which marks them ignored instead.
#![allow(dead_code)]
use anyhow::{bail, ensure, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

pub(crate) struct Tmpfs {
    _dir: tempfile::TempDir,
    pub path: PathBuf,
}

/// Why a full-disk test cannot run here and how a machine that cannot allow it opts out.
const OPT_OUT: &str = "the full-disk tests mount a tmpfs, which needs root with CAP_SYS_ADMIN; \
    a machine that cannot grant it builds the tests with TESSERA_TESTS_SKIP=mount, which \
    reports them as ignored";

/// Whether this process runs as root (the `Uid:` line of /proc/self/status).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

impl Tmpfs {
    /// A tmpfs of `bytes` (rounded up to pages) on a fresh folder; an error naming the missing
    /// privilege and the opt-out where mounting is not allowed.
    pub(crate) fn mount(bytes: u64) -> Result<Tmpfs> {
        if !is_root() {
            bail!("this test runs as a user other than root: {OPT_OUT}");
        }
        let dir = tempfile::tempdir()?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .context("running mount")?;
        if !out.status.success() {
            bail!(
                "mount -t tmpfs on {} was refused ({}): no CAP_SYS_ADMIN here (a container?); \
                 {OPT_OUT}",
                dir.path().display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(Tmpfs {
            path: dir.path().to_path_buf(),
            _dir: dir,
        })
    }

    /// Grows (or shrinks) the filesystem to `bytes`, keeping its files.
    pub(crate) fn resize(&self, bytes: u64) -> Result<()> {
        let out = Command::new("mount")
            .args(["-o", &format!("remount,size={bytes}")])
            .arg(&self.path)
            .output()?;
        ensure!(
            out.status.success(),
            "remounting {} at {bytes} bytes: {}",
            self.path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }

    /// Fills the filesystem to the last page with a file `filler` (removing it frees the space
    /// again).
    pub(crate) fn fill(&self) -> Result<PathBuf> {
        use std::io::Write;
        let path = self.path.join("filler");
        let mut file = std::fs::File::create(&path)?;
        let block = vec![0u8; 1 << 16];
        loop {
            match file.write(&block) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(28) => break,
                Err(e) => return Err(e.into()),
            }
        }
        // Page by page: the last partial page too.
        loop {
            match file.write(&block[..512]) {
                Ok(n) if n > 0 => {}
                _ => break,
            }
        }
        Ok(path)
    }
}

/// Bytes `path` takes on a tmpfs: every file rounded up to whole 4 KiB pages, recursively.
pub(crate) fn pages_bytes(path: &Path) -> Result<u64> {
    let meta = std::fs::symlink_metadata(path)?;
    if meta.is_file() {
        return Ok(meta.len().div_ceil(4096) * 4096);
    }
    let mut total = 0;
    if meta.is_dir() {
        for entry in std::fs::read_dir(path)? {
            total += pages_bytes(&entry?.path())?;
        }
    }
    Ok(total)
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let unmounted = Command::new("umount")
            .arg(&self.path)
            .status()
            .is_ok_and(|s| s.success());
        if !unmounted {
            // Busy (a process of a failed test still holds a file): detach it anyway.
            let _ = Command::new("umount").arg("-l").arg(&self.path).status();
        }
    }
}
