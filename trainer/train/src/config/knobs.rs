//! `knobs!`: the one list of training knobs becomes the TOML layer, the command-line flags,
//! the resolved config and the merge between them.
//!
//! Each entry is `/// help` + optional `#[resume]` + optional `#[arg(...)]` + `name: Type = how`,
//! where `how` is
//! - `default(expr)`: the value when neither file nor flag sets it; `expr` may use the knobs
//!   listed above it, by name (the learning rates read `stage`);
//! - `required("hint")`: unset is a [`ConfigError::Missing`](super::ConfigError) with the hint;
//! - `optional`: unset stays `None` (the resolved field is `Option<Type>`).
//!
//! From it `knobs!` writes
//! - `ConfigLayer`: every knob as `Option<Type>`; serde with `deny_unknown_fields` (the TOML key
//!   is the name) and `clap::Args` (the flag is `--name` with dashes, its help the doc comment;
//!   `#[arg(...)]` adds to it, e.g. another flag name). Values parse as clap's
//!   `value_parser!` picks: `clap::ValueEnum`, then `FromStr`;
//! - `ConfigLayer::overlay` (a field set on top wins) and `ConfigLayer::fill` (defaults, or the
//!   missing required knob);
//! - `TrainConfig`: every knob resolved, with the same doc comment;
//! - `TrainConfig::resume_record` and `TrainConfig::resume_knobs`: the knobs marked `#[resume]`
//!   (they change the math, so a resumed run must have the checkpoint's values) by name and
//!   value as serde spells them (`"squash"`, `"bf16"`, `0.001`). `#[resume(when = |c| ...)]`
//!   records the knob only when the closure says so for the resolved config: a knob that does
//!   not apply (LoRA's rank without LoRA, the reduce dtype of an f32 run).
//!
//! A `bool` knob takes a value on the command line (`--name true`); an on/off switch that only
//! makes sense for one invocation (`--resume`) is a plain field of the CLI's `train::Args`.

/// A knob's value in the run record: serde's spelling, a string unquoted, a number as Rust
/// prints it (`0.001`, `2e-5` as `0.00002`, `256.0` as `256`: the spelling records had before
/// they came from serde, so older checkpoints compare equal). `None` for an unset optional
/// knob.
pub(crate) fn record_value<T: serde::Serialize>(value: &T) -> Option<String> {
    use serde_json::Value;
    match serde_json::to_value(value).ok()? {
        Value::Null => None,
        Value::String(s) => Some(s),
        Value::Number(n) => Some(match (n.as_u64(), n.as_i64(), n.as_f64()) {
            (Some(u), _, _) => u.to_string(),
            (None, Some(i), _) => i.to_string(),
            (None, None, Some(f)) => f.to_string(),
            (None, None, None) => n.to_string(),
        }),
        other => Some(other.to_string()),
    }
}

/// The resolved type of a knob: `Option<T>` for `optional`, `T` otherwise.
macro_rules! knob_type {
    ($ty:ty, optional) => { Option<$ty> };
    ($ty:ty, $how:ident) => { $ty };
}

/// The resolved value of a knob from its layer value `set` (an `Option`).
macro_rules! knob_value {
    ($set:expr, $key:expr, default($value:expr)) => {
        $set.unwrap_or_else(|| $value)
    };
    ($set:expr, $key:expr, required($hint:literal)) => {
        $set.ok_or(ConfigError::Missing {
            field: $key,
            hint: $hint,
        })?
    };
    ($set:expr, $key:expr, optional) => {
        $set
    };
}

/// Puts knob `$name` of `$cfg` into `$record` if it is marked `#[resume]` (and its `when`
/// holds).
macro_rules! knob_record {
    ($record:ident, $cfg:ident, $name:ident, []) => {};
    ($record:ident, $cfg:ident, $name:ident, [resume]) => {
        if let Some(value) = record_value(&$cfg.$name) {
            $record.insert(stringify!($name).to_string(), value);
        }
    };
    ($record:ident, $cfg:ident, $name:ident, [resume(when = $when:expr)]) => {
        let when: fn(&TrainConfig) -> bool = $when;
        if when($cfg) {
            knob_record!($record, $cfg, $name, [resume]);
        }
    };
}

/// The name of a knob marked `#[resume]`, or nothing.
macro_rules! knob_resume_name {
    ($name:ident, []) => {
        None
    };
    ($name:ident, [resume $($when:tt)*]) => {
        Some(stringify!($name))
    };
}

macro_rules! knobs {
    ($(
        $(#[doc = $doc:literal])*
        $(#[resume $($resume:tt)*])?
        $(#[arg($($arg:tt)*)])*
        $name:ident : $ty:ty = $how:ident $(($($how_args:tt)*))?
    ),* $(,)?) => {
        /// One layer of settings: a TOML file or the command line. `None` = not set here.
        #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, clap::Args)]
        #[serde(deny_unknown_fields)]
        pub struct ConfigLayer {
            $(
                $(#[doc = $doc])*
                #[arg(long)]
                $(#[arg($($arg)*)])*
                pub $name: Option<$ty>,
            )*
        }

        /// A resolved configuration: every knob has its value ([`ConfigLayer::resolve`]
        /// validates it).
        #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
        pub struct TrainConfig {
            $(
                $(#[doc = $doc])*
                pub $name: knob_type!($ty, $how),
            )*
        }

        impl ConfigLayer {
            /// `self` with every field that `top` sets replaced by `top`'s value.
            pub fn overlay(self, top: ConfigLayer) -> ConfigLayer {
                ConfigLayer {
                    $($name: top.$name.or(self.$name),)*
                }
            }

            /// Every knob's value, or its default, in list order; the first unset required
            /// knob is the error. No validation.
            fn fill(self) -> Result<TrainConfig, ConfigError> {
                $(
                    let $name = knob_value!(self.$name, stringify!($name), $how $(($($how_args)*))?);
                )*
                Ok(TrainConfig { $($name,)* })
            }
        }

        impl TrainConfig {
            /// Every knob marked `#[resume]`, in list order (whether or not a given run
            /// records it): the keys of [`TrainConfig::resume_record`].
            pub fn resume_knobs() -> impl Iterator<Item = &'static str> {
                [$(knob_resume_name!($name, [$(resume $($resume)*)?])),*]
                    .into_iter()
                    .flatten()
            }

            /// The knobs a resumed run must match (those marked `#[resume]` whose `when`
            /// holds): name -> value as serde writes it, strings unquoted.
            pub fn resume_record(&self) -> std::collections::BTreeMap<String, String> {
                let cfg = self;
                let mut record = std::collections::BTreeMap::new();
                $(knob_record!(record, cfg, $name, [$(resume $($resume)*)?]);)*
                record
            }
        }
    };
}
