//! Which of the tower's hidden states the image features are: one (LLaVA's
//! `mm_vision_select_layer`; by default -2, the layer before the last) or several, concatenated
//! along the channels in the order listed, as transformers' list `vision_feature_layer` does
//! (an early layer keeps what a middle one has learnt to ignore, such as colour). Written as
//! an integer when it is one layer and a list when several, in JSON, TOML and run records
//! alike, and as `-2` or `1,6` on the command line.
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// The hidden states the features are: `hidden_states[k]` with 0 the embeddings and k the
/// output of encoder layer k; a negative k counts from the end (-1 the last layer's output).
/// Never empty.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeatureLayers(Vec<i64>);

impl Default for FeatureLayers {
    /// LLaVA's choice: -2, the layer before the last.
    fn default() -> Self {
        Self::one(-2)
    }
}

impl FeatureLayers {
    pub fn one(layer: i64) -> Self {
        FeatureLayers(vec![layer])
    }

    /// Several layers, concatenated in this order; an empty list is refused.
    pub fn new(layers: Vec<i64>) -> Result<Self, String> {
        if layers.is_empty() {
            return Err("a list of vision feature layers needs at least one layer".into());
        }
        Ok(FeatureLayers(layers))
    }

    /// The layers as configured (negative ones still counting from the end).
    pub fn as_slice(&self) -> &[i64] {
        &self.0
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Always false: there is at least one layer.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Each layer as a positive index into an `n`-layer tower's hidden states, in list order
    /// (a negative k is `n + 1 + k`). Out-of-range layers come out as they resolve; see
    /// [`FeatureLayers::check`].
    pub fn resolve(&self, n: i64) -> Vec<i64> {
        self.0
            .iter()
            .map(|&k| if k < 0 { n + 1 + k } else { k })
            .collect()
    }

    /// Every layer is one of the `n` encoder layers' outputs (1..=n, or -n..=-1), and none is
    /// listed twice (as itself or counted from the other end).
    pub fn check(&self, n: i64) -> Result<(), String> {
        let resolved = self.resolve(n);
        for (&k, &at) in self.0.iter().zip(&resolved) {
            if !(1..=n).contains(&at) {
                return Err(format!(
                    "vision feature layer {k} is not a layer of a {n}-layer tower (1..={n}, or \
                     -{n}..=-1 counting from the end: -1 the last layer's output, -2 the one \
                     before)"
                ));
            }
        }
        for (i, at) in resolved.iter().enumerate() {
            if resolved[..i].contains(at) {
                return Err(format!(
                    "vision feature layers {self} name layer {at} of {n} twice"
                ));
            }
        }
        Ok(())
    }
}

impl fmt::Display for FeatureLayers {
    /// `-2`, or `1,6` for a list: what `--vision-feature-layer` takes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(i64::to_string).collect();
        f.write_str(&parts.join(","))
    }
}

impl FromStr for FeatureLayers {
    type Err = String;

    /// `-2` or a comma-separated list such as `1,6`.
    fn from_str(s: &str) -> Result<Self, String> {
        let layers = s
            .split(',')
            .map(|part| {
                part.trim().parse::<i64>().map_err(|_| {
                    format!(
                        "`{s}` is not a layer or a comma-separated list of layers (such as -2 \
                         or 1,6)"
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Self::new(layers)
    }
}

/// The two spellings in JSON and TOML: `-2` and `[1, 6]`.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum Spelled {
    One(i64),
    Many(Vec<i64>),
}

impl Serialize for FeatureLayers {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0.as_slice() {
            [one] => Spelled::One(*one),
            many => Spelled::Many(many.to_vec()),
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for FeatureLayers {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Spelled::deserialize(deserializer)? {
            Spelled::One(k) => Ok(Self::one(k)),
            Spelled::Many(layers) => Self::new(layers).map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Result = std::result::Result<(), Box<dyn std::error::Error>>;

    #[test]
    fn one_layer_is_an_integer_and_several_a_list_in_every_spelling() -> Result {
        let one: FeatureLayers = "-2".parse()?;
        assert_eq!(one, FeatureLayers::default());
        assert_eq!(serde_json::to_string(&one)?, "-2");
        let two: FeatureLayers = " 1, 6".parse()?;
        assert_eq!(two.as_slice(), [1, 6]);
        assert_eq!(two.to_string(), "1,6");
        assert_eq!(serde_json::to_string(&two)?, "[1,6]");
        let back: FeatureLayers = serde_json::from_str("[1,6]")?;
        assert_eq!(back, two);
        assert_eq!(serde_json::from_str::<FeatureLayers>("-2")?, one);
        assert!(serde_json::from_str::<FeatureLayers>("[]").is_err());
        assert!("1,x".parse::<FeatureLayers>().is_err());
        assert!("".parse::<FeatureLayers>().is_err());
        Ok(())
    }

    #[test]
    fn layers_resolve_from_the_end_and_are_checked_against_the_tower() -> Result {
        let layers: FeatureLayers = "-1,1,6".parse()?;
        assert_eq!(layers.resolve(12), [12, 1, 6]);
        assert!(layers.check(12).is_ok());
        let short = layers.check(5).err().unwrap_or_default();
        assert!(short.contains("6 is not a layer of a 5-layer"), "{short}");
        let twice: FeatureLayers = "11,-2".parse()?;
        let err = twice.check(12).err().unwrap_or_default();
        assert!(err.contains("layer 11 of 12 twice"), "{err}");
        assert!(FeatureLayers::one(0).check(12).is_err());
        Ok(())
    }
}
