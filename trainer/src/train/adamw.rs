//! AdamW for the trainable tensors of a replicated (NO_SHARD / single-rank) run, with PyTorch's
//! update order: decoupled decay `p *= 1 - lr*wd`, then `p -= lr * m_hat / (sqrt(v_hat) + eps)`.
//! Decay applies to matrices only (as Hugging Face's Trainer: no decay on biases and norms).
//! State (`exp_avg`, `exp_avg_sq`, step) saves to and loads from safetensors by parameter name.
use crate::model::{weights, ModelError};
use crate::unit::ParamMap;
use std::collections::BTreeMap;
use std::path::Path;
use tch::Tensor;

pub const BETA1: f64 = 0.9;
pub const BETA2: f64 = 0.999;
pub const EPS: f64 = 1e-8;

/// One optimizer over named tensors; each name has its own peak learning rate.
pub struct AdamW {
    exp_avg: BTreeMap<String, Tensor>,
    exp_avg_sq: BTreeMap<String, Tensor>,
    /// Updates taken (bias correction uses it).
    pub steps: u64,
    pub weight_decay: f64,
}

impl AdamW {
    pub fn new(params: &ParamMap, weight_decay: f64) -> Self {
        let zeros = || -> BTreeMap<String, Tensor> {
            params
                .iter()
                .map(|(k, t)| (k.clone(), t.detach().zeros_like()))
                .collect()
        };
        AdamW {
            exp_avg: zeros(),
            exp_avg_sq: zeros(),
            steps: 0,
            weight_decay,
        }
    }

    /// One update of every tensor in `params` that has a gradient in `grads`, at `lr_of(name)`.
    pub fn step(&mut self, params: &mut ParamMap, grads: &ParamMap, lr_of: &dyn Fn(&str) -> f64) {
        self.steps += 1;
        let t = self.steps as i32;
        let (bc1, bc2) = (1.0 - BETA1.powi(t), 1.0 - BETA2.powi(t));
        let _guard = tch::no_grad_guard();
        for (name, p) in params.iter_mut() {
            let Some(g) = grads.get(name) else {
                continue;
            };
            let (Some(m), Some(v)) = (self.exp_avg.get_mut(name), self.exp_avg_sq.get_mut(name))
            else {
                continue;
            };
            let lr = lr_of(name);
            if self.weight_decay > 0.0 && p.dim() >= 2 {
                let _ = p.g_mul_scalar_(1.0 - lr * self.weight_decay);
            }
            let _ = m.g_mul_scalar_(BETA1);
            let _ = m.g_add_(&(g * (1.0 - BETA1)));
            let _ = v.g_mul_scalar_(BETA2);
            let _ = v.g_add_(&(g * g * (1.0 - BETA2)));
            let denom = (&*v / bc2).sqrt() + EPS;
            let update = &*m / &denom * (lr / bc1);
            let _ = p.g_sub_(&update);
        }
    }

    /// Writes the moments to one safetensors file (`{name}.exp_avg`, `{name}.exp_avg_sq`).
    pub fn save(&self, path: &Path) -> Result<(), ModelError> {
        let mut all = ParamMap::new();
        for (k, t) in &self.exp_avg {
            all.insert(format!("{k}.exp_avg"), t.shallow_clone());
        }
        for (k, t) in &self.exp_avg_sq {
            all.insert(format!("{k}.exp_avg_sq"), t.shallow_clone());
        }
        weights::save(path, &all)
    }

    /// Restores the moments saved by [`AdamW::save`]; every tensor must be present with the
    /// same shape.
    pub fn load(&mut self, path: &Path, steps: u64) -> Result<(), ModelError> {
        let saved = weights::load_all(path)?;
        for (suffix, map) in [
            ("exp_avg", &mut self.exp_avg),
            ("exp_avg_sq", &mut self.exp_avg_sq),
        ] {
            for (name, t) in map.iter_mut() {
                let key = format!("{name}.{suffix}");
                let src = saved.get(&key).ok_or_else(|| ModelError::MissingTensor {
                    dir: path.into(),
                    name: key.clone(),
                })?;
                if src.size() != t.size() {
                    return Err(ModelError::ShapeMismatch {
                        path: path.into(),
                        name: key,
                        expected: t.size(),
                        found: src.size(),
                    });
                }
                t.copy_(src);
            }
        }
        self.steps = steps;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_step_matches_the_adamw_formula() {
        let mut params = ParamMap::new();
        params.insert(
            "w".into(),
            Tensor::from_slice(&[1.0f32, -2.0])
                .view([1, 2])
                .set_requires_grad(true),
        );
        let loss = (params["w"].shallow_clone() * 3.0).sum(tch::Kind::Float);
        loss.backward();
        let grads: ParamMap = params.iter().map(|(k, t)| (k.clone(), t.grad())).collect();
        let mut opt = AdamW::new(&params, 0.1);
        opt.step(&mut params, &grads, &|_| 0.01);
        // m_hat = g, v_hat = g^2 -> update = lr * g / (|g| + eps) = 0.01; decay 1 - 0.001.
        let got: Vec<f32> = Vec::try_from(params["w"].detach().view([-1])).expect("f32");
        let want = [1.0 * 0.999 - 0.01, -2.0 * 0.999 - 0.01];
        for (g, w) in got.iter().zip(want) {
            assert!((f64::from(*g) - w).abs() < 1e-6, "{got:?} vs {want:?}");
        }
    }

    #[test]
    fn state_round_trips_through_a_file() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let mut params = ParamMap::new();
        params.insert(
            "b".into(),
            Tensor::from_slice(&[0.5f32, 0.25]).set_requires_grad(true),
        );
        (params["b"].shallow_clone() * params["b"].shallow_clone())
            .sum(tch::Kind::Float)
            .backward();
        let grads: ParamMap = params.iter().map(|(k, t)| (k.clone(), t.grad())).collect();
        let mut opt = AdamW::new(&params, 0.0);
        opt.step(&mut params, &grads, &|_| 0.1);
        opt.save(&dir.path().join("opt.safetensors"))?;
        let mut back = AdamW::new(&params, 0.0);
        back.load(&dir.path().join("opt.safetensors"), opt.steps)?;
        assert!(back.exp_avg["b"].allclose(&opt.exp_avg["b"], 0.0, 0.0, false));
        assert!(back.exp_avg_sq["b"].allclose(&opt.exp_avg_sq["b"], 0.0, 0.0, false));
        assert_eq!(back.steps, 1);
        Ok(())
    }
}
