//! Loading Hugging Face directories: sparse and nested configs, sharded checkpoints, dtype
//! conversion, error messages that name the tensor, and `init-model` output loading back.

use crate::support::*;
use std::collections::BTreeMap;
use tch::{Kind, Tensor};
use tessera_fsdp::ParamSpec;
use tessera_model::testing::{random_params, write_checkpoints};
use tessera_model::{save_safetensors, HfCheckpoint};
use tessera_model::{write_preset, LmFamily, Preset};
use tessera_model::{LmConfig, ModelError, VisionConfig, Vlm, VlmOptions};

fn spec(name: &str, shape: &[i64]) -> ParamSpec {
    ParamSpec {
        name: name.into(),
        shape: shape.to_vec(),
        trainable: false,
        expert: None,
    }
}

#[test]
fn sparse_and_nested_configs_get_hf_defaults() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    std::fs::write(
        dir.path().join("config.json"),
        r#"{"model_type": "siglip", "text_config": {"hidden_size": 1},
            "vision_config": {"image_size": 384, "patch_size": 14, "hidden_size": 1152,
                              "intermediate_size": 4304, "num_hidden_layers": 27, "num_attention_heads": 16}}"#,
    )?;
    let v = VisionConfig::from_dir(dir.path())?;
    assert_eq!(
        (v.num_patches(), v.hidden_act.as_str(), v.layer_norm_eps),
        (729, "gelu_pytorch_tanh", 1e-6)
    );
    std::fs::write(
        dir.path().join("config.json"),
        r#"{"model_type": "siglip_vision_model", "image_size": 256}"#,
    )?;
    let v = VisionConfig::from_dir(dir.path())?;
    assert_eq!(
        (
            v.hidden_size,
            v.num_hidden_layers,
            v.patch_size,
            v.num_patches()
        ),
        (768, 12, 16, 256)
    );

    let lm = LmConfig::from_json(
        serde_json::from_str(
            r#"{"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
                "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
                "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}}"#,
        )?,
        dir.path(),
    )?;
    assert_eq!(
        (
            lm.vocab_size,
            lm.head_dim(),
            lm.rope_theta(),
            lm.rms_norm_eps
        ),
        (151_936, 64, 1e6, 1e-6)
    );
    assert!(lm.qkv_bias() && !lm.o_bias() && !lm.qk_norm());
    // Qwen3's head_dim defaults to 128 (Qwen3Config), not hidden / heads.
    let lm = LmConfig::from_json(
        serde_json::json!({"model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072,
            "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8}),
        dir.path(),
    )?;
    assert_eq!((lm.head_dim(), lm.vocab_size), (128, 151_936));
    assert!(!lm.qkv_bias() && !lm.o_bias() && lm.qk_norm() && !lm.mlp_bias());
    let lm = LmConfig::from_json(
        serde_json::json!({"model_type": "llama", "hidden_size": 576, "intermediate_size": 1536,
            "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
            "rope_theta": 100000.0, "mlp_bias": true, "rms_norm_eps": 1e-5}),
        dir.path(),
    )?;
    assert_eq!(
        (lm.head_dim(), lm.vocab_size, lm.rope_theta()),
        (64, 32_000, 1e5)
    );
    assert!(!lm.qkv_bias() && !lm.qk_norm() && lm.mlp_bias());
    Ok(())
}

#[test]
fn missing_and_misshaped_tensors_are_named() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut tensors = BTreeMap::new();
    tensors.insert(
        "model.norm.weight".to_string(),
        Tensor::ones([8], (Kind::Float, tch::Device::Cpu)),
    );
    save_safetensors(&dir.path().join("model.safetensors"), &tensors)?;
    let ckpt = HfCheckpoint::open(dir.path())?;

    let err = ckpt
        .load_specs(&[spec("model.norm.weight", &[16])], None, tch::Device::Cpu)
        .expect_err("shape error");
    assert!(matches!(err, ModelError::ShapeMismatch { .. }));
    let msg = err.to_string();
    assert!(
        msg.contains("model.norm.weight") && msg.contains("[8]") && msg.contains("[16]"),
        "{msg}"
    );

    let err = ckpt
        .load_specs(&[spec("lm_head.weight", &[4, 8])], None, tch::Device::Cpu)
        .expect_err("missing");
    let msg = err.to_string();
    assert!(
        msg.contains("lm_head.weight") && msg.contains("missing"),
        "{msg}"
    );

    let empty = tempfile::tempdir()?;
    let msg = HfCheckpoint::open(empty.path())
        .err()
        .expect("no weights")
        .to_string();
    assert!(msg.contains("model.safetensors.index.json"), "{msg}");
    Ok(())
}

#[test]
fn sharded_checkpoint_and_bf16_load_like_a_single_file() -> anyhow::Result<()> {
    let (vlm, _) = tiny_vlm(None);
    let specs = tessera_model::testing::lm_checkpoint_specs(&vlm.lm);
    let params = random_params(&specs, 3, 0.1);
    let single = tempfile::tempdir()?;
    save_safetensors(&single.path().join("model.safetensors"), &params)?;

    let sharded = tempfile::tempdir()?;
    let (first, second): (Vec<_>, Vec<_>) =
        params.iter().enumerate().partition(|(i, _)| i % 2 == 0);
    let mut weight_map = serde_json::Map::new();
    for (file, part) in [
        ("model-00001-of-00002.safetensors", first),
        ("model-00002-of-00002.safetensors", second),
    ] {
        let shard: BTreeMap<String, Tensor> = part
            .into_iter()
            .map(|(_, (k, t))| {
                weight_map.insert(k.clone(), file.into());
                // Store the second shard in bf16: it must come back as f32.
                let t = if file.contains("00002") {
                    t.to_kind(Kind::BFloat16)
                } else {
                    t.shallow_clone()
                };
                (k.clone(), t)
            })
            .collect();
        save_as(&sharded.path().join(file), &shard)?;
    }
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
    std::fs::write(
        sharded.path().join("model.safetensors.index.json"),
        index.to_string(),
    )?;

    let a = HfCheckpoint::open(single.path())?.load_specs(&specs, None, tch::Device::Cpu)?;
    let b = HfCheckpoint::open(sharded.path())?.load_specs(&specs, None, tch::Device::Cpu)?;
    for (name, t) in &a {
        assert_eq!(b[name].kind(), Kind::Float);
        assert_close(t, &b[name], 1e-2, name);
    }
    Ok(())
}

/// `write_hub_files` asks for each tensor once, in order, only when its bytes are due (the
/// previous one is written by then); the files it writes read back exactly (f32) or as the
/// bf16 rounding (bf16), through `HfCheckpoint` and the safetensors crate alike. An earlier
/// export's `model.safetensors` in the same folder is removed once the shards and their index
/// exist, no `.tmp` file is left, and a tensor of the wrong shape stops the write naming it.
#[test]
fn streamed_shards_ask_for_one_tensor_at_a_time_and_read_back() -> anyhow::Result<()> {
    let (vlm, _) = tiny_vlm(None);
    let specs = tessera_model::testing::lm_checkpoint_specs(&vlm.lm);
    let params = random_params(&specs, 5, 0.1);
    let entries: Vec<(String, Vec<i64>)> =
        params.iter().map(|(k, t)| (k.clone(), t.size())).collect();
    let total: i64 = params.values().map(|t| t.numel() as i64 * 4).sum();
    for kind in [Kind::Float, Kind::BFloat16] {
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("model.safetensors"), b"an earlier export")?;
        let mut asked = Vec::new();
        let files = tessera_model::write_hub_files(
            dir.path(),
            &entries,
            kind,
            (total / 5) as u64,
            |name| {
                // The file being written holds every tensor asked for before this one.
                asked.push(name.to_string());
                Ok::<_, ModelError>(params[name].shallow_clone())
            },
        )?;
        let names: Vec<String> = entries.iter().map(|(k, _)| k.clone()).collect();
        assert_eq!(asked, names, "each tensor asked for once, in order");
        assert!(
            files.len() > 2,
            "{kind:?}: several shards and an index: {files:?}"
        );
        let left: Vec<String> = std::fs::read_dir(dir.path())?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<Result<_, _>>()?;
        assert!(
            !left
                .iter()
                .any(|n| n == "model.safetensors" || n.ends_with(".tmp")),
            "{left:?}"
        );
        let ckpt = HfCheckpoint::open(dir.path())?;
        for (name, t) in &params {
            let back = ckpt.tensor_as_stored(name, &t.size())?;
            assert_eq!(back.kind(), kind, "{name}");
            assert!(back.equal(&t.to_kind(kind)), "{name} reads back as written");
        }
        for file in files
            .iter()
            .filter(|f| f.extension().is_some_and(|e| e == "safetensors"))
        {
            let bytes = std::fs::read(file)?;
            safetensors::SafeTensors::deserialize(&bytes)?;
        }
    }

    let dir = tempfile::tempdir()?;
    let err = tessera_model::write_hub_files(dir.path(), &entries, Kind::Float, u64::MAX, |name| {
        let t = &params[name];
        Ok::<_, ModelError>(if name == entries[1].0 {
            t.unsqueeze(0)
        } else {
            t.shallow_clone()
        })
    })
    .expect_err("a misshaped tensor");
    assert!(err.to_string().contains(&entries[1].0), "{err}");
    assert_eq!(
        std::fs::read_dir(dir.path())?.count(),
        0,
        "nothing left behind"
    );
    Ok(())
}

/// `save_safetensors` always writes f32; bf16 shards are written through tch's own writer.
fn save_as(path: &std::path::Path, tensors: &BTreeMap<String, Tensor>) -> anyhow::Result<()> {
    let list: Vec<(&str, &Tensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    Tensor::write_safetensors(&list, path)?;
    Ok(())
}

/// Qwen's `<|image_pad|>`, the image token of the tokenizer the tiny preset is made for.
const QWEN_IMAGE_PAD: i64 = 151_655;

#[test]
fn tiny_preset_writes_checkpoints_the_model_loads() -> anyhow::Result<()> {
    let out = tempfile::tempdir()?;
    let written = write_preset(out.path(), Preset::Tiny, LmFamily::Qwen2, 1)?;
    let vlm = Vlm::from_dirs(
        &out.path().join("vision"),
        &out.path().join("lm"),
        VlmOptions {
            image_token_id: Some(QWEN_IMAGE_PAD),
            ..VlmOptions::default()
        },
    )?;
    assert!(vlm.tied);
    assert_eq!((vlm.lm.vocab_size, vlm.vision.num_patches()), (151_936, 64));
    let params = vlm.load_params(&out.path().join("vision"), &out.path().join("lm"), None, 0)?;
    let in_model: i64 = params.values().map(|t| t.numel() as i64).sum();
    assert!(
        in_model < written,
        "the last vision layer and post-layernorm are not model parameters"
    );
    // Real Qwen token ids fit; one image sample runs end to end.
    let side = vlm.vision.image_size as usize;
    let mut s = image_sample(64, 4, 1, side);
    s.ids
        .iter_mut()
        .filter(|id| **id == IMAGE_ID)
        .for_each(|id| *id = QWEN_IMAGE_PAD);
    s.ids[0] = 151_644; // <|im_start|>
    let mb = micro_batch(&[vec![s]], side, 64);
    let (loss, n) = vlm.loss(&params, &mb)?;
    assert_eq!(n, 4);
    let mean = loss.double_value(&[]) / n as f64;
    // Random logits with std σ = embed_std·√hidden = 2 over 151,936 tokens score about
    // ln(151936) + σ²/2 ≈ 13.9: above a uniform guess (11.93), but not wildly.
    assert!((11.93..15.0).contains(&mean), "mean loss {mean}");
    // The LM is drawn at a trained model's scale (gain-1 matrices, embeddings 2/√hidden), so
    // a frozen LM can still express confident predictions (see `LmInit`).
    let std = |name: &str| params[name].std(true).double_value(&[]);
    let hidden = vlm.lm.hidden_size as f64;
    assert!((std("model.embed_tokens.weight") * hidden.sqrt() - 2.0).abs() < 0.05);
    let q = std("model.layers.0.self_attn.q_proj.weight") * hidden.sqrt();
    assert!((q - 1.0).abs() < 0.05, "q_proj std x sqrt(fan_in) = {q}");
    Ok(())
}

#[test]
fn untied_checkpoint_gets_an_lm_head() -> anyhow::Result<()> {
    let out = tempfile::tempdir()?;
    let mut lm = tiny_lm();
    lm.tie_word_embeddings = false;
    write_checkpoints(out.path(), &tiny_vision(), &lm, 2)?;
    let vlm = Vlm::from_dirs(
        &out.path().join("vision"),
        &out.path().join("lm"),
        VlmOptions::default(),
    )?;
    assert!(!vlm.tied);
    assert!(vlm.shared_params().is_empty());
    let (tied, _) = tiny_vlm(None);
    assert_eq!(
        tied.shared_params(),
        vec![(
            "model.embed_tokens.weight".to_string(),
            vec!["embed".to_string(), "head".to_string()]
        )]
    );
    Ok(())
}
