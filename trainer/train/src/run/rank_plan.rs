//! How a plan's micro-batches map onto this run's ranks. The planner lays each micro-step out
//! for `plan_world_size` ranks (P: the world size of the run's first start); a run resumed at
//! W ranks executes exactly that plan, so every step trains on the same samples, with the same
//! loss divisor, as the uninterrupted run (only the order of the reductions differs).
//!
//! Rank r runs the plan's micro-batches r, r + W, r + 2W, ... of each micro-step, then
//! zero-loss copies of one of them (labels ignored, images kept) until it has run
//! `ceil(P / W)`: every rank runs the same number of forward/backward passes of the same kind
//! at every micro-step, as FSDP's collectives require. At W = P this is the plan itself; at
//! W < P a rank runs several of the plan's micro-batches in a row (gradient accumulation); at
//! W > P, or when W does not divide P, some ranks run fillers.
use tessera_pipeline::plan::Step;
use tessera_pipeline::MicroBatchPlan;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RankLayout {
    pub plan_world_size: usize,
    pub world_size: usize,
    pub rank: usize,
}

impl RankLayout {
    /// Forward/backward passes every rank runs per micro-step of the plan.
    pub(crate) fn per_micro_step(&self) -> usize {
        self.plan_world_size.div_ceil(self.world_size)
    }

    /// This rank's micro-batches of `step`, in the order it runs them.
    pub(crate) fn batches(&self, step: &Step) -> Vec<MicroBatchPlan> {
        let mut out = Vec::with_capacity(step.micro_steps.len() * self.per_micro_step());
        for micro_step in &step.micro_steps {
            let mine = (self.rank..self.plan_world_size).step_by(self.world_size);
            let mut n = 0;
            for l in mine {
                out.push(micro_step.ranks[l].clone());
                n += 1;
            }
            let mut filler = micro_step.ranks[self.rank % self.plan_world_size].clone();
            filler.zero_loss = true;
            out.extend(std::iter::repeat_n(filler, self.per_micro_step() - n));
        }
        out
    }
}

/// The samples a step trains on (fillers left out), all ranks: global sample indices in plan
/// order (what `plan.jsonl` records per step).
pub(crate) fn step_samples(step: &Step) -> Vec<u64> {
    step.micro_steps
        .iter()
        .flat_map(|m| &m.ranks)
        .filter(|mb| !mb.zero_loss)
        .flat_map(|mb| mb.rows.iter().flatten().copied())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_pipeline::plan::{synthetic_llava, Planner};

    /// Every real micro-batch of the plan runs on exactly one rank, whatever W, and every rank
    /// runs the same number of passes of the same kind per micro-step.
    #[test]
    fn every_planned_micro_batch_runs_once_at_any_world_size() -> anyhow::Result<()> {
        let samples = synthetic_llava(300, 0.2, 1);
        let plan = Planner::builder()
            .samples(&samples)
            .world_size(2)
            .token_budget(4096)
            .micro_steps(2)
            .fingerprint("layout")
            .build()?
            .plan();
        for world_size in [1, 2, 3, 5] {
            for step in &plan.steps {
                let per_rank: Vec<Vec<MicroBatchPlan>> = (0..world_size)
                    .map(|rank| {
                        RankLayout {
                            plan_world_size: 2,
                            world_size,
                            rank,
                        }
                        .batches(step)
                    })
                    .collect();
                let k = 2usize.div_ceil(world_size);
                for batches in &per_rank {
                    assert_eq!(batches.len(), step.micro_steps.len() * k);
                    for (m, micro_step) in step.micro_steps.iter().enumerate() {
                        let kind = micro_step.kind().expect("pack aligns kinds");
                        assert!(batches[m * k..(m + 1) * k].iter().all(|b| b.kind == kind));
                    }
                }
                let mut ran: Vec<u64> = per_rank
                    .iter()
                    .flatten()
                    .filter(|b| !b.zero_loss)
                    .flat_map(|b| b.rows.iter().flatten().copied())
                    .collect();
                let mut planned = step_samples(step);
                ran.sort_unstable();
                planned.sort_unstable();
                assert_eq!(ran, planned, "W={world_size} step {}", step.index);
            }
        }
        Ok(())
    }
}
