//! LLaVA and LLaVA-OneVision json records: the file is memory-mapped and split into its
//! top-level array elements by a small byte scanner (strings and nesting aware), then each
//! element is parsed with serde. Any syntax error, or an element that is not a record (no `id`,
//! no `conversations`), fails the whole run with the byte offset: such a file is not a LLaVA
//! json and guessing is worse.
//!
//! A record is `{"id", "image"?, "video"?, "conversations": [{"from", "value"}, ...]}`. `image`
//! is a path under `--images` (LLaVA) or a list of them (LLaVA-OneVision's multi-image
//! samples), taken by the `<image>` tags of the turns in order. A record with a `video` is
//! refused (`video_unsupported`): tessera trains on images.
//!
//! Memory stays flat in the file's size: every pass over the mapping (hashing, splitting, the
//! reader's parse in json order) hands the pages behind it back (`MADV_DONTNEED`; the page
//! cache keeps them), so the process holds a window of the file, not all of it (LLaVA-Pretrain's
//! json is 181 MB; a mixture's can be gigabytes).
use crate::error::IngestError;
use crate::reason::Reason;
use crate::record::{ImageRef, Record};
use serde::Deserialize;
use sha2::Digest;
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use tessera_shards::Turn;

/// The mapping's page size for `MADV_DONTNEED` ranges (4 KiB pages; a larger page size only
/// makes a release start inside a page, which the kernel rounds).
const PAGE: usize = 4096;

#[derive(Deserialize)]
#[serde(untagged)]
enum RawId {
    Text(String),
    Number(serde_json::Number),
}

#[derive(Deserialize)]
struct RawTurn {
    from: String,
    value: String,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawImages {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
struct RawRecord {
    id: RawId,
    #[serde(default)]
    image: Option<RawImages>,
    #[serde(default)]
    video: Option<serde::de::IgnoredAny>,
    conversations: Vec<RawTurn>,
}

/// What [`RecordFile::shape`] finds: whether any record uses LLaVA-OneVision's additions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct JsonShape {
    /// Records whose `image` is a list.
    pub image_lists: u64,
    /// Records with a `video`.
    pub videos: u64,
}

/// The fields [`RecordFile::shape`] looks at (the rest is skipped unparsed).
#[derive(Deserialize)]
struct ShapeOnly {
    #[serde(default)]
    image: Option<ShapeImage>,
    #[serde(default)]
    video: Option<serde::de::IgnoredAny>,
}

/// A list or anything else; untagged, so the list is tried first.
#[derive(Deserialize)]
#[serde(untagged)]
enum ShapeImage {
    Many(#[allow(dead_code)] Vec<serde::de::IgnoredAny>),
    One(#[allow(dead_code)] serde::de::IgnoredAny),
}

/// Bytes read past before the pages behind are handed back.
const RELEASE_WINDOW: usize = 8 << 20;

/// The json file, memory-mapped, with the byte range of every top-level array element.
pub(crate) struct RecordFile {
    path: std::path::PathBuf,
    map: memmap2::Mmap,
    spans: Vec<Range<usize>>,
    /// The mapping's bytes before this offset were handed back ([`RecordFile::release_before`]).
    released: AtomicUsize,
    /// sha256 of the file, computed while it was split.
    sha256: String,
}

impl RecordFile {
    /// Maps `path` and finds its elements; fails on any structural syntax error.
    pub(crate) fn open(path: &Path) -> Result<Self, IngestError> {
        let meta = std::fs::metadata(path).map_err(|e| IngestError::io(path, e))?;
        if meta.is_dir() {
            // mmap of a folder fails with ENODEV ("No such device"), which says nothing useful.
            return Err(IngestError::io(
                path,
                std::io::Error::other("is a folder; --json wants the LLaVA .json file"),
            ));
        }
        if meta.len() == 0 {
            return Err(IngestError::Json {
                path: path.to_path_buf(),
                offset: 0,
                detail: "the file is empty (a LLaVA json is an array of records)".into(),
            });
        }
        let file = std::fs::File::open(path).map_err(|e| IngestError::io(path, e))?;
        // SAFETY: the json is only read; a user editing it during ingest gets garbage records
        // (which fail to parse), never memory unsafety beyond what reading a file allows.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| IngestError::io(path, e))?;
        let mut this = RecordFile {
            path: path.to_path_buf(),
            map,
            spans: Vec::new(),
            released: AtomicUsize::new(0),
            sha256: String::new(),
        };
        // One pass: the splitter leads, the hash follows it window by window, and the pages
        // both are done with go back.
        let mut hasher = sha2::Sha256::new();
        let mut hashed = 0;
        let spans = split_array(&this.map, |pos| {
            if pos >= hashed + RELEASE_WINDOW {
                hasher.update(&this.map[hashed..pos]);
                hashed = pos;
                this.release_before(pos);
            }
        })
        .map_err(|(offset, detail)| IngestError::Json {
            path: path.to_path_buf(),
            offset: offset as u64,
            detail,
        })?;
        hasher.update(&this.map[hashed..]);
        this.release_before(this.map.len());
        this.released.store(0, Ordering::Relaxed);
        this.sha256 = hex::encode(hasher.finalize());
        this.spans = spans;
        Ok(this)
    }

    /// Hands the mapping's pages before `offset` back to the kernel once `offset` is a window
    /// past the last release (the reader calls it as it goes; a later read of those bytes
    /// only faults them in again from the page cache).
    pub(crate) fn release_before(&self, offset: usize) {
        let from = self.released.load(Ordering::Relaxed);
        let to = offset.min(self.map.len()) / PAGE * PAGE;
        if to <= from || (to < from + RELEASE_WINDOW && offset < self.map.len()) {
            return;
        }
        let claimed =
            self.released
                .compare_exchange(from, to, Ordering::Relaxed, Ordering::Relaxed);
        if claimed.is_err() {
            return;
        }
        // SAFETY: the mapping is read-only and backed by the file: dropping its pages loses
        // nothing, and a later access reads them back from the page cache or the file. No
        // reference into the mapping is invalidated (its address range stays mapped).
        let _ = unsafe {
            self.map
                .unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, from, to - from)
        };
    }

    /// Number of records.
    pub(crate) fn len(&self) -> usize {
        self.spans.len()
    }

    /// Hex sha256 of the json's bytes: what a resume checks the file against.
    pub(crate) fn sha256(&self) -> String {
        self.sha256.clone()
    }

    /// Where record `n` ends in the file (the reader releases the pages behind it).
    pub(crate) fn end_of(&self, n: usize) -> usize {
        self.spans.get(n).map_or(self.map.len(), |s| s.end)
    }

    /// Size of the json file in bytes.
    pub(crate) fn byte_len(&self) -> u64 {
        self.map.len() as u64
    }

    /// Parses record `n`.
    pub(crate) fn record(&self, n: usize) -> Result<Record, IngestError> {
        let span = self.spans[n].clone();
        let text = &self.map[span.clone()];
        let raw: RawRecord = serde_json::from_slice(text).map_err(|e| IngestError::Record {
            path: self.path.clone(),
            offset: (span.start + offset_of(text, e.line(), e.column())) as u64,
            record: n,
            source: e,
        })?;
        let id = match raw.id {
            RawId::Text(s) => s,
            RawId::Number(n) => n.to_string(),
        };
        if raw.video.is_some() {
            let detail = format!("record {id} has a video; tessera trains on images");
            return Ok(Record::refused(id, Reason::VideoUnsupported, detail));
        }
        let images = match raw.image {
            None => Vec::new(),
            Some(RawImages::One(path)) => vec![path],
            Some(RawImages::Many(paths)) => paths,
        };
        Ok(Record {
            id,
            images: images.into_iter().map(ImageRef::Path).collect(),
            conversations: raw
                .conversations
                .into_iter()
                .map(|t| Turn {
                    role: t.from,
                    text: t.value,
                })
                .collect(),
            refused: None,
        })
    }

    /// Counts the records that use LLaVA-OneVision's additions (an `image` list, a `video`),
    /// parsing only those two fields of each record: what `--format` detection looks at. A
    /// record that does not parse is left to [`Self::record`] to report.
    pub(crate) fn shape(&self) -> JsonShape {
        let mut shape = JsonShape::default();
        for span in &self.spans {
            let Ok(only) = serde_json::from_slice::<ShapeOnly>(&self.map[span.clone()]) else {
                continue;
            };
            shape.image_lists += u64::from(matches!(only.image, Some(ShapeImage::Many(_))));
            shape.videos += u64::from(only.video.is_some());
            self.release_before(span.end);
        }
        self.release_before(self.map.len());
        // The reader's pass releases from the start again.
        self.released.store(0, Ordering::Relaxed);
        shape
    }
}

/// Byte offset of serde_json's 1-based (line, column) inside `text`.
fn offset_of(text: &[u8], line: usize, column: usize) -> usize {
    let mut offset = 0;
    for _ in 1..line {
        match text[offset..].iter().position(|&b| b == b'\n') {
            Some(p) => offset += p + 1,
            None => return text.len(),
        }
    }
    (offset + column.saturating_sub(1)).min(text.len())
}

fn skip_ws(bytes: &[u8], mut pos: usize) -> usize {
    while pos < bytes.len() && matches!(bytes[pos], b' ' | b'\n' | b'\r' | b'\t') {
        pos += 1;
    }
    pos
}

/// Returns the end (exclusive) of the object or array starting at `start`; brackets must
/// match (`{"a": [}` fails at the `}`).
fn value_end(bytes: &[u8], start: usize) -> Result<usize, (usize, String)> {
    let mut pos = start;
    let mut open: Vec<u8> = Vec::new();
    loop {
        let Some(&b) = bytes.get(pos) else {
            return Err((pos, "unexpected end of file inside a record".into()));
        };
        match b {
            b'"' => {
                pos += 1;
                loop {
                    match bytes.get(pos) {
                        None => return Err((start, "unterminated string".into())),
                        Some(b'\\') => pos += 2,
                        Some(b'"') => break,
                        Some(_) => pos += 1,
                    }
                }
            }
            b'{' => open.push(b'}'),
            b'[' => open.push(b']'),
            b'}' | b']' => {
                if open.pop() != Some(b) {
                    return Err((pos, format!("unexpected `{}`", b as char)));
                }
                if open.is_empty() {
                    return Ok(pos + 1);
                }
            }
            _ => {}
        }
        pos += 1;
    }
}

/// Splits a top-level json array into element byte ranges; `progress` hears the offset after
/// each element (the caller releases what is behind it).
fn split_array(
    bytes: &[u8],
    mut progress: impl FnMut(usize),
) -> Result<Vec<Range<usize>>, (usize, String)> {
    let mut pos = skip_ws(bytes, 0);
    if bytes[pos..].starts_with(b"\xEF\xBB\xBF") {
        pos = skip_ws(bytes, pos + 3);
    }
    if bytes.get(pos) != Some(&b'[') {
        return Err((
            pos,
            "expected `[` (a LLaVA json is an array of records)".into(),
        ));
    }
    pos = skip_ws(bytes, pos + 1);
    let mut spans = Vec::new();
    if bytes.get(pos) == Some(&b']') {
        pos += 1;
    } else {
        loop {
            if bytes.get(pos) != Some(&b'{') {
                return Err((pos, "expected `{` starting a record".into()));
            }
            let end = value_end(bytes, pos)?;
            spans.push(pos..end);
            progress(end);
            pos = skip_ws(bytes, end);
            match bytes.get(pos) {
                Some(b',') => pos = skip_ws(bytes, pos + 1),
                Some(b']') => {
                    pos += 1;
                    break;
                }
                Some(_) => return Err((pos, "expected `,` or `]` after a record".into())),
                None => {
                    return Err((
                        pos,
                        "unexpected end of file: the array is not closed".into(),
                    ))
                }
            }
        }
    }
    pos = skip_ws(bytes, pos);
    if pos != bytes.len() {
        return Err((pos, "trailing bytes after the array".into()));
    }
    Ok(spans)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_elements_with_tricky_strings() {
        let text = br#" [ {"id":"a","conversations":[{"from":"gpt","value":"x}],\"{"}]} ,{"id":2,"conversations":[]}]  "#;
        let spans = split_array(text, |_| {}).expect("valid json");
        assert_eq!(spans.len(), 2);
        let first: serde_json::Value =
            serde_json::from_slice(&text[spans[0].clone()]).expect("element 0");
        assert_eq!(first["conversations"][0]["value"], "x}],\"{");
    }

    #[test]
    fn reports_offset_of_structural_errors() {
        let text = br#"[{"id":"a","conversations":[]} {"id":"b"}]"#;
        let (offset, _) = split_array(text, |_| {}).expect_err("missing comma");
        assert_eq!(offset, 31);
        assert!(split_array(br#"[{"id":"a""#, |_| {}).is_err());
    }

    #[test]
    fn onevision_image_lists_and_videos() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("ov.json");
        std::fs::write(
            &path,
            br#"[{"id": "a", "image": ["x/1.jpg", "x/2.jpg"], "conversations": []},
                {"id": "b", "image": "x/3.jpg", "conversations": []},
                {"id": "c", "video": "v.mp4", "conversations": []}]"#,
        )?;
        let file = RecordFile::open(&path)?;
        assert_eq!(
            file.shape(),
            JsonShape {
                image_lists: 1,
                videos: 1
            }
        );
        let a = file.record(0)?;
        let paths = ["x/1.jpg", "x/2.jpg"].map(|p| ImageRef::Path(p.into()));
        assert_eq!(a.images, paths);
        assert_eq!(
            file.record(1)?.images,
            vec![ImageRef::Path("x/3.jpg".into())]
        );
        let c = file.record(2)?;
        assert_eq!(c.refused.map(|(r, _)| r), Some(Reason::VideoUnsupported));
        Ok(())
    }

    #[test]
    fn offset_of_line_and_column() {
        assert_eq!(offset_of(b"ab\ncd\nef", 3, 2), 7);
        assert_eq!(offset_of(b"abc", 1, 1), 0);
    }
}
