//! Accumulates `PlanStats` over a plan's micro-steps: padding, rank imbalance by the cost
//! model, type alignment.
use super::planner::Planner;
use super::types::{MicroStep, PlanStats};

#[derive(Default)]
pub(crate) struct StatsAccumulator {
    stats: PlanStats,
    imbalance_sum: f64,
    aligned: u64,
}

impl StatsAccumulator {
    pub(super) fn add(&mut self, planner: &Planner, micro_step: &MicroStep) {
        let s = &mut self.stats;
        s.micro_steps += 1;
        let mut rank_costs = Vec::with_capacity(micro_step.ranks.len());
        for mb in &micro_step.ranks {
            s.micro_batches += 1;
            let mut cost = 0.0;
            let mut longest = 0u64;
            for row in &mb.rows {
                let mut len = 0u64;
                for &i in row {
                    len += u64::from(planner.lens[i as usize]);
                    cost += planner.costs[i as usize];
                }
                longest = longest.max(len);
                if !mb.zero_loss {
                    s.real_tokens += len;
                    s.samples += row.len() as u64;
                }
            }
            s.filler_micro_batches += u64::from(mb.zero_loss);
            s.computed_tokens += mb.rows.len() as u64 * longest;
            rank_costs.push(cost);
        }
        let mean = rank_costs.iter().sum::<f64>() / rank_costs.len().max(1) as f64;
        let max = rank_costs.iter().copied().fold(0.0, f64::max);
        let imbalance = if mean > 0.0 { max / mean } else { 1.0 };
        self.imbalance_sum += imbalance;
        s.imbalance_worst = s.imbalance_worst.max(imbalance);
        s.critical_cost += max;
        self.aligned += u64::from(micro_step.kind().is_some());
    }

    pub(super) fn finish(mut self, token_budget: u64) -> PlanStats {
        let s = &mut self.stats;
        if s.micro_steps > 0 {
            s.imbalance_mean = self.imbalance_sum / s.micro_steps as f64;
            s.type_aligned = self.aligned as f64 / s.micro_steps as f64;
        }
        if s.computed_tokens > 0 {
            s.pad_fraction = 1.0 - s.real_tokens as f64 / s.computed_tokens as f64;
        }
        if s.micro_batches > 0 {
            s.budget_fill = s.real_tokens as f64 / (s.micro_batches as f64 * token_budget as f64);
        }
        self.stats
    }
}
