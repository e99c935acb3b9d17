//! `bf16` / `f32`: the values of `--precision`, `--reduce-dtype`, `tessera export --dtype` and
//! the model bench's dtypes.
use serde::{Deserialize, Serialize};

/// A floating-point dtype, by the names PyTorch users type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(
    feature = "clap",
    derive(clap::ValueEnum),
    value(rename_all = "snake_case")
)]
#[serde(rename_all = "snake_case")]
pub enum Dtype {
    /// bfloat16: f32's range, 8 bits of mantissa.
    Bf16,
    /// float32.
    F32,
}

impl Dtype {
    pub fn kind(self) -> tch::Kind {
        match self {
            Dtype::Bf16 => tch::Kind::BFloat16,
            Dtype::F32 => tch::Kind::Float,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Dtype::Bf16 => "bf16",
            Dtype::F32 => "f32",
        }
    }
}
