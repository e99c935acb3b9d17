//! `knobs!`: the one list of training knobs becomes the TOML layer, the command-line flags,
//! the resolved config and the merge between them.
//!
//! Each entry is `/// help` + optional `#[arg(...)]` + `name: Type = how`, where `how` is
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
//! - `TrainConfig`: every knob resolved, with the same doc comment.
//!
//! A `bool` knob takes a value on the command line (`--name true`); an on/off switch that only
//! makes sense for one invocation (`--resume`) is a plain field of the CLI's `train::Args`.

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

macro_rules! knobs {
    ($(
        $(#[doc = $doc:literal])*
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
    };
}
