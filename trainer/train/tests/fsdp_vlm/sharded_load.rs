//! Per-rank loading from bf16 safetensors (the Hub's dtype): at W=2 each rank reads from the
//! checkpoint files only the slices its shards keep (half the bytes, every byte read by
//! exactly one rank), and the gathered parameters equal the ones a W=1 run built from the
//! fully loaded model.

use crate::support::{tiny_lm, tiny_vision, IMAGE_ID};
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use std::path::Path;
use std::time::Duration;
use tch::Kind;
use tessera_fsdp::dist::{local_groups, ProcessGroup};
use tessera_fsdp::ParamMap;
use tessera_fsdp::{Fsdp, FsdpConfig};
use tessera_model::testing::write_checkpoints;
use tessera_model::{load_safetensors, LoraConfig, Vlm, VlmOptions};

/// Rewrites `dir/model.safetensors` with every tensor in bf16, as the Hub ships them.
fn to_bf16(dir: &Path) -> anyhow::Result<()> {
    let path = dir.join("model.safetensors");
    let tensors = load_safetensors(&path)?;
    let mut bytes = Vec::new();
    for (name, t) in &tensors {
        let t = t.to_kind(Kind::BFloat16).contiguous();
        let mut data = vec![0u8; t.numel() * 2];
        t.copy_data_u8(&mut data, t.numel());
        let shape: Vec<usize> = t.size().iter().map(|&d| d as usize).collect();
        bytes.push((name.clone(), shape, data));
    }
    let views = bytes
        .iter()
        .map(|(name, shape, data)| {
            Ok((
                name.as_str(),
                TensorView::new(Dtype::BF16, shape.clone(), data)?,
            ))
        })
        .collect::<Result<Vec<_>, safetensors::SafeTensorError>>()?;
    safetensors::serialize_to_file(views, &None, &path)?;
    Ok(())
}

#[test]
fn each_rank_reads_only_its_slices_of_a_bf16_checkpoint() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    write_checkpoints(dir.path(), &tiny_vision(), &tiny_lm(), 11)?;
    let (vision_dir, lm_dir) = (dir.path().join("vision"), dir.path().join("lm"));
    to_bf16(&vision_dir)?;
    to_bf16(&lm_dir)?;
    let options = VlmOptions {
        image_token_id: Some(IMAGE_ID),
        lora: Some(LoraConfig {
            r: 4,
            lora_alpha: 8.0,
            ..LoraConfig::default()
        }),
        loss_chunk: Some(5),
        ..Default::default()
    };
    let vlm = Vlm::from_dirs(&vision_dir, &lm_dir, options)?;
    // Checkpoint bytes the model reads (bf16: 2 bytes an element), the fresh projector and
    // adapters aside.
    let full = vlm.load_params(&vision_dir, &lm_dir, None, 3)?;
    let fresh = vlm.init_source(&vision_dir, &lm_dir, None, 3)?;
    let checkpoint_bytes: u64 = vlm
        .param_specs()
        .iter()
        .filter(|s| !s.name.starts_with("mm_projector") && !s.name.contains(".lora_"))
        .map(|s| 2 * s.shape.iter().product::<i64>() as u64)
        .sum();
    assert_eq!(fresh.bytes_read(), 0, "opening reads headers only");

    let single = ProcessGroup::single(Duration::from_secs(60))?;
    let want =
        Fsdp::new(vlm.units(), &single, &full, FsdpConfig::default())?.gather_params(false)?;

    let groups = local_groups(2, Duration::from_secs(60))?;
    let vlm = &vlm;
    let (vision_dir, lm_dir) = (&vision_dir, &lm_dir);
    let runs: Vec<(u64, usize, ParamMap)> = std::thread::scope(|s| {
        let handles: Vec<_> = groups
            .iter()
            .map(|pg| {
                s.spawn(move || -> anyhow::Result<_> {
                    let init = vlm.init_source(vision_dir, lm_dir, None, 3)?;
                    let fsdp = Fsdp::new(vlm.units(), pg, &init, FsdpConfig::default())?;
                    let buffers = fsdp.buffer_count();
                    Ok((init.bytes_read(), buffers, fsdp.gather_params(false)?))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().map_err(|_| anyhow::anyhow!("a rank panicked"))?)
            .collect::<anyhow::Result<_>>()
    })?;

    let total: u64 = runs.iter().map(|r| r.0).sum();
    assert_eq!(
        total, checkpoint_bytes,
        "every checkpoint byte is read by exactly one rank"
    );
    for (rank, (bytes, buffers, params)) in runs.iter().enumerate() {
        // Shards split each buffer evenly up to its padding (< W elements of 2 bytes).
        let slack = (*buffers as u64) * 2 * 2;
        assert!(
            bytes.abs_diff(checkpoint_bytes / 2) <= slack,
            "rank {rank} read {bytes} of {checkpoint_bytes} checkpoint bytes, not its half"
        );
        assert_eq!(params.len(), want.len());
        for (name, w) in &want {
            let got = &params[name];
            assert!(
                got.equal(w),
                "rank {rank}: `{name}` differs from the W=1 load"
            );
        }
    }
    Ok(())
}
