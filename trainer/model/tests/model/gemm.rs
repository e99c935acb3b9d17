//! bf16 products through the f32 kernels (CPUs without bf16 arithmetic) give the native bf16
//! products' values: bf16 results within one rounding of the exact product, forward and
//! backward (the widened linear is a custom autograd node, `csrc/widened_linear.cpp`); small
//! row counts and f32 tensors take the plain kernels untouched.
use tch::{Device, Kind, Tensor};
use tessera_model::CpuBf16Gemm::{Native, ViaF32};
use tessera_sys::ShimError;

fn randn(shape: &[i64], seed: i64) -> Tensor {
    tch::manual_seed(seed);
    Tensor::randn(shape, (Kind::Float, Device::Cpu))
}

fn bf16(t: &Tensor) -> Tensor {
    t.to_kind(Kind::BFloat16)
}

/// Largest |got - exact| over max |exact|: a bf16 result rounds each value to 2^-9 of itself.
fn error_over_max(got: &Tensor, exact: &Tensor) -> f64 {
    assert_eq!(got.kind(), Kind::BFloat16, "a bf16 product stays bf16");
    let exact = exact.to_kind(Kind::Double);
    let diff = (got.to_kind(Kind::Double) - &exact)
        .abs()
        .max()
        .double_value(&[]);
    diff / exact.abs().max().double_value(&[])
}

const ONE_ROUNDING: f64 = 1.0 / 256.0;

#[test]
fn widened_linear_matmul_and_patch_conv_match_the_exact_product_like_native_bf16(
) -> Result<(), ShimError> {
    let (x, w, b) = (
        bf16(&randn(&[2, 40, 96], 1)),
        bf16(&randn(&[80, 96], 2)),
        bf16(&randn(&[80], 3)),
    );
    let exact = x
        .to_kind(Kind::Double)
        .linear(&w.to_kind(Kind::Double), Some(&b.to_kind(Kind::Double)));
    for mode in [Native, ViaF32] {
        let e = error_over_max(&mode.linear(&x, &w, Some(&b))?, &exact);
        assert!(e <= ONE_ROUNDING, "{mode:?} linear: error {e} of max");
    }

    let (a, m) = (bf16(&randn(&[64, 96], 4)), bf16(&randn(&[96, 72], 5)));
    let exact = a.to_kind(Kind::Double).matmul(&m.to_kind(Kind::Double));
    for mode in [Native, ViaF32] {
        let e = error_over_max(&mode.matmul(&a, &m), &exact);
        assert!(e <= ONE_ROUNDING, "{mode:?} matmul: error {e} of max");
    }

    let (pixels, kernel, bias) = (
        bf16(&randn(&[2, 3, 28, 28], 6)),
        bf16(&randn(&[32, 3, 7, 7], 7)),
        bf16(&randn(&[32], 8)),
    );
    let d = |t: &Tensor| t.to_kind(Kind::Double);
    let exact = d(&pixels).conv2d(&d(&kernel), Some(&d(&bias)), [7, 7], [0, 0], [1, 1], 1);
    for mode in [Native, ViaF32] {
        let e = error_over_max(&mode.patch_conv(&pixels, &kernel, &bias, 7), &exact);
        assert!(e <= ONE_ROUNDING, "{mode:?} patch conv: error {e} of max");
    }
    Ok(())
}

#[test]
fn gradients_through_the_widened_linear_are_bf16_and_match_native() -> Result<(), ShimError> {
    let x0 = bf16(&randn(&[48, 64], 11));
    let w0 = bf16(&randn(&[56, 64], 12));
    let b0 = bf16(&randn(&[56], 14));
    let upstream = bf16(&randn(&[48, 56], 13));
    let grads = |mode: tessera_model::CpuBf16Gemm| {
        let x = x0.detach().set_requires_grad(true);
        let w = w0.detach().set_requires_grad(true);
        let b = b0.detach().set_requires_grad(true);
        let y = mode.linear(&x, &w, Some(&b))?;
        (&y * &upstream).sum(Kind::Float).backward();
        Ok::<_, ShimError>((x.grad(), w.grad(), b.grad()))
    };
    let (gx_native, gw_native, gb_native) = grads(Native)?;
    let (gx_wide, gw_wide, gb_wide) = grads(ViaF32)?;
    let d = |t: &Tensor| t.to_kind(Kind::Double);
    let exact_gx = d(&upstream).matmul(&d(&w0));
    let exact_gw = d(&upstream).tr().matmul(&d(&x0));
    let exact_gb = d(&upstream).sum_dim_intlist(0, false, Kind::Double);
    for (name, got, exact) in [
        ("native dx", &gx_native, &exact_gx),
        ("widened dx", &gx_wide, &exact_gx),
        ("native dw", &gw_native, &exact_gw),
        ("widened dw", &gw_wide, &exact_gw),
        ("native db", &gb_native, &exact_gb),
        ("widened db", &gb_wide, &exact_gb),
    ] {
        let e = error_over_max(got, exact);
        assert!(e <= ONE_ROUNDING, "{name}: error {e} of max");
    }
    Ok(())
}

#[test]
fn few_rows_and_f32_operands_take_the_plain_kernels() -> Result<(), ShimError> {
    // 8 rows: a decode step's product stays on the native kernel, bit for bit.
    let (x, w) = (bf16(&randn(&[8, 96], 21)), bf16(&randn(&[80, 96], 22)));
    assert!(ViaF32
        .linear(&x, &w, None)?
        .equal(&x.linear::<Tensor>(&w, None)));
    // f32 operands: nothing to widen, the f32 kernel's own result.
    let (x, w) = (randn(&[64, 96], 23), randn(&[80, 96], 24));
    let y = ViaF32.linear(&x, &w, None)?;
    assert_eq!(y.kind(), Kind::Float);
    assert!(y.equal(&x.linear::<Tensor>(&w, None)));
    Ok(())
}

/// A product the shim cannot compute (the weight's width is not the input's) comes back as an
/// error naming the operation, with libtorch's message, instead of a panic.
#[test]
fn a_failing_widened_linear_is_an_error_naming_the_op() {
    let (x, w) = (bf16(&randn(&[64, 96], 31)), bf16(&randn(&[80, 95], 32)));
    let err = match ViaF32.linear(&x, &w, None) {
        Err(e) => e,
        Ok(y) => panic!("a [64, 96] x [80, 95]ᵀ product gave {:?}", y.size()),
    };
    assert_eq!(err.op, "widened bf16 linear");
    assert!(!err.message.is_empty());
    assert!(
        err.to_string().starts_with("widened bf16 linear: "),
        "{err}"
    );
}

/// The start-of-run measurement times both kernels and picks by its one rule: the widened
/// product when it takes under 0.9x the native one's time.
#[test]
fn the_measurement_times_both_kernels_and_picks_the_faster() -> Result<(), ShimError> {
    let timing = tessera_model::CpuBf16Gemm::measure()?;
    assert!(
        timing.native_s > 0.0 && timing.widened_s > 0.0,
        "{timing:?}"
    );
    let want = if timing.widened_s < 0.9 * timing.native_s {
        ViaF32
    } else {
        Native
    };
    assert_eq!(timing.faster(), want, "{timing:?}");
    let parity = tessera_model::GemmTiming {
        native_s: 1.0,
        widened_s: 0.95,
    };
    assert_eq!(parity.faster(), Native);
    Ok(())
}
