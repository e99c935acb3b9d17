//! What a plan is made of: steps of micro-steps of per-rank `MicroBatchPlan`s, the resume
//! `Position`, and the per-plan quality statistics.
use crate::MicroBatchPlan;
use tessera_shards::Kind;

/// Where an epoch stands: how many samples of each kind are consumed. It does not depend on
/// the world size, so a run resumed with a different W continues from exactly these samples.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Position {
    pub epoch: u64,
    /// Identifies the epoch's sample order (hash of fingerprint, seed and epoch); a position is
    /// only valid for the order it was made in.
    pub order_key: String,
    /// Optimizer steps already taken in this epoch (used to number the resumed steps).
    pub step: u64,
    /// Text-only samples consumed: a prefix of the epoch's text stream.
    pub consumed_text: u64,
    /// Image samples consumed: a prefix of the epoch's image stream.
    pub consumed_image: u64,
}

impl Position {
    pub fn consumed(&self, kind: Kind) -> u64 {
        match kind {
            Kind::Text => self.consumed_text,
            Kind::Image => self.consumed_image,
        }
    }
}

/// One micro-step: one `MicroBatchPlan` per rank (index = rank).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MicroStep {
    pub ranks: Vec<MicroBatchPlan>,
}

impl MicroStep {
    /// The kind every rank runs, or `None` when ranks disagree (only the `fixed` baseline
    /// can produce that; `pack` and `bucket` never do).
    pub fn kind(&self) -> Option<Kind> {
        let first = self.ranks.first()?.kind;
        self.ranks.iter().all(|r| r.kind == first).then_some(first)
    }
}

/// One optimizer step: G micro-steps (fewer only for an epoch's last step).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Step {
    /// Step number within the epoch.
    pub index: u64,
    /// Position before this step (resume here to run this step next).
    pub start: Position,
    pub micro_steps: Vec<MicroStep>,
    /// Supervised tokens in the whole step, all ranks and micro-steps, fillers excluded: the
    /// loss divisor.
    pub supervised_tokens: u64,
}

impl Step {
    /// This rank's micro-batches, in micro-step order.
    pub fn for_rank(&self, rank: usize) -> impl Iterator<Item = &MicroBatchPlan> + '_ {
        self.micro_steps
            .iter()
            .filter_map(move |m| m.ranks.get(rank))
    }
}

/// Quality of a plan, as `tessera bench plan` reports it.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PlanStats {
    /// Real samples planned (zero-loss fillers excluded).
    pub samples: u64,
    pub micro_steps: u64,
    pub micro_batches: u64,
    /// Zero-loss filler micro-batches added at the ends of the kinds' streams.
    pub filler_micro_batches: u64,
    /// Tokens of real samples.
    pub real_tokens: u64,
    /// Tokens the model computes: `rows * row_len` per micro-batch (fillers included).
    pub computed_tokens: u64,
    /// `1 - real_tokens / computed_tokens`: row padding plus filler tokens.
    pub pad_fraction: f64,
    /// `real_tokens / (micro_batches * token_budget)`: how full micro-batches are.
    pub budget_fill: f64,
    /// Max over mean rank cost per micro-step, averaged over micro-steps.
    pub imbalance_mean: f64,
    /// The worst micro-step's max over mean rank cost.
    pub imbalance_worst: f64,
    /// Fraction of micro-steps on which every rank runs the same kind.
    pub type_aligned: f64,
    /// Sum over micro-steps of the slowest rank's cost: the epoch's run time in cost units
    /// (every rank waits for the slowest at each micro-step's collectives).
    pub critical_cost: f64,
}

/// An epoch's plan (or its remainder, when resumed).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Plan {
    pub epoch: u64,
    pub world_size: usize,
    pub steps: Vec<Step>,
    /// Position after the last step (everything consumed).
    pub end: Position,
    pub stats: PlanStats,
}

impl Plan {
    /// Where to resume to run `step` (an index into `steps`) next; `steps.len()` gives the
    /// epoch's end.
    pub fn resume_position(&self, step: usize) -> Result<Position, crate::plan::PlanError> {
        match self.steps.get(step) {
            Some(s) => Ok(s.start.clone()),
            None if step == self.steps.len() => Ok(self.end.clone()),
            None => Err(crate::plan::PlanError::StepOutOfRange {
                step,
                steps: self.steps.len(),
            }),
        }
    }
}
