//! The llava-hf export and generation against transformers: tests/fixtures/llava/ was written
//! by tests/oracles/llava_golden.py from the golden SigLIP tower, untied Qwen2 and projector
//! (tests/fixtures/golden/): the tensor names, shapes and config fields `save_pretrained`
//! writes for that `LlavaForConditionalGeneration`, and its logits and greedy tokens for two
//! images. tessera exports the same weights, reads its export back and must generate the same.
//! `LLAVA_EXPORT_DIR=DIR` keeps the f32 export there, for `llava_golden.py --check DIR`.

use crate::support::*;
use std::path::{Path, PathBuf};
use tch::Kind;
use tessera_fsdp::ParamMap;
use tessera_model::llava::load_llava_dir;
use tessera_model::{load_safetensors, GenerateOptions, Generator};
use tessera_train::{write_llava_hf, LlavaHfOptions, LlavaSources, TrainedTensors};

const TOL: f64 = 1e-4;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

fn get<'a>(map: &'a ParamMap, key: &str) -> &'a tch::Tensor {
    map.get(key)
        .unwrap_or_else(|| panic!("fixture has no `{key}`"))
}

/// Exports the golden weights as a llava-hf directory into `out`.
fn export(out: &Path, options: &LlavaHfOptions) -> anyhow::Result<()> {
    let golden = fixtures().join("golden");
    let projector = load_safetensors(&golden.join("projector.safetensors"))?;
    let sources = LlavaSources {
        vision_dir: &golden.join("vision"),
        lm_dir: &golden.join("lm_untied"),
        trainable: &TrainedTensors::Full(projector),
        initial_projector: None,
        feature_stats: None,
        lora: None,
        tokens: &test_tokens(),
        added_tokens: 0,
        template: "plain",
        image_size: None,
        vision_feature_layer: None,
        image_layout: Default::default(),
    };
    write_llava_hf(&sources, out, options)?;
    Ok(())
}

/// The test vocabulary's special tokens (no tokenizer: the export writes no processor files).
fn test_tokens() -> tessera_text::SpecialTokens {
    tessera_text::SpecialTokens {
        image: tessera_text::Token::new("<image>", IMAGE_ID as u32),
        image_frame: None,
        eos: tessera_text::Token::new("</s>", 0),
        pad_id: 0,
        added: Vec::new(),
    }
}

fn f32_options() -> LlavaHfOptions {
    LlavaHfOptions {
        dtype: Kind::Float,
        ..Default::default()
    }
}

/// Fails naming the field when `got` differs from `want` (numbers within 1e-9 relative).
fn assert_fields(section: &str, want: &serde_json::Value, got: &serde_json::Value) {
    let want = want.as_object().expect("expected section is an object");
    for (key, w) in want {
        let g = got
            .get(key)
            .unwrap_or_else(|| panic!("{section}.{key} is missing from the export"));
        match (w.as_f64(), g.as_f64()) {
            (Some(a), Some(b)) => assert!(
                (a - b).abs() <= 1e-9 * a.abs().max(1.0),
                "{section}.{key}: {b} != {a}"
            ),
            _ => assert_eq!(g, w, "{section}.{key}"),
        }
    }
}

#[test]
fn llava_export_has_the_keys_shapes_and_config_transformers_writes() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let out = std::env::var_os("LLAVA_EXPORT_DIR").map_or(tmp.path().join("export"), PathBuf::from);
    export(&out, &f32_options())?;
    let text = std::fs::read_to_string(fixtures().join("llava/expected.json"))?;
    let expected: serde_json::Value = serde_json::from_str(&text)?;
    let written = load_safetensors(&out.join("model.safetensors"))?;
    let got: Vec<(String, Vec<i64>)> = written.iter().map(|(k, t)| (k.clone(), t.size())).collect();
    let want: Vec<(String, Vec<i64>)> = expected["tensors"]
        .as_object()
        .expect("tensors is an object")
        .iter()
        .map(|(k, v)| {
            let shape = v.as_array().expect("a shape is a list");
            (k.clone(), shape.iter().filter_map(|d| d.as_i64()).collect())
        })
        .collect();
    assert_eq!(
        got, want,
        "tensor names and shapes differ from save_pretrained's"
    );

    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json"))?)?;
    assert_fields("config", &expected["config"], &config);
    assert_fields(
        "vision_config",
        &expected["vision_config"],
        &config["vision_config"],
    );
    assert_fields(
        "text_config",
        &expected["text_config"],
        &config["text_config"],
    );
    Ok(())
}

#[test]
fn generate_from_the_export_matches_transformers_greedy_tokens_and_logits() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    export(tmp.path(), &f32_options())?;
    let (vlm, params) = load_llava_dir(tmp.path())?;
    let generator = Generator::new(&vlm, params)?;
    let fixture = load_safetensors(&fixtures().join("llava/outputs.safetensors"))?;
    let prompt = to_i64(get(&fixture, "prompt_ids"));
    let pixels: Vec<u8> = to_i64(get(&fixture, "pixels_u8"))
        .into_iter()
        .map(|v| v as u8)
        .collect();
    let per_image = pixels.len() / 2;
    for i in 0..2 {
        let image = &pixels[i * per_image..(i + 1) * per_image];
        let logits = generator.prompt_logits(&prompt, image)?;
        assert_close(
            &logits,
            get(&fixture, &format!("prompt_logits_{i}")),
            TOL,
            "prompt logits",
        );
        let want = to_i64(get(&fixture, &format!("tokens_{i}")));
        let options = GenerateOptions {
            max_new_tokens: want.len(),
            ..Default::default()
        };
        let cached = generator.generate(&prompt, image, &options)?;
        assert_eq!(cached.tokens, want, "image {i}: greedy tokens (KV cache)");
        let step = get(&fixture, &format!("step_logits_{i}"));
        assert_close(&cached.step_logits, step, TOL, "step logits (KV cache)");
        let recomputed = generator.generate(
            &prompt,
            image,
            &GenerateOptions {
                kv_cache: false,
                ..options
            },
        )?;
        assert_eq!(
            recomputed.tokens, want,
            "image {i}: greedy tokens (no cache)"
        );
        assert_close(&recomputed.step_logits, step, TOL, "step logits (no cache)");
    }
    Ok(())
}

#[test]
fn bf16_sharded_export_reads_back_and_stops_at_a_stop_id() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let options = LlavaHfOptions {
        max_shard_bytes: 40_000,
        ..Default::default()
    };
    export(tmp.path(), &options)?;
    let index: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        tmp.path().join("model.safetensors.index.json"),
    )?)?;
    let files: std::collections::BTreeSet<&str> = index["weight_map"]
        .as_object()
        .expect("weight_map is an object")
        .values()
        .filter_map(|v| v.as_str())
        .collect();
    assert!(
        files.len() > 1,
        "40 KB shards of a 200 KB bf16 model: {files:?}"
    );
    let (vlm, params) = load_llava_dir(tmp.path())?;
    let embed = get(&params, "model.embed_tokens.weight");
    assert_eq!(embed.kind(), Kind::BFloat16);
    let golden = load_safetensors(&fixtures().join("golden/lm_untied/model.safetensors"))?;
    let exact = get(&golden, "model.embed_tokens.weight");
    assert_close(&embed.to_kind(Kind::Float), exact, 1e-2, "bf16 embedding");

    let generator = Generator::new(&vlm, params)?;
    let fixture = load_safetensors(&fixtures().join("llava/outputs.safetensors"))?;
    let prompt = to_i64(get(&fixture, "prompt_ids"));
    let pixels: Vec<u8> = to_i64(get(&fixture, "pixels_u8"))
        .into_iter()
        .map(|v| v as u8)
        .collect();
    let image = &pixels[..pixels.len() / 2];
    let free = generator.generate(
        &prompt,
        image,
        &GenerateOptions {
            max_new_tokens: 4,
            ..Default::default()
        },
    )?;
    let stop = free.tokens[1];
    let stopped = generator.generate(
        &prompt,
        image,
        &GenerateOptions {
            max_new_tokens: 4,
            stop_ids: vec![stop],
            ..Default::default()
        },
    )?;
    assert!(stopped.stopped);
    let end = free
        .tokens
        .iter()
        .position(|&t| t == stop)
        .expect("stop id was generated")
        + 1;
    assert_eq!(stopped.tokens, free.tokens[..end].to_vec());

    // A nucleus of one token is greedy; the same seed draws the same tokens.
    let sample = |top_p: f64, seed: u64| {
        let options = GenerateOptions {
            max_new_tokens: 4,
            temperature: 0.8,
            top_p,
            seed,
            ..Default::default()
        };
        generator
            .generate(&prompt, image, &options)
            .map(|g| g.tokens)
    };
    assert_eq!(sample(1e-9, 1)?, free.tokens);
    assert_eq!(sample(0.9, 7)?, sample(0.9, 7)?);

    // The same export held and run in bf16 (what `tessera generate` picks for a bf16 export):
    // its prompt logits stay within bf16's rounding of the f32 run's.
    let (vlm, params) = load_llava_dir(tmp.path())?;
    let narrow = Generator::with_kind(&vlm, params, Kind::BFloat16)?;
    assert_eq!(narrow.kind(), Kind::BFloat16);
    let wide = generator.prompt_logits(&prompt, image)?;
    let logits = narrow.prompt_logits(&prompt, image)?;
    assert_eq!(logits.kind(), Kind::Float);
    let scale = wide.abs().max().double_value(&[]);
    assert_close(&logits, &wide, 0.05 * scale, "bf16 prompt logits");
    Ok(())
}

/// A full fine-tune (projector and the whole untied LM, trained by FSDP for three steps at
/// lr 1e-2) exported as llava-hf in shards: transformers loads it with no missing, unexpected or
/// mismatched weight (`tests/oracles/transformers_oracle.py greedy`, in `.deps/hfvenv` from setup.sh) and
/// generates greedily the tokens tessera's `Generator` generates from the same export.
#[test]
fn a_full_finetune_export_loads_in_transformers_and_generates_the_same_tokens() -> anyhow::Result<()>
{
    use std::time::Duration;
    use tessera_fsdp::dist::ProcessGroup;
    use tessera_fsdp::{AdamWConfig, Fsdp, FsdpConfig};
    use tessera_model::{Vlm, VlmOptions};

    let golden = fixtures().join("golden");
    let (vision, lm) = (golden.join("vision"), golden.join("lm_untied"));
    let options = VlmOptions {
        image_token_id: Some(IMAGE_ID),
        train_lm: true,
        ..Default::default()
    };
    let vlm = Vlm::from_dirs(&vision, &lm, options)?;
    let init = vlm.load_params(&vision, &lm, Some(&golden.join("projector.safetensors")), 0)?;
    let pg = ProcessGroup::single(Duration::from_secs(60))?;
    let config = FsdpConfig {
        adamw: AdamWConfig {
            lr: 1e-2,
            ..AdamWConfig::default()
        },
        ..FsdpConfig::default()
    };
    let mut fsdp = Fsdp::new(vlm.units(), &pg, &init, config)?;
    let (side, tokens) = (
        vlm.vision.image_size as usize,
        vlm.vision.num_patches() as usize,
    );
    for step in 0..3 {
        let rows = vec![
            vec![image_sample(tokens, 4, step, side)],
            vec![image_sample(tokens, 3, step + 10, side)],
        ];
        fsdp_step(&mut fsdp, &vlm, &pg, &[micro_batch(&rows, side, tokens)])?;
    }
    let trained = fsdp.gather_params(true)?;
    let moved = max_abs_diff(&trained["model.norm.weight"], &init["model.norm.weight"]);
    assert!(
        moved > 1e-3,
        "three steps at lr 1e-2 moved the final norm by {moved} only"
    );

    let tmp = tempfile::tempdir()?;
    let out = tmp.path().join("export");
    let sources = LlavaSources {
        vision_dir: &vision,
        lm_dir: &lm,
        trainable: &TrainedTensors::Full(trained),
        initial_projector: None,
        feature_stats: None,
        lora: None,
        tokens: &test_tokens(),
        added_tokens: 0,
        template: "plain",
        image_size: None,
        vision_feature_layer: None,
        image_layout: Default::default(),
    };
    // Streamed into 100 KB shards (of a 400 KB f32 model) with an index, as `save_pretrained`
    // shards a large model: transformers reads the index.
    let sharded = LlavaHfOptions {
        max_shard_bytes: 100_000,
        ..f32_options()
    };
    let report = write_llava_hf(&sources, &out, &sharded)?;
    assert!(
        report.weight_files.len() > 2 && out.join("model.safetensors.index.json").is_file(),
        "{:?}",
        report.weight_files
    );
    let (export_vlm, params) = load_llava_dir(&out)?;
    let generator = Generator::new(&export_vlm, params)?;

    let fixture = load_safetensors(&fixtures().join("llava/outputs.safetensors"))?;
    let prompt = to_i64(get(&fixture, "prompt_ids"));
    let pixels_u8 = get(&fixture, "pixels_u8");
    let pixels: Vec<u8> = to_i64(pixels_u8).into_iter().map(|v| v as u8).collect();
    let per_image = pixels.len() / 2;
    const NEW: usize = 8;
    let mut ours = Vec::new();
    for i in 0..2 {
        let options = GenerateOptions {
            max_new_tokens: NEW,
            ..Default::default()
        };
        let image = &pixels[i * per_image..(i + 1) * per_image];
        ours.push(generator.generate(&prompt, image, &options)?.tokens);
    }

    let inputs = tmp.path().join("inputs.safetensors");
    let pixel_values = (pixels_u8.to_kind(Kind::Float) / 255.0 - 0.5) / 0.5;
    let mut tensors = ParamMap::new();
    tensors.insert("prompt_ids".into(), tch::Tensor::from_slice(&prompt));
    tensors.insert("pixel_values".into(), pixel_values);
    tessera_model::save_safetensors(&inputs, &tensors)?;
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let output = std::process::Command::new(root.join(".deps/hfvenv/bin/python"))
        .arg(root.join("tests/oracles/transformers_oracle.py"))
        .arg("greedy")
        .arg(&out)
        .arg(&inputs)
        .arg(NEW.to_string())
        .output()?;
    assert!(
        output.status.success(),
        "transformers_oracle.py greedy failed (run scripts/setup/setup.sh for .deps/hfvenv): {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let line: serde_json::Value = serde_json::from_slice(&output.stdout)?;
    let theirs: Vec<Vec<i64>> = serde_json::from_value(line["tokens"].clone())?;
    assert_eq!(
        theirs, ours,
        "greedy tokens: transformers vs tessera on the full fine-tune's export"
    );
    Ok(())
}
