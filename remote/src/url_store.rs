//! `--shards` arguments: a path, `file://` URL, or an object-store URL.
use crate::cache::RangeCache;
use crate::files::ObjectFiles;
use crate::request_counts::{Counters, CountingConnector};
use crate::retry::{config_value, RetryPolicy};
use crate::RemoteError;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::http::HttpBuilder;
use object_store::path::Path as ObjectPath;
use object_store::{ClientConfigKey, ClientOptions, ObjectStore};
use std::path::PathBuf;
use std::sync::Arc;
use tessera_shards::DatasetLocation;

/// Store settings on top of the environment's: object_store config keys and values, e.g.
/// `("aws_endpoint", "http://127.0.0.1:9000")` (tests point at their own server this way).
pub type StoreSettings<'a> = &'a [(&'a str, &'a str)];

/// The local cache of a remote dataset: where, and at most how many bytes.
#[derive(Clone, Debug)]
pub struct CacheConfig {
    pub dir: PathBuf,
    pub limit: u64,
}

/// Whether `spec` names an object store (rather than a local directory or `file://`).
pub fn is_remote(spec: &str) -> bool {
    matches!(
        spec.split_once("://").map(|(scheme, _)| scheme),
        Some("s3" | "s3a" | "gs" | "az" | "abfs" | "abfss" | "azure" | "http" | "https")
    )
}

/// Opens `spec` (a path or URL) as a dataset location; `cache` applies to remote ones.
pub fn open_location(
    spec: &str,
    cache: Option<&CacheConfig>,
) -> Result<DatasetLocation, RemoteError> {
    if let Some(path) = spec.strip_prefix("file://") {
        return Ok(DatasetLocation::Dir(PathBuf::from(path)));
    }
    if !is_remote(spec) {
        return Ok(DatasetLocation::Dir(PathBuf::from(spec)));
    }
    Ok(DatasetLocation::Remote(open_remote(spec, cache, &[])?))
}

/// The files of an object-store URL (`s3://`, `gs://`, `az://`, `https://`): credentials and
/// endpoint from the environment, then `settings`.
pub fn open_remote(
    spec: &str,
    cache: Option<&CacheConfig>,
    settings: StoreSettings<'_>,
) -> Result<Arc<ObjectFiles>, RemoteError> {
    let bad = |source| RemoteError::BadUrl {
        url: spec.to_string(),
        source,
    };
    let url = url::Url::parse(spec).map_err(|e| bad(Box::new(e)))?;
    let policy = RetryPolicy::from_switches();
    let counters = Arc::new(Counters::default());
    // A builder's `Generic` error says "Generic S3 error: ..." around the reason: keep the reason.
    let (store, prefix, can_list) =
        build_store(spec, &url, settings, &policy, &counters).map_err(|e| match e {
            object_store::Error::Generic { source, .. } => bad(source),
            other => bad(Box::new(other)),
        })?;
    let cache = match cache {
        Some(c) => Some(RangeCache::open(&c.dir, c.limit)?),
        None => None,
    };
    let files = ObjectFiles::new(spec.to_string(), store, prefix, can_list, cache, counters)?;
    Ok(Arc::new(files))
}

/// A store for `url` from the environment's credentials, timed out and retried as `policy`
/// says, its requests counted into `counters`; and the dataset's prefix in it.
fn build_store(
    spec: &str,
    url: &url::Url,
    settings: StoreSettings<'_>,
    policy: &RetryPolicy,
    counters: &Arc<Counters>,
) -> Result<(Arc<dyn ObjectStore>, ObjectPath, bool), object_store::Error> {
    // Set through `with_config` so that client settings from the environment (AWS_ALLOW_HTTP,
    // proxies) stay: `with_client_options` would replace them all.
    let timeouts = [
        (
            ClientConfigKey::ConnectTimeout,
            config_value(policy.connect_timeout()),
        ),
        (ClientConfigKey::Timeout, config_value(policy.timeout)),
    ];
    let retry = policy.retry_config();
    let connector = || CountingConnector::new(counters.clone());
    let prefix = ObjectPath::from(url.path().trim_matches('/'));
    let store: Arc<dyn ObjectStore> = match url.scheme() {
        "s3" | "s3a" => {
            let mut builder = AmazonS3Builder::from_env().with_url(spec);
            for (key, value) in timeouts {
                builder = builder.with_config(AmazonS3ConfigKey::Client(key), value);
            }
            for (key, value) in settings {
                builder = builder.with_config(key.parse()?, *value);
            }
            let builder = builder.with_retry(retry).with_http_connector(connector());
            Arc::new(builder.build()?)
        }
        "gs" => {
            let mut builder = GoogleCloudStorageBuilder::from_env().with_url(spec);
            for (key, value) in timeouts {
                builder = builder.with_config(GoogleConfigKey::Client(key), value);
            }
            for (key, value) in settings {
                builder = builder.with_config(key.parse()?, *value);
            }
            let builder = builder.with_retry(retry).with_http_connector(connector());
            Arc::new(builder.build()?)
        }
        "http" | "https" => {
            let client = ClientOptions::new()
                .with_connect_timeout(policy.connect_timeout())
                .with_timeout(policy.timeout)
                .with_allow_http(true);
            let store = HttpBuilder::new()
                .with_url(spec)
                .with_client_options(client)
                .with_retry(retry)
                .with_http_connector(connector())
                .build()?;
            // The URL is the store's root: object paths are relative to it.
            return Ok((Arc::new(store), ObjectPath::default(), false));
        }
        _ => {
            let mut builder = MicrosoftAzureBuilder::from_env().with_url(spec);
            for (key, value) in timeouts {
                builder = builder.with_config(AzureConfigKey::Client(key), value);
            }
            for (key, value) in settings {
                builder = builder.with_config(key.parse()?, *value);
            }
            let builder = builder.with_retry(retry).with_http_connector(connector());
            Arc::new(builder.build()?)
        }
    };
    Ok((store, prefix, true))
}
