//! The mixture file (`--shards mix.toml`): shard sets and how much of each an epoch draws.
//!
//! ```toml
//! # Every source a `weight` (its share of each epoch, relative to the others) ...
//! samples = 100000            # optional: samples per epoch (default: all sources' samples)
//! [[source]]
//! name = "cauldron"           # optional: default, the last part of `shards`
//! shards = "data/cauldron"    # a shard folder (relative to this file) or a URL (s3://...)
//! weight = 0.7
//! [[source]]
//! shards = "s3://bucket/llava-558k"
//! weight = 0.3
//! ```
//! ... or every source a `repeat` (passes over it per epoch: `2` draws each sample twice,
//! `0.5` half of them; a source with neither repeats once), as MosaicML's `Stream(proportion=)`
//! and `Stream(repeat=)`, and LLaVA-OneVision's yaml (`sampling_strategy: first:50%`).
//! Weights and repeats do not mix in one file.
use super::error::MixError;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// How much of a source an epoch draws.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Amount {
    /// A share of the epoch, relative to the other sources' weights.
    Weight(f64),
    /// Passes over the source per epoch.
    Repeat(f64),
}

/// One source of a mixture file.
#[derive(Clone, Debug, PartialEq)]
pub struct SourceSpec {
    pub name: String,
    /// A shard directory (resolved against the mixture file's folder) or a URL.
    pub shards: String,
    pub amount: Amount,
}

/// A parsed mixture file.
#[derive(Clone, Debug, PartialEq)]
pub struct MixSpec {
    pub path: PathBuf,
    pub sources: Vec<SourceSpec>,
    /// Samples per epoch (weights only; default: the sum of the sources' samples).
    pub samples: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSource {
    name: Option<String>,
    shards: String,
    weight: Option<f64>,
    repeat: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMix {
    samples: Option<u64>,
    source: Vec<RawSource>,
}

/// Whether `spec` (a `--shards` value) names a mixture file rather than a shard set.
pub fn is_mixture(spec: &str) -> bool {
    spec.ends_with(".toml")
}

impl MixSpec {
    /// Reads and checks `path`.
    pub fn load(path: &Path) -> Result<MixSpec, MixError> {
        let text = std::fs::read_to_string(path).map_err(|source| MixError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        MixSpec::parse(&text, path)
    }

    /// Parses a mixture file's text; `path` names it and anchors relative shard folders.
    pub fn parse(text: &str, path: &Path) -> Result<MixSpec, MixError> {
        let invalid = |detail: String| MixError::Invalid {
            path: path.to_path_buf(),
            detail,
        };
        let raw: RawMix = toml::from_str(text).map_err(|source| MixError::Toml {
            path: path.to_path_buf(),
            source,
        })?;
        if raw.source.is_empty() {
            return Err(invalid("names no [[source]]".into()));
        }
        let weighted = raw.source.iter().filter(|s| s.weight.is_some()).count();
        if weighted > 0 && weighted < raw.source.len() {
            return Err(invalid(
                "give every source a weight, or none (then each a repeat, default 1)".into(),
            ));
        }
        if weighted == 0 && raw.samples.is_some() {
            return Err(invalid(
                "`samples` sets the epoch of weighted sources; repeats set their own".into(),
            ));
        }
        let base = path.parent().unwrap_or(Path::new("."));
        let mut sources = Vec::with_capacity(raw.source.len());
        for (i, s) in raw.source.into_iter().enumerate() {
            let name = s.name.unwrap_or_else(|| {
                s.shards
                    .trim_end_matches('/')
                    .rsplit('/')
                    .next()
                    .unwrap_or("source")
                    .to_string()
            });
            let amount = match (s.weight, s.repeat) {
                (Some(_), Some(_)) => {
                    return Err(invalid(format!(
                        "source {name}: a weight or a repeat, not both"
                    )))
                }
                (Some(w), None) => Amount::Weight(w),
                (None, r) => Amount::Repeat(r.unwrap_or(1.0)),
            };
            let value = match amount {
                Amount::Weight(v) | Amount::Repeat(v) => v,
            };
            if !value.is_finite() || value < 0.0 {
                return Err(invalid(format!(
                    "source {name}: {value} is not a weight or repeat"
                )));
            }
            if sources.iter().any(|o: &SourceSpec| o.name == name) {
                return Err(invalid(format!(
                    "two sources named {name} (source {i}); name them apart with `name`"
                )));
            }
            let shards = if s.shards.contains("://") || Path::new(&s.shards).is_absolute() {
                s.shards
            } else {
                base.join(&s.shards).to_string_lossy().into_owned()
            };
            sources.push(SourceSpec {
                name,
                shards,
                amount,
            });
        }
        if weighted > 0 && sources.iter().all(|s| s.amount == Amount::Weight(0.0)) {
            return Err(invalid("every weight is 0".into()));
        }
        Ok(MixSpec {
            path: path.to_path_buf(),
            sources,
            samples: raw.samples,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_repeats_names_and_relative_folders() -> Result<(), MixError> {
        let path = Path::new("/data/mix.toml");
        let spec = MixSpec::parse(
            "samples = 10\n[[source]]\nshards = \"a/shards\"\nweight = 3\n\
             [[source]]\nname = \"llava\"\nshards = \"s3://b/llava\"\nweight = 1\n",
            path,
        )?;
        assert_eq!(spec.samples, Some(10));
        assert_eq!(spec.sources[0].name, "shards");
        assert_eq!(spec.sources[0].shards, "/data/a/shards");
        assert_eq!(spec.sources[1].shards, "s3://b/llava");
        assert_eq!(spec.sources[1].amount, Amount::Weight(1.0));
        let repeats = MixSpec::parse(
            "[[source]]\nshards = \"/x\"\nrepeat = 2\n[[source]]\nshards = \"/y\"\n",
            path,
        )?;
        assert_eq!(repeats.sources[1].amount, Amount::Repeat(1.0));
        for bad in [
            "[[source]]\nshards = \"/x\"\nweight = 1\n[[source]]\nshards = \"/y\"\n",
            "[[source]]\nshards = \"/x\"\nweight = 1\nrepeat = 1\n",
            "[[source]]\nshards = \"/x\"\nweight = -1\n",
            "[[source]]\nshards = \"/x\"\n[[source]]\nshards = \"/z/x\"\n",
            "samples = 3\n[[source]]\nshards = \"/x\"\n",
            "[[source]]\nshard = \"/x\"\n",
        ] {
            let err = MixSpec::parse(bad, path).expect_err(bad);
            assert!(err.to_string().starts_with("/data/mix.toml"), "{err}");
        }
        Ok(())
    }
}
