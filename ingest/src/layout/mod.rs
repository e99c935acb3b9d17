//! Input layouts: what `ingest --input` reads, each turned into [`Record`]s.
//!
//! | `--format`  | input                                   | images                      |
//! |-------------|-----------------------------------------|-----------------------------|
//! | `llava`     | LLaVA json (`image`: one path)          | `--images` folder or zip    |
//! | `onevision` | LLaVA-OneVision json (`image`: a path or a list; `video` refused) | `--images` |
//! | `cauldron`  | `datasets` parquet: `images` + `texts` (the_cauldron, FineVision) | in the file |
//! | `messages`  | `datasets` parquet: `messages` + `images` (TRL, prime-rl) | in the file |
//!
//! Detection ([`Input::open`] without a format): a `.json` file is `onevision` when any record
//! has an `image` list or a `video`, else `llava`; parquet (a `.parquet` file, a folder of them,
//! a URL, or a file starting with `PAR1`) is `messages` when it has a `messages` column,
//! `cauldron` when it has `texts` and `images`. A given `--format` must fit the input.
//!
//! Parquet rows have no ids: a row's id is its `id` column when the file has one, else
//! `FILE:ROW` (the file name without `.parquet`, the row within the file: `train-00000:17`).
mod cauldron;
mod columns;
mod images;
pub(crate) mod json;
mod messages;
mod parquet;

use crate::error::IngestError;
use crate::record::Record;
use columns::id_at;
use json::RecordFile;
use parquet::ParquetInput;
use std::path::Path;

/// An input layout (`--format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    Llava,
    Onevision,
    Cauldron,
    Messages,
}

impl Format {
    /// The chat template a layout's records are rendered with when `--template` is not
    /// given: plain for LLaVA-Pretrain's json (an image and its caption), chatml for the chat
    /// layouts, whose records hold several turns.
    pub fn default_template(self) -> tessera_text::chat::Template {
        match self {
            Format::Llava => tessera_text::chat::Template::Plain,
            Format::Onevision | Format::Cauldron | Format::Messages => {
                tessera_text::chat::Template::Chatml
            }
        }
    }

    pub const ALL: [Format; 4] = [
        Format::Llava,
        Format::Onevision,
        Format::Cauldron,
        Format::Messages,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Format::Llava => "llava",
            Format::Onevision => "onevision",
            Format::Cauldron => "cauldron",
            Format::Messages => "messages",
        }
    }

    /// Whether the layout's images live outside the input (so `--images` is needed).
    pub fn images_outside(self) -> bool {
        matches!(self, Format::Llava | Format::Onevision)
    }

    fn is_json(self) -> bool {
        self.images_outside()
    }
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Format::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| {
                format!("unknown format {s:?} (expected llava, onevision, cauldron or messages)")
            })
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// An opened input.
pub(crate) enum Input {
    Json(RecordFile),
    Parquet { files: ParquetInput, format: Format },
}

/// Whether `spec` names parquet (else json): a URL, a folder, a `.parquet` file, or a file
/// whose first bytes are parquet's magic.
fn is_parquet(spec: &str) -> Result<bool, IngestError> {
    if tessera_remote::is_remote(spec) {
        return Ok(true);
    }
    let path = Path::new(spec);
    let meta = std::fs::metadata(path).map_err(|e| IngestError::io(path, e))?;
    if meta.is_dir() || path.extension().is_some_and(|e| e == "parquet") {
        return Ok(true);
    }
    if path.extension().is_some_and(|e| e == "json") {
        return Ok(false);
    }
    let mut magic = [0u8; 4];
    let read = std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read(&mut f, &mut magic))
        .map_err(|e| IngestError::io(path, e))?;
    Ok(read == 4 && &magic == b"PAR1")
}

impl Input {
    /// Opens `spec` as `format`, or detects the format (see the module docs); returns it.
    pub(crate) fn open(spec: &str, format: Option<Format>) -> Result<(Input, Format), IngestError> {
        let mismatch = |detail: String| IngestError::Input {
            input: spec.to_string(),
            detail,
        };
        if !is_parquet(spec)? {
            if let Some(f) = format.filter(|f| !f.is_json()) {
                return Err(mismatch(format!(
                    "is a json file, --format {f} reads parquet (llava and onevision read json)"
                )));
            }
            let file = RecordFile::open(Path::new(spec))?;
            let format = match format {
                Some(f) => f,
                None => {
                    let shape = file.shape();
                    let detected = if shape.image_lists > 0 || shape.videos > 0 {
                        Format::Onevision
                    } else {
                        Format::Llava
                    };
                    tracing::info!(
                        "{spec}: format {detected} ({} records with an image list, {} with a video)",
                        shape.image_lists,
                        shape.videos
                    );
                    detected
                }
            };
            return Ok((Input::Json(file), format));
        }
        if let Some(f) = format.filter(|f| f.is_json()) {
            return Err(mismatch(format!(
                "is parquet, --format {f} reads json (cauldron and messages read parquet)"
            )));
        }
        let files = ParquetInput::open(spec)?;
        let first = &files.files[0];
        let schema = first.metadata.schema();
        let detected = if first.has_column("messages") {
            Some(Format::Messages)
        } else if cauldron::looks_like(schema) && first.has_column("images") {
            Some(Format::Cauldron)
        } else {
            None
        };
        let format = match (format, detected) {
            (Some(f), _) => f,
            (None, Some(d)) => {
                tracing::info!(
                    "{spec}: format {d} (from the columns of {})",
                    first.location
                );
                d
            }
            (None, None) => {
                return Err(mismatch(format!(
                    "{} has columns {:?}: neither `messages` (the messages layout) nor `images` \
                     and `texts` (the cauldron layout)",
                    first.location,
                    first.columns()
                )))
            }
        };
        let needed: &[&str] = match format {
            Format::Messages => &["messages"],
            _ => &["images", "texts"],
        };
        for file in &files.files {
            if let Some(missing) = needed.iter().find(|c| !file.has_column(c)) {
                return Err(mismatch(format!(
                    "{} has no `{missing}` column, which --format {format} reads (its columns: \
                     {:?})",
                    file.location,
                    file.columns()
                )));
            }
        }
        Ok((Input::Parquet { files, format }, format))
    }

    /// Records in the input.
    pub(crate) fn len(&self) -> u64 {
        match self {
            Input::Json(file) => file.len() as u64,
            Input::Parquet { files, .. } => files.rows(),
        }
    }

    /// Bytes of the input (the json, or all parquet files).
    pub(crate) fn byte_len(&self) -> u64 {
        match self {
            Input::Json(file) => file.byte_len(),
            Input::Parquet { files, .. } => files.bytes(),
        }
    }

    /// What a resume checks the input against: the json's sha256; for parquet the files'
    /// names, sizes, modification times and footers (see `parquet::ParquetFile`).
    pub(crate) fn fingerprint(&self) -> Result<String, IngestError> {
        match self {
            Input::Json(file) => Ok(file.sha256()),
            Input::Parquet { files, .. } => files.fingerprint(),
        }
    }

    /// Calls `each` for every record in input order until it returns false: with
    /// [`Item::Earlier`] (just the id, where the input has ids of its own) for records before
    /// `start`, so a resumed run still finds their duplicates, then with [`Item::Record`] from
    /// `start` on. A record that cannot be read is handed over as the error, and nothing after
    /// it.
    pub(crate) fn read_from(&self, start: u64, each: &mut dyn FnMut(u64, Item) -> bool) {
        match self {
            Input::Json(file) => {
                for n in 0..file.len() {
                    let record = file.record(n);
                    file.release_before(file.end_of(n));
                    if (n as u64) < start {
                        if let Ok(r) = record {
                            each(n as u64, Item::Earlier(r.id));
                        }
                        continue;
                    }
                    let stop = record.is_err();
                    if !each(n as u64, Item::Record(record)) || stop {
                        return;
                    }
                }
            }
            Input::Parquet { files, format } => {
                let outcome = read_parquet(files, *format, start, each);
                if let Err((n, e)) = outcome {
                    each(n, Item::Record(Err(e)));
                }
            }
        }
    }
}

/// What [`Input::read_from`] hands over for one record.
pub(crate) enum Item {
    /// The id of a record before the resume point.
    Earlier(String),
    /// A record from the resume point on.
    Record(Result<Record, IngestError>),
}

/// [`Input::read_from`] for parquet: row group by row group. `Err((n, e))`: reading failed at
/// record n.
fn read_parquet(
    files: &ParquetInput,
    format: Format,
    start: u64,
    each: &mut dyn FnMut(u64, Item) -> bool,
) -> Result<(), (u64, IngestError)> {
    let layout_columns: &[&str] = match format {
        Format::Messages => &messages::COLUMNS,
        _ => &cauldron::COLUMNS,
    };
    for file in &files.files {
        let has_ids = file.has_column("id");
        let mut columns = layout_columns.to_vec();
        if has_ids {
            columns.push("id");
        }
        for g in 0..file.row_groups() {
            let (first, end) = (file.group_start(g), file.group_start(g + 1));
            if end <= start {
                if has_ids {
                    let mut ids = Vec::new();
                    file.ids_of_group(g, &mut ids).map_err(|e| (first, e))?;
                    for (n, id) in (first..).zip(ids) {
                        each(n, Item::Earlier(id));
                    }
                }
                continue;
            }
            let mut n = first;
            let mut go_on = true;
            let read = file.read_group(g, &columns, &mut |batch| {
                for row in 0..batch.num_rows() {
                    let in_file = n - file.group_start(0);
                    let id = batch
                        .column_by_name("id")
                        .and_then(|ids| id_at(ids.as_ref(), row))
                        .unwrap_or_else(|| format!("{}:{in_file}", file.stem));
                    if n < start {
                        if has_ids {
                            each(n, Item::Earlier(id));
                        }
                        n += 1;
                        continue;
                    }
                    let record = match format {
                        Format::Messages => messages::record(&batch, row, id),
                        _ => cauldron::record(&batch, row, id),
                    };
                    go_on = each(n, Item::Record(Ok(record)));
                    n += 1;
                    if !go_on {
                        return Ok(false);
                    }
                }
                Ok(true)
            });
            read.map_err(|e| (n, e))?;
            if !go_on {
                return Ok(());
            }
        }
    }
    Ok(())
}
