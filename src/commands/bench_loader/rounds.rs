//! The measured part of `tessera bench loader`: the workload read once, then rounds of the
//! loader and the decode-only bound back to back (with `--checksum-cost`, also the loader with
//! the crc32c check off).
use super::measure::{read_images, run_decode_only, run_loader, workload, Workload};
use super::Args;
use anyhow::Context;
use std::path::Path;
use std::sync::Arc;
use tessera_pipeline::loader::{LoaderConfig, LoaderStats, SampleSource};
use tessera_shards::image_layout::ImageLayout;

/// What every round measures: the dataset prefix, its images' bytes and the loader config.
pub(super) struct Bench {
    source: Arc<dyn SampleSource>,
    work: Workload,
    /// The workload's images (sample id, encoded bytes), for the references.
    pub(super) images: Vec<(String, Vec<u8>)>,
    /// The same bytes, for the decode-only bound.
    bytes: Vec<Vec<u8>>,
    pub(super) config: LoaderConfig,
    pub(super) layout: ImageLayout,
    checksum_cost: bool,
}

/// One round: the loader, then decode-only, back to back.
pub(super) struct Round {
    pub(super) images_per_s: f64,
    /// Tower views: images/s under `single`, base views and tiles under `anyres_max_N`.
    pub(super) views_per_s: f64,
    pub(super) samples_per_s: f64,
    pub(super) decode_only: f64,
    pub(super) loader_cpu_ms: Option<f64>,
    pub(super) decode_cpu_ms: Option<f64>,
    /// Images/s with the checksum check off (`--checksum-cost`).
    pub(super) unchecked: Option<f64>,
}

impl Bench {
    /// Opens the local shards of `args`, plans the prefix holding `--limit` image samples and
    /// reads their images (which also warms the page cache).
    pub(super) fn prepare(args: &Args) -> anyhow::Result<Bench> {
        let dataset = tessera_shards::Dataset::open(Path::new(&args.shards))
            .with_context(|| format!("opening shards in {}", args.shards))?;
        let kinds: Vec<_> = dataset.metadata()?.iter().map(|m| m.kind).collect();
        let tokens = dataset.manifest().special_tokens();
        let source: Arc<dyn SampleSource> = Arc::new(dataset);
        let work = workload(&kinds, args.limit, args.packing[0], args.packing[1]);
        anyhow::ensure!(
            !work.image_indices.is_empty(),
            "no image samples in {}",
            args.shards
        );
        let images = read_images(source.as_ref(), &work.image_indices)?;
        let layout = args.image_layout.clone().unwrap_or_default();
        let side = args.image_size / args.patch_size.max(1) as usize;
        let config = LoaderConfig::builder()
            .threads(args.threads)
            .image_size(args.image_size)
            .image_tokens(side * side)
            .image_layout(layout.clone(), args.patch_size)
            .resize(args.policy)
            .tokens(&tokens)
            .build()?;
        Ok(Bench {
            source,
            work,
            bytes: images.iter().map(|(_, b)| b.clone()).collect(),
            images,
            config,
            layout,
            checksum_cost: args.checksum_cost,
        })
    }

    /// Whether images are cut into a base view and tiles (`anyres_max_N`).
    pub(super) fn anyres(&self) -> bool {
        self.layout != ImageLayout::Single
    }

    /// `rounds` rounds (at least one), and the loader's counters summed over them.
    pub(super) fn rounds(&self, rounds: usize) -> anyhow::Result<(Vec<Round>, LoaderStats)> {
        let mut measured = Vec::new();
        let mut total = LoaderStats::default();
        for round in 1..=rounds.max(1) {
            let (measurement, stats) = self.round(round)?;
            measured.push(measurement);
            total.add(&stats);
        }
        Ok((measured, total))
    }

    /// Round `round`: the loader (with `--checksum-cost` also without the check: odd rounds
    /// before, even ones after, so a warmer cache favours neither), then decode-only.
    fn round(&self, round: usize) -> anyhow::Result<(Round, LoaderStats)> {
        let unchecked_first = round % 2 == 1;
        let unchecked_before = self.unchecked_rate(round, unchecked_first)?;
        let cpu_before = process_cpu_seconds();
        let (stats, took) = run_loader(
            self.source.clone(),
            self.work.plans.clone(),
            self.config.clone(),
        )?;
        let loader_cpu = cpu_since(cpu_before);
        let secs = took.as_secs_f64();
        let images_per_s = stats.images as f64 / secs;
        self.print_loader(round, &stats, secs);
        let unchecked = unchecked_before.or(self.unchecked_rate(round, !unchecked_first)?);
        if let Some(rate) = unchecked {
            println!(
                "round {round}: with / without the check {:.4}",
                images_per_s / rate
            );
        }
        let (decode_only, decode_cpu_ms) = self.decode_only(round, images_per_s);
        let measured = Round {
            views_per_s: stats.views as f64 / secs,
            images_per_s,
            samples_per_s: stats.samples as f64 / secs,
            decode_only,
            loader_cpu_ms: cpu_ms(loader_cpu, stats.images),
            decode_cpu_ms,
            unchecked,
        };
        Ok((measured, stats))
    }

    fn print_loader(&self, round: usize, stats: &LoaderStats, secs: f64) {
        println!(
            "round {round}: tessera {} images ({} views), {} samples, {} skipped in {secs:.3}s \
             with {} threads: {:.1} images/s, {:.1} views/s, consumer wait {:.3}s",
            stats.images,
            stats.views,
            stats.samples,
            stats.skipped,
            self.config.threads,
            stats.images as f64 / secs,
            stats.views as f64 / secs,
            stats.wait.as_secs_f64()
        );
    }

    /// The loader's images/s with the crc32c check off, when `--checksum-cost` asks and this
    /// is its turn in the round (`now` is whether the unchecked run goes now); else `None`.
    fn unchecked_rate(&self, round: usize, now: bool) -> anyhow::Result<Option<f64>> {
        if !self.checksum_cost || !now {
            return Ok(None);
        }
        let off = LoaderConfig {
            verify_checksums: false,
            ..self.config.clone()
        };
        let (stats, took) = run_loader(self.source.clone(), self.work.plans.clone(), off)?;
        let rate = stats.images as f64 / took.as_secs_f64();
        println!("round {round}: tessera without the crc32c check: {rate:.1} images/s");
        Ok(Some(rate))
    }

    /// Decode-only over the same bytes and threads: its images/s and CPU ms per image.
    fn decode_only(&self, round: usize, images_per_s: f64) -> (f64, Option<f64>) {
        let threads = self.config.threads;
        let cpu_before = process_cpu_seconds();
        let (took, failed) = run_decode_only(&self.bytes, threads);
        let decode_cpu = cpu_since(cpu_before);
        let decoded = self.bytes.len() - failed;
        let decode_only = decoded as f64 / took.as_secs_f64();
        println!(
            "round {round}: decode only (image crate, full decode, {threads} threads): {decoded} \
             images in {:.3}s: {decode_only:.1} images/s; tessera / decode-only {:.3}",
            took.as_secs_f64(),
            images_per_s / decode_only
        );
        (decode_only, cpu_ms(decode_cpu, decoded as u64))
    }
}

/// CPU milliseconds per item. CPU seconds per image move less than wall time when other
/// processes share the cores (preemption drops out; cache contention stays): the same ratio,
/// less noisy.
fn cpu_ms(cpu: Option<f64>, n: u64) -> Option<f64> {
    cpu.map(|c| c * 1e3 / n.max(1) as f64)
}

/// User + system CPU seconds of this whole process so far (Linux: /proc/self/stat, 10 ms ticks);
/// `None` where that file is missing or unreadable.
fn process_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: f64 = fields.next()?.parse().ok()?;
    let stime: f64 = fields.next()?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

fn cpu_since(before: Option<f64>) -> Option<f64> {
    Some(process_cpu_seconds()? - before?)
}
