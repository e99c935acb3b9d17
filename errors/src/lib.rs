//! How every tessera crate prints an error: its message and each cause below it, joined by
//! `": "` ([`with_causes`]), what the CLI prints after `error: ` and the form an error takes
//! when it is kept as text (a log line, a rejected-record reason, a verify report).
//!
//! tessera's own errors never put their source in their message (the message says what
//! failed, the source why), so their chain prints every cause exactly once as it is. A few
//! libraries do print their source inside their own message and return it from `source()`
//! as well; [`embeds_its_source`] lists them, and only below one of those is a cause whose
//! text its parent already printed left out. An error of ours that repeated its cause would
//! show the repetition, which the crates' tests look for.
use std::error::Error;

/// `error`'s message and every cause below it, joined by `": "`. Trailing whitespace of a
/// message (toml ends its multi-line messages with a newline) is dropped, and so is an empty
/// message.
pub fn with_causes(error: &(dyn Error + 'static)) -> String {
    let mut text = error.to_string().trim_end().to_string();
    let mut parent = error;
    while let Some(cause) = parent.source() {
        let message = cause.to_string();
        let message = message.trim_end();
        let already_printed = embeds_its_source(parent) && parent.to_string().contains(message);
        if !message.is_empty() && !already_printed {
            text.push_str(": ");
            text.push_str(message);
        }
        parent = cause;
    }
    text
}

/// Whether `error` is one of the library errors whose message holds their source's message:
/// parquet's `External`, arrow's `ExternalError`, object_store's errors (`Generic`,
/// `NotFound`, ...) and image's decoding and I/O errors. Each is looked for when its feature
/// is on, which the crate wrapping that library turns on.
pub fn embeds_its_source(error: &(dyn Error + 'static)) -> bool {
    // Not reassigned when no feature is on: a crate that wraps none of these libraries.
    #[allow(unused_mut)]
    let mut embeds = false;
    #[cfg(feature = "parquet")]
    {
        embeds |= error.is::<parquet::errors::ParquetError>();
    }
    #[cfg(feature = "arrow")]
    {
        embeds |= error.is::<arrow_schema::ArrowError>();
    }
    #[cfg(feature = "object_store")]
    {
        embeds |= error.is::<object_store::Error>();
    }
    #[cfg(feature = "image")]
    {
        embeds |= error.is::<image::ImageError>();
    }
    embeds
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("shard-00004.parquet")]
    struct Ours {
        source: parquet::errors::ParquetError,
    }

    /// A regression: one of our errors that prints its source in its message.
    #[derive(Debug, thiserror::Error)]
    #[error("reading index.json: {source}")]
    struct Repeats {
        source: std::io::Error,
    }

    #[test]
    fn a_library_error_that_prints_its_own_source_prints_it_once() {
        let io = std::io::Error::other("connection reset");
        let source = parquet::errors::ParquetError::External(Box::new(io));
        assert_eq!(
            with_causes(&Ours { source }),
            "shard-00004.parquet: External: connection reset"
        );
    }

    #[test]
    fn our_own_error_repeating_its_cause_shows_the_repetition() {
        let source = std::io::Error::other("disk on fire");
        let text = with_causes(&Repeats { source });
        assert_eq!(text, "reading index.json: disk on fire: disk on fire");
    }

    #[test]
    fn trailing_newlines_and_empty_messages_are_dropped() {
        #[derive(Debug, thiserror::Error)]
        #[error("config.toml\n")]
        struct Config {
            source: std::io::Error,
        }
        let text = with_causes(&Config {
            source: std::io::Error::other(""),
        });
        assert_eq!(text, "config.toml");
    }
}
