//! The model's matrix products (`linear`, `matmul`, the patch convolution), with one choice
//! made for bf16 on the CPU.
//!
//! A bf16 product is defined as bf16 operands, f32 accumulation and a bf16 result. CPUs with
//! bf16 arithmetic (`avx512_bf16`, AMX) run it natively, several times faster than f32. CPUs
//! without it (AVX-512 or AVX2 only) get oneDNN's emulation, measured ~5x *slower* than an
//! f32 GEMM of the same shape (`scripts/bf16_gemm_bench.py`, docs/performance-notes.md). There the same
//! product is computed through the f32 kernels instead: the bf16 operands are widened to f32
//! (exact: every bf16 value is an f32 value), multiplied with f32 accumulation, and the result
//! is rounded to bf16. That is the definition above; only the accumulation order differs from
//! the native kernel, so results agree to within one bf16 rounding step.
//!
//! The choice is made once per process from the CPU's flags; `TESSERA_CPU_BF16_GEMM=native` or
//! `=f32` overrides it. CUDA tensors and f32 tensors always take the plain kernels.
use std::sync::OnceLock;
use tch::{Device, Kind, Tensor};
use tessera_switches::{Bf16Gemm, Switches};
use tessera_sys::kernels::tc_widened_linear;
use tessera_sys::ShimError;

/// Fewer rows than this keep the native kernel whatever the mode: below it, widening the
/// weights costs more than the emulated product saves (`scripts/bf16_gemm_bench.py`: the
/// 151,936 x 896 head, native against widened, breaks even near 16 rows).
pub(crate) const MIN_WIDENED_ROWS: i64 = 16;

/// How bf16 matrix products run on the CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuBf16Gemm {
    /// libtorch's bf16 kernels (native on CPUs with bf16 arithmetic).
    Native,
    /// f32 kernels over the widened bf16 operands, result rounded to bf16.
    ViaF32,
}

impl CpuBf16Gemm {
    /// `TESSERA_CPU_BF16_GEMM` (`native` | `f32`) if set, else [`Self::detect`] (once).
    pub fn current() -> Self {
        static DETECTED: OnceLock<CpuBf16Gemm> = OnceLock::new();
        match Switches::get().cpu_bf16_gemm {
            Some(Bf16Gemm::Native) => CpuBf16Gemm::Native,
            Some(Bf16Gemm::F32) => CpuBf16Gemm::ViaF32,
            None => *DETECTED.get_or_init(Self::detect),
        }
    }

    /// `Native` when the CPU has bf16 arithmetic (`avx512_bf16` or `amx_bf16` in
    /// `/proc/cpuinfo`) or its flags cannot be read; `ViaF32` otherwise.
    pub fn detect() -> Self {
        let Ok(cpuinfo) = std::fs::read_to_string("/proc/cpuinfo") else {
            return CpuBf16Gemm::Native;
        };
        let Some(flags) = cpuinfo.lines().find(|l| l.starts_with("flags")) else {
            return CpuBf16Gemm::Native;
        };
        let has = |flag: &str| flags.split_whitespace().any(|f| f == flag);
        if has("avx512_bf16") || has("amx_bf16") {
            CpuBf16Gemm::Native
        } else {
            CpuBf16Gemm::ViaF32
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            CpuBf16Gemm::Native => "native bf16",
            CpuBf16Gemm::ViaF32 => "f32 kernels (no bf16 arithmetic on this CPU)",
        }
    }

    /// Whether a product with `x` as its left operand goes through f32: a bf16 CPU tensor with
    /// at least [`MIN_WIDENED_ROWS`] rows (a decode step's single row is left to the native
    /// kernel, where widening the weights would cost more than the product).
    pub(crate) fn widens(self, x: &Tensor) -> bool {
        let rows = match x.size().last() {
            Some(&cols) if cols > 0 => x.numel() as i64 / cols,
            _ => 0,
        };
        self == CpuBf16Gemm::ViaF32
            && x.kind() == Kind::BFloat16
            && x.device() == Device::Cpu
            && rows >= MIN_WIDENED_ROWS
    }

    /// `x · wᵀ + b` (`torch.nn.functional.linear`). Widened, it runs as one autograd node
    /// (`csrc/widened_linear.cpp`) that keeps the bf16 operands for backward and widens them
    /// again there, so no f32 copy of a weight outlives the product.
    pub fn linear(self, x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor, ShimError> {
        if !self.widens(x) || w.kind() != Kind::BFloat16 {
            return Ok(x.linear(w, b));
        }
        let mut out = std::ptr::null_mut();
        // SAFETY: tch tensors wrap `torch::Tensor*`; the shim only reads them (its autograd
        // node keeps its own references) and hands back a new tensor on success.
        let err = unsafe {
            tc_widened_linear(
                x.as_ptr(),
                w.as_ptr(),
                b.map_or(std::ptr::null(), |b| b.as_ptr()),
                &mut out,
            )
        };
        // SAFETY: `err` is what the shim just returned.
        unsafe { tessera_sys::take_error(err, "widened bf16 linear") }?;
        // SAFETY: on success `out` is a fresh heap tensor, owned from here.
        Ok(unsafe { Tensor::from_ptr(out) })
    }

    /// `a · b` (`torch.matmul`).
    pub fn matmul(self, a: &Tensor, b: &Tensor) -> Tensor {
        if !self.widens(a) {
            return a.matmul(b);
        }
        wide(a).matmul(&wide(b)).to_kind(Kind::BFloat16)
    }

    /// Convolution with stride = kernel and no padding (SigLIP's patch embedding).
    pub fn patch_conv(self, x: &Tensor, w: &Tensor, b: &Tensor, patch: i64) -> Tensor {
        let conv = |x: &Tensor, w: &Tensor, b: &Tensor| {
            x.conv2d(w, Some(b), [patch, patch], [0, 0], [1, 1], 1)
        };
        if !self.widens(x) {
            return conv(x, w, b);
        }
        conv(&wide(x), &wide(w), &wide(b)).to_kind(Kind::BFloat16)
    }
}

fn wide(t: &Tensor) -> Tensor {
    t.to_kind(Kind::Float)
}

/// [`CpuBf16Gemm::linear`] with this process's choice.
pub(crate) fn linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor, ShimError> {
    CpuBf16Gemm::current().linear(x, w, b)
}

/// [`CpuBf16Gemm::matmul`] with this process's choice.
pub(crate) fn matmul(a: &Tensor, b: &Tensor) -> Tensor {
    CpuBf16Gemm::current().matmul(a, b)
}
