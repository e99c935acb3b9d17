//! The byte sink under a shard's parquet writer: bytes are gathered into 4 MiB chunks that a
//! second thread hashes (sha256) and writes to the file, so the thread encoding parquet never
//! hashes nor waits on the kernel. On Linux the sink thread also starts the disk writeback of
//! each chunk as soon as it is written (`sync_file_range`), so the `fsync` that ends a shard
//! only waits for the last few chunks instead of the whole shard.
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::thread::JoinHandle;

const CHUNK: usize = 4 << 20;
/// Chunks in flight between the encoder and the sink thread.
const IN_FLIGHT: usize = 4;

/// What the sink thread hands back once every byte is written and synced.
pub(crate) struct SinkDone {
    pub sha256: String,
    pub bytes: u64,
}

/// A `Write` that hashes and writes on its own thread; [`ShardSink::finish`] waits for it.
pub(crate) struct ShardSink {
    path: PathBuf,
    buf: Vec<u8>,
    full: Option<SyncSender<Vec<u8>>>,
    empty: Receiver<Vec<u8>>,
    thread: Option<JoinHandle<std::io::Result<SinkDone>>>,
}

impl ShardSink {
    /// Starts the sink thread writing into `file` (at `path`, for error messages).
    pub(crate) fn new(file: File, path: PathBuf) -> std::io::Result<Self> {
        let (full_tx, full_rx) = sync_channel::<Vec<u8>>(IN_FLIGHT);
        let (empty_tx, empty_rx) = sync_channel::<Vec<u8>>(IN_FLIGHT + 2);
        let thread = std::thread::Builder::new()
            .name("shard-sink".into())
            .spawn(move || write_chunks(file, full_rx, empty_tx))?;
        Ok(ShardSink {
            path,
            buf: Vec::with_capacity(CHUNK),
            full: Some(full_tx),
            empty: empty_rx,
            thread: Some(thread),
        })
    }

    /// Hands the gathered bytes to the sink thread and takes an empty buffer back.
    fn send(&mut self) -> std::io::Result<()> {
        let next = self
            .empty
            .try_recv()
            .unwrap_or_else(|_| Vec::with_capacity(CHUNK));
        let chunk = std::mem::replace(&mut self.buf, next);
        let sent = self.full.as_ref().is_some_and(|tx| tx.send(chunk).is_ok());
        if sent {
            Ok(())
        } else {
            // The sink thread stopped: its own error says why.
            Err(self.join().err().unwrap_or_else(|| {
                std::io::Error::other(format!("{}: shard sink stopped", self.path.display()))
            }))
        }
    }

    fn join(&mut self) -> std::io::Result<SinkDone> {
        self.full = None;
        match self.thread.take() {
            Some(thread) => thread
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("the shard sink thread panicked"))),
            None => Err(std::io::Error::other("the shard sink was already finished")),
        }
    }

    /// Writes what is left, waits for the sink thread (which syncs the file) and returns the
    /// sha256 and length of everything written.
    pub(crate) fn finish(&mut self) -> std::io::Result<SinkDone> {
        if !self.buf.is_empty() {
            self.send()?;
        }
        self.join()
    }
}

impl Write for ShardSink {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        if self.full.is_none() {
            return Err(std::io::Error::other("write after the shard sink finished"));
        }
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK {
            self.send()?;
        }
        Ok(data.len())
    }

    /// Bytes reach the file when the shard finishes; flushing on the way has nothing to do.
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The sink thread: hash, write, start writeback; at the end sync and report.
fn write_chunks(
    mut file: File,
    full: Receiver<Vec<u8>>,
    empty: SyncSender<Vec<u8>>,
) -> std::io::Result<SinkDone> {
    let mut hasher = Sha256::new();
    let mut bytes = 0u64;
    for mut chunk in full {
        hasher.update(&chunk);
        file.write_all(&chunk)?;
        start_writeback(&file, bytes, chunk.len() as u64);
        bytes += chunk.len() as u64;
        chunk.clear();
        let _ = empty.try_send(chunk);
    }
    file.sync_all()?;
    Ok(SinkDone {
        sha256: hex::encode(hasher.finalize()),
        bytes,
    })
}

/// Asks the kernel to start writing `len` bytes at `offset` to disk without waiting for it.
#[cfg(target_os = "linux")]
fn start_writeback(file: &File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    // SAFETY: plain syscall on a file descriptor this thread owns; a failure only means the
    // final fsync has more to do, so its result is ignored.
    unsafe {
        libc::sync_file_range(
            file.as_raw_fd(),
            offset as libc::off64_t,
            len as libc::off64_t,
            libc::SYNC_FILE_RANGE_WRITE,
        );
    }
}

#[cfg(not(target_os = "linux"))]
fn start_writeback(_file: &File, _offset: u64, _len: u64) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_and_hashes_every_byte_in_order() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("out.bin");
        let mut sink = ShardSink::new(File::create(&path)?, path.clone())?;
        let mut expected = Vec::new();
        for i in 0..3000u32 {
            let piece: Vec<u8> = (0..(i as usize * 7919) % 9001)
                .map(|j| (i as usize + j) as u8)
                .collect();
            sink.write_all(&piece)?;
            expected.extend_from_slice(&piece);
        }
        let done = sink.finish()?;
        assert!(
            expected.len() > 2 * CHUNK,
            "the test must cross chunk borders"
        );
        assert_eq!(std::fs::read(&path)?, expected);
        assert_eq!(done.bytes, expected.len() as u64);
        assert_eq!(done.sha256, hex::encode(Sha256::digest(&expected)));
        Ok(())
    }
}
