//! Parity with transformers: the checkpoints and outputs under tests/fixtures/golden/ were
//! written by tests/oracles/golden.py (SiglipVisionModel, tied and untied Qwen2ForCausalLM, LLaVA's
//! mlp2x_gelu projector); tessera loads the same files and must compute the same numbers
//! (f32, CPU, within 1e-4).

use crate::support::*;
use std::path::PathBuf;
use tessera_fsdp::ParamMap;
use tessera_model::load_safetensors;
use tessera_model::{Vlm, VlmOptions};

const TOL: f64 = 1e-4;

fn golden() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/golden")
}

fn outputs() -> anyhow::Result<ParamMap> {
    Ok(load_safetensors(&golden().join("outputs.safetensors"))?)
}

fn get<'a>(map: &'a ParamMap, key: &str) -> &'a tch::Tensor {
    map.get(key)
        .unwrap_or_else(|| panic!("fixture has no `{key}`"))
}

#[test]
fn vision_features_and_projector_match_transformers() -> anyhow::Result<()> {
    let dir = golden();
    let options = VlmOptions {
        image_token_id: Some(IMAGE_ID),
        ..Default::default()
    };
    let vlm = Vlm::from_dirs(&dir.join("vision"), &dir.join("lm_tied"), options)?;
    let params = vlm.load_params(
        &dir.join("vision"),
        &dir.join("lm_tied"),
        Some(&dir.join("projector.safetensors")),
        0,
    )?;
    let out = outputs()?;
    let pixels: Vec<u8> = to_i64(get(&out, "pixels_u8"))
        .into_iter()
        .map(|v| v as u8)
        .collect();
    let side = vlm.vision.image_size as usize;
    let tokens = vlm.vision.num_patches() as usize;
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

    let pixel_values = ctx
        .pixel_values
        .as_ref()
        .expect("image micro-batch has pixels");
    assert_close(
        pixel_values,
        get(&out, "pixel_values"),
        1e-6,
        "normalised pixels",
    );
    let pixels = ("vision.embeddings", ctx.first_input());
    let last_layer = format!("vision.layers.{}", vlm.vision.num_hidden_layers - 2);
    let features = run_units(&vlm, &params, &ctx, pixels, &last_layer)?;
    assert_close(
        &features,
        get(&out, "vision_features"),
        TOL,
        "vision hidden_states[-2]",
    );
    let projected = run_units(&vlm, &params, &ctx, ("projector", features), "projector")?;
    let expected = get(&out, "projected").reshape([-1, vlm.lm.hidden_size]);
    assert_close(&projected, &expected, TOL, "projector output");
    Ok(())
}

fn lm_parity(name: &str, expect_tied: bool) -> anyhow::Result<()> {
    let dir = golden();
    // A placeholder id outside the vocabulary: the golden sequences are text only.
    let options = VlmOptions {
        image_token_id: Some(1 << 40),
        ..Default::default()
    };
    let vlm = Vlm::from_dirs(&dir.join("vision"), &dir.join(name), options)?;
    assert_eq!(vlm.tied, expect_tied, "{name}: tied head detection");
    let params = vlm.load_params(&dir.join("vision"), &dir.join(name), None, 0)?;
    let out = outputs()?;
    let ids = get(&out, &format!("{name}_input_ids"));
    let (rows, len) = (ids.size()[0] as usize, ids.size()[1] as usize);
    let mb = raw_text_batch(
        rows,
        len,
        to_i64(ids),
        to_i64(get(&out, &format!("{name}_labels"))),
        to_i64(get(&out, &format!("{name}_positions"))),
    );

    let logits = vlm.logits(&params, &mb)?;
    assert_close(
        &logits,
        get(&out, &format!("{name}_logits")),
        TOL,
        &format!("{name} logits"),
    );

    let (loss_sum, supervised) = vlm.loss(&params, &mb)?;
    assert_eq!(supervised as usize, mb.supervised_tokens);
    let mean = scalar(&loss_sum) / supervised as f64;
    let expected = scalar(&get(&out, &format!("{name}_loss")).reshape([]));
    assert!(
        (mean - expected).abs() < TOL,
        "{name} loss {mean} vs transformers {expected}"
    );
    Ok(())
}

#[test]
fn tied_qwen2_logits_and_loss_match_transformers() -> anyhow::Result<()> {
    // This checkpoint's config nests rope_theta in `rope_parameters` (transformers 5).
    lm_parity("lm_tied", true)
}

#[test]
fn untied_qwen2_logits_and_loss_match_transformers() -> anyhow::Result<()> {
    // This one has `lm_head.weight` and a top-level `rope_theta` of 1e6 (released Qwen2.5 form).
    lm_parity("lm_untied", false)
}
