//! The fixture of tests/layouts.rs, tests/multi_image.rs and tests/s3_shards.rs: crops of real
//! photographs (`tessera synth --photos`) written by `tests/support/layouts.py` as the_cauldron's
//! parquet, TRL's `messages` parquet and LLaVA-OneVision's json (see the script for the rows).
use super::{run_ok, scratch_once, tessera};
use anyhow::Result;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The photos every layout is made from (Debian's mate-backgrounds, installed by setup.sh).
const PHOTOS: &str = "/usr/share/backgrounds/mate";

/// The three layouts of the same samples, under a temporary folder.
pub(crate) struct Layouts {
    _tmp: tempfile::TempDir,
    pub root: PathBuf,
}

impl Layouts {
    pub(crate) fn cauldron(&self) -> PathBuf {
        self.root.join("layouts/cauldron")
    }
    pub(crate) fn messages(&self) -> PathBuf {
        self.root.join("layouts/messages/train.parquet")
    }
    pub(crate) fn onevision(&self) -> PathBuf {
        self.root.join("layouts/onevision/train.json")
    }
    pub(crate) fn onevision_images(&self) -> PathBuf {
        self.root.join("layouts/onevision/images")
    }
    /// Two 64x64 PNG crops (the tiny preset's image size).
    pub(crate) fn pair(&self) -> [PathBuf; 2] {
        ["a", "b"].map(|n| self.root.join(format!("layouts/pair/{n}.png")))
    }
}

pub(crate) fn python() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(".deps/venv/bin/python")
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/layouts.py")
}

/// 12 crops of real photos (`synth --photos`, seed 7), made once under cargo's test scratch
/// folder and shared by every test (read only): decoding the wallpapers takes seconds.
fn photos() -> Result<PathBuf> {
    static MADE: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    let made = MADE.get_or_init(|| {
        scratch_once("photo-crops-12-seed7", "images", |dir| {
            run_ok(
                tessera()
                    .args(["synth", "--quiet", "--samples", "12", "--seed", "7"])
                    .args(["--photos", PHOTOS, "--out"])
                    .arg(dir),
            )
            .map(drop)
        })
        .map_err(|e| format!("{e:#}"))
    });
    made.clone().map_err(anyhow::Error::msg)
}

/// The layouts of the shared photo crops in a fresh temporary folder; `extra` goes to
/// layouts.py.
pub(crate) fn layouts(extra: &[&str]) -> Result<Layouts> {
    let tmp = tempfile::tempdir()?;
    let root = tmp.path().to_path_buf();
    run_ok(
        Command::new(python())
            .arg(script())
            .arg(photos()?.join("images"))
            .arg(root.join("layouts"))
            .args(extra),
    )?;
    Ok(Layouts { _tmp: tmp, root })
}
