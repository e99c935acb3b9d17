//! A flaky object store for tests: an HTTP/1.1 proxy on 127.0.0.1 (a free port) in front of
//! the moto S3 server that fails a chosen share of requests, by method, the ways real stores
//! fail: an HTTP 503 (S3's `SlowDown`) before the request reaches the server, an answer cut
//! mid-way after it did, or a stall with no answer past the client's timeout. Faults are
//! deterministic: of the requests of a method, every `every`-th one fails, the fault kinds
//! taking turns. Each connection carries one request (the proxy answers `Connection: close`).
#![allow(dead_code)]
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// One way a request fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Fault {
    /// `503 Slow Down` without forwarding the request.
    Unavailable,
    /// Forwarded; the answer is cut after half its bytes (a GET's body mid-way).
    CutBody,
    /// Not forwarded; the connection stays silent for the plan's stall, then closes.
    Stall,
}

/// Which requests of a method fail, and how.
#[derive(Clone, Debug)]
pub(crate) struct Rule {
    pub method: &'static str,
    /// Every `every`-th request of the method fails (10: 10% of them).
    pub every: usize,
    /// The fault kinds, in turn.
    pub faults: Vec<Fault>,
}

/// What the proxy saw and did.
#[derive(Clone, Debug, Default)]
pub(crate) struct ProxyLog {
    /// Requests per method.
    pub requests: BTreeMap<String, usize>,
    /// Faults injected per (method, fault).
    pub injected: BTreeMap<(String, Fault), usize>,
}

impl ProxyLog {
    /// Faults injected into requests of `method`.
    pub(crate) fn injected_into(&self, method: &str) -> usize {
        self.injected
            .iter()
            .filter(|((m, _), _)| m == method)
            .map(|(_, n)| n)
            .sum()
    }
}

struct Shared {
    upstream: u16,
    rules: Mutex<Vec<Rule>>,
    stall: Duration,
    log: Mutex<ProxyLog>,
    stop: AtomicBool,
}

pub(crate) struct FaultProxy {
    pub(crate) port: u16,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl FaultProxy {
    /// A proxy to the server on 127.0.0.1:`upstream` failing requests as `rules` say; a stall
    /// lasts `stall` (longer than the client's timeout).
    pub(crate) fn start(upstream: u16, rules: Vec<Rule>, stall: Duration) -> Result<FaultProxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Shared {
            upstream,
            rules: Mutex::new(rules),
            stall,
            log: Mutex::new(ProxyLog::default()),
            stop: AtomicBool::new(false),
        });
        let accept = {
            let shared = shared.clone();
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    if shared.stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    let shared = shared.clone();
                    std::thread::spawn(move || {
                        let _ = serve(conn, &shared);
                    });
                }
            })
        };
        Ok(FaultProxy {
            port,
            shared,
            accept: Some(accept),
        })
    }

    pub(crate) fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The S3 client environment pointing at the proxy instead of the server.
    pub(crate) fn env(&self) -> Vec<(&'static str, String)> {
        super::moto::client_env(self.endpoint())
    }

    pub(crate) fn log(&self) -> ProxyLog {
        self.shared
            .log
            .lock()
            .map(|l| l.clone())
            .unwrap_or_default()
    }

    /// Replaces the fault rules (empty: a healthy store from now on).
    pub(crate) fn set_rules(&self, rules: Vec<Rule>) {
        if let Ok(mut r) = self.shared.rules.lock() {
            *r = rules;
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        // Wakes the accept loop so it sees the stop flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
    }
}

/// One request: read it whole, decide its fate, answer.
fn serve(mut client: TcpStream, shared: &Shared) -> Result<()> {
    client.set_read_timeout(Some(Duration::from_secs(30)))?;
    let request = read_request(&mut client)?;
    let method = request_method(&request);
    let fault = decide(shared, &method);
    match fault {
        Some(Fault::Unavailable) => {
            let body = b"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code>\
<Message>Please reduce your request rate.</Message></Error>";
            let head = format!(
                "HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n",
                body.len()
            );
            client.write_all(head.as_bytes())?;
            client.write_all(body)?;
        }
        Some(Fault::Stall) => {
            std::thread::sleep(shared.stall);
        }
        Some(Fault::CutBody) => {
            let answer = forward(&request, shared.upstream)?;
            let head_end = find(&answer, b"\r\n\r\n").map_or(answer.len() / 2, |i| i + 4);
            let body = answer.len() - head_end;
            // Half the body; an answer without a body loses half its head.
            let cut = if body > 1 {
                head_end + body / 2
            } else {
                head_end / 2
            };
            client.write_all(&answer[..cut])?;
        }
        None => {
            let answer = forward(&request, shared.upstream)?;
            client.write_all(&answer)?;
        }
    }
    client.flush()?;
    let _ = client.shutdown(Shutdown::Both);
    Ok(())
}

/// Counts the request and picks its fault, if any.
fn decide(shared: &Shared, method: &str) -> Option<Fault> {
    let mut log = shared.log.lock().ok()?;
    let n = {
        let count = log.requests.entry(method.to_string()).or_default();
        *count += 1;
        *count
    };
    let rules = shared.rules.lock().ok()?;
    let rule = rules.iter().find(|r| r.method == method)?;
    if rule.every == 0 || rule.faults.is_empty() || n % rule.every != 0 {
        return None;
    }
    let fault = rule.faults[(n / rule.every - 1) % rule.faults.len()];
    *log.injected.entry((method.to_string(), fault)).or_default() += 1;
    Some(fault)
}

/// Sends `request` to the server with `Connection: close` and reads its whole answer.
fn forward(request: &[u8], upstream: u16) -> Result<Vec<u8>> {
    let mut server = TcpStream::connect(("127.0.0.1", upstream)).context("connecting to moto")?;
    server.set_read_timeout(Some(Duration::from_secs(60)))?;
    let head_end = find(request, b"\r\n\r\n").context("a request without a head")? + 4;
    let head = String::from_utf8_lossy(&request[..head_end]);
    let mut rewritten = String::new();
    for line in head.split("\r\n").filter(|l| !l.is_empty()) {
        if !line.to_ascii_lowercase().starts_with("connection:") {
            rewritten.push_str(line);
            rewritten.push_str("\r\n");
        }
    }
    rewritten.push_str("Connection: close\r\n\r\n");
    server.write_all(rewritten.as_bytes())?;
    server.write_all(&request[head_end..])?;
    let mut answer = Vec::new();
    server.read_to_end(&mut answer)?;
    Ok(answer)
}

fn request_method(request: &[u8]) -> String {
    let end = request
        .iter()
        .position(|&b| b == b' ')
        .unwrap_or(request.len());
    String::from_utf8_lossy(&request[..end]).into_owned()
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Reads one request: the head, then a body of `Content-Length` bytes or chunked.
fn read_request(conn: &mut TcpStream) -> Result<Vec<u8>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 64 * 1024];
    let head_end = loop {
        if let Some(i) = find(&buf, b"\r\n\r\n") {
            break i + 4;
        }
        let n = conn.read(&mut chunk)?;
        if n == 0 {
            bail!("the client closed before its request's head ended");
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let header = |name: &str| {
        head.split("\r\n")
            .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string()))
    };
    if header("transfer-encoding:").is_some_and(|v| v.contains("chunked")) {
        // Until the zero-length chunk and its blank line.
        while find(&buf[head_end..], b"\r\n0\r\n\r\n").is_none()
            && !buf[head_end..].starts_with(b"0\r\n\r\n")
        {
            let n = conn.read(&mut chunk)?;
            if n == 0 {
                bail!("the client closed inside a chunked body");
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        return Ok(buf);
    }
    let length: usize = header("content-length:")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let n = conn.read(&mut chunk)?;
        if n == 0 {
            bail!("the client closed inside its request's body");
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Ok(buf)
}
