//! TensorBoard's event file, written by hand: `events.out.tfevents.{secs}.{host}.{pid}` holds
//! TFRecords, each `u64 length` (little-endian), `masked crc32c(length bytes)`, the data,
//! `masked crc32c(data)`; the masked crc is `((crc >> 15) | (crc << 17)) + 0xa282ead8`. Each
//! record's data is a `tensorflow.Event` protobuf:
//!
//! ```text
//! Event      { double wall_time = 1; int64 step = 2; string file_version = 3;
//!              Summary summary = 5; SessionLog session_log = 6; }
//! Summary    { repeated Value value = 1; }
//! Value      { string tag = 1; float simple_value = 2; }
//! SessionLog { Status status = 1; }   // START = 1
//! ```
//!
//! The first record is `file_version: "brain.Event:2"`, the second a `SessionLog START` at the
//! run's first step: every (re)start of a run opens a new file, and TensorBoard drops what
//! earlier files logged from that step on, as a resumed run's `metrics.jsonl` drops its lines.
//!
//! Why not a crate: `tensorboard-rs` (last release 2022, its repository marked inactive)
//! brings image and protobuf stacks for ~17k lines; `syntaxdot-summary` (scalars only, last
//! release 2022) brings `prost`. Scalars need the ~100 lines here and `crc32c`, which the
//! workspace already has.
use std::io::Write;
use std::path::{Path, PathBuf};

/// What an event file write failed on.
#[derive(Debug, thiserror::Error)]
#[error("TensorBoard event file {path}")]
pub struct EventFileError {
    pub path: PathBuf,
    pub source: std::io::Error,
}

/// The `file_version` every TensorBoard reader expects first.
const FILE_VERSION: &str = "brain.Event:2";
const CRC_MASK_DELTA: u32 = 0xa282_ead8;

/// An open event file; every call appends whole records and flushes, so a killed run keeps
/// every step it logged.
pub(crate) struct EventFile {
    path: PathBuf,
    file: std::fs::File,
}

impl EventFile {
    /// Creates a new event file in `dir` (TensorBoard reads every `*tfevents*` file of a
    /// folder in name order; the name starts with the time, so later files sort later) and
    /// writes its `file_version` record, then a `SessionLog START` at `first_step` (the step
    /// this run (re)starts at), so readers discard what earlier files logged from there on.
    pub(crate) fn create(dir: &Path, first_step: u64) -> Result<Self, EventFileError> {
        let now = wall_time();
        let name = format!(
            "events.out.tfevents.{:010}.{}.{}",
            now as u64,
            hostname(),
            std::process::id()
        );
        // A second file of this process in the same second gets a counter (sorting later).
        let mut attempt = 0;
        let (path, file) = loop {
            let path = match attempt {
                0 => dir.join(&name),
                n => dir.join(format!("{name}.{n}")),
            };
            let opened = std::fs::OpenOptions::new()
                .create_new(true)
                .write(true)
                .open(&path);
            match opened {
                Ok(file) => break (path, file),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 1000 => {
                    attempt += 1;
                }
                Err(source) => return Err(EventFileError { path, source }),
            }
        };
        let mut out = EventFile { path, file };
        out.write(&event(now, 0, Payload::FileVersion(FILE_VERSION)))?;
        out.write(&event(now, first_step, Payload::SessionStart))?;
        Ok(out)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// One event at `step` holding `scalars` (tag, value), stamped with the current time.
    pub(crate) fn scalars(
        &mut self,
        step: u64,
        scalars: &[(String, f64)],
    ) -> Result<(), EventFileError> {
        self.write(&event(wall_time(), step, Payload::Scalars(scalars)))
    }

    fn write(&mut self, data: &[u8]) -> Result<(), EventFileError> {
        self.file
            .write_all(&record(data))
            .and_then(|_| self.file.flush())
            .map_err(|source| EventFileError {
                path: self.path.clone(),
                source,
            })
    }
}

fn wall_time() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// This machine's name, as TensorBoard's own writers put it in the file name; `localhost`
/// where it cannot be read. Characters other than letters, digits, `-` and `.` become `_`.
fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name: String = String::from_utf8_lossy(&buf[..end])
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if rc != 0 || name.is_empty() {
        "localhost".into()
    } else {
        name
    }
}

/// What an event carries besides its time and step.
enum Payload<'a> {
    FileVersion(&'a str),
    Scalars(&'a [(String, f64)]),
    SessionStart,
}

/// The `Event` protobuf.
fn event(wall_time: f64, step: u64, payload: Payload) -> Vec<u8> {
    let mut out = Vec::new();
    out.push(key(1, WIRE_FIXED64));
    out.extend_from_slice(&wall_time.to_le_bytes());
    out.push(key(2, WIRE_VARINT));
    varint(&mut out, step);
    match payload {
        Payload::FileVersion(version) => bytes_field(&mut out, 3, version.as_bytes()),
        Payload::Scalars(scalars) => {
            let mut summary = Vec::new();
            for (tag, value) in scalars {
                let mut v = Vec::new();
                bytes_field(&mut v, 1, tag.as_bytes());
                v.push(key(2, WIRE_FIXED32));
                v.extend_from_slice(&(*value as f32).to_le_bytes());
                bytes_field(&mut summary, 1, &v);
            }
            bytes_field(&mut out, 5, &summary);
        }
        Payload::SessionStart => {
            let session_log = [key(1, WIRE_VARINT), 1];
            bytes_field(&mut out, 6, &session_log);
        }
    }
    out
}

const WIRE_VARINT: u8 = 0;
const WIRE_FIXED64: u8 = 1;
const WIRE_BYTES: u8 = 2;
const WIRE_FIXED32: u8 = 5;

/// A field key of a field number below 16 (one byte).
fn key(field: u8, wire: u8) -> u8 {
    (field << 3) | wire
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn bytes_field(out: &mut Vec<u8>, field: u8, bytes: &[u8]) {
    out.push(key(field, WIRE_BYTES));
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// TFRecord framing of one record.
fn record(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
    out
}

fn masked_crc(bytes: &[u8]) -> u32 {
    let crc = crc32c::crc32c(bytes);
    crc.rotate_right(15).wrapping_add(CRC_MASK_DELTA)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Splits a file into its records' data, checking both checksums of each.
    fn records(bytes: &[u8]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut rest = bytes;
        while !rest.is_empty() {
            let len_bytes: [u8; 8] = rest[..8].try_into().expect("8 bytes");
            let len = u64::from_le_bytes(len_bytes) as usize;
            let len_crc = u32::from_le_bytes(rest[8..12].try_into().expect("4 bytes"));
            assert_eq!(len_crc, masked_crc(&len_bytes), "length checksum");
            let data = &rest[12..12 + len];
            let data_crc = u32::from_le_bytes(rest[12 + len..16 + len].try_into().expect("4"));
            assert_eq!(data_crc, masked_crc(data), "data checksum");
            out.push(data.to_vec());
            rest = &rest[16 + len..];
        }
        out
    }

    #[test]
    fn masked_crc_matches_tensorflows_for_a_known_input() {
        // crc32c("123456789") = 0xe3069283 (the CRC-32C check value); masked by hand:
        // rotate right 15 = 0x2507c60d, + 0xa282ead8 = 0xc78ab0e5.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(masked_crc(b"123456789"), 0xc78a_b0e5);
    }

    #[test]
    fn an_event_encodes_as_protobuf_lays_it_out() {
        let scalars = [("loss/all".to_string(), 2.5)];
        let bytes = event(1.0, 300, Payload::Scalars(&scalars));
        let mut want = vec![0x09];
        want.extend_from_slice(&1.0f64.to_le_bytes());
        want.extend_from_slice(&[0x10, 0xac, 0x02]); // step 300 as a varint
        let value: Vec<u8> = [&[0x0a, 8][..], b"loss/all", &[0x15], &2.5f32.to_le_bytes()].concat();
        want.extend_from_slice(&[0x2a, value.len() as u8 + 2, 0x0a, value.len() as u8]);
        want.extend_from_slice(&value);
        assert_eq!(bytes, want);
    }

    #[test]
    fn a_file_starts_with_its_version_and_a_resume_with_a_session_start() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let mut file = EventFile::create(dir.path(), 7)?;
        file.scalars(7, &[("lr".to_string(), 1e-3)])?;
        let name = file
            .path()
            .file_name()
            .map(|n| n.to_string_lossy().to_string());
        assert!(name.is_some_and(|n| n.starts_with("events.out.tfevents.")));
        let recs = records(&std::fs::read(file.path())?);
        assert_eq!(recs.len(), 3);
        assert!(recs[0].ends_with(b"\x1a\x0dbrain.Event:2"), "{:?}", recs[0]);
        assert!(
            recs[1].ends_with(&[0x10, 7, 0x32, 2, 0x08, 1]),
            "{:?}",
            recs[1]
        );
        assert!(recs[2].ends_with(&1e-3f32.to_le_bytes()));
        Ok(())
    }
}
