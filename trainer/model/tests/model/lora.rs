//! LoRA in PEFT's format: fresh adapters leave the model unchanged, a saved adapter loads
//! back to the same outputs, and merging gives W + (alpha/r)·B·A with the same outputs.

use crate::support::*;
use tessera_fsdp::ParamMap;
use tessera_model::{
    init_adapters, load_adapter, merge_adapters, save_adapter, ADAPTER_CONFIG, ADAPTER_WEIGHTS,
};
use tessera_model::{LoraConfig, Vlm};

fn lora_cfg() -> LoraConfig {
    LoraConfig {
        r: 4,
        lora_alpha: 8.0,
        lora_dropout: 0.0,
        ..Default::default()
    }
}

fn without_lora(params: &ParamMap) -> ParamMap {
    params
        .iter()
        .filter(|(k, _)| !k.contains(".lora_"))
        .map(|(k, v)| (k.clone(), v.shallow_clone()))
        .collect()
}

#[test]
fn fresh_adapters_follow_peft_init_and_change_nothing() -> anyhow::Result<()> {
    let (lora_vlm, random) = tiny_vlm(Some(lora_cfg()));
    let (base_vlm, _) = tiny_vlm(None);
    let mut params = without_lora(&random);
    let fresh = init_adapters(&lora_vlm.param_specs(), 11);
    // 7 target modules x 2 layers x (A, B)
    assert_eq!(fresh.len(), 28);
    let a = &fresh["model.layers.0.self_attn.q_proj.lora_A.weight"];
    assert_eq!(a.size(), vec![4, 32]);
    let bound = 1.0 / 32f64.sqrt();
    assert!(
        a.abs().max().double_value(&[]) <= bound && a.abs().max().double_value(&[]) > 0.5 * bound
    );
    assert_eq!(
        fresh["model.layers.1.mlp.down_proj.lora_B.weight"].size(),
        vec![32, 4]
    );
    assert!(fresh
        .iter()
        .filter(|(k, _)| k.contains("lora_B"))
        .all(|(_, t)| t.abs().sum(tch::Kind::Float).double_value(&[]) == 0.0));
    let mb = micro_batch(&[vec![text_sample(8, 1)]], 0, 0);
    let base = base_vlm.logits(&params, &mb)?;
    params.extend(fresh);
    assert_close(
        &lora_vlm.logits(&params, &mb)?,
        &base,
        0.0,
        "zero B leaves outputs unchanged",
    );
    Ok(())
}

#[test]
fn adapter_round_trip_and_merge() -> anyhow::Result<()> {
    let cfg = LoraConfig {
        target_modules: vec!["q_proj".into(), "v_proj".into(), "down_proj".into()],
        ..lora_cfg()
    };
    let options = tessera_model::VlmOptions {
        image_token_id: Some(IMAGE_ID),
        lora: Some(cfg.clone()),
        ..Default::default()
    };
    let vlm = Vlm::new(tiny_vision(), tiny_lm(), true, options)?;
    // Random (non-zero) A and B, so the adapters matter.
    let params = tessera_model::testing::random_params(&vlm.param_specs(), 5, 0.1);
    let mb = micro_batch(&[vec![text_sample(8, 1), text_sample(5, 3)]], 0, 0);
    let with_lora = vlm.logits(&params, &mb)?;

    let dir = tempfile::tempdir()?;
    save_adapter(dir.path(), &cfg, &params, "tiny-lm")?;
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join(ADAPTER_CONFIG))?)?;
    assert_eq!(config["peft_type"], "LORA");
    assert_eq!(config["task_type"], "CAUSAL_LM");
    assert_eq!(config["r"], 4);
    assert_eq!(config["bias"], "none");
    assert_eq!(config["base_model_name_or_path"], "tiny-lm");
    let raw = tessera_model::load_safetensors(&dir.path().join(ADAPTER_WEIGHTS))?;
    assert_eq!(
        raw["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"].size(),
        vec![4, 32]
    );
    assert_eq!(
        raw["base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"].size(),
        vec![32, 4]
    );
    assert_eq!(raw.len(), 2 * 3 * 2);

    let (loaded_cfg, adapters) = load_adapter(dir.path())?;
    assert_eq!(loaded_cfg, cfg);
    let mut reloaded = without_lora(&params);
    reloaded.extend(adapters);
    assert_close(
        &vlm.logits(&reloaded, &mb)?,
        &with_lora,
        0.0,
        "outputs after save + load",
    );

    let merged = merge_adapters(&cfg, &params)?;
    assert!(merged.keys().all(|k| !k.contains("lora")));
    let q = "model.layers.1.self_attn.q_proj";
    let expected = &params[&format!("{q}.weight")]
        + params[&format!("{q}.lora_B.weight")].matmul(&params[&format!("{q}.lora_A.weight")])
            * 2.0;
    assert_close(
        &merged[&format!("{q}.weight")],
        &expected,
        1e-6,
        "W + (alpha/r) B A",
    );
    let k = "model.layers.1.self_attn.k_proj.weight";
    assert_close(&merged[k], &params[k], 0.0, "untargeted module unchanged");
    let (base_vlm, _) = tiny_vlm(None);
    assert_close(
        &base_vlm.logits(&merged, &mb)?,
        &with_lora,
        1e-5,
        "merged model = base + adapters",
    );
    Ok(())
}

#[test]
fn lora_params_are_the_trainable_ones_of_each_layer() {
    let (vlm, _) = tiny_vlm(Some(lora_cfg()));
    let layer = vlm
        .units()
        .iter()
        .find(|u| u.name() == "layers.1")
        .expect("layer unit");
    let trainable: Vec<&str> = layer
        .params()
        .iter()
        .filter(|p| p.trainable)
        .map(|p| p.name.as_str())
        .collect();
    assert_eq!(trainable.len(), 14);
    assert!(trainable
        .iter()
        .all(|n| n.starts_with("model.layers.1.") && n.contains(".lora_")));
    assert!(layer
        .params()
        .iter()
        .filter(|p| !p.trainable)
        .all(|p| !p.name.contains("lora")));
}
