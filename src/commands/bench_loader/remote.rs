//! `tessera bench loader --shards s3://...`: the loader on an object-store dataset next to the
//! same shards on local disk, in one run. The shards are first downloaded whole (timed: what a
//! whole-shard cache would fetch), then the loader runs on the local copy, on the URL with an
//! empty cache (cold: ranged reads of just the pages used) and again with that cache (warm).
use super::measure::{run_loader, workload};
use super::summary::median;
use super::Args;
use anyhow::Context;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;
use tessera_pipeline::loader::{LoaderConfig, SampleSource};
use tessera_shards::{Dataset, DatasetLocation, RemoteFiles, INDEX_FILE};

/// A scratch directory removed on drop (the local copy and the cache).
struct Scratch(std::path::PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub(super) fn run(args: &Args) -> anyhow::Result<()> {
    let url = args.shards.as_str();
    let scratch =
        Scratch(std::env::temp_dir().join(format!("tessera-bench-{}", std::process::id())));
    let (local_dir, cache_dir) = (scratch.0.join("local"), scratch.0.join("cache"));
    std::fs::create_dir_all(&local_dir)?;

    let files = tessera_remote::open_remote(url, None, &[])?;
    let started = Instant::now();
    let whole_bytes = download(files.as_ref(), &local_dir)?;
    let download_s = started.elapsed().as_secs_f64();
    println!(
        "whole shards: {:.1} MB downloaded in {download_s:.2}s ({:.1} MB/s)",
        whole_bytes as f64 / 1e6,
        whole_bytes as f64 / 1e6 / download_s
    );

    let local: Arc<dyn SampleSource> = Arc::new(Dataset::open(&local_dir)?);
    let kinds: Vec<_> = Dataset::open(&local_dir)?
        .metadata()?
        .iter()
        .map(|m| m.kind)
        .collect();
    let work = workload(&kinds, args.limit, args.packing[0], args.packing[1]);
    anyhow::ensure!(!work.image_indices.is_empty(), "no image samples in {url}");
    let config = LoaderConfig::builder()
        .threads(args.threads)
        .image_size(args.image_size)
        .resize(args.policy)
        .tokens(&Dataset::open(&local_dir)?.manifest().special_tokens())
        .build()?;
    let cache = tessera_remote::CacheConfig {
        dir: cache_dir,
        limit: u64::MAX,
    };
    let rate = |source: Arc<dyn SampleSource>| -> anyhow::Result<f64> {
        let (stats, took) = run_loader(source, work.plans.clone(), config.clone())?;
        Ok(stats.images as f64 / took.as_secs_f64())
    };
    let open_remote =
        || -> anyhow::Result<(Arc<tessera_remote::ObjectFiles>, Arc<dyn SampleSource>)> {
            let files = tessera_remote::open_remote(url, Some(&cache), &[])?;
            let dataset = Dataset::open_at(&DatasetLocation::Remote(files.clone()))?;
            dataset.metadata()?; // the planner's scan, as `train` does
            Ok((files, Arc::new(dataset)))
        };

    let local_first = rate(local.clone())?;
    let started = Instant::now();
    let (cold_files, cold) = open_remote()?;
    let open_s = started.elapsed().as_secs_f64();
    let opened = cold_files.fetched();
    let cold_rate = rate(cold)?;
    let fetched = cold_files.fetched();
    let images = work.image_indices.len() as f64;
    let loader_bytes = (fetched.bytes - opened.bytes) as f64;
    let image_bytes = image_bytes(local.as_ref(), &work.image_indices)? as f64;
    let shard_share = whole_bytes as f64 * work.samples as f64 / kinds.len() as f64;
    println!(
        "cold: open + metadata scan {open_s:.2}s ({} requests, {:.2} MB); loader {cold_rate:.1} \
         images/s, {} requests, {:.1} KB fetched per image (image bytes {:.1} KB, shard bytes \
         of the samples used {:.1} KB per image)",
        opened.requests,
        opened.bytes as f64 / 1e6,
        fetched.requests - opened.requests,
        loader_bytes / images / 1e3,
        image_bytes / images / 1e3,
        shard_share / images / 1e3,
    );

    let (mut local_rates, mut warm_rates) = (vec![local_first], Vec::new());
    let mut warm_fetched = 0;
    for round in 1..=args.rounds.max(1) {
        let (warm_files, warm) = open_remote()?;
        let warm_rate = rate(warm)?;
        warm_fetched = warm_files.fetched().bytes;
        let local_rate = rate(local.clone())?;
        println!(
            "round {round}: local disk {local_rate:.1} images/s, warm cache {warm_rate:.1} \
             images/s ({:.3}x)",
            warm_rate / local_rate
        );
        local_rates.push(local_rate);
        warm_rates.push(warm_rate);
    }
    let (local_rate, warm_rate) = (median(local_rates), median(warm_rates));
    println!(
        "{} threads: cold {:.3}x of local disk, warm {:.3}x (medians); warm run fetched {} bytes",
        config.threads,
        cold_rate / local_rate,
        warm_rate / local_rate,
        warm_fetched
    );
    let line = serde_json::json!({
        "url": url,
        "threads": config.threads,
        "images": work.image_indices.len(),
        "latency_ms": cold_files.latency().as_millis() as u64,
        "local_images_per_s": local_rate,
        "cold_images_per_s": cold_rate,
        "warm_images_per_s": warm_rate,
        "cold_ratio_vs_local": cold_rate / local_rate,
        "warm_ratio_vs_local": warm_rate / local_rate,
        "cold_fetched_bytes_per_image": loader_bytes / images,
        "image_bytes_per_image": image_bytes / images,
        "shard_bytes_per_image": shard_share / images,
        "whole_shard_mb_per_s": whole_bytes as f64 / 1e6 / download_s,
        "open_seconds": open_s,
    });
    println!("{line}");
    Ok(())
}

/// Copies index.json and every shard (fetched whole) into `dir`; returns the shard bytes.
fn download(files: &tessera_remote::ObjectFiles, dir: &Path) -> anyhow::Result<u64> {
    let index = files.read_file(INDEX_FILE)?;
    let manifest =
        tessera_shards::Manifest::parse(&index, format!("{}/{INDEX_FILE}", files.url()).into())?;
    let mut total = 0;
    for info in &manifest.shards {
        let bytes = files.read_ranges(info, std::slice::from_ref(&(0..info.bytes)))?;
        let path = dir.join(&info.file);
        let body = bytes.first().map_or(&[][..], |b| &b[..]);
        std::fs::write(&path, body).with_context(|| format!("writing {}", path.display()))?;
        total += info.bytes;
    }
    std::fs::write(dir.join(INDEX_FILE), &index)?;
    Ok(total)
}

/// Bytes of the stored images of `indices`.
fn image_bytes(source: &dyn SampleSource, indices: &[u64]) -> anyhow::Result<u64> {
    let mut total = 0;
    for chunk in indices.chunks(256) {
        for sample in source.read(chunk)? {
            total += sample
                .images
                .iter()
                .map(|i| i.bytes.len() as u64)
                .sum::<u64>();
        }
    }
    Ok(total)
}
