//! Qwen3-MoE against transformers: `tests/oracles/qwen3_moe_parity.py` (run once per test
//! binary, in scripts/setup/setup.sh's `.deps/hfvenv`) writes tiny random `Qwen3MoeForCausalLM`
//! checkpoints in the Hub's per-expert layout (top-1, top-2 renormalised with a dense layer,
//! top-3 raw) with their logits, losses and every parameter's gradient of
//! `ce + router_aux_loss_coef · aux`; tessera must compute the same (f32, within 1e-4) through
//! the plain chain, through FSDP's engine (whose backward adds each sparse layer's share of
//! the balance loss itself), and through the generator. MoE variants tessera does not
//! implement are refused naming what asks for them.
use crate::support::*;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;
use tessera_fsdp::dist::ProcessGroup;
use tessera_fsdp::{Fsdp, FsdpConfig, ParamMap, Recompute};
use tessera_model::{load_safetensors, Generator, LmFamily, Vlm, VlmOptions};

const TOL: f64 = 1e-4;
const VARIANTS: [&str; 3] = ["top2-norm", "top1", "top3-raw"];

/// The folder the oracle wrote every variant into (once for all tests of the binary).
fn oracle() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| run_oracle("tests/oracles/qwen3_moe_parity.py"))
}

/// A variant's model, its parameters (every LM weight trainable), the oracle's outputs and
/// its micro-batch.
fn load(variant: &str) -> anyhow::Result<(Vlm, ParamMap, ParamMap, tessera_batch::MicroBatch)> {
    let dir = oracle().join(variant);
    let lm = dir.join("model");
    let options = VlmOptions {
        image_token_id: Some(1 << 40),
        train_lm: true,
        ..Default::default()
    };
    let vlm = Vlm::from_dirs(&golden_vision(), &lm, options)?;
    assert_eq!(vlm.lm.family(), LmFamily::Qwen3Moe, "{variant}");
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
    Ok((vlm, params, out, mb))
}

/// Every `grad.KEY` of the oracle against `grads[KEY]`, relative to the tensor's largest
/// entry; each LM parameter has one.
fn assert_grads(variant: &str, grads: &ParamMap, out: &ParamMap, how: &str) {
    let mut checked = 0;
    for (key, want) in out.iter().filter(|(k, _)| k.starts_with("grad.")) {
        let name = &key["grad.".len()..];
        // An expert no token reached has no gradient in autograd (transformers' fused tensor
        // holds zeros for it).
        let zeros = want.zeros_like();
        let got = grads.get(name).unwrap_or(&zeros);
        let scale = want.abs().max().double_value(&[]).max(1e-6);
        let diff = max_abs_diff(got, want);
        assert!(
            diff <= TOL * scale,
            "{variant} {how}: {name} gradient differs by {diff:e} (largest {scale:e})"
        );
        checked += 1;
    }
    assert!(checked > 10, "{variant}: only {checked} gradients compared");
}

#[test]
fn qwen3_moe_logits_losses_and_gradients_match_transformers() -> anyhow::Result<()> {
    for variant in VARIANTS {
        let (vlm, mut params, out, mb) = load(variant)?;
        let expected = get(&out, "logits");
        assert_close(
            &vlm.logits(&params, &mb)?,
            expected,
            TOL,
            &format!("{variant} logits"),
        );
        vlm.mark_trainable(&mut params);
        let (sum, supervised, balance) = vlm.loss_and_balance(&params, &mb)?;
        let balance = balance.expect("an MoE LM reports its balance loss");
        let ce = &sum / supervised as f64;
        let total = &ce + &balance * vlm.lm.router_aux_loss_coef();
        for (what, got, key) in [("ce", &ce, "ce_loss"), ("aux", &balance, "aux_loss")] {
            let want = scalar(&get(&out, key).reshape([]));
            let got = scalar(got);
            assert!(
                (got - want).abs() <= TOL * want.abs(),
                "{variant} {what} loss {got} vs transformers {want}"
            );
        }
        total.backward();
        let grads: ParamMap = params
            .iter()
            .filter(|(_, t)| t.grad().defined())
            .map(|(k, t)| (k.clone(), t.grad()))
            .collect();
        assert_grads(variant, &grads, &out, "autograd");

        // The generator's KV-cache path routes the same way.
        let generator = Generator::new(
            &vlm,
            params
                .iter()
                .map(|(k, t)| (k.clone(), t.detach()))
                .collect(),
        )?;
        let len = expected.size()[1] as usize;
        let prompt: Vec<i64> = to_i64(get(&out, "input_ids"))[..len].to_vec();
        assert_close(
            &generator.prompt_logits(&prompt, &[])?,
            &expected.get(0),
            TOL,
            &format!("{variant} generator logits"),
        );
    }
    Ok(())
}

#[test]
fn fsdp_adds_each_sparse_layers_share_of_the_balance_loss_in_backward() -> anyhow::Result<()> {
    // The engine never sees the balance loss as a whole: each sparse layer adds its share in
    // its own backward (after a recompute, or through the graph its forward kept).
    for variant in ["top2-norm", "top3-raw"] {
        for recompute in [Recompute::All, Recompute::None, Recompute::Selective] {
            let (vlm, params, out, mb) = load(variant)?;
            let single = ProcessGroup::single(Duration::from_secs(60))?;
            let config = FsdpConfig {
                recompute,
                ..FsdpConfig::default()
            };
            let mut fsdp = Fsdp::new(vlm.units(), &single, &params, config)?;
            let mut ctx = vlm.ctx(&ParamMap::new(), &mb)?;
            ctx.share_balance_loss(vlm.lm.router_aux_loss_coef(), 1);
            ctx.set_recompute_cheap_ops(recompute.recomputes_cheap_ops());
            let sum = fsdp
                .forward_backward(&ctx, &ctx.first_input(), 1.0 / ctx.supervised as f64)?
                .sum;
            let want = scalar(&get(&out, "ce_loss").reshape([])) * ctx.supervised as f64;
            assert!(
                (sum - want).abs() <= TOL * want,
                "{variant}: token loss sum {sum} vs {want}"
            );
            let stats = ctx.router_log.stats().expect("router stats");
            let aux = scalar(&get(&out, "aux_loss").reshape([]));
            assert!(
                (stats.aux_loss - aux).abs() <= TOL * aux,
                "{variant}: aux {}",
                stats.aux_loss
            );
            // Every token reached k experts in every sparse layer.
            let k = vlm.lm.experts_per_token() as f64;
            for (layer, load) in &stats.loads {
                let slots: f64 = load.iter().sum();
                assert_eq!(slots, k * 24.0, "{variant} layer {layer}: {load:?}");
            }
            assert_grads(
                variant,
                &fsdp.gather_grads()?,
                &out,
                &format!("{recompute:?}"),
            );
        }
    }
    Ok(())
}

#[test]
fn moe_variants_tessera_does_not_implement_are_refused_by_name() -> anyhow::Result<()> {
    let lm = oracle().join("top1/model");
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(lm.join("config.json"))?)?;
    let cases = [
        (
            serde_json::json!({"model_type": "qwen2_moe"}),
            "shared expert",
        ),
        (
            serde_json::json!({"shared_expert_intermediate_size": 64}),
            "shared_expert_intermediate_size = 64 asks for a shared expert",
        ),
        (
            serde_json::json!({"scoring_func": "sigmoid"}),
            "scoring_func = \"sigmoid\"",
        ),
        (
            serde_json::json!({"moe_router_bias": true}),
            "an expert bias in the router",
        ),
        (
            serde_json::json!({"num_experts_per_tok": 9}),
            "num_experts_per_tok 9 must be in 1..=num_experts (4)",
        ),
        (
            serde_json::json!({"model_type": "qwen3"}),
            "is it qwen3_moe?",
        ),
        (serde_json::json!({"model_type": "mixtral"}), "qwen3_moe is"),
    ];
    for (edit, expect) in cases {
        let mut edited = config.clone();
        for (k, v) in edit.as_object().expect("an object") {
            edited[k] = v.clone();
        }
        let err = tessera_model::LmConfig::from_json(edited, &lm)
            .expect_err(&format!("{edit} is refused"));
        let message = format!("{err}");
        assert!(
            message.contains(expect) && message.contains(&lm.display().to_string()),
            "{edit}: {message}"
        );
    }
    Ok(())
}
