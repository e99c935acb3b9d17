//! The special tokens a dataset's ids were made with, as its tokenizer spells and numbers them.
//! Ingest resolves them from the tokenizer it is given ([`crate::Encoder::load`], with feature
//! `tokenizer`) and records them in index.json; the templates ([`crate::chat`]), the loader's padding, training's
//! placeholder, generation's stop ids and the llava-hf export all read them from there, so no
//! crate assumes one model's vocabulary.
use serde::{Deserialize, Serialize};

/// One special token: its text and its id in the dataset's tokenizer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Token {
    pub text: String,
    pub id: u32,
}

impl Token {
    pub fn new(text: &str, id: u32) -> Self {
        Token {
            text: text.to_string(),
            id,
        }
    }
}

/// The image placeholder and the ends of sequences, from one tokenizer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpecialTokens {
    /// The one token standing for an image in `input_ids` (the loader expands it to the vision
    /// tower's tokens): the tokenizer's `<|image_pad|>` or `<image>`, or `<image>` added by
    /// ingest when it had neither (see `added`).
    pub image: Token,
    /// The tokens framing an image in `chatml`, when the tokenizer has both (Qwen's
    /// `<|vision_start|>` and `<|vision_end|>`); otherwise the image token stands alone.
    #[serde(default)]
    pub image_frame: Option<(Token, Token)>,
    /// The tokenizer's end of sequence (tokenizer_config.json's `eos_token`): it ends a `plain`
    /// conversation and stops generation.
    pub eos: Token,
    /// The id packed rows are padded with (`pad_token`, else `eos`).
    pub pad_id: u32,
    /// Tokens ingest added to the tokenizer (`<image>`), appended after its last id: the
    /// language model gets an embedding row for each (see tessera-model's `VlmOptions`).
    #[serde(default)]
    pub added: Vec<String>,
}

impl SpecialTokens {
    /// The Qwen2/Qwen2.5/Qwen3 vocabulary's special tokens as ingest resolves them from its
    /// `tokenizer.json` alone (the tokenizer the tests ingest with, `.deps/tokenizer`):
    /// `<|image_pad|>` framed by `<|vision_start|>` and `<|vision_end|>`, `<|endoftext|>` ending
    /// and padding (the base models' `eos_token`; an instruct model's tokenizer_config.json
    /// names `<|im_end|>` instead), nothing added. For the tests' shards and the benches' models,
    /// which use Qwen's ids.
    pub fn qwen() -> Self {
        SpecialTokens {
            image: Token::new("<|image_pad|>", 151_655),
            image_frame: Some((
                Token::new("<|vision_start|>", 151_652),
                Token::new("<|vision_end|>", 151_653),
            )),
            eos: Token::new("<|endoftext|>", 151_643),
            pad_id: 151_643,
            added: Vec::new(),
        }
    }
    /// SmolLM2-Instruct's special tokens with `<image>` added by ingest (its vocabulary has no
    /// image token and no frame; `<|im_end|>` is its `eos_token` and padding): the tests' case
    /// of a tokenizer that is not Qwen's.
    #[cfg(any(test, feature = "testing"))]
    pub fn smollm2_instruct() -> Self {
        SpecialTokens {
            image: Token::new("<image>", 49_152),
            image_frame: None,
            eos: Token::new("<|im_end|>", 2),
            pad_id: 2,
            added: vec!["<image>".into()],
        }
    }
}
