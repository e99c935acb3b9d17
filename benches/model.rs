//! Forward+backward tokens/s of the `small` preset on the CPU and its share of the machine's
//! peak f32 matmul FLOP/s, measured in the same run by a 2048×2048 libtorch matmul.
//! Threads: TESSERA_BENCH_THREADS (default all cores).
//! Ends with one JSON line. Needs the `bench` feature (the [[bench]] entry says so):
//! `cargo bench --bench model --features bench`.
#![cfg(feature = "bench")]
use trainer::model::{measure_throughput, Preset};

fn main() -> anyhow::Result<()> {
    let threads = std::env::var("TESSERA_BENCH_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get() as i32)
                .unwrap_or(1)
        });
    let report = measure_throughput(Preset::Small, threads, 2, 512, 3)?;
    eprintln!(
        "small preset: {:.0} tokens/s fwd+bwd, {:.1} GFLOP/s = {:.0}% of peak matmul {:.1} GFLOP/s ({} threads)",
        report.tokens_per_s,
        report.model_flop_per_s / 1e9,
        report.share_of_peak * 100.0,
        report.peak_matmul_flop_per_s / 1e9,
        report.threads
    );
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}
