//! The demo's pretrained parts (`demo-models/`, made by `scripts/make_demo_models.sh`): they
//! were trained on other scenes than the ones the demo scores, the committed files are the
//! ones the manifest names, the pretraining scripts still make what the manifest says they
//! make (rerun at a reduced budget, same sha256), and tessera loads what they write.
#![cfg(feature = "train")]
use anyhow::{bail, ensure, Context, Result};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use tessera_model::{Vlm, VlmOptions};

mod support;
use support::{run_ok, tessera};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn manifest() -> Result<serde_json::Value> {
    let path = root().join("demo-models/MANIFEST.json");
    let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    Ok(serde_json::from_str(&text)?)
}

fn sha256_hex(path: &Path) -> Result<String> {
    Ok(shards::sha256_file(path)?.0)
}

/// `NAME=value` of scripts/demo.sh, as a number.
fn demo_seed(name: &str) -> Result<u64> {
    let script = std::fs::read_to_string(root().join("scripts/demo.sh"))?;
    let prefix = format!("{name}=");
    let line = script
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .with_context(|| format!("scripts/demo.sh sets no {name}"))?;
    Ok(line.trim().parse()?)
}

/// sha256 of every image `tessera synth` draws for `samples` records of `seed` (the demo's
/// text-only share, so the validation set is the demo's own).
fn scene_hashes(dir: &Path, seed: u64, samples: usize) -> Result<BTreeSet<String>> {
    let out = dir.join(format!("seed-{seed}"));
    run_ok(
        tessera()
            .args(["synth", "--quiet", "--samples", &samples.to_string()])
            .args([
                "--text-only-fraction",
                "0.2",
                "--seed",
                &seed.to_string(),
                "--out",
            ])
            .arg(&out),
    )?;
    let mut hashes = BTreeSet::new();
    for folder in std::fs::read_dir(out.join("images"))? {
        for file in std::fs::read_dir(folder?.path())? {
            hashes.insert(sha256_hex(&file?.path())?);
        }
    }
    ensure!(!hashes.is_empty(), "seed {seed} drew no image");
    Ok(hashes)
}

#[test]
fn the_parts_were_pretrained_on_other_scenes_than_the_demo_scores() -> Result<()> {
    let (train_seed, val_seed) = (demo_seed("TRAIN_SEED")?, demo_seed("VAL_SEED")?);
    let m = manifest()?;
    let tmp = tempfile::tempdir()?;
    let validation = scene_hashes(tmp.path(), val_seed, 200)?;
    for part in ["vision", "lm"] {
        let seeds: Vec<u64> = m["parts"][part]["seeds"]
            .as_array()
            .context("seeds")?
            .iter()
            .filter_map(serde_json::Value::as_u64)
            .collect();
        ensure!(!seeds.is_empty(), "{part}: no seeds in the manifest");
        for seed in seeds {
            ensure!(
                seed != val_seed && seed != train_seed,
                "{part} was pretrained on seed {seed}, one of the demo's ({train_seed}, {val_seed})"
            );
            // The seeds differ, and so do the scenes they draw (the first 200 of each).
            let drawn = scene_hashes(tmp.path(), seed, 200)?;
            ensure!(
                drawn.is_disjoint(&validation),
                "seed {seed} draws an image of the demo's validation seed {val_seed}"
            );
        }
    }
    Ok(())
}

/// Runs `script` (in .deps/hfvenv) with `args`, writing to `out`; returns its result line.
fn pretrain(script: &str, args: &[String], out: &Path) -> Result<serde_json::Value> {
    let python = root().join(".deps/hfvenv/bin/python");
    let output = Command::new(&python)
        .current_dir(root())
        .arg(root().join("scripts").join(script))
        .arg("--out")
        .arg(out)
        .args(["--tessera", &support::binary().display().to_string()])
        .args(args)
        .output()
        .with_context(|| {
            format!(
                "running {} (scripts/setup.sh installs it)",
                python.display()
            )
        })?;
    ensure!(
        output.status.success(),
        "{script} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .with_context(|| format!("{script} printed no result line: {stdout}"))?;
    Ok(serde_json::from_str(line)?)
}

/// The LM's full checkpoint from a compact folder (scripts/expand_lm.py, .deps/venv).
fn expand_lm(compact: &Path, out: &Path) -> Result<()> {
    let status = Command::new(root().join(".deps/venv/bin/python"))
        .arg(root().join("scripts/expand_lm.py"))
        .arg(compact)
        .arg(out)
        .status()?;
    ensure!(
        status.success(),
        "expand_lm.py {} failed",
        compact.display()
    );
    Ok(())
}

/// Loads vision + LM in tessera and checks the image placeholder and vocabulary it needs.
fn loads_in_tessera(vision: &Path, lm: &Path) -> Result<()> {
    let vlm = Vlm::from_dirs(vision, lm, VlmOptions::default())?;
    let params = vlm.load_params(vision, lm, None, 0)?;
    ensure!(
        params.len() == vlm.param_specs().len(),
        "{} of {} parameters loaded",
        params.len(),
        vlm.param_specs().len()
    );
    Ok(())
}

#[test]
fn pretraining_scripts_remake_their_recorded_checksums_and_tessera_loads_the_parts() -> Result<()> {
    let m = manifest()?;
    let tmp = tempfile::tempdir()?;
    // The committed files are the ones made.
    for part in ["vision", "lm"] {
        let p = &m["parts"][part];
        let folder = root()
            .join("demo-models")
            .join(p["folder"].as_str().context("folder")?);
        for (file, want) in p["sha256"].as_object().context("sha256")? {
            let got = sha256_hex(&folder.join(file))?;
            ensure!(Some(got.as_str()) == want.as_str(), "{part}/{file} changed");
        }
    }
    let parts = root().join("demo-models");
    let demo_lm = tmp.path().join("demo-lm");
    expand_lm(&parts.join("lm"), &demo_lm)?;
    loads_in_tessera(&parts.join("vision"), &demo_lm)?;

    // Reduced budgets, reproducible kernels: the same bytes as when the manifest was made.
    let mut made: Vec<PathBuf> = Vec::new();
    for (part, script) in [("vision", "pretrain_tower.py"), ("lm", "pretrain_lm.py")] {
        let reduced = &m["parts"][part]["reduced"];
        let args: Vec<String> = reduced["args"]
            .as_array()
            .context("reduced args")?
            .iter()
            .filter_map(|a| a.as_str().map(String::from))
            .collect();
        let out = tmp.path().join(part);
        let result = pretrain(script, &args, &out)?;
        if result["sha256"] != reduced["sha256"] {
            bail!(
                "{script} {} made sha256 {}, the manifest records {}",
                args.join(" "),
                result["sha256"],
                reduced["sha256"]
            );
        }
        made.push(out);
    }
    let lm = tmp.path().join("lm-full");
    expand_lm(&made[1], &lm)?;
    loads_in_tessera(&made[0], &lm)
}
