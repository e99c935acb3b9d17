//! A rank never materialises the full model: at W=2 (FULL_SHARD, recompute) a rank holds its
//! shards (half the parameters) plus at most two consecutive units gathered at once (the one
//! computing and the one prefetched), counted by FSDP's own gather accounting over a stage-1
//! step. Both towers are wrapped layer by layer, so no unit is a whole tower.

use crate::support::{image_sample, micro_batch, on_thread_ranks, tiny_vlm};
use std::time::Duration;
use tessera_fsdp::dist::local_groups;
use tessera_fsdp::ParamSpec;
use tessera_fsdp::{Fsdp, FsdpConfig, Recompute};

const F32_BYTES: u64 = 4;

fn bytes(specs: &[ParamSpec]) -> u64 {
    specs
        .iter()
        .map(|s| F32_BYTES * s.shape.iter().product::<i64>() as u64)
        .sum()
}

#[test]
fn a_rank_holds_half_the_parameters_plus_two_units_never_the_whole_model() -> anyhow::Result<()> {
    let (vlm, init) = tiny_vlm(None);
    let model_bytes = bytes(&vlm.param_specs());
    let unit_bytes: Vec<u64> = vlm.units().iter().map(|u| bytes(u.params())).collect();
    let largest_pair = unit_bytes
        .windows(2)
        .map(|w| w[0] + w[1])
        .max()
        .unwrap_or(0);
    let names: Vec<&str> = vlm.units().iter().map(|u| u.name()).collect();
    assert!(
        names.contains(&"vision.layers.1") && !names.contains(&"vision"),
        "the vision tower is wrapped layer by layer: {names:?}"
    );

    let groups = local_groups(2, Duration::from_secs(60))?;
    let per_rank = on_thread_ranks(&groups, &init, |init, pg| {
        let config = FsdpConfig {
            recompute: Recompute::All,
            ..FsdpConfig::default()
        };
        let mut fsdp = Fsdp::new(vlm.units(), pg, init, config)?;
        let rows = vec![vec![image_sample(16, 5, 3 + pg.rank() as i64, 16)]];
        let ctx = vlm.ctx(init, &micro_batch(&rows, 16, 16))?;
        fsdp.forward_backward(&ctx, &ctx.first_input(), 1.0)?;
        let stats = fsdp.step(1.0)?;
        Ok((fsdp.memory().param_bytes, stats.peak_gathered_bytes))
    })?;

    // Flat buffers are padded to a multiple of W elements: under one element per buffer.
    let padding = F32_BYTES * (2 * vlm.units().len() as u64 + 2);
    for (rank, &(shards, gathered)) in per_rank.iter().enumerate() {
        assert!(
            shards <= model_bytes / 2 + padding,
            "rank {rank} keeps {shards} bytes of shards, more than half of {model_bytes}"
        );
        assert!(
            gathered > 0,
            "rank {rank} gathered nothing: the step did not run sharded"
        );
        assert!(
            gathered <= largest_pair + 2 * padding,
            "rank {rank} held {gathered} gathered bytes at once, more than two units ({largest_pair})"
        );
        assert!(
            shards + gathered < model_bytes,
            "rank {rank} held {shards} + {gathered} bytes: the whole model is {model_bytes}"
        );
    }
    Ok(())
}
