//! Expert parallelism on the real (tiny) Qwen3-MoE VLM: at W=2 with the 4 experts of its
//! sparse layer split over both ranks (EP=2: each rank holds 2 experts, tokens travel by
//! all-to-all), 20 f32 steps training the projector and the whole LM (experts and router
//! included) give the losses and weights of W=2 without expert parallelism (every rank holds
//! every expert, FSDP shards them), under FULL_SHARD and NO_SHARD; the image and text-only
//! micro-steps alternate as the planner schedules them, and each rank holds only its experts.
//! At W=4 with EP=2 (torchtitan's layout: expert groups {0,1} and {2,3}, each expert sharded
//! over the two ranks holding it, {0,2} or {1,3}) the same holds against W=4 without EP over
//! 10 steps. "The same": within `LOSS_DRIFT` and `WEIGHT_DRIFT` (see there).

use crate::support::{
    expert_groups, fsdp_step, image_sample, micro_batch, replica_ranks, text_sample, tiny_lm_of,
    tiny_vision, IMAGE_ID,
};
use std::sync::Arc;
use std::time::Duration;
use tessera_fsdp::dist::{local_groups, ProcessGroup};
use tessera_fsdp::ParamMap;
use tessera_fsdp::{AdamWConfig, Fsdp, FsdpConfig, Recompute, Strategy};
use tessera_model::testing::random_params;
use tessera_model::{ExpertGroup, LmFamily, VisionTraining, Vlm, VlmOptions};

const STEPS: usize = 20;

/// How far the two runs may part, relative: the all-to-all sums the experts' rows in another
/// order, and once such a last-bit difference tips a near-tied top-2 route the runs part a
/// little, for good. W=4 over 20 steps (AMD EPYC): the loss gap went from 1e-8 to 4e-6 at
/// step 10 and to 4.3e-5 by step 20, `lm_head` parted by 2.4e-4 of its scale, the embedding
/// (Adam magnifies its near-zero gradients) by 1.4e-3. So W=4 runs the first 10 steps, and a
/// loss may part by `LOSS_DRIFT`, a weight by `WEIGHT_DRIFT` of its scale: a wrong expert or
/// gradient parts them by far more within a few steps.
const LOSS_DRIFT: f64 = 1e-4;
const WEIGHT_DRIFT: f64 = 1e-3;

fn batch(step: usize, i: usize) -> tessera_pipeline::MicroBatch {
    let seed = (step * 7 + i) as i64;
    if step % 3 != 2 {
        let rows = vec![
            vec![image_sample(16, 4 + i, seed, 16)],
            vec![image_sample(16, 3 + step % 4, seed + 1, 16)],
        ];
        micro_batch(&rows, 16, 16)
    } else {
        micro_batch(
            &[vec![text_sample(9 + i, seed), text_sample(6, seed + 2)]],
            16,
            16,
        )
    }
}

fn vlm(experts: Option<ExpertGroup>) -> anyhow::Result<Vlm> {
    let options = VlmOptions {
        image_token_id: Some(IMAGE_ID),
        train_lm: true,
        train_vision: VisionTraining::Frozen,
        loss_chunk: Some(5),
        expert_parallel: experts,
        ..Default::default()
    };
    Ok(Vlm::new(
        tiny_vision(),
        tiny_lm_of(LmFamily::Qwen3Moe),
        false,
        options,
    )?)
}

/// The runs' FSDP settings, computing in `compute` (bf16: mixed precision, f32 masters).
fn config(strategy: Strategy, recompute: Recompute, compute: tch::Kind) -> FsdpConfig {
    FsdpConfig {
        compute_kind: compute,
        strategy,
        adamw: AdamWConfig {
            lr: 2e-3,
            ..AdamWConfig::default()
        },
        max_grad_norm: Some(1.0),
        recompute,
        ..FsdpConfig::default()
    }
}

/// Losses per step and the trained weights this rank can gather (under EP: its experts).
type Run = (Vec<f64>, ParamMap);

fn train(
    mut fsdp: Fsdp<'_, tessera_model::VlmCtx>,
    vlm: &Vlm,
    pg: &ProcessGroup,
    steps: usize,
) -> anyhow::Result<Run> {
    let mut losses = Vec::new();
    for step in 0..steps {
        // Two micro-batches per rank and step.
        let batches: Vec<_> = (0..2 * pg.world_size()).map(|i| batch(step, i)).collect();
        losses.push(fsdp_step(&mut fsdp, vlm, pg, &batches)?.loss);
    }
    Ok((losses, fsdp.gather_params(true)?))
}

/// `w` ranks on threads: without expert parallelism, then with EP=2.
fn runs(
    w: usize,
    strategy: Strategy,
    recompute: Recompute,
    compute: tch::Kind,
    steps: usize,
) -> anyhow::Result<(Vec<Run>, Vec<Run>)> {
    let t = Duration::from_secs(60);
    let plain = vlm(None)?;
    let init = random_params(&plain.param_specs(), 7, 0.1);
    let world = local_groups(w, t)?;
    let ep = expert_groups(w, t)?;
    let own = |init: &ParamMap| -> ParamMap {
        init.iter()
            .map(|(k, v)| (k.clone(), v.shallow_clone()))
            .collect()
    };
    std::thread::scope(|s| {
        let handles: Vec<_> = world
            .iter()
            .zip(ep)
            .map(|(pg, (ep, replicas))| {
                let (plain, init) = (&plain, own(&init));
                s.spawn(move || -> anyhow::Result<(Run, Run)> {
                    let cfg = config(strategy, recompute, compute);
                    let fsdp = Fsdp::new(plain.units(), pg, &init, cfg.clone())?;
                    let without = train(fsdp, plain, pg, steps)?;
                    let parallel = vlm(Some(ExpertGroup(Arc::new(ep))))?;
                    let fsdp = Fsdp::new_expert_parallel(
                        parallel.units(),
                        pg,
                        &replicas,
                        &replica_ranks(w, pg.rank()),
                        &init,
                        cfg,
                    )?;
                    let with = train(fsdp, &parallel, pg, steps)?;
                    Ok((without, with))
                })
            })
            .collect();
        let mut without = Vec::new();
        let mut with = Vec::new();
        for (rank, h) in handles.into_iter().enumerate() {
            let (a, b) = h
                .join()
                .map_err(|_| anyhow::anyhow!("rank {rank} panicked"))??;
            without.push(a);
            with.push(b);
        }
        Ok((without, with))
    })
}

fn expert_of(name: &str) -> Option<usize> {
    let rest = name.split(".mlp.experts.").nth(1)?;
    rest.split('.').next()?.parse().ok()
}

fn check(w: usize, strategy: Strategy, recompute: Recompute, steps: usize) -> anyhow::Result<()> {
    let (without, with) = runs(w, strategy, recompute, tch::Kind::Float, steps)?;
    let what = format!("W={w} {strategy:?} {recompute:?}");
    for rank in 0..w {
        let (want_losses, want) = &without[rank];
        let (losses, got) = &with[rank];
        for (step, (a, b)) in losses.iter().zip(want_losses).enumerate() {
            assert!(
                (a - b).abs() <= LOSS_DRIFT * b.abs(),
                "{what} rank {rank} step {step}: EP=2 loss {a} vs EP=1 {b}"
            );
        }
        // Rank r holds experts 2(r mod 2) and 2(r mod 2)+1 of the sparse layer, and every
        // other weight.
        for (name, want) in want {
            let held = expert_of(name).is_none_or(|e| e / 2 == rank % 2);
            let Some(t) = got.get(name) else {
                assert!(!held, "{what} rank {rank}: {name} missing under EP=2");
                continue;
            };
            assert!(
                held,
                "{what} rank {rank} holds {name}, another rank's expert"
            );
            let diff = (t - want).abs().max().double_value(&[]);
            let scale = want.abs().max().double_value(&[]).max(1e-3);
            assert!(
                diff <= WEIGHT_DRIFT * scale,
                "{what} rank {rank}: {name} differs by {diff} (scale {scale})"
            );
        }
        let experts = got.keys().filter(|n| expert_of(n).is_some()).count();
        assert_eq!(
            experts,
            2 * 3,
            "{what} rank {rank}: 2 experts x 3 projections"
        );
        assert!(want_losses.iter().all(|l| l.is_finite() && *l > 0.0));
    }
    Ok(())
}

#[test]
fn expert_parallel_two_ranks_match_no_expert_parallel_over_20_steps() -> anyhow::Result<()> {
    check(2, Strategy::FullShard, Recompute::All, STEPS)?;
    check(2, Strategy::NoShard, Recompute::None, STEPS)?;
    Ok(())
}

#[test]
fn expert_parallel_four_ranks_shard_each_expert_over_its_two_holders() -> anyhow::Result<()> {
    check(4, Strategy::FullShard, Recompute::All, STEPS / 2)?;
    check(4, Strategy::ShardGradOp, Recompute::None, STEPS / 2)?;
    Ok(())
}

/// bf16 compute (f32 masters) with gradient accumulation: the exchanges carry bf16 rows and
/// their gradients, and EP=2 stays within bf16's rounding of W=2 without EP (the experts'
/// GEMMs see other row groupings, so bit-equality is not expected).
#[test]
fn expert_parallel_in_bf16_stays_within_rounding_of_no_expert_parallel() -> anyhow::Result<()> {
    let (without, with) = runs(
        2,
        Strategy::FullShard,
        Recompute::All,
        tch::Kind::BFloat16,
        6,
    )?;
    for rank in 0..2 {
        for (step, (a, b)) in with[rank].0.iter().zip(&without[rank].0).enumerate() {
            assert!(
                a.is_finite() && (a - b).abs() <= 2e-2 * b.abs(),
                "bf16 rank {rank} step {step}: EP=2 loss {a} vs EP=1 {b}"
            );
        }
    }
    Ok(())
}

#[test]
fn expert_parallel_refuses_an_expert_count_it_cannot_split() {
    let err = vlm(None).and_then(|_| {
        let groups = local_groups(3, Duration::from_secs(10))?;
        let group = groups
            .into_iter()
            .next()
            .ok_or_else(|| anyhow::anyhow!("no group"))?;
        vlm(Some(ExpertGroup(Arc::new(group))))
    });
    let message = format!("{:#}", err.err().expect("3 ranks cannot split 4 experts"));
    assert!(
        message.contains("4 experts do not split evenly"),
        "{message}"
    );
}
