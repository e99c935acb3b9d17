//! The chunked loss: same value and same gradients as the plain full-logits cross-entropy,
//! whatever the chunk length, and a zero-loss micro-batch still back-propagates.

use crate::support::*;
use tch::{Kind, Tensor};
use tessera_batch::IGNORE_INDEX;
use tessera_model::testing::{chunked_cross_entropy_sum, full_cross_entropy_sum};

fn leaf(t: Tensor) -> Tensor {
    t.set_requires_grad(true)
}

#[test]
fn chunked_loss_and_gradients_equal_full_logits() {
    tch::manual_seed(3);
    let (n, d, v) = (37, 16, 101);
    let h0 = Tensor::randn([n, d], (Kind::Float, tch::Device::Cpu));
    let w0 = Tensor::randn([v, d], (Kind::Float, tch::Device::Cpu)) * 0.5;
    let targets = Tensor::randint(v, [n], (Kind::Int64, tch::Device::Cpu));
    let (h_full, w_full) = (leaf(h0.copy()), leaf(w0.copy()));
    let full = full_cross_entropy_sum(&h_full, &w_full, &targets);
    full.backward();
    for chunk in [1, 8, 37, 100] {
        let (h, w) = (leaf(h0.copy()), leaf(w0.copy()));
        // Something before h and an upstream gradient of 3, as in a real backward.
        let loss = chunked_cross_entropy_sum(&(&h * 1.0), &w, &targets, chunk);
        assert!(
            (scalar(&loss) - scalar(&full)).abs() < 1e-3,
            "chunk {chunk}: value"
        );
        (loss * 3.0).backward();
        assert_close(
            &h.grad(),
            &(h_full.grad() * 3.0),
            1e-4,
            &format!("chunk {chunk}: dL/dh"),
        );
        assert_close(
            &w.grad(),
            &(w_full.grad() * 3.0),
            1e-4,
            &format!("chunk {chunk}: dL/dW"),
        );
    }
}

/// bf16 hidden states and head (this CPU's bf16 product path, see `gemm.rs`): the value and the
/// gradients follow the exact (f64) full-logits loss of the same bf16 values to bf16 precision.
#[test]
fn bf16_chunked_loss_and_gradients_follow_the_exact_loss() {
    tch::manual_seed(5);
    let (n, d, v) = (40, 16, 101);
    let bf16 = |t: Tensor| t.to_kind(Kind::BFloat16);
    let h0 = bf16(Tensor::randn([n, d], (Kind::Float, tch::Device::Cpu)));
    let w0 = bf16(Tensor::randn([v, d], (Kind::Float, tch::Device::Cpu)) * 0.5);
    let targets = Tensor::randint(v, [n], (Kind::Int64, tch::Device::Cpu));
    let (h_exact, w_exact) = (
        leaf(h0.to_kind(Kind::Double)),
        leaf(w0.to_kind(Kind::Double)),
    );
    let exact = full_cross_entropy_sum(&h_exact, &w_exact, &targets);
    exact.backward();
    let relative = |got: &Tensor, want: &Tensor| {
        let want = want.to_kind(Kind::Double);
        let diff = (got.to_kind(Kind::Double) - &want).abs().max();
        scalar(&diff) / scalar(&want.abs().max())
    };
    for chunk in [7, 40] {
        let (h, w) = (leaf(h0.copy()), leaf(w0.copy()));
        let loss = chunked_cross_entropy_sum(&(&h * 1.0), &w, &targets, chunk);
        let value_error = (scalar(&loss) - scalar(&exact)).abs() / scalar(&exact);
        assert!(
            value_error < 1e-3,
            "chunk {chunk}: loss off by {value_error} relative"
        );
        loss.backward();
        assert_eq!(h.grad().kind(), Kind::BFloat16);
        for (name, got, want) in [
            ("dL/dh", h.grad(), h_exact.grad()),
            ("dL/dW", w.grad(), w_exact.grad()),
        ] {
            let e = relative(&got, &want);
            assert!(
                e < 1e-2,
                "chunk {chunk}: {name} off by {e} of its largest value"
            );
        }
    }
}

#[test]
fn frozen_weight_gets_no_gradient_and_hidden_still_does() {
    tch::manual_seed(4);
    let h = leaf(Tensor::randn([9, 8], (Kind::Float, tch::Device::Cpu)));
    let w = Tensor::randn([20, 8], (Kind::Float, tch::Device::Cpu));
    let targets = Tensor::randint(20, [9], (Kind::Int64, tch::Device::Cpu));
    chunked_cross_entropy_sum(&h, &w, &targets, 4).backward();
    let h2 = leaf(h.detach().copy());
    full_cross_entropy_sum(&h2, &w, &targets).backward();
    assert_close(&h.grad(), &h2.grad(), 1e-5, "dL/dh with a frozen W");
    assert!(
        !w.grad().defined(),
        "a frozen weight must not receive a gradient"
    );
}

#[test]
fn model_loss_gradient_matches_full_logits_through_the_head() -> anyhow::Result<()> {
    let (vlm, mut params) = tiny_vlm(None);
    let mb = micro_batch(&[vec![text_sample(9, 1), text_sample(4, 2)]], 0, 0);
    for t in params.values_mut() {
        *t = t.detach().set_requires_grad(true);
    }
    let (loss, n) = vlm.loss(&params, &mb)?;
    loss.backward();
    let chunked_grad = params["model.norm.weight"].grad().copy();
    let embed_grad = params["model.embed_tokens.weight"].grad().copy();
    for t in params.values_mut() {
        *t = t.detach().set_requires_grad(true);
    }
    let logits = vlm.logits(&params, &mb)?.reshape([-1, vlm.lm.vocab_size]);
    let labels = Tensor::from_slice(&mb.labels);
    let full =
        logits.cross_entropy_loss::<Tensor>(&labels, None, tch::Reduction::Sum, IGNORE_INDEX, 0.0);
    full.backward();
    assert_eq!(n as usize, mb.supervised_tokens);
    assert!((scalar(&loss) - scalar(&full)).abs() < 1e-4);
    assert_close(
        &chunked_grad,
        &params["model.norm.weight"].grad(),
        1e-5,
        "final norm gradient",
    );
    assert_close(
        &embed_grad,
        &params["model.embed_tokens.weight"].grad(),
        1e-5,
        "tied embedding gradient",
    );
    Ok(())
}

#[test]
fn zero_loss_micro_batch_is_zero_and_back_propagates() -> anyhow::Result<()> {
    let (vlm, mut params) = tiny_vlm(None);
    let mut mb = micro_batch(&[vec![text_sample(6, 5)]], 0, 0);
    mb.labels.iter_mut().for_each(|l| *l = IGNORE_INDEX);
    mb.zero_loss = true;
    let key = "model.layers.0.mlp.up_proj.weight";
    let t = params[key].detach().set_requires_grad(true);
    params.insert(key.into(), t);
    let (loss, n) = vlm.loss(&params, &mb)?;
    assert_eq!((scalar(&loss), n), (0.0, 0));
    loss.backward();
    assert_eq!(
        params[key].grad().abs().sum(Kind::Float).double_value(&[]),
        0.0
    );
    Ok(())
}
