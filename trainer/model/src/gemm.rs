//! The model's matrix products (`linear`, `matmul`, the patch convolution), with one choice
//! made for bf16 on the CPU.
//!
//! A bf16 product is defined as bf16 operands, f32 accumulation and a bf16 result. CPUs with
//! bf16 arithmetic (`avx512_bf16`, AMX) run it natively, several times faster than f32. CPUs
//! without it (AVX-512 or AVX2 only) get oneDNN's emulation, measured ~5x *slower* than an
//! f32 GEMM of the same shape (`scripts/bench/bf16_gemm_bench.py`, docs/performance-notes.md). There the same
//! product is computed through the f32 kernels instead: the bf16 operands are widened to f32
//! (exact: every bf16 value is an f32 value), multiplied with f32 accumulation, and the result
//! is rounded to bf16. That is the definition above; only the accumulation order differs from
//! the native kernel, so results agree to within one bf16 rounding step.
//!
//! The flags are not the speed: a KVM Xeon that reports `avx512_bf16` (no AMX) runs libtorch's
//! native bf16 GEMMs at ~1.9x the f32 time, while an AMD EPYC with the same flag ran the bf16
//! training step faster than the f32 one (BENCHMARKS.md). So
//! a bf16 CPU run measures both ways once at its start ([`CpuBf16Gemm::measure`], on rank 0,
//! which tells the other ranks) and records the choice in its checkpoints, so a resume
//! multiplies the same way ([`CpuBf16Gemm::use_for_process`]). `TESSERA_CPU_BF16_GEMM=native`
//! or `=f32` overrides it; elsewhere (generation, tests) the choice comes from the CPU's flags
//! ([`CpuBf16Gemm::detect`]). CUDA tensors and f32 tensors always take the plain kernels.
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Instant;
use tch::{Device, Kind, Tensor};
use tessera_switches::{Bf16Gemm, Switches};
use tessera_sys::kernels::tc_widened_linear;
use tessera_sys::ShimError;

/// Fewer rows than this keep the native kernel whatever the mode: below it, widening the
/// weights costs more than the emulated product saves (`scripts/bench/bf16_gemm_bench.py`: the
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

/// This process's choice: 0 while none is made, else [`CpuBf16Gemm::code`].
static CHOSEN: AtomicU8 = AtomicU8::new(0);

/// What [`CpuBf16Gemm::measure`] found: the best of three timings of one product each way.
#[derive(Clone, Copy, Debug)]
pub struct GemmTiming {
    pub native_s: f64,
    pub widened_s: f64,
}

impl GemmTiming {
    /// `ViaF32` when the widened product takes under 0.9x the native one's time, else
    /// `Native` (near parity the native kernel keeps its one rounding).
    pub fn faster(&self) -> CpuBf16Gemm {
        if self.widened_s < 0.9 * self.native_s {
            CpuBf16Gemm::ViaF32
        } else {
            CpuBf16Gemm::Native
        }
    }
}

impl CpuBf16Gemm {
    /// `TESSERA_CPU_BF16_GEMM` (`native` | `f32`) if set, else the choice this process made
    /// ([`Self::use_for_process`]), else [`Self::detect`].
    pub fn current() -> Self {
        if let Some(forced) = Self::forced() {
            return forced;
        }
        match Self::from_code(CHOSEN.load(Ordering::Relaxed)) {
            Some(chosen) => chosen,
            None => {
                let detected = Self::detect();
                CHOSEN.store(detected.code(), Ordering::Relaxed);
                detected
            }
        }
    }

    /// The choice `TESSERA_CPU_BF16_GEMM` forces, if it is set.
    pub fn forced() -> Option<Self> {
        match Switches::get().cpu_bf16_gemm {
            Some(Bf16Gemm::Native) => Some(CpuBf16Gemm::Native),
            Some(Bf16Gemm::F32) => Some(CpuBf16Gemm::ViaF32),
            None => None,
        }
    }

    /// Makes `self` this process's choice from now on (a run's measured or recorded one).
    pub fn use_for_process(self) {
        CHOSEN.store(self.code(), Ordering::Relaxed);
    }

    fn code(self) -> u8 {
        match self {
            CpuBf16Gemm::Native => 1,
            CpuBf16Gemm::ViaF32 => 2,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(CpuBf16Gemm::Native),
            2 => Some(CpuBf16Gemm::ViaF32),
            _ => None,
        }
    }

    /// How a run records the choice (`native`, `f32`: `TESSERA_CPU_BF16_GEMM`'s values).
    pub fn record_name(self) -> &'static str {
        match self {
            CpuBf16Gemm::Native => "native",
            CpuBf16Gemm::ViaF32 => "f32",
        }
    }

    /// The choice a run recorded with [`Self::record_name`].
    pub fn from_record(name: &str) -> Option<Self> {
        match name {
            "native" => Some(CpuBf16Gemm::Native),
            "f32" => Some(CpuBf16Gemm::ViaF32),
            _ => None,
        }
    }

    /// Times one bf16 product of a language model's MLP shape (`[256, 1024] · [4096, 1024]ᵀ`)
    /// natively and through the f32 kernels on this CPU, after one warm-up each: the best of
    /// three runs of each (the model test that runs it takes 0.23 s on a 2-core Xeon).
    pub fn measure() -> Result<GemmTiming, ShimError> {
        tch::no_grad(|| {
            tch::manual_seed(0);
            let opts = (Kind::BFloat16, Device::Cpu);
            let x = Tensor::randn([256, 1024], opts);
            let w = Tensor::randn([4096, 1024], opts);
            let best = |mode: CpuBf16Gemm| -> Result<f64, ShimError> {
                let mut fastest = f64::INFINITY;
                for round in 0..4 {
                    let t = Instant::now();
                    let y = mode.linear(&x, &w, None)?;
                    let _ = y.sum(Kind::Float).double_value(&[]);
                    if round > 0 {
                        fastest = fastest.min(t.elapsed().as_secs_f64());
                    }
                }
                Ok(fastest)
            };
            Ok(GemmTiming {
                native_s: best(CpuBf16Gemm::Native)?,
                widened_s: best(CpuBf16Gemm::ViaF32)?,
            })
        })
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
            CpuBf16Gemm::ViaF32 => "f32 kernels over the widened bf16 operands",
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
