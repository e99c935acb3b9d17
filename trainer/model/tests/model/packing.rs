//! Packed rows: samples packed into one row (block-diagonal causal attention, positions
//! restarting per sample) must compute exactly what each sample computes alone, and image
//! tokens must land at the placeholder positions.

use crate::support::*;
use tch::{Device, Kind, Tensor};
use tessera_batch::IGNORE_INDEX;
use tessera_model::testing::{
    attend, attend_spans, attend_varlen, block_causal_mask, row_spans, Varlen,
};
use tessera_model::VlmCtx;

const TOL: f64 = 1e-5;

/// Logits of the tokens `start..start+len` of row `row`.
fn slice(logits: &Tensor, row: i64, start: i64, len: i64) -> Tensor {
    logits.get(row).narrow(0, start, len)
}

#[test]
fn packed_text_row_equals_each_sample_alone() -> anyhow::Result<()> {
    let (vlm, params) = tiny_vlm(None);
    let (a, b) = (text_sample(7, 1), text_sample(5, 2));
    // Row 0 packs a then b; row 1 holds b alone and is padded, so padding is exercised too.
    let packed = micro_batch(&[vec![a.clone(), b.clone()], vec![b.clone()]], 0, 0);
    let logits = vlm.logits(&params, &packed)?;
    let alone_a = vlm.logits(&params, &micro_batch(&[vec![a.clone()]], 0, 0))?;
    let alone_b = vlm.logits(&params, &micro_batch(&[vec![b.clone()]], 0, 0))?;

    assert_close(
        &slice(&logits, 0, 0, 7),
        &alone_a.get(0),
        TOL,
        "sample a packed first",
    );
    assert_close(
        &slice(&logits, 0, 7, 5),
        &alone_b.get(0),
        TOL,
        "sample b packed second",
    );
    assert_close(
        &slice(&logits, 1, 0, 5),
        &alone_b.get(0),
        TOL,
        "sample b in a padded row",
    );
    // Without the block-diagonal mask, b would see a: make sure the test could fail.
    let naive = {
        let mut mb = packed.clone();
        mb.segment_ids.iter_mut().take(12).for_each(|s| *s = 0);
        vlm.logits(&params, &mb)?
    };
    assert!(
        max_abs_diff(&slice(&naive, 0, 7, 5), &alone_b.get(0)) > 1e-3,
        "mask had no effect"
    );

    let (packed_loss, n) = vlm.loss(&params, &packed)?;
    let (loss_a, na) = vlm.loss(&params, &micro_batch(&[vec![a]], 0, 0))?;
    let (loss_b, nb) = vlm.loss(&params, &micro_batch(&[vec![b]], 0, 0))?;
    assert_eq!(n, na + 2 * nb);
    let expected = scalar(&loss_a) + 2.0 * scalar(&loss_b);
    assert!(
        (scalar(&packed_loss) - expected).abs() < 1e-4,
        "{} vs {expected}",
        scalar(&packed_loss)
    );
    Ok(())
}

#[test]
fn the_head_splits_a_packed_loss_by_each_samples_source() -> anyhow::Result<()> {
    let (vlm, params) = tiny_vlm(None);
    let (a, b, c) = (text_sample(7, 1), text_sample(5, 2), text_sample(6, 3));
    // Row 0 packs a (source 2) then b (source 0); row 1 holds c (source 2), padded.
    let mut packed = micro_batch(&[vec![a.clone(), b.clone()], vec![c.clone()]], 0, 0);
    packed.sample_sources = vec![2, 0, 2];
    let ctx = vlm.ctx(&params, &packed)?;
    let head = run_units(&vlm, &params, &ctx, ("embed", ctx.first_input()), "head")?;
    let out: Vec<f64> = Vec::try_from(head.to_kind(Kind::Double))?;
    let alone = |s: &TestSample| -> anyhow::Result<f64> {
        Ok(scalar(
            &vlm.loss(&params, &micro_batch(&[vec![s.clone()]], 0, 0))?.0,
        ))
    };
    let (la, lb, lc) = (alone(&a)?, alone(&b)?, alone(&c)?);
    // The summed loss first, then sources 0, 1 (no sample) and 2.
    let expected = [la + lb + lc, lb, 0.0, la + lc];
    assert_eq!(out.len(), expected.len(), "{out:?}");
    for (got, want) in out.iter().zip(expected) {
        assert!((got - want).abs() < 1e-4, "{out:?} vs {expected:?}");
    }
    // The summed loss is the head's first element whatever the sources.
    let (sum, _) = vlm.loss(&params, &packed)?;
    assert!((scalar(&sum) - expected[0]).abs() < 1e-4);
    Ok(())
}

#[test]
fn packed_image_samples_equal_each_alone() -> anyhow::Result<()> {
    let (vlm, params) = tiny_vlm(None);
    let side = vlm.vision.image_size as usize;
    let tokens = vlm.vision.num_patches() as usize;
    let (a, b) = (
        image_sample(tokens, 4, 1, side),
        image_sample(tokens, 6, 2, side),
    );
    let t = text_sample(3, 9);
    let packed = micro_batch(&[vec![a.clone(), t.clone(), b.clone()]], side, tokens);
    let logits = vlm.logits(&params, &packed)?;
    let (la, lb) = (a.ids.len() as i64, b.ids.len() as i64);
    let alone_a = vlm.logits(&params, &micro_batch(&[vec![a]], side, tokens))?;
    let alone_b = vlm.logits(&params, &micro_batch(&[vec![b]], side, tokens))?;
    assert_close(
        &slice(&logits, 0, 0, la),
        &alone_a.get(0),
        TOL,
        "image sample a",
    );
    assert_close(
        &slice(&logits, 0, la + 3, lb),
        &alone_b.get(0),
        TOL,
        "image sample b after text",
    );
    Ok(())
}

#[test]
fn image_tokens_land_at_placeholders_in_order() -> anyhow::Result<()> {
    let (vlm, params) = tiny_vlm(None);
    let side = vlm.vision.image_size as usize;
    let tokens = vlm.vision.num_patches() as usize;
    let rows = vec![
        vec![text_sample(4, 3), image_sample(tokens, 3, 1, side)],
        vec![image_sample(tokens, 5, 2, side)],
    ];
    let mb = micro_batch(&rows, side, tokens);
    let ctx = vlm.ctx(&params, &mb)?;
    let pixels = ("vision.embeddings", ctx.first_input());
    let image_tokens = run_units(&vlm, &params, &ctx, pixels, "projector")?;
    assert_eq!(
        image_tokens.size(),
        vec![2 * tokens as i64, vlm.lm.hidden_size]
    );
    let embeds = run_units(
        &vlm,
        &params,
        &ctx,
        ("embed", image_tokens.shallow_clone()),
        "embed",
    )?
    .reshape([-1, vlm.lm.hidden_size]);
    let text_only = Tensor::empty([0], (Kind::Float, tch::Device::Cpu));
    let plain = run_units(&vlm, &params, &ctx, ("embed", text_only), "embed")?;
    let plain = plain.reshape([-1, vlm.lm.hidden_size]);

    let mut next_image_token = 0;
    for (t, &id) in mb.input_ids.iter().enumerate() {
        let row = embeds.get(t as i64);
        if id == IMAGE_ID {
            let expected = image_tokens.get(next_image_token);
            assert_close(
                &row,
                &expected,
                0.0,
                &format!("position {t}: image token {next_image_token}"),
            );
            assert_ne!(
                mb.labels[t], IMAGE_ID,
                "position {t} must not target a placeholder"
            );
            next_image_token += 1;
        } else {
            assert_close(
                &row,
                &plain.get(t as i64),
                0.0,
                &format!("position {t}: text embedding"),
            );
        }
    }
    assert_eq!(
        next_image_token,
        2 * tokens as i64,
        "every image token placed once"
    );
    // Placeholders are never prediction targets: no supervised label is the placeholder id,
    // and a micro-batch that asks for one is rejected with its sample ids.
    assert!(mb
        .labels
        .iter()
        .all(|&l| l == IGNORE_INDEX || l != IMAGE_ID));
    let mut bad = mb.clone();
    bad.labels[3] = IMAGE_ID;
    let err = vlm
        .ctx(&params, &bad)
        .err()
        .expect("a placeholder label is rejected")
        .to_string();
    assert!(err.contains("placeholder") && err.contains("s0"), "{err}");
    Ok(())
}

#[test]
fn text_only_batches_skip_the_vision_tower() -> anyhow::Result<()> {
    let (vlm, params) = tiny_vlm(None);
    let mb = micro_batch(&[vec![text_sample(6, 4)]], 0, 0);
    let ctx = vlm.ctx(&params, &mb)?;
    let runs: Vec<&str> = vlm
        .units()
        .iter()
        .filter(|u| u.runs_on(&ctx))
        .map(|u| u.name())
        .collect();
    assert_eq!(runs, ["embed", "layers.0", "layers.1", "head"]);
    // And the text-only loss needs no vision or projector parameters at all.
    let lm_only = params
        .iter()
        .filter(|(k, _)| !k.starts_with("vision_model.") && !k.starts_with("mm_projector."))
        .map(|(k, v)| (k.clone(), v.shallow_clone()))
        .collect();
    let (loss, n) = vlm.loss(&lm_only, &mb)?;
    assert_eq!(n, 5);
    assert!(scalar(&loss).is_finite() && scalar(&loss) > 0.0);
    Ok(())
}

/// The span-by-span attention (what varlen attention computes, emulated per packed sample on
/// the CPU) equals the dense block-causal-mask attention, values and gradients, with grouped
/// kv heads, two samples in one row and a padded row.
#[test]
fn span_attention_equals_dense_mask_attention() -> anyhow::Result<()> {
    let (rows, len, heads, kv_heads, hd) = (2i64, 12i64, 4i64, 2i64, 8i64);
    let segments: Vec<i32> = [vec![0; 7], vec![1; 5], vec![0; 5], vec![-1; 7]].concat();
    let spans = row_spans(&segments, rows as usize, len as usize);
    assert_eq!(spans[0].len(), 2);
    assert!(spans[1][1].padding && spans[1][1].len == 7);
    let mask = block_causal_mask(&Tensor::from_slice(&segments).view([rows, len]));
    tch::manual_seed(3);
    let opts = (Kind::Float, Device::Cpu);
    let q = Tensor::randn([rows, heads, len, hd], opts).set_requires_grad(true);
    let k = Tensor::randn([rows, kv_heads, len, hd], opts).set_requires_grad(true);
    let v = Tensor::randn([rows, kv_heads, len, hd], opts).set_requires_grad(true);
    let upstream = Tensor::randn([rows, heads, len, hd], opts);
    let run = |out: Tensor| -> anyhow::Result<Vec<Tensor>> {
        let root = (&out * &upstream).sum(Kind::Float);
        let mut grads = Tensor::f_run_backward(&[root], &[&q, &k, &v], false, false)?;
        grads.insert(0, out.detach());
        Ok(grads)
    };
    let dense = run(attend(&q, &k, &v, Some(&mask)))?;
    let by_span = run(attend_spans(&q, &k, &v, &spans))?;
    for (what, (a, b)) in ["output", "dq", "dk", "dv"]
        .iter()
        .zip(dense.iter().zip(&by_span))
    {
        assert_close(a, b, TOL, what);
    }
    Ok(())
}

/// What the CUDA varlen kernels compute, emulated sequence by sequence on the CPU from the
/// same flattened `[total, heads, hd]` tensors and `cu_seqlens` boundaries the kernels get,
/// equals the dense block-causal-mask attention (values and gradients): samples packed in
/// one row, a padded row (each padding token its own sequence), grouped kv heads.
#[test]
fn varlen_sequences_equal_dense_mask_attention() -> anyhow::Result<()> {
    let (rows, len, heads, kv_heads, hd) = (3i64, 10i64, 6i64, 2i64, 8i64);
    let segments: Vec<i32> = [
        vec![0; 4],
        vec![1; 3],
        vec![2; 3],
        vec![0; 6],
        vec![-1; 4],
        vec![0; 10],
    ]
    .concat();
    let spans = row_spans(&segments, rows as usize, len as usize);
    let varlen = Varlen::from_spans(&spans, len, Device::Cpu)?;
    // Row 0: three samples; row 1: one sample then four padding tokens; row 2: one sample.
    assert_eq!(varlen.bounds, vec![0, 4, 7, 10, 16, 17, 18, 19, 20, 30]);
    assert_eq!(varlen.max_len, 10);
    assert_eq!(
        Vec::<i32>::try_from(&varlen.cu_seqlens)?,
        vec![0, 4, 7, 10, 16, 17, 18, 19, 20, 30]
    );
    let mask = block_causal_mask(&Tensor::from_slice(&segments).view([rows, len]));
    tch::manual_seed(5);
    let opts = (Kind::Float, Device::Cpu);
    let q = Tensor::randn([rows, heads, len, hd], opts).set_requires_grad(true);
    let k = Tensor::randn([rows, kv_heads, len, hd], opts).set_requires_grad(true);
    let v = Tensor::randn([rows, kv_heads, len, hd], opts).set_requires_grad(true);
    let upstream = Tensor::randn([rows, heads, len, hd], opts);
    let run = |out: Tensor| -> anyhow::Result<Vec<Tensor>> {
        let root = (&out * &upstream).sum(Kind::Float);
        let mut grads = Tensor::f_run_backward(&[root], &[&q, &k, &v], false, false)?;
        grads.insert(0, out.detach());
        Ok(grads)
    };
    let dense = run(attend(&q, &k, &v, Some(&mask)))?;
    let varlen_out = run(attend_varlen(&q, &k, &v, &varlen)?)?;
    for (what, (a, b)) in ["output", "dq", "dk", "dv"]
        .iter()
        .zip(dense.iter().zip(&varlen_out))
    {
        assert_close(a, b, TOL, what);
    }
    Ok(())
}

/// The decoder's rotary tables in its compute dtype are cast once per micro-batch and shared
/// by every layer (and FSDP's recompute): the same values as a fresh cast, the same storage on
/// the second ask, and the f32 tables themselves for an f32 model.
#[test]
fn rotary_tables_are_cast_once_per_micro_batch() -> anyhow::Result<()> {
    let mb = micro_batch(&[vec![text_sample(8, 1), text_sample(5, 3)]], 0, 0);
    let (vlm, _) = tiny_vlm(None);
    let ctx = VlmCtx::new(&mb, &vlm.batch_spec(), Device::Cpu)?;
    let (cos, sin) = ctx.rotary_as(Kind::BFloat16);
    assert_eq!(cos.kind(), Kind::BFloat16);
    assert!(cos.equal(&ctx.cos.to_kind(Kind::BFloat16)));
    assert!(sin.equal(&ctx.sin.to_kind(Kind::BFloat16)));
    let (again, _) = ctx.rotary_as(Kind::BFloat16);
    assert_eq!(
        again.data_ptr(),
        cos.data_ptr(),
        "the second layer reuses the cast"
    );
    let (f32_cos, _) = ctx.rotary_as(Kind::Float);
    assert_eq!(f32_cos.data_ptr(), ctx.cos.data_ptr(), "f32 needs no cast");
    Ok(())
}
