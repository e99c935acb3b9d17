//! Stage 1 learns: on synth captions that describe their pictures ("a large red circle to the
//! left of a small blue square on a grey background"), training only the projector of the
//! tiny preset takes the loss below 70% of where it started, and below the loss of a uniform
//! guess over Qwen's vocabulary by a clear margin. Through the binary, as `make demo` runs it.
#![cfg(feature = "train")]
use anyhow::{Context, Result};

use crate::support;
use support::{fixture, run_ok, tessera};

/// Qwen2's vocabulary size: a uniform guess scores ln(151,936) ≈ 11.93 nats per token.
const VOCAB: f64 = 151_936.0;

#[test]
fn stage1_on_describing_captions_ends_below_70_percent_of_its_starting_loss() -> Result<()> {
    // 20% text-only like the demo's data: stage 1 leaves them out, so they cost nothing here.
    // 75 steps end at 0.63 of the first loss on an AMD EPYC (150 steps: 0.60; 50: 0.66).
    let f = fixture(700, 0.2)?;
    let run = f.root.join("stage1");
    run_ok(
        tessera()
            .args(["train", "--quiet", "--stage", "1", "--shards"])
            .arg(&f.shards)
            .arg("--vision")
            .arg(&f.vision)
            .arg("--lm")
            .arg(&f.lm)
            .args(["--steps", "75", "--lr", "3e-2", "--token-budget", "512"])
            .args(["--seq-len", "512", "--seed", "5", "--out"])
            .arg(&run),
    )?;
    let text = std::fs::read_to_string(run.join("summary.json")).context("summary.json")?;
    let summary: serde_json::Value = serde_json::from_str(&text)?;
    let field = |name: &str| {
        summary[name]
            .as_f64()
            .with_context(|| format!("{name} in {text}"))
    };
    let (first, end) = (field("first_loss")?, field("final_loss_mean")?);
    assert!(
        end < 0.7 * first,
        "stage 1 went from {first:.3} to {end:.3} (mean of the last 10% of steps): not below 70%"
    );
    let uniform = VOCAB.ln();
    assert!(
        end < uniform - 1.5,
        "stage 1 ended at {end:.3}, not clearly below a uniform guess ({uniform:.3})"
    );
    Ok(())
}
