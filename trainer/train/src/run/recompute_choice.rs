//! `--recompute auto` (the default): before the first step each rank estimates its peak under
//! every policy (what it holds now, measured, plus what one micro-batch adds:
//! `memory_estimate.rs`) and the run takes the fastest policy that fits every rank's share of
//! the memory at hand. The estimates go to the log and to `RUN/recompute.json` (also for a
//! policy given by name); the choice goes into the run record, so a resume keeps it, and a
//! resume that names another one is refused like any changed setting (`--resume-changing
//! recompute` accepts it).
use super::memory_estimate::{
    micro_batch_peak, Gathered, MicroBatchShape, Trains, FASTEST_FIRST, FIT_MARGIN,
};
use super::setup::Setup;
use super::sharded_vlm::ShardedVlm;
use crate::checkpoint::format::Checkpoint;
use crate::config::{RecomputeSetting, Strategy, TrainConfig};
use crate::error::TrainError;
use crate::report::metrics::rss_mib;
use crate::run_dir::RunDir;
use serde::Serialize;
use tch::Tensor;
use tessera_fsdp::Recompute;
use tessera_model::{VisionTraining, Vlm};

/// The run-record key of the policy.
pub(crate) const RECORD_KEY: &str = "recompute";

/// `TESSERA_RECOMPUTE_MEMORY`: the bytes this rank may use in all (suffix KiB, MiB, GiB),
/// instead of its share of what the device has free. For shared machines, and tests.
const MEMORY_ENV: &str = "TESSERA_RECOMPUTE_MEMORY";

/// What `RUN/recompute.json` holds.
#[derive(Debug, Serialize)]
pub(crate) struct RecomputeReport {
    /// The policy the run takes.
    pub choice: String,
    /// Why: asked for, estimated, recorded by the resumed run.
    pub how: String,
    /// What rank 0 holds before the first step (its resident set on the CPU, its device's
    /// used memory on CUDA).
    pub held_bytes: f64,
    /// Rank 0's estimated peak under each policy: held plus one micro-batch's peak.
    pub estimated_peak_bytes: Vec<(String, f64)>,
    /// How much more rank 0 may take.
    pub headroom_bytes: f64,
    /// A policy fits when this many times what it adds fits the headroom.
    pub fit_margin: f64,
    /// What tensors each policy keeps until backward (docs/trainer-and-fsdp.md).
    pub kept: Vec<(String, String)>,
}

/// Settles the policy (every rank the same) and sets it on `model`. Returns it for the run
/// record, or `None` for a resume of a run from before the record held it (which ran `all`).
pub(crate) fn settle(
    cfg: &TrainConfig,
    s: &Setup,
    model: &mut ShardedVlm,
    resumed: Option<&Checkpoint>,
) -> Result<Option<Recompute>, TrainError> {
    let mem = memory(s)?;
    let extra: Vec<(Recompute, f64)> = FASTEST_FIRST
        .iter()
        .map(|&p| (p, micro_batch(cfg, s, p)))
        .collect();
    let recorded = resumed.map(|c| c.meta.run.get(RECORD_KEY));
    let (choice, how) = match (cfg.recompute, recorded) {
        (RecomputeSetting::Fixed(p), _) => (p, "asked for".to_string()),
        (RecomputeSetting::Auto, Some(Some(name))) => {
            let p = name.parse::<Recompute>().map_err(|e| {
                let dir = resumed.map_or_else(String::new, |c| c.dir.display().to_string());
                TrainError::Invalid(format!("checkpoint {dir}: run record {RECORD_KEY}: {e}"))
            })?;
            (p, "as the resumed run chose".to_string())
        }
        (RecomputeSetting::Auto, Some(None)) => (
            Recompute::All,
            "the resumed run is from before auto, whose default was all".to_string(),
        ),
        (RecomputeSetting::Auto, None) => agreed(s, &extra, mem.headroom)?,
    };
    model.set_recompute(choice);
    if s.rank == 0 {
        let gib = |b: f64| b / (1u64 << 30) as f64;
        let list: Vec<String> = extra
            .iter()
            .map(|(p, b)| format!("{p} {:.2}", gib(mem.held + b)))
            .collect();
        tracing::info!(
            "recompute {choice} ({how}); estimated peak per rank in GiB: {}; held now {:.2}, \
             room for {:.2} more",
            list.join(", "),
            gib(mem.held),
            gib(mem.headroom)
        );
        let report = RecomputeReport {
            choice: choice.to_string(),
            how,
            held_bytes: mem.held,
            estimated_peak_bytes: extra
                .iter()
                .map(|(p, b)| (p.to_string(), mem.held + b))
                .collect(),
            headroom_bytes: mem.headroom,
            fit_margin: FIT_MARGIN,
            kept: kept_by_policy(),
        };
        let path = RunDir::new(&cfg.out).recompute_report();
        let text = serde_json::to_string_pretty(&report).map_err(|source| TrainError::Json {
            what: path.display().to_string(),
            source,
        })?;
        tessera_shards::write_atomically(&path, text.as_bytes())?;
    }
    let old_checkpoint = matches!(recorded, Some(None));
    Ok((!old_checkpoint).then_some(choice))
}

/// The fastest policy whose micro-batch fits this rank's headroom ([`FIT_MARGIN`] times its
/// estimate), agreed over the ranks (the slowest any rank needs); `all` when none fits, with
/// a warning.
fn agreed(
    s: &Setup,
    estimates: &[(Recompute, f64)],
    headroom: f64,
) -> Result<(Recompute, String), TrainError> {
    let fits = estimates
        .iter()
        .position(|&(_, b)| b * FIT_MARGIN <= headroom);
    let mine = fits.unwrap_or(estimates.len() - 1);
    // Each rank marks the policy it needs; the slowest marked is every rank's.
    let mut marks = vec![0f32; estimates.len()];
    marks[mine] = 1.0;
    if s.world_size > 1 {
        let mut shared = Tensor::from_slice(&marks);
        s.pg.all_reduce_sum(&mut shared, "recompute choice")?
            .wait()?;
        marks = Vec::<f32>::try_from(&shared)?;
    }
    let index = marks.iter().rposition(|&m| m > 0.0).unwrap_or(mine);
    let how = match fits {
        None => {
            tracing::warn!(
                "rank {}: no recompute policy fits ({:.2} GiB free); `all` needs an estimated \
                 {:.2} GiB more and may run out of memory",
                s.rank,
                headroom / (1u64 << 30) as f64,
                estimates[estimates.len() - 1].1 / (1u64 << 30) as f64
            );
            "auto: nothing fits, the least memory".to_string()
        }
        Some(_) if index != mine => "auto: the fastest that fits every rank".to_string(),
        Some(_) => "auto: the fastest that fits".to_string(),
    };
    Ok((estimates[index].0, how))
}

/// What one micro-batch adds at its peak under `policy` on this rank.
fn micro_batch(cfg: &TrainConfig, s: &Setup, policy: Recompute) -> f64 {
    let vlm: &Vlm = &s.vlm;
    let trains = Trains {
        lm: cfg.train.lm,
        lora: cfg.train.lora,
        vision: cfg.train.vision != VisionTraining::Frozen,
    };
    let bytes = cfg.precision.kind().elt_size_in_bytes() as f64;
    let tokens = cfg.token_budget as f64;
    // Tower tokens per LM image token (patches plus prefix tokens over the patches kept).
    let vision = &vlm.vision;
    let per_image = vision.num_patches() as f64;
    let vision_tokens = tokens * (per_image + vision.prefix_tokens() as f64) / per_image;
    let mb = MicroBatchShape {
        tokens,
        vision_tokens,
        bytes,
        head_chunk: vlm.loss_chunk() as f64,
    };
    micro_batch_peak(policy, &vlm.lm, vision, trains, mb, gathered(cfg, s))
}

/// The full parameter bytes of each kind of unit, when this rank gathers them.
fn gathered(cfg: &TrainConfig, s: &Setup) -> Gathered {
    let gathers =
        s.world_size > 1 && matches!(cfg.strategy, Strategy::FullShard | Strategy::HybridShard);
    if !gathers {
        return Gathered::default();
    }
    let bytes = cfg.precision.kind().elt_size_in_bytes() as f64;
    let mut g = Gathered::default();
    for unit in s.vlm.units() {
        let numel: i64 = unit
            .params()
            .iter()
            .map(|p| p.shape.iter().product::<i64>())
            .sum();
        let b = numel as f64 * bytes;
        let name = unit.name();
        let slot = if name.starts_with("vision.") {
            &mut g.vision_layer
        } else if name == "projector" {
            &mut g.projector
        } else if name == "embed" {
            &mut g.embed
        } else if name == "head" {
            &mut g.head
        } else {
            &mut g.lm_layer
        };
        *slot = slot.max(b);
    }
    g
}

/// What this rank holds now and how much more it may take.
#[derive(Clone, Copy, Debug)]
struct Memory {
    held: f64,
    headroom: f64,
}

/// With `TESSERA_RECOMPUTE_MEMORY` the rank may hold that much in all. Otherwise, on the CPU:
/// it holds its resident set and may take its share of the machine's available memory
/// (`MemAvailable` over the local ranks) less a margin (1 GiB or 5% of the machine's memory,
/// the larger); on CUDA: it holds what `nvidia-smi` says its device uses and may take the
/// device's free memory less a margin (1 GiB or 5%).
fn memory(s: &Setup) -> Result<Memory, TrainError> {
    let held_cpu = rss_mib() * (1u64 << 20) as f64;
    if let Ok(text) = std::env::var(MEMORY_ENV) {
        let total = parse_bytes(&text).ok_or_else(|| {
            TrainError::Invalid(format!(
                "{MEMORY_ENV}={text:?}: not a size (a number of bytes, or with KiB, MiB, GiB)"
            ))
        })?;
        let held = match s.device {
            tch::Device::Cuda(i) => gpu_memory(i)?.0,
            _ => held_cpu,
        };
        return Ok(Memory {
            held,
            headroom: (total - held).max(0.0),
        });
    }
    let margin = |total: f64| (total * 0.05).max((1u64 << 30) as f64);
    if let tch::Device::Cuda(i) = s.device {
        let (used, total) = gpu_memory(i)?;
        return Ok(Memory {
            held: used,
            headroom: (total - used - margin(total)).max(0.0),
        });
    }
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |key: &str| -> Option<f64> {
        meminfo
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|kib| kib.parse::<f64>().ok())
            .map(|kib| kib * 1024.0)
    };
    let (Some(available), Some(total)) = (field("MemAvailable:"), field("MemTotal:")) else {
        return Err(TrainError::Invalid(format!(
            "--recompute auto: /proc/meminfo does not say how much memory is available; name a \
             policy (--recompute all|none|selective|every:K) or set {MEMORY_ENV}"
        )));
    };
    let local_ranks = std::env::var("LOCAL_WORLD_SIZE")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(1.0)
        .max(1.0);
    Ok(Memory {
        held: held_cpu,
        headroom: ((available - margin(total)) / local_ranks).max(0.0),
    })
}

/// (used, total) bytes of CUDA device `index` as `nvidia-smi` reports them (the device
/// `CUDA_VISIBLE_DEVICES` maps it to, when set).
fn gpu_memory(index: usize) -> Result<(f64, f64), TrainError> {
    let physical = std::env::var("CUDA_VISIBLE_DEVICES")
        .ok()
        .and_then(|v| v.split(',').nth(index).map(|d| d.trim().to_string()))
        .unwrap_or_else(|| index.to_string());
    let refuse = |why: String| {
        TrainError::Invalid(format!(
            "--recompute auto: {why}; name a policy (--recompute all|none|selective|every:K) \
             or set {MEMORY_ENV}"
        ))
    };
    let out = std::process::Command::new("nvidia-smi")
        .args([
            "--query-gpu=memory.used,memory.total",
            "--format=csv,noheader,nounits",
            "-i",
            &physical,
        ])
        .output()
        .map_err(|e| refuse(format!("nvidia-smi did not run ({e})")))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mib: Vec<f64> = text
        .split(',')
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .collect();
    match mib[..] {
        [used, total] if out.status.success() => {
            Ok((used * (1u64 << 20) as f64, total * (1u64 << 20) as f64))
        }
        _ => Err(refuse(format!(
            "nvidia-smi -i {physical} said {:?}",
            text.trim()
        ))),
    }
}

/// `"12GiB"`, `"512MiB"`, `"64KiB"` or a plain number of bytes.
fn parse_bytes(text: &str) -> Option<f64> {
    let t = text.trim();
    for (suffix, scale) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if let Some(n) = t.strip_suffix(suffix) {
            return n.trim().parse::<f64>().ok().map(|n| n * scale as f64);
        }
    }
    t.parse::<f64>().ok()
}

/// What each policy keeps until backward, as the report shows it.
fn kept_by_policy() -> Vec<(String, String)> {
    [
        ("none", "every trained unit's whole autograd graph"),
        (
            "selective",
            "every trained unit's graph, but each RMSNorm keeps only its input and the SwiGLU \
             activation only gate and up (their intermediates recomputed in backward); matmul \
             outputs and attention outputs kept",
        ),
        (
            "every:K",
            "the whole graph of the units not recomputed; the input of every K-th unit",
        ),
        (
            "all",
            "each trained unit's input; each graph rebuilt in backward",
        ),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_bytes("2GiB"), Some(2.0 * (1u64 << 30) as f64));
        assert_eq!(parse_bytes("512 MiB"), Some(512.0 * (1u64 << 20) as f64));
        assert_eq!(parse_bytes("4096"), Some(4096.0));
        assert_eq!(parse_bytes("lots"), None);
    }
}
