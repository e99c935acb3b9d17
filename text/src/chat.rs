//! The chat templates, defined once for every crate: ingest renders each record with
//! [`Template::render`] (after checking its turns), `tessera generate` asks the model with
//! [`Template::generation_prompt`], and the llava-hf export writes the same templates as Jinja
//! for transformers (`tessera-train`'s `llava_hf.rs`, checked against this file). The special
//! tokens they write are the dataset's own ([`SpecialTokens`], resolved from its tokenizer by
//! ingest and kept in index.json), never one model's constants.
//!
//! * `plain` (LLaVA-Pretrain, stage 1). An image conversation becomes one image token per
//!   image, then each assistant turn's text and `\n`; the user turns' text (the instruction)
//!   is dropped, as in LLaVA. A text-only conversation is every turn's text followed by `\n`. A finished
//!   conversation ends with the tokenizer's end of sequence (`eos`: Qwen2.5's
//!   `<|endoftext|>`, SmolLM2-Instruct's `<|im_end|>`), which teaches the model to stop.
//!   Supervised: the assistant turns (with their `\n`) and the end token.
//! * `chatml` (multi-turn mixtures; needs a tokenizer with `<|im_start|>` and `<|im_end|>`):
//!   `<|im_start|>{user|assistant|system}\n{text}<|im_end|>\n` per turn, no default system
//!   prompt added. `<image>` in a turn becomes the image token, framed as Qwen2-VL frames it
//!   (`<|vision_start|>…<|vision_end|>`) when the tokenizer has those tokens (only the image
//!   token is expanded later to the vision tokens). Supervised: each assistant turn's text and
//!   its `<|im_end|>` (not the role header, not the newline after `<|im_end|>`).
use crate::special_tokens::SpecialTokens;
use std::ops::Range;

/// LLaVA json's image placeholder inside a turn's text.
pub const IMAGE_TAG: &str = "<image>";
/// ChatML's markers, as every ChatML tokenizer spells them (their ids are the tokenizer's).
pub const IM_START: &str = "<|im_start|>";
pub const IM_END: &str = "<|im_end|>";

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

    /// The markers the template writes besides [`SpecialTokens`]: a tokenizer must know each.
    pub fn markers(self) -> &'static [&'static str] {
        match self {
            Template::Plain => &[],
            Template::Chatml => &[IM_START, IM_END],
        }
    }

    /// The tokens generation stops after: `plain` answers end with `eos`, `chatml` turns with
    /// `<|im_end|>` (whose id `im_end` is, when the tokenizer has it), and `eos` ends either.
    pub fn stop_ids(self, tokens: &SpecialTokens, im_end: Option<u32>) -> Vec<u32> {
        let mut ids = vec![tokens.eos.id];
        if let (Template::Chatml, Some(id)) = (self, im_end) {
            if id != tokens.eos.id {
                ids.push(id);
            }
        }
        ids
    }

    /// A whole conversation, as training sees it. `images`: how many images come with it
    /// (`plain` renders them as that many image tokens in place of the user turns; `chatml`
    /// frames each `<image>` of the turns where it stands).
    pub fn render(self, turns: &[(Role, &str)], images: usize, tokens: &SpecialTokens) -> Rendered {
        let mut out = self.turns(turns, images, tokens);
        if self == Template::Plain {
            out.push(&tokens.eos.text, true);
        }
        out
    }

    /// What the model continues from to answer `turns` (which end with a user turn): the
    /// turns as [`Template::render`] writes them, without the end of the conversation, then
    /// (`chatml`) the assistant's header. transformers' `add_generation_prompt`.
    pub fn generation_prompt(
        self,
        turns: &[(Role, &str)],
        images: usize,
        tokens: &SpecialTokens,
    ) -> String {
        let mut out = self.turns(turns, images, tokens);
        if self == Template::Chatml {
            out.push(&chatml_header(Role::Assistant), false);
        }
        out.text
    }

    fn turns(self, turns: &[(Role, &str)], images: usize, tokens: &SpecialTokens) -> Rendered {
        let mut out = Rendered {
            text: String::new(),
            supervised: Vec::new(),
        };
        match self {
            Template::Plain if images > 0 => {
                out.push(&tokens.image.text.repeat(images), false);
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
                let framed = framed_image(tokens);
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

/// The image token as `chatml` writes it: framed when the tokenizer has the frame.
pub fn framed_image(tokens: &SpecialTokens) -> String {
    match &tokens.image_frame {
        Some((start, end)) => format!("{}{}{}", start.text, tokens.image.text, end.text),
        None => tokens.image.text.clone(),
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
        let r = Template::Chatml.render(&turns, 1, &SpecialTokens::qwen());
        assert_eq!(
            r.text,
            "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>\nWhat is shown?\
             <|im_end|>\n<|im_start|>assistant\nA gradient.<|im_end|>\n"
        );
        assert_eq!(supervised(&r), "A gradient.<|im_end|>");
        // A tokenizer without Qwen's frame: the image token alone.
        let r = Template::Chatml.render(&turns, 1, &SpecialTokens::smollm2_instruct());
        assert_eq!(
            r.text,
            "<|im_start|>user\n<image>\nWhat is shown?<|im_end|>\n<|im_start|>assistant\n\
             A gradient.<|im_end|>\n"
        );
    }

    #[test]
    fn the_generation_prompt_is_the_training_text_up_to_the_answer() {
        let question = [(Role::User, "<image>\nDescribe the image.")];
        let answered = [question[0], (Role::Assistant, "A red square.")];
        for tokens in [SpecialTokens::qwen(), SpecialTokens::smollm2_instruct()] {
            for template in [Template::Plain, Template::Chatml] {
                let prompt = template.generation_prompt(&question, 1, &tokens);
                let trained = template.render(&answered, 1, &tokens);
                let answer_starts = trained.supervised[0].start;
                assert_eq!(prompt, trained.text[..answer_starts], "{template:?}");
            }
            assert_eq!(
                Template::Plain.generation_prompt(&question, 1, &tokens),
                tokens.image.text
            );
        }
    }

    #[test]
    fn plain_drops_the_instruction_and_ends_with_the_tokenizers_eos() {
        let turns = [
            (Role::User, "<image>\nignored"),
            (Role::Assistant, "A cat."),
        ];
        let r = Template::Plain.render(&turns, 1, &SpecialTokens::qwen());
        assert_eq!(r.text, "<|image_pad|>A cat.\n<|endoftext|>");
        assert_eq!(supervised(&r), "A cat.\n<|endoftext|>");
        let text = Template::Plain.render(
            &[(Role::User, "Hi"), (Role::Assistant, "Yo")],
            0,
            &SpecialTokens::qwen(),
        );
        assert_eq!(text.text, "Hi\nYo\n<|endoftext|>");
        assert_eq!(supervised(&text), "Yo\n<|endoftext|>");
        let r = Template::Plain.render(&turns, 1, &SpecialTokens::smollm2_instruct());
        assert_eq!(r.text, "<image>A cat.\n<|im_end|>");
    }

    #[test]
    fn generation_stops_at_the_templates_end_and_the_eos() {
        assert_eq!(
            Template::Plain.stop_ids(&SpecialTokens::qwen(), Some(151_645)),
            [151_643]
        );
        assert_eq!(
            Template::Chatml.stop_ids(&SpecialTokens::qwen(), Some(151_645)),
            [151_643, 151_645]
        );
        // SmolLM2's eos is <|im_end|> itself: listed once.
        assert_eq!(
            Template::Chatml.stop_ids(&SpecialTokens::smollm2_instruct(), Some(2)),
            [2]
        );
    }

    #[test]
    fn plain_puts_one_placeholder_per_image_and_chatml_frames_each_tag_in_place() {
        let turns = [
            (Role::User, "<image>Left.<image>Right. Which is brighter?"),
            (Role::Assistant, "The left."),
        ];
        let plain = Template::Plain.render(&turns, 2, &SpecialTokens::qwen());
        assert_eq!(
            plain.text,
            "<|image_pad|><|image_pad|>The left.\n<|endoftext|>"
        );
        assert_eq!(
            Template::Plain.generation_prompt(&turns[..1], 2, &SpecialTokens::qwen()),
            "<|image_pad|><|image_pad|>"
        );
        let framed = "<|vision_start|><|image_pad|><|vision_end|>";
        let chatml = Template::Chatml.render(&turns, 2, &SpecialTokens::qwen());
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
