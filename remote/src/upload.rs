//! `tessera ingest --out s3://...`: a finished local shard directory uploaded to object
//! storage, shards first (multipart, a few parts in flight; then rejected.jsonl and the
//! tokenizer.json ingest keeps beside the index), index.json last, so a reader never
//! sees an index naming a shard that is not all there. A shard already stored with the
//! index's size is not sent again (a rerun after an interrupted upload resumes).
use crate::files::ObjectFiles;
use crate::RemoteError;
use object_store::{PutPayload, WriteMultipart};
use std::io::Read;
use std::path::Path;
use tessera_shards::{Manifest, INDEX_FILE, TOKENIZER_FILE};

/// Bytes per multipart part (S3 wants at least 5 MiB for all but the last).
const PART_BYTES: usize = 8 << 20;
/// Parts in flight per file.
const PARTS_IN_FLIGHT: usize = 4;

/// What [`ObjectFiles::upload_dataset`] sent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UploadSummary {
    pub files_sent: usize,
    pub files_already_there: usize,
    pub bytes_sent: u64,
}

impl ObjectFiles {
    /// Uploads the shard directory `dir` (index.json present: a complete ingest) here.
    pub fn upload_dataset(&self, dir: &Path) -> Result<UploadSummary, RemoteError> {
        let manifest = Manifest::load(dir).map_err(|source| RemoteError::Upload {
            dir: dir.to_path_buf(),
            source,
        })?;
        let mut summary = UploadSummary::default();
        let mut names: Vec<(String, u64)> = manifest
            .shards
            .iter()
            .map(|s| (s.file.clone(), s.bytes))
            .collect();
        for extra in ["rejected.jsonl", TOKENIZER_FILE] {
            if let Ok(meta) = std::fs::metadata(dir.join(extra)) {
                names.push((extra.into(), meta.len()));
            }
        }
        for (name, bytes) in names {
            if self.stored_size(&name)? == Some(bytes) {
                summary.files_already_there += 1;
                continue;
            }
            self.upload_file(&dir.join(&name), &name)?;
            summary.files_sent += 1;
            summary.bytes_sent += bytes;
        }
        let index = std::fs::read(dir.join(INDEX_FILE))
            .map_err(|e| RemoteError::cache(dir.join(INDEX_FILE), e))?;
        let path = self.object(INDEX_FILE);
        summary.bytes_sent += index.len() as u64;
        self.block_on(self.store().put(&path, PutPayload::from(index)))
            .map_err(|e| RemoteError::store(self.url_of(INDEX_FILE), e))?;
        summary.files_sent += 1;
        Ok(summary)
    }

    /// The object's size, or `None` when it does not exist.
    pub(crate) fn stored_size(&self, name: &str) -> Result<Option<u64>, RemoteError> {
        let path = self.object(name);
        match self.block_on(self.store().head(&path)) {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(RemoteError::store(self.url_of(name), e)),
        }
    }

    /// One file as a multipart upload (read in parts of [`PART_BYTES`]) to `name` in this
    /// directory.
    pub fn upload_file(&self, local: &Path, name: &str) -> Result<(), RemoteError> {
        let url = self.url_of(name);
        let mut file = std::fs::File::open(local).map_err(|e| RemoteError::cache(local, e))?;
        let path = self.object(name);
        let sent = self.block_on(async {
            let upload = self.store().put_multipart(&path).await?;
            let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_BYTES);
            let mut buf = vec![0u8; PART_BYTES];
            loop {
                let n = match file.read(&mut buf) {
                    Ok(n) => n,
                    Err(e) => {
                        writer.abort().await?;
                        return Ok(Err(RemoteError::cache(local, e)));
                    }
                };
                if n == 0 {
                    break;
                }
                writer.wait_for_capacity(PARTS_IN_FLIGHT).await?;
                writer.write(&buf[..n]);
            }
            writer.finish().await?;
            Ok::<_, object_store::Error>(Ok(()))
        });
        sent.map_err(|e| RemoteError::store(url, e))?
    }
}
