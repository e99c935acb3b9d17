//! Every request an object store makes, counted where it is made: object_store's HTTP client
//! sits behind a counting layer ([`CountingConnector`]), so the attempts its retry loop makes
//! are seen one by one, with the reason each failed one failed (an HTTP 5xx or 429, a timeout,
//! a connection dropped, a body cut mid-way). object_store retries each failed attempt unless
//! it was its request's last (`retry.rs`): in a run that finished, every failed attempt was
//! retried, so the count is the run's retries.
use bytes::Bytes;
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest, HttpResponse,
    HttpResponseBody, HttpService, ReqwestConnector,
};
use object_store::ClientOptions;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Context, Poll};

/// The counters one store's requests add to.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    attempts: AtomicU64,
    server_errors: AtomicU64,
    timeouts: AtomicU64,
    dropped: AtomicU64,
    cut_bodies: AtomicU64,
}

impl Counters {
    pub(crate) fn snapshot(&self) -> RequestCounts {
        RequestCounts {
            attempts: self.attempts.load(Relaxed),
            server_errors: self.server_errors.load(Relaxed),
            timeouts: self.timeouts.load(Relaxed),
            dropped: self.dropped.load(Relaxed),
            cut_bodies: self.cut_bodies.load(Relaxed),
        }
    }
}

/// What a store's requests met so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestCounts {
    /// HTTP requests sent, retries included.
    pub attempts: u64,
    /// Answered with a 5xx or 429 status.
    pub server_errors: u64,
    /// No answer within the timeout (`TESSERA_REMOTE_TIMEOUT_S`).
    pub timeouts: u64,
    /// The connection failed or closed before an answer.
    pub dropped: u64,
    /// The answer's body stopped short.
    pub cut_bodies: u64,
}

impl RequestCounts {
    /// Failed attempts: each was retried, unless it was its request's last.
    pub fn failed(&self) -> u64 {
        self.server_errors + self.timeouts + self.dropped + self.cut_bodies
    }

    /// `7 of 120 requests failed and were retried (HTTP 5xx: 3, timed out: 2, ...)`.
    pub fn describe(&self) -> String {
        let causes: Vec<String> = [
            ("HTTP 5xx", self.server_errors),
            ("timed out", self.timeouts),
            ("connection dropped", self.dropped),
            ("body cut short", self.cut_bodies),
        ]
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(what, n)| format!("{what}: {n}"))
        .collect();
        if causes.is_empty() {
            return format!("{} requests, none failed", self.attempts);
        }
        format!(
            "{} of {} requests failed and were retried ({})",
            self.failed(),
            self.attempts,
            causes.join(", ")
        )
    }
}

/// object_store's own reqwest client, behind the counting layer.
#[derive(Debug)]
pub(crate) struct CountingConnector {
    counters: Arc<Counters>,
}

impl CountingConnector {
    pub(crate) fn new(counters: Arc<Counters>) -> Self {
        CountingConnector { counters }
    }
}

impl HttpConnector for CountingConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let inner = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(CountingService {
            inner,
            counters: self.counters.clone(),
        }))
    }
}

#[derive(Debug)]
struct CountingService {
    inner: HttpClient,
    counters: Arc<Counters>,
}

#[async_trait::async_trait]
impl HttpService for CountingService {
    async fn call(&self, req: HttpRequest) -> Result<HttpResponse, HttpError> {
        let c = &self.counters;
        c.attempts.fetch_add(1, Relaxed);
        match self.inner.execute(req).await {
            Ok(response) => {
                let status = response.status();
                if status.is_server_error() || status.as_u16() == 429 {
                    c.server_errors.fetch_add(1, Relaxed);
                }
                let (parts, body) = response.into_parts();
                let body = HttpResponseBody::new(CountingBody {
                    inner: body,
                    counters: c.clone(),
                });
                Ok(HttpResponse::from_parts(parts, body))
            }
            Err(e) => {
                match e.kind() {
                    HttpErrorKind::Timeout => c.timeouts.fetch_add(1, Relaxed),
                    _ => c.dropped.fetch_add(1, Relaxed),
                };
                Err(e)
            }
        }
    }
}

/// A response body that counts an error while it is read (the connection cut mid-way, or
/// the timeout hit mid-body).
struct CountingBody {
    inner: HttpResponseBody,
    counters: Arc<Counters>,
}

impl http_body::Body for CountingBody {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, HttpError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Err(_))) = &polled {
            self.counters.cut_bodies.fetch_add(1, Relaxed);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_description_names_each_cause_once() {
        let counts = RequestCounts {
            attempts: 120,
            server_errors: 3,
            timeouts: 2,
            dropped: 0,
            cut_bodies: 2,
        };
        assert_eq!(counts.failed(), 7);
        assert_eq!(
            counts.describe(),
            "7 of 120 requests failed and were retried (HTTP 5xx: 3, timed out: 2, body cut \
             short: 2)"
        );
        assert_eq!(
            RequestCounts::default().describe(),
            "0 requests, none failed"
        );
    }
}
