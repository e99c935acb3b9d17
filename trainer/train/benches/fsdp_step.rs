//! FSDP's step time and bytes: the `tiny` preset, stage 2 (projector + LoRA), FULL_SHARD at W=2
//! (two gloo ranks as two threads) against W=1 measured in the same run, on the same global
//! batches; the bytes each rank sends per step against FSDP's theory (two all-gathers and one
//! reduce-scatter of every unit's sharded bytes, (W-1) shards each). Ends with one JSON line.
//! Run: `cargo bench -p tessera-train --bench fsdp_step`.
#[path = "../../model/tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};
use support::{fsdp_step, image_sample, micro_batch, on_thread_ranks, text_sample};
use tessera_fsdp::dist::{local_groups, ProcessGroup};
use tessera_fsdp::ParamMap;
use tessera_fsdp::{Fsdp, FsdpConfig, Strategy};
use tessera_model::testing::random_params;
use tessera_model::{LmFamily, Preset};
use tessera_model::{LoraConfig, Vlm, VlmOptions};

/// Timed steps, after one warm-up step.
const STEPS: usize = 6;

fn batch(step: usize, i: usize) -> tessera_batch::MicroBatch {
    let seed = (step * 5 + i) as i64;
    let rows: Vec<_> = (0..4)
        .map(|k| {
            vec![
                image_sample(64, 24, seed + k, 64),
                text_sample(32, seed + k),
            ]
        })
        .collect();
    micro_batch(&rows, 64, 64)
}

/// What one rank measured.
struct Measured {
    step_s: f64,
    /// Real (not padding) tokens of the global batch per second.
    tokens_per_s: f64,
    bytes_sent_per_step: u64,
    sharded_param_bytes: u64,
}

fn run(vlm: &Vlm, init: &ParamMap, pg: &ProcessGroup) -> anyhow::Result<Measured> {
    let mut fsdp = Fsdp::new(
        vlm.units(),
        pg,
        init,
        FsdpConfig {
            strategy: Strategy::FullShard,
            ..FsdpConfig::default()
        },
    )?;
    let sharded_param_bytes = fsdp.memory().param_bytes;
    let (mut bytes, mut tokens) = (0, 0);
    let mut start = Instant::now();
    for step in 0..=STEPS {
        if step == 1 {
            start = Instant::now();
        }
        let batches = [batch(step, 0), batch(step, 1)];
        if step > 0 {
            tokens += batches.iter().map(|b| b.real_tokens).sum::<usize>();
        }
        bytes = fsdp_step(&mut fsdp, vlm, pg, &batches)?.bytes_sent;
    }
    let elapsed = start.elapsed().as_secs_f64();
    Ok(Measured {
        step_s: elapsed / STEPS as f64,
        tokens_per_s: tokens as f64 / elapsed,
        bytes_sent_per_step: bytes,
        sharded_param_bytes,
    })
}

fn main() -> anyhow::Result<()> {
    let (vision, lm) = Preset::Tiny.configs(LmFamily::Qwen2);
    let lora = LoraConfig {
        r: 8,
        lora_alpha: 16.0,
        ..LoraConfig::default()
    };
    let options = VlmOptions {
        image_token_id: Some(299),
        lora: Some(lora),
        ..VlmOptions::default()
    };
    let vlm = Vlm::new(vision, lm, true, options)?;
    let init = random_params(&vlm.param_specs(), 3, 0.02);
    let single = ProcessGroup::single(Duration::from_secs(120))?;
    let w1 = run(&vlm, &init, &single)?;
    let groups = local_groups(2, Duration::from_secs(120))?;
    let vlm = &vlm;
    let mut ranks = on_thread_ranks(&groups, &init, |init, pg| run(vlm, init, pg))?;
    let w2 = ranks.swap_remove(0);
    // Theory per micro-step: 2 all-gathers + 1 reduce-scatter, each sending (W-1) shards.
    let theory = 3 * w2.sharded_param_bytes;
    eprintln!(
        "tiny preset, stage 2, FULL_SHARD: W=1 {:.3} s/step ({:.0} tokens/s), W=2 {:.3} s/step \
         ({:.0} tokens/s), W=2 / W=1 {:.2}; {} bytes sent per step, {:.3} of theory",
        w1.step_s,
        w1.tokens_per_s,
        w2.step_s,
        w2.tokens_per_s,
        w2.step_s / w1.step_s,
        w2.bytes_sent_per_step,
        w2.bytes_sent_per_step as f64 / theory as f64
    );
    println!(
        "{}",
        serde_json::json!({
            "bench": "fsdp_step", "preset": "tiny", "stage": 2, "strategy": "full_shard",
            "step_s_w1": w1.step_s, "step_s_w2": w2.step_s,
            "tokens_per_s_w1": w1.tokens_per_s, "tokens_per_s_w2": w2.tokens_per_s,
            "w2_over_w1": w2.step_s / w1.step_s,
            "bytes_sent_per_step_w2": w2.bytes_sent_per_step,
            "theory_bytes_per_step": theory,
            "bytes_over_theory": w2.bytes_sent_per_step as f64 / theory as f64,
        })
    );
    Ok(())
}
