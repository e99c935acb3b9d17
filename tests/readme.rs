//! README.md's "Train on the real thing" block, run as written on the tiny preset, so that the
//! commands a newcomer copies cannot rot. (The same job on the real SmolLM2-135M-Instruct, a
//! tokenizer that gets `<image>` added, is tests/families.rs's
//! `the_whole_job_on_smollm2_135m_with_image_added_to_its_tokenizer`: stage 1, a whole-LM
//! stage 2, the llava-hf export and generation, compared with transformers.)
//!
//! The block sits between `<!-- real-data:begin -->` and `<!-- real-data:end -->` in one
//! ```` ```bash ```` fence: first the user's paths as shell variables, then `$T` commands. The
//! test builds stand-ins for what a user downloads (`tessera synth --zip`: LLaVA-Pretrain's
//! json + images.zip; `tessera init-model --preset tiny`: the two Hugging Face folders, the LM's
//! with its own tokenizer.json), gives the README's variables those paths, makes the batch small
//! (`REWRITES`: each must still match the README), and runs every command with `bash -euo pipefail`. Then it checks what a user looks for: the
//! shards, both runs' checkpoints and summaries, a stage 2 that trained the whole LM with
//! finite losses, a llava-hf export with its weights and the shards' tokenizer, and a caption.
#![cfg(feature = "train")]
use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support;
use support::checkpoints::{newest_checkpoint, trained_parameters};
use support::{binary, read_json, run_ok, tessera, tokenizer};

const BEGIN: &str = "<!-- real-data:begin -->";
const END: &str = "<!-- real-data:end -->";

/// Text of the README's commands that the test changes, and what it puts instead. Each must
/// occur in the block, so a README edit that drops one fails here rather than running a
/// real-sized batch.
const REWRITES: &[(&str, &str)] = &[("--token-budget 8192", "--token-budget 512 --seq-len 512")];

/// The records `synth` writes for the stand-in LLaVA-Pretrain.
const SAMPLES: u64 = 40;

/// The fenced bash between the markers.
fn real_data_block(readme: &str) -> Result<&str> {
    let start = readme
        .find(BEGIN)
        .with_context(|| format!("README.md has no {BEGIN} marker"))?;
    let rest = &readme[start + BEGIN.len()..];
    let end = rest
        .find(END)
        .with_context(|| format!("README.md has no {END} after {BEGIN}"))?;
    let inner = rest[..end].trim();
    let body = inner
        .strip_prefix("```bash\n")
        .and_then(|b| b.strip_suffix("```"))
        .with_context(|| {
            format!("between the markers README.md must hold one ```bash fence, not:\n{inner}")
        })?;
    Ok(body)
}

/// One shell statement of the block: lines joined where they end in `\`, comments and blank
/// lines left out.
fn statements(block: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in block.lines() {
        let trimmed = line.trim();
        if current.is_empty() && (trimmed.is_empty() || trimmed.starts_with('#')) {
            continue;
        }
        current.push_str(line);
        if let Some(open) = current.strip_suffix('\\') {
            current = format!("{open}\\\n");
            continue;
        }
        out.push(std::mem::take(&mut current));
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// `NAME` when `statement` is an assignment `NAME=...`.
fn assigned_name(statement: &str) -> Option<&str> {
    let (name, _) = statement.split_once('=')?;
    let valid = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit());
    valid.then_some(name)
}

/// The first file under `dir`, in name order, descending into folders.
fn first_file(dir: &Path) -> Result<PathBuf> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    entries.sort();
    for path in entries {
        if path.is_file() {
            return Ok(path);
        }
        if let Ok(found) = first_file(&path) {
            return Ok(found);
        }
    }
    bail!("no file under {}", dir.display())
}

/// A run's summary.json, checked against its metrics.jsonl: every step's loss finite, as many
/// steps as the summary says. Returns (summary, metrics lines).
fn finished_run(run: &Path) -> Result<(Value, Vec<Value>)> {
    let summary = read_json(&run.join("summary.json"))?;
    let text = std::fs::read_to_string(run.join("metrics.jsonl"))
        .with_context(|| format!("{} has no metrics.jsonl", run.display()))?;
    let metrics: Vec<Value> = text
        .lines()
        .map(serde_json::from_str)
        .collect::<serde_json::Result<_>>()
        .with_context(|| format!("parsing {}/metrics.jsonl", run.display()))?;
    ensure!(!metrics.is_empty(), "{}: no step logged", run.display());
    for m in &metrics {
        let loss = m["loss"].as_f64().unwrap_or(f64::NAN);
        ensure!(
            loss.is_finite(),
            "{}: a step's loss is not finite: {m}",
            run.display()
        );
    }
    ensure!(
        summary["steps"].as_u64() == Some(metrics.len() as u64),
        "{}: summary.json says {} steps, metrics.jsonl holds {}",
        run.display(),
        summary["steps"],
        metrics.len()
    );
    for key in ["first_loss", "last_loss"] {
        let v = summary[key].as_f64().unwrap_or(f64::NAN);
        ensure!(v.is_finite(), "{}: summary {key} is {v}", run.display());
    }
    Ok((summary, metrics))
}

/// Tensor names in a safetensors file's header.
fn safetensors_names(path: &Path) -> Result<Vec<String>> {
    let mut file =
        std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut len = [0u8; 8];
    file.read_exact(&mut len)?;
    let mut header = vec![0u8; usize::try_from(u64::from_le_bytes(len))?];
    file.read_exact(&mut header)?;
    let header: BTreeMap<String, Value> = serde_json::from_slice(&header)
        .with_context(|| format!("{}: header is not JSON", path.display()))?;
    Ok(header.into_keys().filter(|k| k != "__metadata__").collect())
}

/// The block with init-model's tiny Qwen2 (and the Qwen tokenizer) as `$LM`, on `SAMPLES`
/// records.
#[test]
fn the_readme_real_data_block_runs_on_the_tiny_preset() -> Result<()> {
    let readme_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
    let readme = std::fs::read_to_string(&readme_path)?;
    let block = real_data_block(&readme)?;

    // Stand-ins for the downloads: LLaVA-Pretrain, and the two snapshot folders.
    let tmp = tempfile::tempdir()?;
    let root = tmp.path();
    let data = root.join("LLaVA-Pretrain");
    run_ok(
        tessera()
            .args(["synth", "--quiet", "--samples", &SAMPLES.to_string()])
            .args(["--text-only-fraction", "0.2", "--zip", "--out"])
            .arg(&data),
    )?;
    for file in ["blip_laion_cc_sbu_558k.json", "images.zip"] {
        ensure!(data.join(file).is_file(), "synth --zip wrote no {file}");
    }
    let hf = root.join("hf");
    run_ok(
        tessera()
            .args(["init-model", "--quiet", "--preset", "tiny", "--out"])
            .arg(&hf),
    )?;
    std::fs::copy(tokenizer(), hf.join("lm/tokenizer.json"))?;
    let lm = hf.join("lm");
    let runs = root.join("runs");
    let image = first_file(&data.join("images"))?;

    let path = |p: &Path| p.to_string_lossy().into_owned();
    let values: BTreeMap<&str, String> = BTreeMap::from([
        ("T", path(binary())),
        ("DATA", path(&data)),
        ("SIGLIP", path(&hf.join("vision"))),
        ("LM", path(&lm)),
        ("IMAGE", path(&image)),
        ("RUNS", path(&runs)),
        ("DEVICE", "cpu".to_string()),
        ("GPUS", "2".to_string()),
    ]);

    // The block: its assignments (given the values above) are the prelude of every command.
    let mut prelude = String::new();
    let mut commands = Vec::new();
    for statement in statements(block) {
        match assigned_name(&statement) {
            Some(name) => {
                let value = values.get(name).with_context(|| {
                    format!(
                        "the README's block sets {name}, which tests/readme.rs gives no value; \
                         add it to `values`"
                    )
                })?;
                ensure!(
                    !value.contains('\''),
                    "{name}={value}: a quote in a test path"
                );
                prelude.push_str(&format!("{name}='{value}'\n"));
            }
            None => commands.push(statement),
        }
    }
    ensure!(!commands.is_empty(), "the README's block holds no command");
    for (from, to) in REWRITES {
        ensure!(
            commands.iter().any(|c| c.contains(from)),
            "no command of the README's block contains `{from}` any more: update REWRITES"
        );
        for c in &mut commands {
            *c = c.replace(from, to);
        }
    }
    for c in &commands {
        ensure!(
            c.starts_with("$T "),
            "README command `{c}` does not run `$T` (the built tessera)"
        );
        ensure!(
            !c.contains('~'),
            "README command `{c}` names a path of its own; use the block's variables"
        );
    }

    let mut outputs = BTreeMap::new();
    for (i, c) in commands.iter().enumerate() {
        let subcommand = c.split_whitespace().nth(1).unwrap_or_default().to_string();
        let out = Command::new("bash")
            .args(["-euo", "pipefail", "-c"])
            .arg(format!("{prelude}{c}"))
            .current_dir(root)
            .env("NO_PROGRESS", "1")
            .env("TESSERA_LOADER_THREADS", "1")
            .env_remove("WORLD_SIZE")
            .env_remove("RANK")
            .output()
            .context("running bash")?;
        ensure!(
            out.status.success(),
            "README command {} of {} failed ({}):\n{c}\n--- stdout\n{}\n--- stderr\n{}",
            i + 1,
            commands.len(),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        outputs.insert(
            subcommand,
            String::from_utf8_lossy(&out.stdout).into_owned(),
        );
    }
    for step in ["ingest", "train", "export", "generate"] {
        ensure!(
            outputs.contains_key(step),
            "the README's block no longer runs `tessera {step}`"
        );
    }

    // ingest: every record became a sample of a complete shard folder.
    let shards = runs.join("shards");
    let index = read_json(&shards.join("index.json"))?;
    ensure!(
        index["num_samples"].as_u64() == Some(SAMPLES),
        "index.json counts {} samples of {SAMPLES} records",
        index["num_samples"]
    );
    for shard in index["shards"]
        .as_array()
        .context("index.json lists no shards")?
    {
        let file = shard["file"].as_str().context("a shard without a file")?;
        ensure!(
            shards.join(file).is_file(),
            "index.json names {file}, which is missing"
        );
    }

    // Stage 1 trained the projector alone, and the embedding row of an `<image>` ingest added
    // when the tokenizer had no image token (the Qwen tokenizer has one).
    let stage1 = runs.join("stage1");
    finished_run(&stage1)?;
    let trained = trained_parameters(&newest_checkpoint(&stage1)?)?;
    let added = !index["special_tokens"]["added"]
        .as_array()
        .is_none_or(Vec::is_empty);
    let mut want = vec!["mm_projector.0.weight".to_string()];
    if added {
        want.push("added_tokens.embed_tokens".into());
    }
    ensure!(
        want.iter().all(|w| trained.contains(w))
            && trained
                .iter()
                .all(|p| p.starts_with("mm_projector.") || p.starts_with("added_tokens.")),
        "stage 1 trained more (or less) than the projector and {want:?}: {trained:?}"
    );

    // Stage 2 trained the projector and the whole LM, at a rate above 0, with finite losses.
    let stage2 = runs.join("stage2");
    let (_, metrics) = finished_run(&stage2)?;
    ensure!(
        metrics
            .iter()
            .any(|m| m["lr"].as_f64().is_some_and(|lr| lr > 0.0)),
        "stage 2 never stepped at a learning rate above 0: {metrics:?}"
    );
    let checkpoint = newest_checkpoint(&stage2)?;
    let trained = trained_parameters(&checkpoint)?;
    for want in [
        "mm_projector.0.weight",
        "model.embed_tokens.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.norm.weight",
    ] {
        ensure!(
            trained.iter().any(|p| p == want),
            "stage 2's checkpoint did not train {want}: {trained:?}"
        );
    }
    let meta = read_json(&checkpoint.join("meta.json"))?;
    ensure!(
        meta["config"]["init_projector"].as_str().is_some(),
        "stage 2 did not start from stage 1's projector: {}",
        meta["config"]
    );

    // export: a llava-hf folder with the whole model's weights and the shards' tokenizer (the
    // LM's, with the `<image>` ingest added when it had no image token).
    let llava = runs.join("llava");
    let config = read_json(&llava.join("config.json"))?;
    ensure!(
        config["model_type"] == "llava",
        "the export's config.json is not a llava config: {config}"
    );
    let names = safetensors_names(&llava.join("model.safetensors"))?;
    for prefix in ["vision_tower.", "multi_modal_projector.", "language_model."] {
        ensure!(
            names.iter().any(|n| n.starts_with(prefix)),
            "the export's model.safetensors holds no {prefix}* tensor"
        );
    }
    ensure!(
        std::fs::read(llava.join("tokenizer.json"))?
            == std::fs::read(shards.join("tokenizer.json"))?,
        "the export's tokenizer.json is not the shards' tokenizer"
    );

    // generate: a caption for the user's image.
    let caption = outputs["generate"].trim();
    ensure!(
        !caption.is_empty(),
        "generate printed no caption for {}",
        image.display()
    );
    Ok(())
}
