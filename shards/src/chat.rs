//! The chat templates and the Qwen2 special tokens, defined once for every crate: ingest renders
//! each record with [`Template::render`] (after checking its turns), `tessera generate` asks the
//! model with [`Template::generation_prompt`], the llava-hf export writes the same templates
//! as Jinja for transformers (`tessera-train`'s `llava_hf.rs`, checked against this file), and
//! the loader pads rows with [`END_OF_TEXT_ID`].
//!
//! * `plain` (LLaVA-Pretrain, stage 1). An image conversation becomes one `<|image_pad|>` per
//!   image, then each assistant turn's text and `\n`; the user turns' text (the instruction)
//!   is dropped, as in LLaVA. A text-only conversation is every turn's text followed by `\n`. Qwen's tokenizer
//!   adds no BOS/EOS, so a finished conversation ends with `<|endoftext|>` (151643), which
//!   teaches the model to stop. Supervised: the assistant turns (with their `\n`) and the
//!   `<|endoftext|>`.
//! * `chatml` (Qwen2.5 chat, multi-turn mixtures): `<|im_start|>{user|assistant|system}\n`
//!   `{text}<|im_end|>\n` per turn, no default system prompt added. `<image>` in a turn becomes
//!   `<|vision_start|><|image_pad|><|vision_end|>` (Qwen2-VL's framing; only `<|image_pad|>`
//!   is expanded later to the vision tokens). Supervised: each assistant turn's text and its
//!   `<|im_end|>` (not the role header, not the newline after `<|im_end|>`).
//!
//! The ids are those of the Qwen2 and Qwen2.5 tokenizers. Where a tokenizer is at hand it is
//! the authority (ingest records its `<|image_pad|>` id in index.json); these are the ids every
//! crate assumes where there is none.
use std::ops::Range;

/// LLaVA json's image placeholder inside a turn's text.
pub const IMAGE_TAG: &str = "<image>";
/// The one token that stands for an image in `input_ids` (the loader expands it).
pub const IMAGE_PAD: &str = "<|image_pad|>";
pub const END_OF_TEXT: &str = "<|endoftext|>";
pub const IM_START: &str = "<|im_start|>";
pub const IM_END: &str = "<|im_end|>";
pub const VISION_START: &str = "<|vision_start|>";
pub const VISION_END: &str = "<|vision_end|>";

pub const END_OF_TEXT_ID: u32 = 151_643;
pub const IM_START_ID: u32 = 151_644;
pub const IM_END_ID: u32 = 151_645;
pub const VISION_START_ID: u32 = 151_652;
pub const VISION_END_ID: u32 = 151_653;
/// `<|image_pad|>`: the one id that stands for an image in `input_ids` (the loader expands it
/// into the vision tokens). Each dataset's own id is recorded in index.json
/// (`image_placeholder_id`); this is the default where no tokenizer is at hand.
pub const IMAGE_PAD_ID: u32 = 151_655;

/// Generation ends after either: `<|endoftext|>` ends a `plain` answer, `<|im_end|>` a
/// `chatml` turn.
pub const STOP_TOKENS: [&str; 2] = [END_OF_TEXT, IM_END];
/// The ids of [`STOP_TOKENS`].
pub const STOP_IDS: [u32; 2] = [END_OF_TEXT_ID, IM_END_ID];

/// Which chat template turns a conversation into text (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Template {
    Plain,
    Chatml,
}

/// Who speaks a turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    User,
    Assistant,
    System,
}

impl Role {
    /// A LLaVA json `from` (`human`, `gpt`, `system`; `user` and `assistant` too).
    pub fn from_llava(from: &str) -> Option<Role> {
        match from {
            "human" | "user" => Some(Role::User),
            "gpt" | "assistant" => Some(Role::Assistant),
            "system" => Some(Role::System),
            _ => None,
        }
    }

    /// The role's name in a ChatML header (and in transformers' `messages`).
    pub fn name(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::System => "system",
        }
    }
}

/// A rendered conversation: the text and the byte ranges whose tokens are supervised.
#[derive(Clone, Debug, PartialEq)]
pub struct Rendered {
    pub text: String,
    pub supervised: Vec<Range<usize>>,
}

impl Rendered {
    fn push(&mut self, text: &str, supervised: bool) {
        let start = self.text.len();
        self.text.push_str(text);
        if supervised && !text.is_empty() {
            self.supervised.push(start..self.text.len());
        }
    }
}

impl Template {
    pub fn name(self) -> &'static str {
        match self {
            Template::Plain => "plain",
            Template::Chatml => "chatml",
        }
    }

    /// The special tokens the template writes: a tokenizer must know each.
    pub fn special_tokens(self) -> &'static [&'static str] {
        match self {
            Template::Plain => &[IMAGE_PAD, END_OF_TEXT],
            Template::Chatml => &[IMAGE_PAD, IM_START, IM_END, VISION_START, VISION_END],
        }
    }

    /// A whole conversation, as training sees it. `images`: how many images come with it
    /// (`plain` renders them as that many `<|image_pad|>` in place of the user turns; `chatml`
    /// frames each `<image>` of the turns where it stands).
    pub fn render(self, turns: &[(Role, &str)], images: usize) -> Rendered {
        let mut out = self.turns(turns, images);
        if self == Template::Plain {
            out.push(END_OF_TEXT, true);
        }
        out
    }

    /// What the model continues from to answer `turns` (which end with a user turn): the
    /// turns as [`Template::render`] writes them, without the end of the conversation, then
    /// (`chatml`) the assistant's header. transformers' `add_generation_prompt`.
    pub fn generation_prompt(self, turns: &[(Role, &str)], images: usize) -> String {
        let mut out = self.turns(turns, images);
        if self == Template::Chatml {
            out.push(&chatml_header(Role::Assistant), false);
        }
        out.text
    }

    fn turns(self, turns: &[(Role, &str)], images: usize) -> Rendered {
        let mut out = Rendered {
            text: String::new(),
            supervised: Vec::new(),
        };
        match self {
            Template::Plain if images > 0 => {
                out.push(&IMAGE_PAD.repeat(images), false);
                for (_, text) in turns.iter().filter(|(r, _)| *r == Role::Assistant) {
                    out.push(text, true);
                    out.push("\n", true);
                }
            }
            Template::Plain => {
                for &(role, text) in turns {
                    let supervised = role == Role::Assistant;
                    out.push(text, supervised);
                    out.push("\n", supervised);
                }
            }
            Template::Chatml => {
                let framed = format!("{VISION_START}{IMAGE_PAD}{VISION_END}");
                for &(role, text) in turns {
                    out.push(&chatml_header(role), false);
                    let assistant = role == Role::Assistant;
                    if assistant {
                        out.push(text, true);
                    } else {
                        out.push(&text.replace(IMAGE_TAG, &framed), false);
                    }
                    out.push(IM_END, assistant);
                    out.push("\n", false);
                }
            }
        }
        out
    }
}

/// `<|im_start|>{role}\n`.
fn chatml_header(role: Role) -> String {
    format!("{IM_START}{}\n", role.name())
}

impl std::str::FromStr for Template {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "plain" => Ok(Template::Plain),
            "chatml" => Ok(Template::Chatml),
            other => Err(format!(
                "unknown template {other:?} (expected plain or chatml)"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn supervised(r: &Rendered) -> String {
        r.supervised.iter().map(|s| &r.text[s.clone()]).collect()
    }

    #[test]
    fn chatml_renders_turns_and_supervises_the_answers() {
        let turns = [
            (Role::User, "<image>\nWhat is shown?"),
            (Role::Assistant, "A gradient."),
        ];
        let r = Template::Chatml.render(&turns, 1);
        assert_eq!(
            r.text,
            "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>\nWhat is shown?\
             <|im_end|>\n<|im_start|>assistant\nA gradient.<|im_end|>\n"
        );
        assert_eq!(supervised(&r), "A gradient.<|im_end|>");
    }

    #[test]
    fn the_generation_prompt_is_the_training_text_up_to_the_answer() {
        let question = [(Role::User, "<image>\nDescribe the image.")];
        let answered = [question[0], (Role::Assistant, "A red square.")];
        for template in [Template::Plain, Template::Chatml] {
            let prompt = template.generation_prompt(&question, 1);
            let trained = template.render(&answered, 1);
            let answer_starts = trained.supervised[0].start;
            assert_eq!(prompt, trained.text[..answer_starts], "{template:?}");
        }
        assert_eq!(Template::Plain.generation_prompt(&question, 1), IMAGE_PAD);
    }

    #[test]
    fn plain_drops_the_instruction_and_ends_with_endoftext() {
        let turns = [
            (Role::User, "<image>\nignored"),
            (Role::Assistant, "A cat."),
        ];
        let r = Template::Plain.render(&turns, 1);
        assert_eq!(r.text, "<|image_pad|>A cat.\n<|endoftext|>");
        assert_eq!(supervised(&r), "A cat.\n<|endoftext|>");
        let text = Template::Plain.render(&[(Role::User, "Hi"), (Role::Assistant, "Yo")], 0);
        assert_eq!(text.text, "Hi\nYo\n<|endoftext|>");
        assert_eq!(supervised(&text), "Yo\n<|endoftext|>");
    }

    #[test]
    fn plain_puts_one_placeholder_per_image_and_chatml_frames_each_tag_in_place() {
        let turns = [
            (Role::User, "<image>Left.<image>Right. Which is brighter?"),
            (Role::Assistant, "The left."),
        ];
        let plain = Template::Plain.render(&turns, 2);
        assert_eq!(
            plain.text,
            "<|image_pad|><|image_pad|>The left.\n<|endoftext|>"
        );
        assert_eq!(
            Template::Plain.generation_prompt(&turns[..1], 2),
            "<|image_pad|><|image_pad|>"
        );
        let framed = "<|vision_start|><|image_pad|><|vision_end|>";
        let chatml = Template::Chatml.render(&turns, 2);
        assert!(chatml.text.starts_with(&format!(
            "<|im_start|>user\n{framed}Left.{framed}Right. Which is brighter?<|im_end|>\n"
        )));
        assert_eq!(supervised(&chatml), "The left.<|im_end|>");
    }

    #[test]
    fn names_round_trip() {
        for t in [Template::Plain, Template::Chatml] {
            assert_eq!(t.name().parse::<Template>(), Ok(t));
        }
        assert!("llama".parse::<Template>().is_err());
    }
}
