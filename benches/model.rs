//! Forward+backward tokens/s of the `small` preset on the CPU in f32 and in bf16, each as a share
//! of the machine's peak matmul FLOP/s in its own dtype, measured in the same run by a
//! 2048×2048 libtorch matmul; and bf16's step time over f32's.
//! Threads: TESSERA_BENCH_THREADS (default all cores).
//! Ends with one JSON line. Needs the `bench` feature (the [[bench]] entry says so):
//! `cargo bench --bench model --features bench`.
#![cfg(feature = "bench")]
use tessera_model::Dtype;
use tessera_model::{measure_throughput, Preset};
use tessera_switches::Switches;

fn main() -> anyhow::Result<()> {
    let threads = Switches::load()?
        .bench_threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        as i32;
    let mut reports = Vec::new();
    for dtype in [Dtype::F32, Dtype::Bf16] {
        let report = measure_throughput(Preset::Small, threads, 2, 512, 3, dtype)?;
        eprintln!(
            "small preset, {}: {:.0} tokens/s fwd+bwd, {:.1} GFLOP/s = {:.0}% of peak {} matmul {:.1} GFLOP/s ({} threads)",
            report.dtype,
            report.tokens_per_s,
            report.model_flop_per_s / 1e9,
            report.share_of_peak * 100.0,
            report.dtype,
            report.peak_matmul_flop_per_s / 1e9,
            report.threads
        );
        reports.push(report);
    }
    let bf16_over_f32_step_time = reports[0].tokens_per_s / reports[1].tokens_per_s;
    eprintln!("bf16 step time / f32 step time: {bf16_over_f32_step_time:.2}");
    println!(
        "{}",
        serde_json::json!({
            "f32": reports[0],
            "bf16": reports[1],
            "bf16_over_f32_step_time": bf16_over_f32_step_time,
        })
    );
    Ok(())
}
