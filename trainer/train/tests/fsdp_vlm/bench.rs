//! Measurement, not a check (ignored by default): the `tiny` preset, stage 2 (projector + LoRA),
//! FULL_SHARD at W=2 (two gloo ranks as two threads) against W=1 in the same run, on the same
//! global batches; bytes each rank sends per step against FSDP's theory (two all-gathers and one
//! reduce-scatter of every unit's sharded bytes, (W-1) shards each). Prints one JSON line.
//! Run: cargo test --release --workspace --test fsdp_vlm -- --ignored --exact \
//!   bench::fsdp_step_time_and_bytes_tiny_preset --nocapture

use crate::support::{fsdp_step, image_sample, micro_batch, on_thread_ranks, text_sample};
use std::time::{Duration, Instant};
use tessera_fsdp::dist::{local_groups, ProcessGroup};
use tessera_fsdp::ParamMap;
use tessera_fsdp::{Fsdp, FsdpConfig, Strategy};
use tessera_model::testing::random_params;
use tessera_model::{LmFamily, Preset};
use tessera_model::{LoraConfig, Vlm, VlmOptions};

const STEPS: usize = 6;

fn batch(step: usize, i: usize) -> tessera_pipeline::MicroBatch {
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

/// Seconds per step (after one warm-up step) and bytes sent per step by this rank.
fn run(vlm: &Vlm, init: &ParamMap, pg: &ProcessGroup) -> anyhow::Result<(f64, u64, u64)> {
    let mut fsdp = Fsdp::new(
        vlm.units(),
        pg,
        init,
        FsdpConfig {
            strategy: Strategy::FullShard,
            ..FsdpConfig::default()
        },
    )?;
    let sharded: u64 = fsdp.memory().param_bytes;
    let mut bytes = 0;
    let mut start = Instant::now();
    for step in 0..=STEPS {
        if step == 1 {
            start = Instant::now();
        }
        let batches = [batch(step, 0), batch(step, 1)];
        bytes = fsdp_step(&mut fsdp, vlm, pg, &batches)?.bytes_sent;
    }
    Ok((start.elapsed().as_secs_f64() / STEPS as f64, bytes, sharded))
}

#[test]
#[ignore = "measurement; run with --ignored --nocapture"]
fn fsdp_step_time_and_bytes_tiny_preset() -> anyhow::Result<()> {
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
    let (t1, _, _) = run(&vlm, &init, &single)?;
    let groups = local_groups(2, Duration::from_secs(120))?;
    let vlm = &vlm;
    let results = on_thread_ranks(&groups, &init, |init, pg| run(vlm, init, pg))?;
    let (t2, bytes, shard_bytes) = results[0];
    // theory per micro-step: 2 all-gathers + 1 reduce-scatter, each sending (W-1) shards
    let theory = 3 * shard_bytes;
    println!(
        "{{\"preset\":\"tiny\",\"stage\":2,\"strategy\":\"full_shard\",\"step_s_w1\":{t1:.4},\"step_s_w2\":{t2:.4},\
         \"w2_over_w1\":{:.3},\"bytes_sent_per_step_w2\":{bytes},\"theory_bytes_per_step\":{theory},\
         \"bytes_over_theory\":{:.3}}}",
        t2 / t1,
        bytes as f64 / theory as f64
    );
    Ok(())
}
