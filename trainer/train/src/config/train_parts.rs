//! `--train`: the parts of the model that learn, as a list (`projector`, `projector,lora`,
//! `projector,lm`, with `vision` or `vision:K` added to any). `--stage` picks the default
//! (stage 1: `projector`; stage 2: `projector,lora`); LLaVA-1.5's own stage 2 is
//! `projector,lm`, ShareGPT4V's and LLaVA-OneVision's add `vision`.
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use tessera_model::VisionTraining;

/// What trains. At least one part; `lora` and `lm` exclude each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TrainParts {
    /// The `mlp2x_gelu` projector.
    pub projector: bool,
    /// LoRA adapters on the LM's linear layers (the LM's weights stay frozen).
    pub lora: bool,
    /// Every LM parameter: embedding, decoder layers, final norm and head (tied or not).
    pub lm: bool,
    /// The vision tower: frozen, whole, or its last K feature layers.
    pub vision: VisionTraining,
}

const PARTS: &str = "projector, lora, lm, vision, vision:K";

impl TrainParts {
    /// Only the projector: stage 1 (alignment).
    pub const PROJECTOR: TrainParts = TrainParts {
        projector: true,
        lora: false,
        lm: false,
        vision: VisionTraining::Frozen,
    };

    /// Projector + LoRA: tessera's stage 2 default.
    pub const PROJECTOR_LORA: TrainParts = TrainParts {
        lora: true,
        ..TrainParts::PROJECTOR
    };

    /// Whether any LM parameter or adapter trains.
    pub fn lm_side(&self) -> bool {
        self.lora || self.lm
    }
}

impl FromStr for TrainParts {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let mut parts = TrainParts {
            projector: false,
            lora: false,
            lm: false,
            vision: VisionTraining::Frozen,
        };
        for word in s.split(',').map(str::trim) {
            match word {
                "projector" => parts.projector = true,
                "lora" => parts.lora = true,
                "lm" => parts.lm = true,
                "vision" => parts.vision = VisionTraining::All,
                _ => match word.strip_prefix("vision:").map(str::parse::<usize>) {
                    Some(Ok(k)) if k > 0 => parts.vision = VisionTraining::LastLayers(k),
                    Some(_) => {
                        return Err(format!(
                            "`{word}`: vision:K takes a number of layers K >= 1"
                        ))
                    }
                    None => return Err(format!("`{word}` is not a part that trains ({PARTS})")),
                },
            }
        }
        if parts.lora && parts.lm {
            return Err(
                "lora and lm exclude each other: the LM trains in full or through \
                        adapters"
                    .into(),
            );
        }
        if !parts.projector && !parts.lm_side() && parts.vision == VisionTraining::Frozen {
            return Err(format!("`{s}` trains nothing ({PARTS})"));
        }
        Ok(parts)
    }
}

impl fmt::Display for TrainParts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut words: Vec<String> = Vec::new();
        let flags = [
            (self.projector, "projector"),
            (self.lora, "lora"),
            (self.lm, "lm"),
        ];
        words.extend(
            flags
                .iter()
                .filter(|(on, _)| *on)
                .map(|(_, w)| w.to_string()),
        );
        match self.vision {
            VisionTraining::Frozen => {}
            VisionTraining::All => words.push("vision".into()),
            VisionTraining::LastLayers(k) => words.push(format!("vision:{k}")),
        }
        f.write_str(&words.join(","))
    }
}

impl TryFrom<String> for TrainParts {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<TrainParts> for String {
    fn from(p: TrainParts) -> String {
        p.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_and_print_back() {
        for s in [
            "projector",
            "projector,lora",
            "projector,lm",
            "projector,lm,vision",
            "lm,vision:4",
        ] {
            let parts: TrainParts = s.parse().expect(s);
            assert_eq!(parts.to_string(), s);
        }
        assert_eq!(
            "projector,lora".parse::<TrainParts>(),
            Ok(TrainParts::PROJECTOR_LORA)
        );
    }

    #[test]
    fn bad_lists_say_why() {
        let err = |s: &str| s.parse::<TrainParts>().expect_err(s);
        assert!(err("projector,lora,lm").contains("exclude"));
        assert!(err("projector,mlp").contains("`mlp` is not a part"));
        assert!(err("vision:0").contains("K >= 1"));
        assert!(err("").contains("not a part"));
    }
}
