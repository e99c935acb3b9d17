//! The run's tokenizer: rank 0 keeps a copy of the shards' `tokenizer.json` in the run folder
//! at the start (checked against the fingerprint their index names), and export and
//! generation find it there (or take `--tokenizer`), refusing one with another fingerprint.
use crate::config::ConfigError;
use crate::error::TrainError;
use crate::export::error::ExportError;
use crate::run_dir::RunDir;
use crate::vlm_description::VlmDescription;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

impl RunDir {
    /// The tokenizer.json to use with this run: `explicit` (`--tokenizer`) when given, else the
    /// run's own copy; refused unless its sha256 is the fingerprint the run's shards recorded
    /// (`vlm.json`), naming the file and both fingerprints.
    pub fn tokenizer_for(&self, explicit: Option<&Path>) -> Result<PathBuf, ExportError> {
        let expected = VlmDescription::load(&self.vlm())?.tokenizer_fingerprint;
        let path = match explicit {
            Some(path) => path.to_path_buf(),
            None if self.tokenizer().is_file() => self.tokenizer(),
            None => {
                return Err(ExportError::NoTokenizer {
                    run: self.path().to_path_buf(),
                    expected,
                })
            }
        };
        let (found, _) =
            tessera_shards::sha256_file(&path).map_err(|e| ExportError::Unreadable {
                run: self.path().to_path_buf(),
                what: "cannot read its tokenizer".into(),
                source: e.into(),
            })?;
        if found != expected {
            return Err(ExportError::TokenizerMismatch {
                run: self.path().to_path_buf(),
                file: path,
                found,
                expected,
            });
        }
        Ok(path)
    }

    /// Rank 0, at the start of a run: copies the `tokenizer.json` that ingest keeps beside the
    /// shards' index.json into the run folder, after checking it is the tokenizer the index
    /// names. Shards without one (ingested before ingest kept it) leave the run without a
    /// tokenizer: export and generate then need `--tokenizer`, and the log says so.
    pub(crate) fn keep_tokenizer(
        &self,
        dataset: &tessera_shards::Dataset,
    ) -> Result<(), TrainError> {
        let name = tessera_shards::TOKENIZER_FILE;
        let bytes = match dataset.source() {
            tessera_shards::DatasetLocation::Dir(dir) => {
                let path = dir.join(name);
                if path.is_file() {
                    Some(std::fs::read(&path).map_err(crate::error::io(&path))?)
                } else {
                    None
                }
            }
            tessera_shards::DatasetLocation::Remote(files) => {
                if files.list()?.iter().any(|n| n == name) {
                    Some(files.read_file(name)?.to_vec())
                } else {
                    None
                }
            }
        };
        let shards_at = dataset.source().describe();
        let Some(bytes) = bytes else {
            tracing::warn!(
                "{shards_at} holds no {name} beside its index.json (ingested before ingest kept \
                 one): `export --format llava-hf` and `generate` of this run will need --tokenizer"
            );
            return Ok(());
        };
        let found = hex::encode(Sha256::digest(&bytes));
        let expected = &dataset.manifest().tokenizer_fingerprint;
        if &found != expected {
            return Err(ConfigError::Invalid {
                field: "shards",
                reason: format!(
                    "{shards_at}/{name} has sha256 {found}, but index.json says the shards were \
                     tokenized with {expected}: put the right tokenizer.json there, or remove it \
                     (export and generate will then need --tokenizer)"
                ),
            }
            .into());
        }
        let path = self.tokenizer();
        tessera_shards::write_atomically(&path, &bytes)?;
        Ok(())
    }
}
