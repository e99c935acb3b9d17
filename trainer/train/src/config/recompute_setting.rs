//! `--recompute`: a policy of FSDP's ([`Recompute`]) or `auto`, which the trainer resolves
//! before the first step from the memory at hand (`run/recompute_choice.rs`).
use serde::{Deserialize, Serialize};
use tessera_fsdp::Recompute;

/// What the run asked for: `auto` (the default) or one policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum RecomputeSetting {
    /// The fastest policy whose estimated peak fits the device (`run/recompute_choice.rs`).
    Auto,
    /// This policy.
    Fixed(Recompute),
}

impl std::str::FromStr for RecomputeSetting {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s == "auto" {
            return Ok(RecomputeSetting::Auto);
        }
        s.parse::<Recompute>()
            .map(RecomputeSetting::Fixed)
            .map_err(|e| format!("{e}; or auto (the fastest that fits the memory at hand)"))
    }
}

impl std::fmt::Display for RecomputeSetting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecomputeSetting::Auto => f.write_str("auto"),
            RecomputeSetting::Fixed(r) => r.fmt(f),
        }
    }
}

impl TryFrom<String> for RecomputeSetting {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<RecomputeSetting> for String {
    fn from(r: RecomputeSetting) -> String {
        r.to_string()
    }
}
