//! The shards' tokenizer against the language model's, checked before training: the ids the
//! shards hold must be the LM's own. Ingest recorded the sha256 of the tokenizer.json it was
//! given (`Manifest::source_tokenizer_fingerprint`) and the special tokens it resolved; a
//! language model folder that holds a tokenizer.json of another sha256 is refused, naming both.
//! A tokenizer with an `<image>` ingest added past the checkpoint's `vocab_size` makes the LM
//! append rows for it ([`added_rows`]).
use crate::config::ConfigError;
use crate::error::TrainError;
use std::path::Path;
use tessera_model::LmConfig;

/// Refuses shards tokenized with another tokenizer than the one in `lm_dir` (when the folder
/// holds one; a folder without tokenizer.json, as `init-model` writes without `--tokenizer`,
/// cannot be checked, which rank 0 logs).
pub(crate) fn check_tokenizer(
    manifest: &tessera_shards::Manifest,
    shards: &Path,
    lm_dir: &Path,
    rank: usize,
) -> Result<(), TrainError> {
    let path = lm_dir.join(tessera_shards::TOKENIZER_FILE);
    if !path.is_file() {
        if rank == 0 {
            tracing::warn!(
                "{} has no tokenizer.json: cannot check that {} were tokenized with the \
                 language model's own tokenizer",
                lm_dir.display(),
                shards.display()
            );
        }
        return Ok(());
    }
    let (found, _) = tessera_shards::sha256_file(&path)?;
    let expected = manifest.source_tokenizer_fingerprint();
    if found != expected {
        return Err(ConfigError::Invalid {
            field: "shards",
            reason: format!(
                "{} were tokenized with a tokenizer.json of sha256 {expected}, but the language \
                 model's {} has sha256 {found}: its ids would mean other tokens to this model; \
                 ingest again with --tokenizer {}",
                shards.display(),
                path.display(),
                path.display()
            ),
        }
        .into());
    }
    Ok(())
}

/// Rows the LM appends for the tokens ingest added past its checkpoint's vocabulary (0 when
/// every id of the shards' tokenizer has a row). An image or end token past the rows that
/// ingest did not add means the shards' tokenizer is not this LM's, and is refused.
pub(crate) fn added_rows(
    manifest: &tessera_shards::Manifest,
    shards: &Path,
    lm: &LmConfig,
) -> Result<i64, TrainError> {
    let tokens = manifest.special_tokens();
    let vocab = lm.vocab_size;
    let past = |id: u32| i64::from(id) >= vocab;
    let added = if !tokens.added.is_empty() && past(tokens.image.id) {
        i64::from(tokens.image.id) + 1 - vocab
    } else {
        0
    };
    let rows = vocab + added;
    let outside = [&tokens.image, &tokens.eos]
        .into_iter()
        .find(|t| i64::from(t.id) >= rows);
    if let Some(token) = outside {
        return Err(ConfigError::Invalid {
            field: "shards",
            reason: format!(
                "{}: {} is id {} in their tokenizer, but the language model has {vocab} \
                 embedding rows: they were tokenized for another model",
                shards.display(),
                token.text,
                token.id
            ),
        }
        .into());
    }
    Ok(added)
}
