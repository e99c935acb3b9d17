//! What is about text and tokens, for every crate: how a conversation becomes text, and how
//! text becomes the ids a dataset holds.
//!
//! 1. [`chat`] defines the chat templates (`plain`, `chatml`): ingest renders each record with
//!    them, `tessera generate` prompts the model with them, the llava-hf export writes them as
//!    Jinja.
//! 2. [`SpecialTokens`] are the tokens the templates write, as the dataset's tokenizer spells
//!    and numbers them (recorded in index.json by `shards`).
//! 3. With feature `tokenizer`: [`Encoder`] loads a tokenizer, resolves its special tokens
//!    (`resolve_tokens.rs`) and tokenizes rendered text with its label mask, returning how many
//!    image tokens the ids hold (ingest picks the reason it rejects a record for);
//!    [`ModelTokenizer`] reads a language model folder's text side (tokenizer, its own chat
//!    template through [`ChatTemplate`], stop ids) for `tessera generate --lm`.
//!
//! ```
//! use tessera_text::chat::{Role, Template};
//! use tessera_text::{SpecialTokens, Token};
//! let tokens = SpecialTokens {
//!     image: Token::new("<image>", 3),
//!     image_frame: None,
//!     eos: Token::new("</s>", 2),
//!     pad_id: 2,
//!     added: Vec::new(),
//! };
//! let turns = [(Role::User, "<image>\nWhat is it?"), (Role::Assistant, "A cat.")];
//! let rendered = Template::Plain.render(&turns, 1, &tokens);
//! assert_eq!(rendered.text, "<image>A cat.\n</s>");
//! ```
pub mod chat;
mod special_tokens;

pub use special_tokens::{SpecialTokens, Token};

#[cfg(feature = "tokenizer")]
mod chat_template;
#[cfg(feature = "tokenizer")]
mod encoder;
#[cfg(feature = "tokenizer")]
mod error;
#[cfg(feature = "tokenizer")]
mod model_tokenizer;
#[cfg(feature = "tokenizer")]
mod resolve_tokens;

#[cfg(feature = "tokenizer")]
pub use chat_template::ChatTemplate;
#[cfg(feature = "tokenizer")]
pub use encoder::{Encoder, Tokenized};
#[cfg(feature = "tokenizer")]
pub use error::TextError;
#[cfg(feature = "tokenizer")]
pub use model_tokenizer::ModelTokenizer;
