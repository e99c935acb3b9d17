//! `tessera-remote`'s error: every message names the URL (or the cache path) it is about; a
//! wrapped library error is the `source()`, never part of the message.
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// A request failed after object_store's retries (or was not retryable: a missing object).
    #[error("{url}")]
    Store {
        url: String,
        source: object_store::Error,
    },
    /// A shard that index.json lists is not in the store (a 404, which is not retried).
    #[error(
        "{url}: not found, though index.json lists it (shard {file}: {rows} rows, {bytes} \
         bytes): the object is gone from the store; put it back (or ingest again), then run \
         again with --resume"
    )]
    ShardGone {
        url: String,
        file: String,
        rows: u64,
        bytes: u64,
        /// Boxed: the variant's names would make every `RemoteError` larger.
        source: Box<object_store::Error>,
    },
    /// The URL does not parse, or object_store cannot build a store for it.
    #[error("{url}: not a shard directory URL")]
    BadUrl {
        url: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("{url}: {detail}")]
    Invalid { url: String, detail: String },
    /// The local directory to upload is not a finished ingest (its index.json is unreadable).
    #[error("cannot upload {dir}")]
    Upload {
        dir: PathBuf,
        source: tessera_shards::ShardError,
    },
    #[error("shard cache {path}")]
    Cache {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cache limit {text:?}: {reason}")]
    BadSize { text: String, reason: String },
    #[error("starting the object-store I/O threads")]
    Runtime(#[source] std::io::Error),
}

impl RemoteError {
    pub(crate) fn store(url: impl Into<String>, source: object_store::Error) -> Self {
        RemoteError::Store {
            url: url.into(),
            source,
        }
    }

    /// A failed read of `shard`: a missing object says which shard of the index is gone.
    pub(crate) fn of_shard(self, shard: &tessera_shards::ShardInfo) -> Self {
        match self {
            RemoteError::Store {
                url,
                source: source @ object_store::Error::NotFound { .. },
            } => RemoteError::ShardGone {
                url,
                file: shard.file.clone(),
                rows: shard.rows,
                bytes: shard.bytes,
                source: Box::new(source),
            },
            other => other,
        }
    }

    pub(crate) fn cache(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        RemoteError::Cache {
            path: path.into(),
            source,
        }
    }
}

impl From<RemoteError> for tessera_shards::ShardError {
    fn from(e: RemoteError) -> Self {
        tessera_shards::ShardError::Remote(Box::new(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_object_names_its_url_and_the_cause_once() {
        let url = "s3://data/set/shard-00001.parquet";
        let missing = object_store::Error::NotFound {
            path: "set/shard-00001.parquet".into(),
            source: "404 Not Found".into(),
        };
        let error = tessera_shards::ShardError::from(RemoteError::store(url, missing));
        let text = tessera_errors::with_causes(&error);
        assert!(text.starts_with(url), "{text}");
        assert_eq!(text.matches(url).count(), 1, "{text}");
        // object_store's message holds its source too: anyhow's `{:#}` would print it twice.
        assert_eq!(text.matches("404 Not Found").count(), 1, "{text}");
    }

    #[test]
    fn an_unparsable_url_says_why() {
        let Err(error) = crate::open_remote("bucket/data", None, &[]) else {
            panic!("a URL without a scheme opened");
        };
        assert!(std::error::Error::source(&error).is_some());
        let text = tessera_errors::with_causes(&error);
        assert!(
            text.starts_with("bucket/data: not a shard directory URL: "),
            "{text}"
        );
    }
}
