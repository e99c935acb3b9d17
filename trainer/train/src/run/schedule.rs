//! Learning-rate schedule: linear warmup then cosine decay to zero, as Hugging Face's
//! `get_cosine_schedule_with_warmup` (which LLaVA-1.5 trains with) computes it:
//! warmup steps = ceil(ratio x total); during warmup lr = base x step / warmup (so step 0 runs
//! at lr 0, as in transformers); after it lr = base x 0.5 x (1 + cos(pi x progress)).

/// A schedule for one run; `lr(step)` is a pure function of the step, so resume needs only the
/// step index.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct CosineSchedule {
    pub base_lr: f64,
    pub warmup_steps: u64,
    pub total_steps: u64,
}

impl CosineSchedule {
    pub(crate) fn new(base_lr: f64, warmup_ratio: f64, total_steps: u64) -> Self {
        let warmup_steps = (warmup_ratio * total_steps as f64).ceil() as u64;
        CosineSchedule {
            base_lr,
            warmup_steps,
            total_steps,
        }
    }

    /// Learning rate used by the optimizer step with index `step` (0-based).
    pub(crate) fn lr(&self, step: u64) -> f64 {
        self.base_lr * self.factor(step)
    }

    /// Multiplier of the base rate at `step`, in [0, 1].
    pub(crate) fn factor(&self, step: u64) -> f64 {
        if step < self.warmup_steps {
            return step as f64 / self.warmup_steps.max(1) as f64;
        }
        let decay_steps = self.total_steps.saturating_sub(self.warmup_steps).max(1);
        let progress = (step - self.warmup_steps) as f64 / decay_steps as f64;
        (0.5 * (1.0 + (std::f64::consts::PI * progress.min(1.0)).cos())).max(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn warmup_rises_linearly_then_cosine_falls_to_zero() {
        let s = CosineSchedule::new(1e-3, 0.03, 1000);
        assert_eq!(s.warmup_steps, 30);
        assert!(close(s.lr(0), 0.0));
        assert!(close(s.lr(15), 0.5e-3));
        assert!(close(s.lr(30), 1e-3));
        assert!(close(s.lr(30 + 485), 0.5e-3));
        assert!(close(s.lr(1000), 0.0));
        let lrs: Vec<f64> = (30..1000).map(|i| s.lr(i)).collect();
        assert!(
            lrs.windows(2).all(|w| w[1] <= w[0]),
            "cosine part must not rise"
        );
    }

    #[test]
    fn matches_transformers_values() {
        // transformers' cosine lr_lambda (num_cycles 0.5) evaluated in Python: warmup 3, total 10.
        let s = CosineSchedule::new(2e-4, 0.3, 10);
        let expected = [
            0.0,
            6.666666666666667e-05,
            0.00013333333333333334,
            0.0002,
            0.0001900968867902419,
            0.00016234898018587337,
            0.00012225209339563145,
            7.774790660436858e-05,
            3.7651019814126654e-05,
            9.903113209758096e-06,
        ];
        for (step, want) in expected.iter().enumerate() {
            assert!(
                (s.lr(step as u64) - want).abs() < 1e-12,
                "step {step}: {} vs {want}",
                s.lr(step as u64)
            );
        }
    }

    #[test]
    fn a_run_shorter_than_its_warmup_still_has_a_finite_rate() {
        let s = CosineSchedule::new(1.0, 0.0, 1);
        assert!(close(s.lr(0), 1.0));
        assert!(s.lr(5).is_finite());
    }
}
