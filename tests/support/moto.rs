//! A real S3-compatible server for tests: moto's standalone server (`.deps/moto`, installed by
//! scripts/setup/setup.sh) on 127.0.0.1 at a free port, killed on drop. Buckets and objects are
//! created with plain HTTP PUTs (moto accepts unsigned requests), so the code under test is
//! the only S3 client.
#![allow(dead_code)]
use anyhow::{bail, ensure, Context, Result};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub(crate) struct MotoServer {
    child: Child,
    pub(crate) port: u16,
}

/// `.deps/moto/bin/moto_server` of the workspace.
fn moto_binary() -> Result<PathBuf> {
    let mut dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    loop {
        let candidate = dir.join(".deps/moto/bin/moto_server");
        if candidate.is_file() {
            return Ok(candidate);
        }
        dir = dir
            .parent()
            .context("no .deps/moto/bin/moto_server above the crate: run scripts/setup/setup.sh")?;
    }
}

impl MotoServer {
    /// Starts a server on a free port and waits until it answers.
    pub(crate) fn start() -> Result<MotoServer> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        MotoServer::start_on(port)
    }

    /// Starts a server on `port` (a restart after [`MotoServer::kill`]: moto keeps nothing).
    pub(crate) fn start_on(port: u16) -> Result<MotoServer> {
        let child = Command::new(moto_binary()?)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting moto_server")?;
        let mut server = MotoServer { child, port };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if server.request("GET", "/", &[]).is_ok() {
                return Ok(server);
            }
            if let Some(status) = server.child.try_wait()? {
                bail!("moto_server exited at start: {status}");
            }
            ensure!(
                Instant::now() < deadline,
                "moto_server did not answer within 60 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub(crate) fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The environment an S3 client needs for this server.
    pub(crate) fn env(&self) -> Vec<(&'static str, String)> {
        client_env(self.endpoint())
    }

    /// One HTTP/1.1 request; returns the status code, or an error for no answer.
    fn request(&self, method: &str, path: &str, body: &[u8]) -> Result<u16> {
        Ok(self.exchange(method, path, body)?.0)
    }

    /// One HTTP/1.1 request; returns the status code and the answer's body.
    fn exchange(&self, method: &str, path: &str, body: &[u8]) -> Result<(u16, Vec<u8>)> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port))?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        // An Authorization header (moto checks no signature unless told to) so that objects
        // written by the code under test, which are private, can be read and deleted here.
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: {}\r\n\
             Authorization: AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/s3/aws4_request, \
             SignedHeaders=host, Signature=0\r\nConnection: close\r\n\r\n",
            self.port,
            body.len()
        );
        stream.write_all(head.as_bytes())?;
        stream.write_all(body)?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response)?;
        let text = String::from_utf8_lossy(&response[..response.len().min(64)]).into_owned();
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("no HTTP status in {text:?}"))?;
        let head_end = response
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map_or(response.len(), |i| i + 4);
        let head = String::from_utf8_lossy(&response[..head_end]).to_ascii_lowercase();
        let mut body = response[head_end..].to_vec();
        if head.contains("transfer-encoding: chunked") {
            body = dechunk(&body)?;
        }
        Ok((status, body))
    }

    /// The bytes of `bucket/key`.
    pub(crate) fn get(&self, bucket: &str, key: &str) -> Result<Vec<u8>> {
        let (status, body) = self.exchange("GET", &format!("/{bucket}/{key}"), &[])?;
        ensure!(status == 200, "GET {bucket}/{key}: HTTP {status}");
        Ok(body)
    }

    /// Removes `bucket/key` (an object gone for good).
    pub(crate) fn delete(&self, bucket: &str, key: &str) -> Result<()> {
        let status = self.request("DELETE", &format!("/{bucket}/{key}"), &[])?;
        ensure!(
            status == 204 || status == 200,
            "DELETE {bucket}/{key}: HTTP {status}"
        );
        Ok(())
    }

    /// The keys under `bucket/prefix/` (at most 1000, as one listing answers).
    pub(crate) fn list(&self, bucket: &str, prefix: &str) -> Result<Vec<String>> {
        let path = format!("/{bucket}?list-type=2&prefix={prefix}/");
        let (status, body) = self.exchange("GET", &path, &[])?;
        ensure!(status == 200, "listing {bucket}/{prefix}: HTTP {status}");
        let text = String::from_utf8_lossy(&body);
        Ok(text
            .split("<Key>")
            .skip(1)
            .filter_map(|rest| rest.split("</Key>").next())
            .map(str::to_string)
            .collect())
    }

    pub(crate) fn create_bucket(&self, bucket: &str) -> Result<()> {
        let status = self.request("PUT", &format!("/{bucket}"), &[])?;
        ensure!(status == 200, "creating bucket {bucket}: HTTP {status}");
        Ok(())
    }

    pub(crate) fn put(&self, bucket: &str, key: &str, body: &[u8]) -> Result<()> {
        let status = self.request("PUT", &format!("/{bucket}/{key}"), body)?;
        ensure!(status == 200, "PUT {bucket}/{key}: HTTP {status}");
        Ok(())
    }

    /// Uploads every file of `dir` (flat) under `bucket/prefix/`; returns `s3://bucket/prefix`.
    pub(crate) fn upload_dir(&self, dir: &Path, bucket: &str, prefix: &str) -> Result<String> {
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if path.is_file() {
                let name = path.file_name().context("file name")?.to_string_lossy();
                self.put(bucket, &format!("{prefix}/{name}"), &std::fs::read(&path)?)?;
            }
        }
        Ok(format!("s3://{bucket}/{prefix}"))
    }
}

/// A chunked HTTP body, decoded.
fn dechunk(mut raw: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = raw
            .windows(2)
            .position(|w| w == b"\r\n")
            .context("a chunk size line without its end")?;
        let size_text = String::from_utf8_lossy(&raw[..line_end]).into_owned();
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .with_context(|| format!("chunk size {size_text:?}"))?;
        raw = &raw[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        ensure!(raw.len() >= size + 2, "a chunk cut short");
        out.extend_from_slice(&raw[..size]);
        raw = &raw[size + 2..];
    }
}

impl Drop for MotoServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The environment an S3 client needs for a test server (or a proxy in front of it) at
/// `endpoint`: moto's fixed credentials, plain HTTP.
pub(crate) fn client_env(endpoint: String) -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ENDPOINT_URL", endpoint),
        ("AWS_ACCESS_KEY_ID", "test".into()),
        ("AWS_SECRET_ACCESS_KEY", "test".into()),
        ("AWS_REGION", "us-east-1".into()),
        ("AWS_ALLOW_HTTP", "true".into()),
    ]
}
