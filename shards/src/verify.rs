//! `tessera shards verify`: checks a shard directory against its index.json: every shard's
//! size and sha256, its schema, its row and row-group counts, and every row's internal
//! consistency (token counts, label mask length, image and token crc32c, kind vs images, one
//! placeholder per image); and
//! that no `shard-*.parquet` lies in the directory without being listed.
use crate::error::ShardError;
use crate::location::DatasetLocation;
use crate::manifest::Manifest;
use crate::reader::OpenShard;
use crate::sample::{Kind, Sample};
use crate::schema::{schema_v3, FORMAT_VERSION};
use crate::shard_info::ShardInfo;
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::Path;
use tessera_errors::with_causes;

/// The outcome of [`verify`]: an empty `problems` list means the directory is sound.
#[derive(Debug, Default)]
pub struct VerifyReport {
    pub shards_checked: usize,
    pub samples_checked: u64,
    /// One line per problem, each starting with the shard's file name.
    pub problems: Vec<String>,
}

impl VerifyReport {
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Hex sha256 and length of a file, streamed.
pub fn sha256_file(path: &Path) -> Result<(String, u64), ShardError> {
    let mut file = std::fs::File::open(path).map_err(|e| ShardError::io(path, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut len = 0u64;
    loop {
        let n = file.read(&mut buf).map_err(|e| ShardError::io(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        len += n as u64;
    }
    Ok((hex::encode(hasher.finalize()), len))
}

/// Verifies `dir`. Fails only when index.json itself cannot be read; everything else is
/// collected into the report.
pub fn verify(dir: &Path) -> Result<VerifyReport, ShardError> {
    verify_at(&DatasetLocation::Dir(dir.to_path_buf()))
}

/// [`verify`] for a local or remote directory; a remote shard is downloaded whole (into
/// memory) and checked against index.json's sha256 before its rows are.
pub fn verify_at(location: &DatasetLocation) -> Result<VerifyReport, ShardError> {
    let manifest = Manifest::load_from(location)?;
    let mut report = VerifyReport::default();
    let mut first_sample = 0u64;
    for info in &manifest.shards {
        report.shards_checked += 1;
        let checked = verify_shard(location, &manifest, info, first_sample, &mut report);
        if let Err(problem) = checked {
            report.problems.push(problem);
        }
        first_sample += info.rows;
    }
    if first_sample != manifest.num_samples {
        report.problems.push(format!(
            "index.json: num_samples is {} but its shards hold {first_sample} rows",
            manifest.num_samples
        ));
    }
    report
        .problems
        .extend(unlisted_shards(location, &manifest)?);
    Ok(report)
}

/// `shard-*.parquet` files in `dir` that index.json does not list (a leftover of another
/// ingest, or a file copied in by hand: the dataset would silently not contain it).
fn unlisted_shards(
    location: &DatasetLocation,
    manifest: &Manifest,
) -> Result<Vec<String>, ShardError> {
    let listed: std::collections::HashSet<&str> =
        manifest.shards.iter().map(|s| s.file.as_str()).collect();
    let names = match location {
        DatasetLocation::Dir(dir) => {
            let mut names = Vec::new();
            for entry in std::fs::read_dir(dir).map_err(|e| ShardError::io(dir, e))? {
                let entry = entry.map_err(|e| ShardError::io(dir, e))?;
                names.push(entry.file_name().to_string_lossy().into_owned());
            }
            names
        }
        DatasetLocation::Remote(files) => files.list()?,
    };
    let mut extra = Vec::new();
    for name in names {
        if name.starts_with("shard-") && name.ends_with(".parquet") && !listed.contains(&*name) {
            extra.push(name);
        }
    }
    extra.sort();
    Ok(extra
        .into_iter()
        .map(|name| format!("{name}: not listed in index.json (not part of this dataset)"))
        .collect())
}

/// Checks one shard; the first fatal problem is returned, row-level ones are pushed.
fn verify_shard(
    location: &DatasetLocation,
    manifest: &Manifest,
    info: &ShardInfo,
    first_sample: u64,
    report: &mut VerifyReport,
) -> Result<(), String> {
    // A remote shard's problems name its URL.
    let name = &match location {
        DatasetLocation::Dir(_) => info.file.clone(),
        DatasetLocation::Remote(files) => format!("{}/{}", files.url(), info.file),
    };
    let (sha, len, whole) = match location {
        DatasetLocation::Dir(dir) => {
            let (sha, len) = sha256_file(&dir.join(&info.file)).map_err(|e| with_causes(&e))?;
            (sha, len, None)
        }
        DatasetLocation::Remote(files) => {
            let fetched = files.read_ranges(info, std::slice::from_ref(&(0..info.bytes)));
            let bytes = fetched.map_err(|e| with_causes(&e))?.into_iter().next();
            let bytes = bytes.unwrap_or_default();
            let len = bytes.len() as u64;
            (hex::encode(Sha256::digest(&bytes)), len, Some(bytes))
        }
    };
    if len != info.bytes {
        return Err(format!(
            "{name}: size is {len} bytes, index.json says {}",
            info.bytes
        ));
    }
    if sha != info.sha256 {
        return Err(format!(
            "{name}: sha256 mismatch: file has {sha}, index.json says {}",
            info.sha256
        ));
    }
    let shard = match (whole, location) {
        (Some(bytes), _) => OpenShard::from_bytes(&info.file, bytes, first_sample),
        (None, DatasetLocation::Dir(dir)) => OpenShard::open(dir, &info.file, first_sample),
        (None, DatasetLocation::Remote(files)) => {
            OpenShard::open_remote(files.clone(), info, first_sample)
        }
    }
    .map_err(|e| with_causes(&e))?;
    let file_schema = shard.metadata.schema();
    if file_schema.fields() != schema_v3().fields() {
        return Err(format!(
            "{name}: schema differs from tessera's format {FORMAT_VERSION} schema: {file_schema:?}"
        ));
    }
    let groups = shard.metadata.metadata().row_groups();
    if shard.rows() != info.rows || groups.len() != info.row_groups.len() {
        return Err(format!(
            "{name}: holds {} rows in {} row groups, index.json says {} rows in {}",
            shard.rows(),
            groups.len(),
            info.rows,
            info.row_groups.len()
        ));
    }
    let (mut text_tokens, mut supervised) = (0u64, 0u64);
    for (g, expected) in info.row_groups.iter().enumerate() {
        if groups[g].num_rows() as u64 != expected.rows {
            return Err(format!(
                "{name}: row group {g} holds {} rows, index.json says {}",
                groups[g].num_rows(),
                expected.rows
            ));
        }
        let rows: Vec<usize> = (0..expected.rows as usize).collect();
        let samples = shard
            .read_rows(g, &rows, None)
            .map_err(|e| with_causes(&e))?;
        for (r, sample) in samples.iter().enumerate() {
            let row = expected.first_row + r as u64;
            let problem = check_row(sample)
                .or_else(|| check_placeholders(sample, manifest.image_placeholder_id));
            if let Some(problem) = problem {
                report.problems.push(format!(
                    "{name} row {row} (sample {}): {problem}",
                    sample.id
                ));
            }
            text_tokens += u64::from(sample.num_text_tokens);
            supervised += u64::from(sample.num_supervised_tokens);
        }
        report.samples_checked += samples.len() as u64;
    }
    if text_tokens != info.num_text_tokens || supervised != info.num_supervised_tokens {
        return Err(format!(
            "{name}: token totals {text_tokens}/{supervised} differ from index.json's {}/{}",
            info.num_text_tokens, info.num_supervised_tokens
        ));
    }
    Ok(())
}

/// A row's internal consistency; `None` when sound.
pub(crate) fn check_row(s: &Sample) -> Option<String> {
    if s.input_ids.len() != s.num_text_tokens as usize {
        return Some(format!(
            "num_text_tokens {} != {} input ids",
            s.num_text_tokens,
            s.input_ids.len()
        ));
    }
    if s.label_mask.len() != s.input_ids.len() {
        return Some(format!(
            "label_mask has {} entries for {} ids",
            s.label_mask.len(),
            s.input_ids.len()
        ));
    }
    let counted = s.label_mask.iter().skip(1).filter(|&&m| m).count();
    if counted != s.num_supervised_tokens as usize {
        return Some(format!(
            "num_supervised_tokens {} != {counted} counted",
            s.num_supervised_tokens
        ));
    }
    if let Some(m) = s.checksum_mismatch() {
        let (column, stored, computed) = (m.what(), m.stored, m.computed);
        return Some(format!("{column} crc32c {stored} != {computed} computed"));
    }
    match (s.kind, s.images.len()) {
        (Kind::Image, 0) => Some("kind is image but no image is stored".into()),
        (Kind::Image, _) => s
            .images
            .iter()
            .any(|i| i.crc32c.is_none())
            .then(|| "image sample without its image crc32c".into()),
        (Kind::Text, 0) => None,
        (Kind::Text, n) => Some(format!("kind is text but {n} images are stored")),
    }
}

/// A row's placeholder count against its images (`None` when they agree).
pub(crate) fn check_placeholders(s: &Sample, placeholder_id: u32) -> Option<String> {
    let placeholders = s.input_ids.iter().filter(|&&t| t == placeholder_id).count();
    (placeholders != s.images.len()).then(|| {
        format!(
            "{placeholders} image placeholders ({placeholder_id}) for {} images",
            s.images.len()
        )
    })
}
