//! Which kernels a bf16 run on the CPU multiplies with (`tessera_model::CpuBf16Gemm`): libtorch's
//! native bf16 GEMMs or the f32 ones over widened operands. The CPU's flags do not say which is
//! faster, so a fresh run measures both once (rank 0, whose choice every rank takes) and
//! records the choice in its checkpoints' run record; a resume takes the recorded one, so it
//! multiplies as the run it continues did. `TESSERA_CPU_BF16_GEMM=native|f32` forces a choice (a
//! resume that forces another one than recorded is refused like any changed setting, naming
//! `cpu_bf16_gemm`; `--resume-changing cpu_bf16_gemm` accepts it).
use super::setup::Setup;
use crate::checkpoint::format::Checkpoint;
use crate::config::{Dtype, TrainConfig};
use crate::error::TrainError;
use tch::{Device, Tensor};
use tessera_model::CpuBf16Gemm;

/// The run-record key of the choice.
pub(crate) const RECORD_KEY: &str = "cpu_bf16_gemm";

/// Makes this process's choice for a bf16 run on the CPU and returns it for the run record;
/// `None` for other runs, and for a resume of a checkpoint written before runs recorded the
/// choice (it keeps the flag-based choice those runs made, and records nothing).
pub(crate) fn settle(
    cfg: &TrainConfig,
    s: &Setup,
    resumed: Option<&Checkpoint>,
) -> Result<Option<CpuBf16Gemm>, TrainError> {
    if cfg.precision != Dtype::Bf16 || s.device != Device::Cpu {
        return Ok(None);
    }
    let recorded = resumed.map(|c| c.meta.run.get(RECORD_KEY));
    let (choice, how) = match (CpuBf16Gemm::forced(), recorded) {
        (Some(forced), _) => (forced, "set by TESSERA_CPU_BF16_GEMM".to_string()),
        (None, Some(Some(name))) => {
            let choice = CpuBf16Gemm::from_record(name).ok_or_else(|| {
                let dir = resumed.map_or_else(String::new, |c| c.dir.display().to_string());
                TrainError::Invalid(format!(
                    "checkpoint {dir}: its run record has {RECORD_KEY} = {name:?}, neither \
                     native nor f32"
                ))
            })?;
            (choice, "as the checkpoint recorded".to_string())
        }
        (None, Some(None)) => (
            CpuBf16Gemm::detect(),
            "from the CPU's flags, as the resumed run chose".to_string(),
        ),
        (None, None) => measured(s)?,
    };
    choice.use_for_process();
    if s.rank == 0 {
        tracing::info!(
            "bf16 matrix products on this CPU: {} ({how})",
            choice.name()
        );
    }
    let old_checkpoint = matches!(recorded, Some(None));
    Ok((!old_checkpoint).then_some(choice))
}

/// Rank 0 times both kernels and every rank takes its choice (one all-reduce, which rank 0
/// joins even when its measurement failed, so that every rank stops with the reason instead of
/// waiting for it).
fn measured(s: &Setup) -> Result<(CpuBf16Gemm, String), TrainError> {
    const FAILED: f64 = -1.0;
    let mut how = String::new();
    let mut code = 0.0;
    let mut failure = None;
    if s.rank == 0 {
        match CpuBf16Gemm::measure() {
            Ok(timing) => {
                let choice = timing.faster();
                code = if choice == CpuBf16Gemm::Native {
                    1.0
                } else {
                    2.0
                };
                how = format!(
                    "measured: a [256, 1024] x [1024, 4096] product {:.1} ms native, {:.1} ms \
                     through f32",
                    timing.native_s * 1e3,
                    timing.widened_s * 1e3
                );
            }
            Err(e) => {
                code = FAILED;
                failure = Some(e);
            }
        }
    }
    if s.world_size > 1 {
        let mut shared = Tensor::from_slice(&[code as f32]);
        s.pg.all_reduce_sum(&mut shared, "bf16 GEMM choice")?
            .wait()?;
        code = shared.double_value(&[0]);
    }
    match code {
        1.0 => Ok((CpuBf16Gemm::Native, how)),
        2.0 => Ok((CpuBf16Gemm::ViaF32, how)),
        _ => Err(TrainError::Invalid(match failure {
            Some(e) => format!("measuring the bf16 matrix products on rank 0: {e}"),
            None => "rank 0 could not measure the bf16 matrix products (its log says why)".into(),
        })),
    }
}
