//! Shard directories on a real S3-compatible server (moto, started per test on 127.0.0.1):
//! the remote dataset reads what the local one does, in ranges; the cache keeps to its limit;
//! two ranks sharing a cache fetch each range once; a missing object fails naming its URL.
use anyhow::{ensure, Context, Result};
use std::path::Path;
use std::sync::Arc;
use tessera_remote::{CacheConfig, ObjectFiles};
use tessera_shards::{
    Dataset, DatasetLocation, IngestReport, Manifest, RowGroupLimits, Sample, ShardWriter,
    FORMAT_VERSION,
};

#[path = "../../tests/support/moto.rs"]
mod moto;
use moto::MotoServer;

/// Sample `i`: every fourth is text-only; the others carry one (even `i`) or two (odd `i`)
/// 6-9 KB incompressible images, so ranged reads cover the nested image list too.
fn sample(i: u32) -> Sample {
    let count = if i.is_multiple_of(4) { 0 } else { 1 + i % 2 };
    tessera_testing::sample(i, count, |k| {
        tessera_testing::noise_bytes(i + 1 + 1000 * k, 6000 + (i % 4) * 1000)
    })
}

/// 3 shards of 64 samples, row groups of 32 rows.
fn write_dataset(dir: &Path) -> Result<Manifest> {
    let samples: Vec<Sample> = (0..192).map(sample).collect();
    let mut infos = Vec::new();
    for (s, chunk) in samples.chunks(64).enumerate() {
        let limits = RowGroupLimits {
            max_rows: 32,
            max_bytes: 1 << 30,
        };
        let mut writer = ShardWriter::create(dir, s, limits)?;
        for x in chunk {
            writer.append(x.clone())?;
        }
        infos.push(writer.finish()?);
    }
    let manifest = Manifest {
        format_version: FORMAT_VERSION,
        tokenizer_fingerprint: "t".repeat(64),
        template: "plain".into(),
        image_placeholder_id: 151_655,
        special_tokens: tessera_text::SpecialTokens::qwen(),
        source_tokenizer_fingerprint: None,
        num_samples: samples.len() as u64,
        shards: infos,
        ingest: IngestReport::default(),
        ingest_settings: None,
    };
    manifest.save(dir)?;
    Ok(manifest)
}

/// A server holding the dataset at `s3://data/set`, and the local copy.
struct Setup {
    server: MotoServer,
    url: String,
    local: tempfile::TempDir,
    manifest: Manifest,
}

fn setup() -> Result<Setup> {
    let local = tempfile::tempdir()?;
    let manifest = write_dataset(local.path())?;
    let server = MotoServer::start()?;
    server.create_bucket("data")?;
    let url = server.upload_dir(local.path(), "data", "set")?;
    Ok(Setup {
        server,
        url,
        local,
        manifest,
    })
}

impl Setup {
    fn files(&self, cache: Option<&CacheConfig>) -> Result<Arc<ObjectFiles>> {
        let endpoint = self.server.endpoint();
        let settings = [
            ("aws_endpoint", endpoint.as_str()),
            ("aws_access_key_id", "test"),
            ("aws_secret_access_key", "test"),
            ("aws_region", "us-east-1"),
            ("aws_allow_http", "true"),
        ];
        Ok(tessera_remote::open_remote(&self.url, cache, &settings)?)
    }

    fn shard_bytes(&self) -> u64 {
        self.manifest.shards.iter().map(|s| s.bytes).sum()
    }
}

fn open(files: &Arc<ObjectFiles>) -> Result<Dataset> {
    Ok(Dataset::open_at(&DatasetLocation::Remote(files.clone()))?)
}

fn ids(samples: &[Sample]) -> Vec<&str> {
    samples.iter().map(|s| s.id.as_str()).collect()
}

#[test]
fn remote_dataset_reads_what_the_local_one_does_fetching_little() -> Result<()> {
    let s = setup()?;
    let local = Dataset::open(s.local.path())?;
    let files = s.files(None)?;
    let remote = open(&files)?;
    assert_eq!(remote.fingerprint(), local.fingerprint());
    assert_eq!(remote.metadata()?, local.metadata()?);

    let before = files.fetched();
    let wanted = [150u64, 3, 77, 3, 191];
    let (got, expected) = (remote.read(&wanted)?, local.read(&wanted)?);
    assert_eq!(got, expected);
    let fetched = files.fetched().bytes - before.bytes;
    // Four samples of a 192-sample dataset: their pages (8 rows each), not their shards.
    ensure!(
        fetched * 4 < s.shard_bytes(),
        "{fetched} bytes fetched for 4 samples of {} shard bytes",
        s.shard_bytes()
    );

    let report = tessera_shards::verify_at(&DatasetLocation::Remote(files.clone()))?;
    ensure!(report.is_ok(), "{:?}", report.problems);
    assert_eq!(report.samples_checked, 192);
    let stats = |d: &Dataset| -> Result<serde_json::Value> {
        Ok(serde_json::to_value(tessera_shards::stats(d)?)?)
    };
    assert_eq!(stats(&remote)?, stats(&local)?);
    Ok(())
}

#[test]
fn cache_keeps_under_its_limit_and_serves_rereads() -> Result<()> {
    let s = setup()?;
    let cache_dir = tempfile::tempdir()?;
    let all: Vec<u64> = (0..192).collect();
    let limit = s.shard_bytes() / 3;
    let small = CacheConfig {
        dir: cache_dir.path().to_path_buf(),
        limit,
    };
    let files = s.files(Some(&small))?;
    let dataset = open(&files)?;
    for pass in 0..2 {
        for chunk in all.chunks(16) {
            let samples = dataset.read(chunk)?;
            assert_eq!(
                ids(&samples),
                ids(&chunk.iter().map(|&i| sample(i as u32)).collect::<Vec<_>>())
            );
            let cached = files.cache().context("cache")?.size_on_disk()?;
            ensure!(
                cached <= limit,
                "pass {pass}: {cached} bytes cached over the {limit} limit"
            );
        }
    }

    // A cache larger than the dataset: the second reader (a later run) fetches no ranges.
    let big = CacheConfig {
        dir: cache_dir.path().join("big"),
        limit: u64::MAX,
    };
    let first = s.files(Some(&big))?;
    open(&first)?.read(&all)?;
    let second = s.files(Some(&big))?;
    let samples = open(&second)?.read(&all)?;
    assert_eq!(samples.len(), 192);
    let index_json = std::fs::metadata(s.local.path().join("index.json"))?.len();
    assert_eq!(
        second.fetched().bytes,
        index_json,
        "only index.json is fetched again"
    );
    Ok(())
}

#[test]
fn two_ranks_sharing_a_cache_fetch_each_range_once() -> Result<()> {
    let s = setup()?;
    let all: Vec<u64> = (0..192).rev().collect();
    let index_json = std::fs::metadata(s.local.path().join("index.json"))?.len();
    let one_dir = tempfile::tempdir()?;
    let one = s.files(Some(&CacheConfig {
        dir: one_dir.path().to_path_buf(),
        limit: u64::MAX,
    }))?;
    open(&one)?.read(&all)?;
    let alone = one.fetched().bytes - index_json;

    let shared_dir = tempfile::tempdir()?;
    let shared = CacheConfig {
        dir: shared_dir.path().to_path_buf(),
        limit: u64::MAX,
    };
    let ranks = [s.files(Some(&shared))?, s.files(Some(&shared))?];
    std::thread::scope(|scope| -> Result<()> {
        let handles: Vec<_> = ranks
            .iter()
            .map(|files| {
                let all = &all;
                scope.spawn(move || -> Result<usize> { Ok(open(files)?.read(all)?.len()) })
            })
            .collect();
        for h in handles {
            let read = h.join().map_err(|_| anyhow::anyhow!("rank panicked"))??;
            assert_eq!(read, 192);
        }
        Ok(())
    })?;
    let together: u64 = ranks.iter().map(|f| f.fetched().bytes - index_json).sum();
    assert_eq!(
        together, alone,
        "two ranks fetched {together} bytes, one alone {alone}"
    );
    Ok(())
}

#[test]
fn a_missing_shard_fails_naming_its_url() -> Result<()> {
    let mut s = setup()?;
    // The same dataset without shard 1 under another prefix.
    for name in ["index.json", "shard-00000.parquet", "shard-00002.parquet"] {
        let body = std::fs::read(s.local.path().join(name))?;
        s.server.put("data", &format!("gap/{name}"), &body)?;
    }
    s.url = s.url.replace("/set", "/gap");
    let files = s.files(None)?;
    let err = open(&files)
        .err()
        .context("opening a dataset missing a shard succeeded")?;
    let text = format!("{err:#}");
    let url = format!("{}/shard-00001.parquet", s.url);
    ensure!(text.contains(&url), "{text} does not name {url}");

    let report = tessera_shards::verify_at(&DatasetLocation::Remote(files.clone()))?;
    ensure!(
        report.problems.iter().any(|p| p.contains(&url)),
        "{:?}",
        report.problems
    );
    Ok(())
}
