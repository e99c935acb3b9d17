//! FSDP on the real (tiny) VLM: stage 1 (projector), stage 2 (projector + LoRA, two lr groups)
//! and full fine-tuning (projector + the whole LM + the vision tower, tied and untied heads,
//! each LM family, with and without rows for an added token) at W=2 over gloo give the same
//! losses and final weights as W=1 on the same global batches,
//! alternating image and text-only micro-steps as the planner schedules them, under every
//! strategy; a rank holds half the training state; keeping the forward's activations
//! (`Recompute::None`) gives the losses recomputing them gives.

use crate::support::{
    fsdp_step, image_sample, micro_batch, on_thread_ranks, text_sample, tiny_lm_of, tiny_vision,
    tiny_vlm, IMAGE_ID,
};
use std::time::Duration;
use tessera_fsdp::dist::{local_groups, ProcessGroup};
use tessera_fsdp::ParamMap;
use tessera_fsdp::{AdamWConfig, Fsdp, FsdpConfig, ParamGroup, Recompute, Strategy};
use tessera_model::testing::random_params;
use tessera_model::{LmFamily, LoraConfig, VisionTraining, Vlm, VlmOptions};

const STEPS: usize = 6;

/// Micro-batch `i` of step `step`: every micro-step of a step has the same kind on all ranks.
fn batch(step: usize, i: usize) -> tessera_pipeline::MicroBatch {
    let seed = (step * 5 + i) as i64;
    if step & 1 == 0 {
        let rows = vec![
            vec![image_sample(16, 4 + i, seed, 16)],
            vec![image_sample(16, 3, seed + 1, 16)],
        ];
        micro_batch(&rows, 16, 16)
    } else {
        micro_batch(
            &[vec![text_sample(9 + i, seed), text_sample(5, seed + 2)]],
            16,
            16,
        )
    }
}

fn train_with(
    vlm: &Vlm,
    init: &ParamMap,
    pg: &ProcessGroup,
    strategy: Strategy,
    recompute: Recompute,
    steps: usize,
) -> anyhow::Result<(Vec<f64>, ParamMap)> {
    let adamw = AdamWConfig {
        lr: 2e-3,
        groups: vec![ParamGroup {
            name: "projector".into(),
            unit_prefixes: vec!["projector".into()],
            name_contains: vec![],
            lr: 5e-4,
            weight_decay: 0.0,
        }],
        ..AdamWConfig::default()
    };
    let config = FsdpConfig {
        strategy,
        adamw,
        max_grad_norm: Some(1.0),
        recompute,
        ..FsdpConfig::default()
    };
    let mut fsdp = Fsdp::new(vlm.units(), pg, init, config)?;
    let mut losses = Vec::new();
    for step in 0..steps {
        let batches = [batch(step, 0), batch(step, 1)];
        losses.push(fsdp_step(&mut fsdp, vlm, pg, &batches)?.loss);
    }
    Ok((losses, fsdp.gather_params(true)?))
}

fn check(lora: Option<LoraConfig>, strategy: Strategy) -> anyhow::Result<()> {
    let (vlm, init) = tiny_vlm(lora);
    compare(&vlm, &init, strategy, STEPS)
}

/// `steps` steps at W=2 under `strategy` against W=1: the same losses and trained weights.
fn compare(vlm: &Vlm, init: &ParamMap, strategy: Strategy, steps: usize) -> anyhow::Result<()> {
    let single = ProcessGroup::single(Duration::from_secs(60))?;
    let run = |init: &ParamMap, pg: &ProcessGroup| {
        train_with(vlm, init, pg, strategy, Recompute::All, steps)
    };
    let (want_losses, want_params) = run(init, &single)?;
    let groups = local_groups(2, Duration::from_secs(60))?;
    let runs = on_thread_ranks(&groups, init, run)?;
    for (rank, (losses, params)) in runs.iter().enumerate() {
        for (step, (a, b)) in losses.iter().zip(&want_losses).enumerate() {
            assert!(
                (a - b).abs() <= 1e-4 * b.abs(),
                "{strategy:?} rank {rank} step {step}: loss {a} vs W=1 {b}"
            );
        }
        assert_eq!(params.len(), want_params.len());
        for (name, want) in &want_params {
            let got = &params[name];
            let diff = (got - want).abs().max().double_value(&[]);
            let scale = want.abs().max().double_value(&[]).max(1e-3);
            // SigLIP's key bias adds q·b to every score of a query, which softmax ignores: its
            // exact gradient is zero, so it holds reduction-order noise that AdamW scales to
            // full-size steps. Its drift is bounded by the steps taken, not by rounding.
            let noise_only = name.starts_with("vision_model.") && name.ends_with("k_proj.bias");
            let tol = if noise_only {
                2e-3 * steps as f64
            } else {
                1e-4 * scale
            };
            assert!(
                diff <= tol,
                "{strategy:?} rank {rank}: {name} differs by {diff} (scale {scale})"
            );
        }
    }
    assert!(
        want_losses.iter().all(|l| l.is_finite() && *l > 0.0),
        "{want_losses:?}"
    );
    Ok(())
}

/// The tiny VLM of `family` with projector, the whole LM and the whole vision tower trainable,
/// and `added` rows for tokens past its vocabulary (an `<image>` ingest added).
fn full_finetune_vlm(family: LmFamily, tied: bool, added: i64) -> anyhow::Result<(Vlm, ParamMap)> {
    let options = VlmOptions {
        image_token_id: Some(IMAGE_ID),
        train_lm: true,
        train_vision: VisionTraining::All,
        loss_chunk: Some(5),
        added_tokens: added,
        ..Default::default()
    };
    let vlm = Vlm::new(tiny_vision(), tiny_lm_of(family), tied, options)?;
    let init = random_params(&vlm.param_specs(), 7, 0.1);
    Ok((vlm, init))
}

#[test]
fn full_finetune_every_strategy_two_ranks_match_one_rank_over_20_steps() -> anyhow::Result<()> {
    for (family, tied, added) in [
        (LmFamily::Qwen2, true, 0),
        (LmFamily::Qwen2, false, 0),
        (LmFamily::Qwen3, true, 1),
        (LmFamily::Llama, false, 1),
        // Experts and router learn; the balance loss's gradient comes through each sparse
        // layer's backward.
        (LmFamily::Qwen3Moe, false, 0),
    ] {
        let (vlm, init) = full_finetune_vlm(family, tied, added)?;
        let trained = vlm.param_specs().iter().filter(|s| s.trainable).count();
        assert_eq!(trained, vlm.param_specs().len(), "everything trains");
        for strategy in [
            Strategy::FullShard,
            Strategy::ShardGradOp,
            Strategy::NoShard,
        ] {
            compare(&vlm, &init, strategy, 20)?;
        }
    }
    Ok(())
}

/// ZeRO-3: under FULL_SHARD a rank keeps half of the f32 masters, gradients and AdamW moments
/// (up to one padding element per buffer); under NO_SHARD (DDP) each rank keeps them all.
#[test]
fn a_rank_holds_one_wth_of_the_full_finetune_training_state() -> anyhow::Result<()> {
    let (vlm, init) = full_finetune_vlm(LmFamily::Qwen2, true, 0)?;
    let state =
        |m: tessera_fsdp::MemoryReport| m.trainable_param_bytes + m.grad_bytes + m.optimizer_bytes;
    let single = ProcessGroup::single(Duration::from_secs(60))?;
    let whole = state(Fsdp::new(vlm.units(), &single, &init, FsdpConfig::default())?.memory());
    let buffers = vlm.units().len() as u64;
    let groups = local_groups(2, Duration::from_secs(60))?;
    for strategy in [Strategy::FullShard, Strategy::NoShard] {
        let vlm = &vlm;
        let held = on_thread_ranks(&groups, &init, |init, pg| {
            let config = FsdpConfig {
                strategy,
                ..FsdpConfig::default()
            };
            Ok(state(Fsdp::new(vlm.units(), pg, init, config)?.memory()))
        })?;
        for (rank, bytes) in held.iter().enumerate() {
            let want = match strategy {
                Strategy::NoShard => whole,
                _ => whole / 2,
            };
            // Padding to a multiple of W adds at most one f32 per buffer and tensor kind.
            assert!(
                bytes.abs_diff(want) <= 4 * 4 * buffers,
                "{strategy:?} rank {rank}: {bytes} bytes of training state, want ~{want} of {whole}"
            );
        }
    }
    assert!(whole > 0);
    Ok(())
}

#[test]
fn stage1_full_shard_two_ranks_match_one_rank() -> anyhow::Result<()> {
    check(None, Strategy::FullShard)
}

#[test]
fn stage2_lora_full_shard_two_ranks_match_one_rank() -> anyhow::Result<()> {
    let lora = LoraConfig {
        r: 4,
        lora_alpha: 8.0,
        ..LoraConfig::default()
    };
    check(Some(lora), Strategy::FullShard)
}

#[test]
fn stage2_lora_no_shard_two_ranks_match_one_rank() -> anyhow::Result<()> {
    let lora = LoraConfig {
        r: 4,
        lora_alpha: 8.0,
        ..LoraConfig::default()
    };
    check(Some(lora), Strategy::NoShard)
}

/// 20 steps with activations kept (`none`), kept but for the norms and activations
/// (`selective`) or kept in every other or third unit (`every:K`) give the same losses and
/// weights as 20 steps recomputing them all, in stage 1 and stage 2, at W=1 and (FULL_SHARD,
/// stage 2) at W=2.
#[test]
fn recompute_none_matches_recompute_all_over_20_steps() -> anyhow::Result<()> {
    let lora = LoraConfig {
        r: 4,
        lora_alpha: 8.0,
        ..LoraConfig::default()
    };
    for lora in [None, Some(lora)] {
        let stage = if lora.is_some() { 2 } else { 1 };
        let (vlm, init) = tiny_vlm(lora);
        let single = ProcessGroup::single(Duration::from_secs(60))?;
        let run = |recompute| train_with(&vlm, &init, &single, Strategy::FullShard, recompute, 20);
        let (all, all_params) = run(Recompute::All)?;
        assert_eq!(all.len(), 20);
        assert!(all[19] < all[0], "stage {stage} did not learn: {all:?}");
        for other in [
            Recompute::None,
            Recompute::Selective,
            Recompute::Every(2),
            Recompute::Every(3),
        ] {
            let (losses, params) = run(other)?;
            for (step, (a, n)) in all.iter().zip(&losses).enumerate() {
                assert!(
                    (a - n).abs() <= 1e-6 * a.abs(),
                    "stage {stage} step {step}: recompute {other} {n} vs all {a}"
                );
            }
            for (name, want) in &all_params {
                let diff = (&params[name] - want).abs().max().double_value(&[]);
                assert!(
                    diff <= 1e-6,
                    "stage {stage} {other}: {name} differs by {diff}"
                );
            }
        }
        if stage == 2 {
            let groups = local_groups(2, Duration::from_secs(60))?;
            let vlm = &vlm;
            let runs = on_thread_ranks(&groups, &init, |init, pg| {
                train_with(vlm, init, pg, Strategy::FullShard, Recompute::None, 20)
            })?;
            for (rank, (losses, _)) in runs.iter().enumerate() {
                for (step, (a, b)) in losses.iter().zip(&all).enumerate() {
                    assert!(
                        (a - b).abs() <= 1e-4 * b.abs(),
                        "W=2 rank {rank} step {step}: recompute none {a} vs W=1 all {b}"
                    );
                }
            }
        }
    }
    Ok(())
}

/// `every:K` sits between `none` and `all`: at W=2 under FULL_SHARD a recomputed unit gathers
/// its parameters again in backward and a kept one does not, so a step of `every:2` sends
/// more bytes than `none` and fewer than `all` (with the same loss).
#[test]
fn recompute_every_k_regathers_only_the_units_it_recomputes() -> anyhow::Result<()> {
    let (vlm, init) = tiny_vlm(None);
    let groups = local_groups(2, Duration::from_secs(60))?;
    let vlm = &vlm;
    let runs = on_thread_ranks(&groups, &init, |init, pg| {
        let mut out = Vec::new();
        for recompute in [Recompute::None, Recompute::Every(2), Recompute::All] {
            let config = FsdpConfig {
                strategy: Strategy::FullShard,
                recompute,
                ..FsdpConfig::default()
            };
            let mut fsdp = Fsdp::new(vlm.units(), pg, init, config)?;
            let stats = fsdp_step(&mut fsdp, vlm, pg, &[batch(0, 0), batch(0, 1)])?;
            out.push((stats.bytes_sent, stats.loss));
        }
        Ok(out)
    })?;
    let [(none, l0), (every, l1), (all, l2)] = runs[0][..] else {
        anyhow::bail!("three runs");
    };
    assert!(
        none < every && every < all,
        "bytes: none {none}, every:2 {every}, all {all}"
    );
    assert!((l0 - l1).abs() <= 1e-6 * l0 && (l0 - l2).abs() <= 1e-6 * l0);
    Ok(())
}
