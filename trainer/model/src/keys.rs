//! Checkpoint keys built as paths, like candle's `VarBuilder::pp`:
//! `&layer / "self_attn" / "q_proj"` is `model.layers.3.self_attn.q_proj`, and
//! [`KeyPath::key`] names a tensor under it. Each model file builds a layer's keys once, in a
//! struct that both its parameter specs and its `forward` read, so a key is spelled in one place.
use std::fmt;
use std::ops::Div;
use tessera_fsdp::ParamSpec;

/// A dotted module path of a Hugging Face checkpoint (`vision_model.encoder.layers.0`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct KeyPath(String);

impl KeyPath {
    pub(crate) fn new(root: &str) -> Self {
        KeyPath(root.to_string())
    }

    /// The key of tensor `leaf` under this path (`{path}.{leaf}`).
    pub(crate) fn key(&self, leaf: &str) -> String {
        format!("{}.{leaf}", self.0)
    }

    /// The last segment (`q_proj` of `model.layers.0.self_attn.q_proj`).
    pub(crate) fn leaf(&self) -> &str {
        self.0.rsplit('.').next().unwrap_or(&self.0)
    }
}

impl fmt::Display for KeyPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Div<&str> for &KeyPath {
    type Output = KeyPath;
    fn div(self, segment: &str) -> KeyPath {
        KeyPath(format!("{}.{segment}", self.0))
    }
}

impl Div<&str> for KeyPath {
    type Output = KeyPath;
    fn div(self, segment: &str) -> KeyPath {
        &self / segment
    }
}

impl Div<i64> for &KeyPath {
    type Output = KeyPath;
    fn div(self, index: i64) -> KeyPath {
        KeyPath(format!("{}.{index}", self.0))
    }
}

impl Div<i64> for KeyPath {
    type Output = KeyPath;
    fn div(self, index: i64) -> KeyPath {
        &self / index
    }
}

/// A linear layer (`nn.Linear`): `{path}.weight` `[out, in]` and, when it has one,
/// `{path}.bias` `[out]`.
#[derive(Clone, Debug)]
pub(crate) struct LinearKeys {
    pub(crate) path: KeyPath,
    pub(crate) weight: String,
    pub(crate) bias: Option<String>,
    pub(crate) out_features: i64,
    pub(crate) in_features: i64,
}

impl LinearKeys {
    pub(crate) fn new(path: KeyPath, out_features: i64, in_features: i64, bias: bool) -> Self {
        LinearKeys {
            weight: path.key("weight"),
            bias: bias.then(|| path.key("bias")),
            path,
            out_features,
            in_features,
        }
    }

    /// Its weight (and bias) as parameters.
    pub(crate) fn specs(&self, trainable: bool) -> Vec<ParamSpec> {
        let mut specs = vec![ParamSpec {
            name: self.weight.clone(),
            shape: vec![self.out_features, self.in_features],
            trainable,
            expert: None,
        }];
        if let Some(bias) = &self.bias {
            specs.push(ParamSpec {
                name: bias.clone(),
                shape: vec![self.out_features],
                trainable,
                expert: None,
            });
        }
        specs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_join_like_the_checkpoint_keys() {
        let layer = KeyPath::new("model") / "layers" / 3;
        let q = &layer / "self_attn" / "q_proj";
        assert_eq!(q.to_string(), "model.layers.3.self_attn.q_proj");
        assert_eq!(q.leaf(), "q_proj");
        let linear = LinearKeys::new(q, 8, 4, true);
        assert_eq!(linear.weight, "model.layers.3.self_attn.q_proj.weight");
        assert_eq!(
            linear.bias.as_deref(),
            Some("model.layers.3.self_attn.q_proj.bias")
        );
        let shapes: Vec<Vec<i64>> = linear.specs(false).into_iter().map(|s| s.shape).collect();
        assert_eq!(shapes, vec![vec![8, 4], vec![8]]);
    }
}
