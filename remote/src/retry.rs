//! The retry policy of every object-store request. object_store retries what can succeed on a
//! second try: HTTP 5xx and 429, connections refused or dropped, bodies cut mid-way, and
//! requests that run past the timeout (for reads and idempotent writes), with exponential
//! backoff and jitter. A missing object (404) or a refusal (403) is not retried. Each part is a
//! documented environment switch (`tessera-switches`), shared by `train`, `ingest --out`,
//! `shards verify` and `bench loader`:
//!
//! | switch | default | what |
//! | --- | --- | --- |
//! | `TESSERA_REMOTE_RETRIES` | 10 | retries of one request at most (0: none) |
//! | `TESSERA_REMOTE_BACKOFF_MS` | 100 | first wait, doubled each retry up to 10 s |
//! | `TESSERA_REMOTE_RETRY_S` | 120 | seconds after which a request is not retried again |
//! | `TESSERA_REMOTE_TIMEOUT_S` | 60 | seconds one attempt may take, first byte to last |
use object_store::{BackoffConfig, RetryConfig};
use std::time::Duration;
use tessera_switches::Switches;

/// Longest wait between two tries of one request.
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// Longest wait for a connection (capped by the request timeout).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How object-store requests are timed out and retried.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries of one request at most.
    pub retries: usize,
    /// The first wait before a retry; each further one doubles, up to 10 s.
    pub first_backoff: Duration,
    /// No retry starts later than this after the request's first try.
    pub budget: Duration,
    /// One attempt's limit, from connecting to the last byte of the answer.
    pub timeout: Duration,
}

impl RetryPolicy {
    /// The policy the environment's switches set (their defaults when unset).
    pub fn from_switches() -> Self {
        let s = Switches::get();
        RetryPolicy {
            retries: s.remote_retries,
            first_backoff: s.remote_backoff,
            budget: s.remote_retry,
            timeout: s.remote_timeout,
        }
    }

    pub(crate) fn retry_config(&self) -> RetryConfig {
        RetryConfig {
            backoff: BackoffConfig {
                init_backoff: self.first_backoff,
                max_backoff: MAX_BACKOFF.max(self.first_backoff),
                base: 2.0,
            },
            max_retries: self.retries,
            retry_timeout: self.budget,
        }
    }

    pub(crate) fn connect_timeout(&self) -> Duration {
        CONNECT_TIMEOUT.min(self.timeout)
    }

    /// `10 retries within 120 s, 100 ms backoff doubling to 10 s, 60 s per attempt`.
    pub fn describe(&self) -> String {
        format!(
            "{} retries within {} s, {} ms backoff doubling to {} s, {} s per attempt",
            self.retries,
            self.budget.as_secs(),
            self.first_backoff.as_millis(),
            MAX_BACKOFF.max(self.first_backoff).as_secs(),
            self.timeout.as_secs_f64()
        )
    }
}

/// A duration as object_store's config values spell one (humantime).
pub(crate) fn config_value(d: Duration) -> String {
    format!("{}ms", d.as_millis().max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_becomes_object_stores_retry_config() {
        let policy = RetryPolicy {
            retries: 3,
            first_backoff: Duration::from_millis(20),
            budget: Duration::from_secs(5),
            timeout: Duration::from_secs(2),
        };
        let config = policy.retry_config();
        assert_eq!(config.max_retries, 3);
        assert_eq!(config.retry_timeout, Duration::from_secs(5));
        assert_eq!(config.backoff.init_backoff, Duration::from_millis(20));
        assert_eq!(policy.connect_timeout(), Duration::from_secs(2));
        assert_eq!(config_value(Duration::from_millis(1500)), "1500ms");
        assert_eq!(
            policy.describe(),
            "3 retries within 5 s, 20 ms backoff doubling to 10 s, 2 s per attempt"
        );
    }
}
