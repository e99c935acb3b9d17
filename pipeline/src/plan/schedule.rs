//! The driver: micro-steps one after another from a `Position`, grouped into steps of G.
//!
//! `pack` and `bucket` run one kind per micro-step; the next kind is the one whose next
//! sample comes first in the shuffled order, so kinds interleave in proportion and a kind's
//! leftovers simply wait for a later micro-step. A kind's last micro-step of the epoch gives
//! ranks it cannot fill zero-loss copies of real samples. The epoch's last step may hold fewer
//! than G micro-steps (the loss divisor is per step, so nothing needs padding).
use super::error::PlanError;
use super::planner::{Mode, Planner};
use super::stats::StatsAccumulator;
use super::types::{MicroStep, Plan, Position, Step};
use crate::MicroBatchPlan;
use tessera_shards::Kind;

impl Planner {
    /// Where an epoch starts.
    pub fn start_position(&self) -> Position {
        self.position([0, 0], 0)
    }

    /// The whole epoch.
    pub fn plan(&self) -> Plan {
        self.run([0, 0], 0)
    }

    /// The rest of the epoch from `position` (from `Plan::resume_position`, possibly made by
    /// a planner with another world size: the samples consumed are the same for any W).
    pub fn plan_from(&self, position: &Position) -> Result<Plan, PlanError> {
        if position.epoch != self.epoch {
            return Err(PlanError::EpochMismatch {
                expected: self.epoch,
                found: position.epoch,
            });
        }
        if position.order_key != self.order.key {
            return Err(PlanError::OrderMismatch {
                expected: self.order.key.clone(),
                found: position.order_key.clone(),
            });
        }
        let mut cursor = [0usize; 2];
        for kind in [Kind::Text, Kind::Image] {
            let consumed = position.consumed(kind);
            let available = self.order.stream_len(kind) as u64;
            if consumed > available {
                return Err(PlanError::PositionOutOfRange {
                    kind,
                    consumed,
                    available,
                });
            }
            cursor[kind as usize] = consumed as usize;
        }
        if self.mode == Mode::Fixed && !self.is_global_prefix(cursor) {
            return Err(PlanError::NotAPrefix);
        }
        Ok(self.run(cursor, position.step))
    }

    fn position(&self, cursor: [usize; 2], step: u64) -> Position {
        Position {
            epoch: self.epoch,
            order_key: self.order.key.clone(),
            step,
            consumed_text: cursor[Kind::Text as usize] as u64,
            consumed_image: cursor[Kind::Image as usize] as u64,
        }
    }

    fn run(&self, mut cursor: [usize; 2], first_step: u64) -> Plan {
        let mut steps = Vec::new();
        let mut stats = StatsAccumulator::default();
        let mut index = first_step;
        loop {
            let start = self.position(cursor, index);
            let mut micro_steps = Vec::with_capacity(self.micro_steps);
            let mut supervised_tokens = 0u64;
            while micro_steps.len() < self.micro_steps {
                let Some(micro_step) = self.next_micro_step(&mut cursor) else {
                    break;
                };
                // The per-item vectors (lengths, costs, supervised tokens) are indexed by
                // planning item, which for a mixture's draw is not the sample index.
                stats.add(self, &micro_step);
                supervised_tokens += self.supervised_tokens(&micro_step);
                micro_steps.push(self.with_sample_indices(micro_step));
            }
            if micro_steps.is_empty() {
                break;
            }
            steps.push(Step {
                index,
                start,
                micro_steps,
                supervised_tokens,
            });
            index += 1;
        }
        Plan {
            epoch: self.epoch,
            world_size: self.world_size,
            steps,
            end: self.position(cursor, index),
            stats: stats.finish(self.token_budget),
        }
    }

    /// `micro_step` (rows of planning items) with each item replaced by its sample index.
    fn with_sample_indices(&self, micro_step: MicroStep) -> MicroStep {
        if self.drawn.is_none() {
            return micro_step;
        }
        let ranks = micro_step
            .ranks
            .into_iter()
            .map(|mb| MicroBatchPlan {
                rows: mb
                    .rows
                    .iter()
                    .map(|row| row.iter().map(|&i| self.sample_of(i as u32)).collect())
                    .collect(),
                ..mb
            })
            .collect();
        MicroStep { ranks }
    }

    /// The next micro-step (rows of planning items), advancing `cursor`; `None` at the
    /// epoch's end.
    fn next_micro_step(&self, cursor: &mut [usize; 2]) -> Option<MicroStep> {
        let (ranks, kind) = if self.mode == Mode::Fixed {
            let pos = cursor[0] + cursor[1];
            if pos >= self.order.order.len() {
                return None;
            }
            let (ranks, taken) = self.fixed_micro_step(pos);
            for &s in &self.order.order[pos..pos + taken] {
                cursor[self.kinds[s as usize] as usize] += 1;
            }
            (ranks, None)
        } else {
            let next = |k: Kind| self.order.global_pos(k, cursor[k as usize]);
            let kind = match (next(Kind::Text), next(Kind::Image)) {
                (None, None) => return None,
                (Some(t), Some(i)) if t < i => Kind::Text,
                (Some(_), None) => Kind::Text,
                _ => Kind::Image,
            };
            let (ranks, taken) = self.kind_micro_step(kind, cursor[kind as usize]);
            cursor[kind as usize] += taken;
            (ranks, Some(kind))
        };
        let ranks = ranks
            .into_iter()
            .map(|r| MicroBatchPlan {
                // `fixed` mixes kinds: a micro-batch with any image runs the vision tower.
                kind: kind.unwrap_or_else(|| self.batch_kind(&r.rows)),
                rows: r
                    .rows
                    .iter()
                    .map(|row| row.iter().map(|&i| u64::from(i)).collect())
                    .collect(),
                zero_loss: r.zero_loss,
            })
            .collect();
        Some(MicroStep { ranks })
    }

    fn batch_kind(&self, rows: &[Vec<u32>]) -> Kind {
        let any_image = rows
            .iter()
            .flatten()
            .any(|&s| self.kinds[s as usize] == Kind::Image);
        if any_image {
            Kind::Image
        } else {
            Kind::Text
        }
    }

    fn supervised_tokens(&self, micro_step: &MicroStep) -> u64 {
        micro_step
            .ranks
            .iter()
            .filter(|mb| !mb.zero_loss)
            .flat_map(|mb| mb.rows.iter().flatten())
            .map(|&s| u64::from(self.supervised[s as usize]))
            .sum()
    }

    /// `fixed` consumes the shuffled order front to back: a valid position has consumed
    /// exactly the kinds of the first `text + image` samples.
    fn is_global_prefix(&self, cursor: [usize; 2]) -> bool {
        let pos = cursor[0] + cursor[1];
        pos <= self.order.order.len()
            && self.order.streams[Kind::Text as usize]
                .get(cursor[0])
                .is_none_or(|&p| p as usize >= pos)
            && self.order.streams[Kind::Image as usize]
                .get(cursor[1])
                .is_none_or(|&p| p as usize >= pos)
    }
}
