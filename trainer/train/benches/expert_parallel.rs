//! Expert parallelism at W=2 on two threads of this machine: a sparse LM whose experts are most
//! of its weights, trained whole (stage 2), with EP=2 against EP=1 (FSDP alone, every rank holds
//! every expert or its shard) measured in the same run, under NO_SHARD and FULL_SHARD. Reports
//! per strategy the step time, the training state a rank holds (parameters, gradients, AdamW
//! moments), the bytes it sends per step, and the all-to-all's share of the EP=2 step; ends
//! with one JSON line holding both strategies.
//! Run: `cargo bench -p tessera-train --bench expert_parallel`.
#[path = "../../model/tests/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{
    expert_groups, image_sample, micro_batch, replica_ranks, step_contexts, text_sample,
    tiny_vision, IMAGE_ID,
};
use tessera_fsdp::dist::{local_groups, ProcessGroup};
use tessera_fsdp::ParamMap;
use tessera_fsdp::{AdamWConfig, Fsdp, FsdpConfig, Recompute, Strategy};
use tessera_model::testing::random_params;
use tessera_model::{ExpertGroup, Vlm, VlmCtx, VlmOptions};

/// Timed steps, after one warm-up step.
const TIMED: usize = 4;

/// A sparse LM where the experts are most of the weights: 4 layers, each 16 experts of
/// 256 → 512 → 256, top-4 (the tiny vision tower in front).
fn bench_vlm(experts: Option<ExpertGroup>) -> anyhow::Result<Vlm> {
    let lm = serde_json::json!({
        "model_type": "qwen3_moe", "vocab_size": support::VOCAB, "hidden_size": 256,
        "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 64, "rope_theta": 10000.0,
        "num_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 512,
        "norm_topk_prob": true, "router_aux_loss_coef": 0.001,
    });
    let lm = tessera_model::LmConfig::from_json(lm, std::path::Path::new("bench_moe"))?;
    let options = VlmOptions {
        image_token_id: Some(IMAGE_ID),
        train_lm: true,
        expert_parallel: experts,
        ..Default::default()
    };
    Ok(Vlm::new(tiny_vision(), lm, false, options)?)
}

fn config(strategy: Strategy) -> FsdpConfig {
    FsdpConfig {
        compute_kind: tch::Kind::Float,
        strategy,
        adamw: AdamWConfig {
            lr: 2e-3,
            ..AdamWConfig::default()
        },
        max_grad_norm: Some(1.0),
        recompute: Recompute::None,
        ..FsdpConfig::default()
    }
}

fn batch(step: usize, i: usize) -> tessera_batch::MicroBatch {
    let seed = (step * 11 + i) as i64;
    let rows: Vec<_> = (0..4)
        .map(|k| vec![image_sample(16, 40, seed + k, 16), text_sample(8, seed + k)])
        .collect();
    micro_batch(&rows, 16, 16)
}

/// What one rank measured over the timed steps.
struct Measured {
    step_s: f64,
    state_bytes: u64,
    sent_per_step: u64,
    exchange_s: f64,
}

/// One micro-batch per rank and step; the first step is a warm-up.
fn measure(vlm: &Vlm, fsdp: &mut Fsdp<'_, VlmCtx>, pg: &ProcessGroup) -> anyhow::Result<Measured> {
    let memory = fsdp.memory();
    let state_bytes = memory.param_bytes + memory.grad_bytes;
    let (mut step_s, mut sent, mut exchange_s) = (0.0, 0, 0.0);
    for step in 0..=TIMED {
        let batches: Vec<_> = (0..pg.world_size()).map(|i| batch(step, i)).collect();
        let started = Instant::now();
        let (ctxs, tokens) = step_contexts(fsdp, vlm, &batches)?;
        let ctx = &ctxs[pg.rank()];
        fsdp.forward_backward(ctx, &ctx.first_input(), 1.0 / tokens as f64)?;
        let stats = fsdp.step(1.0)?;
        if step > 0 {
            step_s += started.elapsed().as_secs_f64();
            sent += stats.bytes_sent;
            exchange_s += ctx.router_log.times().exchange;
        }
    }
    let n = TIMED as f64;
    Ok(Measured {
        step_s: step_s / n,
        state_bytes: state_bytes + fsdp.memory().optimizer_bytes,
        sent_per_step: sent / TIMED as u64,
        exchange_s: exchange_s / n,
    })
}

/// Rank 0's EP=1 and EP=2 measurements under `strategy`, both ranks on threads.
fn ep1_and_ep2(strategy: Strategy) -> anyhow::Result<(Measured, Measured)> {
    let t = Duration::from_secs(300);
    let plain = bench_vlm(None)?;
    let init = random_params(&plain.param_specs(), 3, 0.05);
    let world = local_groups(2, t)?;
    let ep = expert_groups(2, t)?;
    let mut results = std::thread::scope(|s| {
        let handles: Vec<_> = world
            .iter()
            .zip(ep)
            .map(|(pg, (ep, replicas))| {
                let plain = &plain;
                let init: ParamMap = init
                    .iter()
                    .map(|(k, v)| (k.clone(), v.shallow_clone()))
                    .collect();
                s.spawn(move || -> anyhow::Result<(Measured, Measured)> {
                    let mut fsdp = Fsdp::new(plain.units(), pg, &init, config(strategy))?;
                    let without = measure(plain, &mut fsdp, pg)?;
                    drop(fsdp);
                    let parallel = bench_vlm(Some(ExpertGroup(Arc::new(ep))))?;
                    let mut fsdp = Fsdp::new_expert_parallel(
                        parallel.units(),
                        pg,
                        &replicas,
                        &replica_ranks(2, pg.rank()),
                        &init,
                        config(strategy),
                    )?;
                    let with = measure(&parallel, &mut fsdp, pg)?;
                    Ok((without, with))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().map_err(|_| anyhow::anyhow!("rank panicked"))?)
            .collect::<anyhow::Result<Vec<_>>>()
    })?;
    Ok(results.swap_remove(0))
}

fn main() -> anyhow::Result<()> {
    let mut report = serde_json::Map::new();
    report.insert("bench".into(), "expert_parallel_w2".into());
    for strategy in [Strategy::NoShard, Strategy::FullShard] {
        let (without, with) = ep1_and_ep2(strategy)?;
        let row = serde_json::json!({
            "ep1_step_s": without.step_s, "ep2_step_s": with.step_s,
            "step_ratio_ep2_over_ep1": with.step_s / without.step_s,
            "ep1_state_bytes": without.state_bytes, "ep2_state_bytes": with.state_bytes,
            "state_ratio_ep2_over_ep1": with.state_bytes as f64 / without.state_bytes as f64,
            "ep1_sent_per_step": without.sent_per_step,
            "ep2_sent_per_step": with.sent_per_step,
            "ep2_all_to_all_share": with.exchange_s / with.step_s,
        });
        eprintln!("{strategy:?}: {row}");
        report.insert(format!("{strategy:?}"), row);
    }
    println!("{}", serde_json::Value::Object(report));
    Ok(())
}
