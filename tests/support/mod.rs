//! What the CLI tests share: a train-capable `tessera` binary, runners that show its output on
//! failure, and a fixture of synth shards plus a tiny random model.
#![allow(dead_code)]
use anyhow::{ensure, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A private hard link to a `tessera` built with `train`, taken once. Builds with
/// `--no-default-features` elsewhere in the shared target dir re-link `target/release/tessera`
/// to a binary without `train`; then the newest train-capable `deps/tessera-*` is used.
pub(crate) fn binary() -> &'static Path {
    static LINK: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    LINK.get_or_init(|| {
        let has_train = |p: &Path| {
            Command::new(p)
                .arg("--help")
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).contains("\n  train "))
                .unwrap_or(false)
        };
        let main = PathBuf::from(env!("CARGO_BIN_EXE_tessera"));
        let mut candidates = vec![main.clone()];
        if let Some(deps) = main.parent().map(|d| d.join("deps")) {
            let mut found: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(&deps)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .filter(|p| {
                    let name = p
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default();
                    name.starts_with("tessera-") && !name.contains('.')
                })
                .filter_map(|p| Some((p.metadata().ok()?.modified().ok()?, p)))
                .collect();
            found.sort();
            candidates.extend(found.into_iter().rev().map(|(_, p)| p));
        }
        let source = candidates
            .into_iter()
            .find(|p| has_train(p))
            .expect("a tessera binary with `train`");
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
        std::fs::create_dir_all(dir).expect("target tmp dir");
        let link = dir.join(format!("tessera-train-test-{}", std::process::id()));
        let _ = std::fs::remove_file(&link);
        if std::fs::hard_link(&source, &link).is_err() {
            std::fs::copy(&source, &link).expect("copy of the tessera binary");
        }
        link
    })
}

pub(crate) fn tessera() -> Command {
    let mut cmd = Command::new(binary());
    cmd.env("NO_PROGRESS", "1")
        .env("TESSERA_LOADER_THREADS", "1");
    cmd
}

pub(crate) fn run_ok(cmd: &mut Command) -> Result<Output> {
    let out = cmd.output().context("spawning tessera")?;
    ensure!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(out)
}

pub(crate) fn run_err(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().context("spawning tessera")?;
    ensure!(!out.status.success(), "{cmd:?} should have failed");
    Ok(String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Shards of synthetic LLaVA records and a tiny random model, in a temporary directory.
pub(crate) struct Fixture {
    _tmp: tempfile::TempDir,
    pub root: PathBuf,
    pub shards: PathBuf,
    pub vision: PathBuf,
    pub lm: PathBuf,
}

/// `samples` synth records (`text_only` of them text-only), ingested, and `init-model tiny`.
pub(crate) fn fixture(samples: usize, text_only: f64) -> Result<Fixture> {
    let tmp = tempfile::tempdir()?;
    let root = tmp.path().to_path_buf();
    let tokenizer = Path::new(env!("CARGO_MANIFEST_DIR")).join(".deps/tokenizer/tokenizer.json");
    let llava = root.join("llava");
    run_ok(
        tessera()
            .args(["synth", "--quiet", "--samples", &samples.to_string()])
            .args([
                "--text-only-fraction",
                &text_only.to_string(),
                "--seed",
                "3",
                "--out",
            ])
            .arg(&llava),
    )?;
    let shards = root.join("shards");
    run_ok(
        tessera()
            .args(["ingest", "--quiet", "--json"])
            .arg(llava.join("blip_laion_cc_sbu_558k.json"))
            .arg("--images")
            .arg(llava.join("images"))
            .arg("--tokenizer")
            .arg(&tokenizer)
            .arg("--out")
            .arg(&shards),
    )?;
    let model = root.join("model");
    run_ok(
        tessera()
            .args(["init-model", "--quiet", "--preset", "tiny", "--out"])
            .arg(&model),
    )?;
    Ok(Fixture {
        shards,
        vision: model.join("vision"),
        lm: model.join("lm"),
        root,
        _tmp: tmp,
    })
}
