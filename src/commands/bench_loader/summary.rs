//! What `tessera bench loader` reports over its rounds: the medians, the loader's stage times,
//! the crc32c check's share, and the machine-readable last line.
use super::rounds::Round;
use std::time::Duration;
use tessera_pipeline::loader::{LoaderStats, ResizePolicy};
use tessera_shards::image_layout::ImageLayout;

/// The rounds' medians (each ratio is the median of the per-round ratios).
pub(super) struct Medians {
    pub(super) rounds: usize,
    pub(super) images_per_s: f64,
    pub(super) views_per_s: f64,
    samples_per_s: f64,
    decode_only: f64,
    ratio_vs_decode_only: f64,
    loader_cpu_ms: Option<f64>,
    decode_cpu_ms: Option<f64>,
    /// Decode-only's CPU per image over the loader's.
    cpu_ratio: Option<f64>,
    /// 1 - (with check / without), over paired rounds: the share of throughput the check
    /// costs (negative = within noise); `None` without `--checksum-cost`.
    checksum_cost: Option<f64>,
}

impl Medians {
    pub(super) fn of(rounds: &[Round]) -> Medians {
        let of = |f: fn(&Round) -> f64| median(rounds.iter().map(f).collect());
        let of_all = |f: fn(&Round) -> Option<f64>| {
            let values: Option<Vec<f64>> = rounds.iter().map(f).collect();
            values.map(median)
        };
        Medians {
            rounds: rounds.len(),
            images_per_s: of(|r| r.images_per_s),
            views_per_s: of(|r| r.views_per_s),
            samples_per_s: of(|r| r.samples_per_s),
            decode_only: of(|r| r.decode_only),
            ratio_vs_decode_only: of(|r| r.images_per_s / r.decode_only),
            loader_cpu_ms: of_all(|r| r.loader_cpu_ms),
            decode_cpu_ms: of_all(|r| r.decode_cpu_ms),
            cpu_ratio: of_all(|r| Some(r.decode_cpu_ms? / r.loader_cpu_ms?)),
            checksum_cost: of_all(|r| Some(1.0 - r.images_per_s / r.unchecked?)),
        }
    }

    /// The check's measured cost, when it was measured.
    pub(super) fn print_checksum_cost(&self) {
        if let Some(cost) = self.checksum_cost {
            println!(
                "crc32c check cost, median of {} paired rounds: {:.2}% of loader throughput",
                self.rounds,
                100.0 * cost
            );
        }
    }

    /// The loader against decode-only, in wall time and in CPU per image.
    pub(super) fn print_vs_decode_only(&self) {
        let n = self.rounds;
        println!(
            "tessera / decode-only, median of {n} paired rounds: {:.3}",
            self.ratio_vs_decode_only
        );
        if let (Some(l), Some(d), Some(r)) =
            (self.loader_cpu_ms, self.decode_cpu_ms, self.cpu_ratio)
        {
            println!(
                "process CPU per image (medians): tessera {l:.3} ms, decode-only {d:.3} ms; \
                 decode-only / tessera {r:.3}"
            );
        }
    }
}

pub(super) fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => values[n / 2],
        _ => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// Each stage's worker time per image, over all rounds.
pub(super) fn print_stage_times(total: &LoaderStats) {
    let per_image = |d: Duration| d.as_secs_f64() * 1e3 / total.images.max(1) as f64;
    println!(
        "  stage time per image (thread-ms): read {:.3} (of it crc32c {:.4}), decode {:.3}, \
         resize {:.3}, assemble {:.3}",
        per_image(total.read),
        per_image(total.checksum),
        per_image(total.decode),
        per_image(total.resize),
        per_image(total.assemble)
    );
}

/// The check's own thread time over all stages' (noise-free next to paired wall times),
/// printed and returned.
pub(super) fn checksum_share(total: &LoaderStats) -> f64 {
    let stages = total.read + total.decode + total.resize + total.assemble;
    let share = total.checksum.as_secs_f64() / stages.as_secs_f64().max(1e-12);
    println!(
        "crc32c check: {:.3}% of the loader's thread time",
        100.0 * share
    );
    share
}

/// The settings a run measured under, for its JSON line.
pub(super) struct Setting<'a> {
    pub(super) layout: &'a ImageLayout,
    pub(super) threads: usize,
    pub(super) image_size: usize,
    pub(super) policy: ResizePolicy,
}

/// The machine-readable last line: medians, the reference and its ratio, and the per-round
/// means of the counters.
pub(super) fn json_line(
    m: &Medians,
    total: &LoaderStats,
    setting: &Setting,
    (reference, ratio_vs_reference): (Option<f64>, Option<f64>),
    checksum_share: f64,
) -> serde_json::Value {
    let n = m.rounds;
    let mean_s = |d: Duration| d.as_secs_f64() / n as f64;
    serde_json::json!({
        "images_per_s": m.images_per_s,
        "views_per_s": m.views_per_s,
        "image_layout": setting.layout.to_string(),
        "samples_per_s": m.samples_per_s,
        "decode_only_images_per_s": m.decode_only,
        "reference_images_per_s": reference,
        "ratio_vs_reference": ratio_vs_reference,
        "ratio_vs_decode_only": m.ratio_vs_decode_only,
        "threads": setting.threads,
        "cpu_ms_per_image": m.loader_cpu_ms,
        "decode_only_cpu_ms_per_image": m.decode_cpu_ms,
        "cpu_ratio_vs_decode_only": m.cpu_ratio,
        "image_size": setting.image_size,
        "checksum_cost": m.checksum_cost,
        "checksum_thread_time_fraction": checksum_share,
        "policy": setting.policy, // serialises as "squash" / "pad"
        "images": total.images / n as u64,
        "rounds": n,
        "stage_seconds": {
            "read": mean_s(total.read),
            "checksum": mean_s(total.checksum),
            "decode": mean_s(total.decode),
            "resize": mean_s(total.resize),
            "assemble": mean_s(total.assemble),
        },
    })
}
