//! Runs the model throughput measurement (ignored by default: it takes ~20 s on 2 cores).
//! `cargo test --release -p trainer --test model_bench -- --ignored --nocapture`
use trainer::model::init::Preset;
use trainer::model::throughput::measure;

#[test]
#[ignore]
fn small_preset_throughput() -> anyhow::Result<()> {
    let threads = std::thread::available_parallelism()
        .map(|n| n.get() as i32)
        .unwrap_or(1);
    let report = measure(Preset::Small, threads, 2, 512, 3)?;
    println!("{}", serde_json::to_string(&report)?);
    assert!(report.tokens_per_s > 0.0 && report.share_of_peak > 0.0);
    Ok(())
}
