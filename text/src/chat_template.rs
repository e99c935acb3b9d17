//! A language model's own chat template, rendered as transformers' `apply_chat_template`
//! renders it: Jinja (here `minijinja`, with Python's string methods) with `trim_blocks` and
//! `lstrip_blocks`, over `messages` (`role`, `content`) and `add_generation_prompt`, with the
//! tokenizer's `bos_token` and `eos_token` and the `raise_exception` and `strftime_now`
//! helpers transformers defines. The template comes from the model folder's
//! `chat_template.jinja` (transformers 5 writes it) or its tokenizer_config.json's
//! `chat_template` (a string, or a list of named templates whose `default` is used).
use crate::chat::Role;
use crate::error::TextError;
use minijinja::{context, Environment, Error, ErrorKind};
use std::path::{Path, PathBuf};

/// Name of the template inside the environment.
const NAME: &str = "chat";

/// A compiled chat template and the special tokens it may write.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    /// Where it came from, for errors.
    origin: PathBuf,
}

impl ChatTemplate {
    /// Compiles `source`; `origin` names it in errors.
    pub fn new(
        source: String,
        bos_token: Option<String>,
        eos_token: Option<String>,
        origin: &Path,
    ) -> Result<Self, TextError> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| template_error(origin, e))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> Result<String, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        env.add_function("strftime_now", |format: String| {
            // transformers passes the local time; a fixed day keeps renders reproducible.
            format
                .replace("%d", "01")
                .replace("%b", "Jan")
                .replace("%Y", "2025")
        });
        env.add_template_owned(NAME, source)
            .map_err(|e| template_error(origin, e))?;
        Ok(ChatTemplate {
            env,
            bos_token,
            eos_token,
            origin: origin.to_path_buf(),
        })
    }

    /// The template of the model folder `dir` (`chat_template.jinja`, else
    /// tokenizer_config.json's), with the tokens that config names; `None` when it has none.
    pub fn from_dir(
        dir: &Path,
        config: Option<&serde_json::Value>,
    ) -> Result<Option<Self>, TextError> {
        let file = dir.join("chat_template.jinja");
        let (source, origin) = if file.is_file() {
            let text = std::fs::read_to_string(&file).map_err(|e| TextError::io(&file, e))?;
            (Some(text), file)
        } else {
            let source = config
                .and_then(|c| c.get("chat_template"))
                .and_then(named_default);
            (source, dir.join("tokenizer_config.json"))
        };
        let Some(source) = source else {
            return Ok(None);
        };
        let token = |key| crate::resolve_tokens::config_token(config, key);
        Self::new(source, token("bos_token"), token("eos_token"), &origin).map(Some)
    }

    /// The text of `messages`, and with `add_generation_prompt` the assistant's header after
    /// them, as transformers renders it.
    pub fn render(
        &self,
        messages: &[(Role, &str)],
        add_generation_prompt: bool,
    ) -> Result<String, TextError> {
        let messages: Vec<_> = messages
            .iter()
            .map(|(role, content)| serde_json::json!({"role": role.name(), "content": content}))
            .collect();
        self.render_json(&serde_json::Value::from(messages), add_generation_prompt)
    }

    /// [`Self::render`] of transformers' `messages` as JSON (a content may be a list of
    /// `{"type": "image"}` and `{"type": "text", "text": ...}` parts).
    pub fn render_json(
        &self,
        messages: &serde_json::Value,
        add_generation_prompt: bool,
    ) -> Result<String, TextError> {
        let messages = minijinja::Value::from(minijinja::value::Serde(messages));
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| template_error(&self.origin, e))?;
        template
            .render(context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => &self.bos_token,
                eos_token => &self.eos_token,
            })
            .map_err(|e| template_error(&self.origin, e))
    }
}

/// A `chat_template` value: the string itself, or the `default` of a list of named templates.
fn named_default(value: &serde_json::Value) -> Option<String> {
    if let Some(text) = value.as_str() {
        return Some(text.to_string());
    }
    value.as_array()?.iter().find_map(|entry| {
        (entry.get("name")?.as_str()? == "default")
            .then(|| entry.get("template")?.as_str().map(str::to_string))?
    })
}

fn template_error(origin: &Path, e: Error) -> TextError {
    TextError::ChatTemplate {
        path: origin.to_path_buf(),
        detail: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SmolLM2-Instruct's template (ChatML with a default system prompt), as its GGUF ships it.
    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn renders_like_apply_chat_template() -> anyhow::Result<()> {
        let t = ChatTemplate::new(SMOLLM2.into(), None, None, Path::new("t.jinja"))?;
        let text = t.render(&[(Role::User, "What is the capital of France?")], true)?;
        assert_eq!(
            text,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by \
             Hugging Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n\
             <|im_start|>assistant\n"
        );
        Ok(())
    }

    #[test]
    fn python_methods_block_trimming_and_raise_exception_work() -> anyhow::Result<()> {
        let source = "{%- for m in messages %}\n  {%- if m.role == 'system' %}{{ raise_exception('no system') }}{% endif %}\n{{ bos_token }}{{ m.content.strip().upper() }}|\n{%- endfor %}";
        let t = ChatTemplate::new(source.into(), Some("<s>".into()), None, Path::new("t"))?;
        assert_eq!(t.render(&[(Role::User, "  hi ")], false)?, "<s>HI|");
        let err = t
            .render(&[(Role::System, "x")], false)
            .expect_err("raise_exception stops the render");
        assert!(err.to_string().contains("no system"), "{err}");
        Ok(())
    }

    #[test]
    fn a_list_of_named_templates_gives_its_default() {
        let value = serde_json::json!([
            {"name": "tool_use", "template": "T"},
            {"name": "default", "template": "D"}
        ]);
        assert_eq!(named_default(&value).as_deref(), Some("D"));
    }
}
