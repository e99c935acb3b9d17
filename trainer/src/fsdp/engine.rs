//! The FSDP engine: runs a unit chain one unit at a time over sharded flat buffers.
use super::flat_param::{FlatParams, ShardSpec};
use super::gather::Gathered;
use super::optim::{AdamWConfig, ShardedAdamW};
use super::{FsdpError, Strategy};
use crate::dist::{ProcessGroup, Work};
use crate::unit::{ParamMap, Unit};
use std::collections::HashMap;
use tch::{Device, Kind, Tensor};

/// Everything FSDP needs besides the units and the process group.
#[derive(Clone, Debug)]
pub struct FsdpConfig {
    pub strategy: Strategy,
    pub adamw: AdamWConfig,
    /// Global grad-norm clipping threshold; None disables clipping (the norm is still reported).
    pub max_grad_norm: Option<f64>,
    /// Dtype of the flat buffers (master weights, gradients, optimizer state).
    pub kind: Kind,
    pub device: Device,
    /// Issue the next unit's all-gather before computing the current unit.
    pub prefetch: bool,
    /// Before each micro-step, one tiny all-gather checks that all ranks run the same units, so
    /// a misaligned schedule fails at once naming the unit. Without it gloo pairs the ranks'
    /// next all-gathers regardless of unit: equal sizes would silently mix buffers, different
    /// sizes abort the process inside gloo ("Received data size doesn't match expected size"),
    /// and a rank waiting on a peer that runs something else times out.
    pub check_schedule: bool,
}

impl Default for FsdpConfig {
    fn default() -> Self {
        FsdpConfig {
            strategy: Strategy::FullShard,
            adamw: AdamWConfig::default(),
            max_grad_norm: Some(1.0),
            kind: Kind::Float,
            device: Device::Cpu,
            prefetch: true,
            check_schedule: true,
        }
    }
}

/// Bytes this rank holds at rest (outside the windows in which a unit is gathered).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryReport {
    pub param_bytes: u64,
    pub trainable_param_bytes: u64,
    pub grad_bytes: u64,
    pub optimizer_bytes: u64,
}

/// What one optimizer step did, over all ranks.
#[derive(Clone, Copy, Debug, Default)]
pub struct StepStats {
    /// Sum of token losses over all ranks and micro-steps.
    pub loss_sum: f64,
    /// `loss_sum` times the loss scale (1 / supervised tokens of the step).
    pub loss: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    pub clipped: bool,
    /// Bytes this rank sent through collectives during the step (ring cost model).
    pub bytes_sent: u64,
    /// Most bytes of gathered buffers this rank held at once during the step.
    pub peak_gathered_bytes: u64,
}

struct PendingGrad {
    buffer: usize,
    out: Tensor,
    work: Work,
}

/// FSDP over a unit chain on one rank.
pub struct Fsdp<'a, C> {
    pub(super) units: &'a [Box<dyn Unit<C>>],
    pub(super) pg: &'a ProcessGroup,
    pub(super) config: FsdpConfig,
    pub(super) flat: FlatParams,
    pub(super) grads: Vec<Option<Tensor>>,
    pub(super) optim: ShardedAdamW,
    pub(super) gathered: Gathered,
    pub(super) loss_sum: f64,
    pub(super) loss_scale: f64,
    pub(super) bytes_mark: u64,
}

impl<'a, C> Fsdp<'a, C> {
    /// Shards `init` (full parameters by name) over the group's ranks.
    pub fn new(
        units: &'a [Box<dyn Unit<C>>],
        pg: &'a ProcessGroup,
        init: &ParamMap,
        config: FsdpConfig,
    ) -> Result<Self, FsdpError> {
        let spec = ShardSpec {
            rank: pg.rank(),
            world_size: pg.world_size(),
            sharded: config.strategy != Strategy::NoShard,
            kind: config.kind,
            device: config.device,
        };
        let flat = FlatParams::new(units, init, spec)?;
        let grads = flat
            .buffers
            .iter()
            .map(|b| b.trainable.then(|| b.shard.zeros_like()))
            .collect();
        let optim = ShardedAdamW::new(config.adamw.clone(), &flat.buffers);
        let bytes_mark = pg.bytes_sent();
        Ok(Fsdp {
            units,
            pg,
            config,
            flat,
            grads,
            optim,
            gathered: Gathered::default(),
            loss_sum: 0.0,
            loss_scale: 1.0,
            bytes_mark,
        })
    }

    pub fn flat(&self) -> &FlatParams {
        &self.flat
    }

    pub(super) fn sharded(&self) -> bool {
        self.config.strategy != Strategy::NoShard
    }

    fn torch_err(&self, unit: usize) -> impl Fn(tch::TchError) -> FsdpError + '_ {
        move |source| FsdpError::Torch {
            rank: self.pg.rank(),
            unit: self.units[unit].name().to_string(),
            source,
        }
    }

    /// Forward and backward of one micro-batch; gradients accumulate into the shards. `input` is
    /// the first unit's input; `loss_scale` multiplies the chain's scalar output (the summed token
    /// loss) before back-propagation: 1 / supervised tokens of the whole step over all ranks.
    /// Returns this rank's loss sum for the micro-batch.
    pub fn forward_backward(
        &mut self,
        ctx: &C,
        input: &Tensor,
        loss_scale: f64,
    ) -> Result<f64, FsdpError> {
        self.loss_scale = loss_scale;
        let running: Vec<usize> = (0..self.units.len())
            .filter(|&i| self.units[i].runs_on(ctx))
            .collect();
        if self.config.check_schedule && self.pg.world_size() > 1 {
            self.check_alignment(&running)?;
        }
        let Some(&last) = running.last() else {
            return Ok(0.0);
        };
        let trains = |i: usize| {
            self.flat.unit_buffers[i]
                .iter()
                .any(|&b| self.flat.buffers[b].trainable)
        };
        let backward_units: Vec<usize> = match running.iter().position(|&i| trains(i)) {
            Some(p) => running[p..].to_vec(),
            None => Vec::new(),
        };
        let mut schedule: Vec<(bool, usize)> = running.iter().map(|&i| (false, i)).collect();
        schedule.extend(backward_units.iter().rev().map(|&i| (true, i)));
        let sharded = self.sharded();
        let mut saved: HashMap<usize, Tensor> = HashMap::new();
        let mut x = input.shallow_clone();
        let mut upstream: Option<Tensor> = None;
        let mut pending: Vec<PendingGrad> = Vec::new();
        let mut loss = 0.0;
        for p in 0..schedule.len() {
            let (backward, u) = schedule[p];
            let name = self.units[u].name();
            self.gathered.ready(&self.flat, u, name, self.pg, sharded)?;
            if self.config.prefetch {
                if let Some(&(_, next)) = schedule.get(p + 1) {
                    self.gathered.issue(
                        &self.flat,
                        next,
                        self.units[next].name(),
                        self.pg,
                        sharded,
                    )?;
                }
            }
            let issued_before = pending.len();
            if !backward {
                if backward_units.contains(&u) {
                    saved.insert(u, x.shallow_clone());
                }
                let params = self.flat.param_map(u, &self.gathered.full);
                x = tch::no_grad(|| self.units[u].forward(&params, &x, ctx));
                if u == last {
                    loss = self.scalar(u, &x)?;
                }
            } else {
                let input = saved.remove(&u).unwrap_or_else(|| x.shallow_clone());
                let first = backward_units.first() == Some(&u);
                upstream =
                    self.backward_unit(u, ctx, &input, upstream.take(), !first, &mut pending)?;
            }
            let done: Vec<PendingGrad> = pending.drain(..issued_before).collect();
            self.finish(done)?;
            let keep: Vec<usize> = match self.config.strategy {
                Strategy::FullShard => schedule
                    .get(p + 1)
                    .map(|&(_, n)| self.flat.unit_buffers[n].clone())
                    .unwrap_or_default(),
                _ => schedule[p + 1..]
                    .iter()
                    .flat_map(|&(_, n)| self.flat.unit_buffers[n].clone())
                    .collect(),
            };
            self.gathered.release(&self.flat, u, &keep, sharded);
        }
        self.finish(pending)?;
        self.loss_sum += loss;
        Ok(loss)
    }

    fn scalar(&self, unit: usize, y: &Tensor) -> Result<f64, FsdpError> {
        if y.numel() != 1 {
            return Err(FsdpError::NotScalarLoss {
                rank: self.pg.rank(),
                unit: self.units[unit].name().to_string(),
                shape: y.size(),
            });
        }
        y.reshape([-1])
            .f_double_value(&[0])
            .map_err(self.torch_err(unit))
    }

    /// Recomputes unit `u` from its saved input with gradients on, back-propagates `upstream`
    /// (or the loss scale for the last unit) and issues the reduction of its parameter grads.
    /// Returns the gradient of the unit's input when the previous unit needs it.
    fn backward_unit(
        &self,
        u: usize,
        ctx: &C,
        input: &Tensor,
        upstream: Option<Tensor>,
        need_input_grad: bool,
        pending: &mut Vec<PendingGrad>,
    ) -> Result<Option<Tensor>, FsdpError> {
        let name = self.units[u].name();
        let mut leaves: Vec<(usize, Tensor)> = Vec::new();
        let mut params = ParamMap::new();
        for &b in &self.flat.unit_buffers[u] {
            let full = self
                .gathered
                .full
                .get(&b)
                .ok_or_else(|| FsdpError::Layout {
                    name: self.flat.buffers[b].key(),
                    message: format!("buffer is not gathered for the backward of unit '{name}'"),
                })?;
            if self.flat.buffers[b].trainable {
                let leaf = full.detach().set_requires_grad(true);
                params.extend(self.flat.buffers[b].views(&leaf));
                leaves.push((b, leaf));
            } else {
                params.extend(self.flat.buffers[b].views(full));
            }
        }
        let x = input.detach().set_requires_grad(need_input_grad);
        let y = self.units[u].forward(&params, &x, ctx);
        let root = match &upstream {
            None => {
                self.scalar(u, &y)?;
                y.sum(y.kind()) * self.loss_scale
            }
            Some(g) => (&y * g).sum(y.kind()),
        };
        let mut inputs: Vec<&Tensor> = Vec::new();
        if need_input_grad {
            inputs.push(&x);
        }
        inputs.extend(leaves.iter().map(|(_, t)| t));
        let mut grads =
            Tensor::f_run_backward(&[root], &inputs, false, false).map_err(self.torch_err(u))?;
        let input_grad = if need_input_grad {
            Some(grads.remove(0))
        } else {
            None
        };
        for ((b, leaf), grad) in leaves.iter().zip(grads) {
            let grad = if grad.defined() {
                grad
            } else {
                leaf.zeros_like()
            };
            let buffer = &self.flat.buffers[*b];
            let (out, work) = if self.sharded() {
                let mut out = Tensor::empty([buffer.shard_len], (grad.kind(), grad.device()));
                let work = self.pg.reduce_scatter_into(&mut out, &grad, name)?;
                (out, work)
            } else {
                let mut out = grad;
                let work = self.pg.all_reduce_sum(&mut out, name)?;
                (out, work)
            };
            pending.push(PendingGrad {
                buffer: *b,
                out,
                work,
            });
        }
        Ok(input_grad.filter(|g| g.defined()))
    }

    /// Waits for gradient reductions and adds them to the shards' gradients.
    fn finish(&mut self, done: Vec<PendingGrad>) -> Result<(), FsdpError> {
        for p in done {
            p.work.wait()?;
            if let Some(g) = &mut self.grads[p.buffer] {
                tch::no_grad(|| {
                    let _ = g.g_add_(&p.out);
                });
            }
        }
        Ok(())
    }

    /// One all-gather of every rank's run flags; the first unit the ranks disagree on fails.
    fn check_alignment(&self, running: &[usize]) -> Result<(), FsdpError> {
        let n = self.units.len() as i64;
        let w = self.pg.world_size();
        let flags: Vec<i64> = (0..self.units.len())
            .map(|i| i64::from(running.contains(&i)))
            .collect();
        let mine = Tensor::from_slice(&flags);
        let mut all = Tensor::zeros([n * w as i64], (Kind::Int64, Device::Cpu));
        self.pg
            .all_gather_into(&mut all, &mine, "schedule check")?
            .wait()?;
        let all = Vec::<i64>::try_from(&all).map_err(self.torch_err(0))?;
        for (i, unit) in self.units.iter().enumerate() {
            let runs: Vec<usize> = (0..w)
                .filter(|r| all[r * self.units.len() + i] != 0)
                .collect();
            if !runs.is_empty() && runs.len() < w {
                return Err(FsdpError::Misaligned {
                    rank: self.pg.rank(),
                    unit: unit.name().to_string(),
                    skipping: (0..w).filter(|r| !runs.contains(r)).collect(),
                    running: runs,
                });
            }
        }
        Ok(())
    }

    /// Ends the step: one all-reduce of (squared grad norm, loss sum), clipping, AdamW with the
    /// configured learning rates times `lr_factor`, and zeroed gradients.
    pub fn step(&mut self, lr_factor: f64) -> Result<StepStats, FsdpError> {
        let counts_norm = self.sharded() || self.pg.rank() == 0;
        let mut sq = 0.0;
        if counts_norm {
            for g in self.grads.iter().flatten() {
                sq += g
                    .to_kind(Kind::Double)
                    .square()
                    .sum(Kind::Double)
                    .double_value(&[]);
            }
        }
        let mut totals = Tensor::from_slice(&[sq, self.loss_sum]);
        self.pg.all_reduce_sum(&mut totals, "step")?.wait()?;
        let totals = Vec::<f64>::try_from(&totals).map_err(self.torch_err(0))?;
        let grad_norm = totals[0].sqrt();
        let mut clipped = false;
        if let Some(max) = self.config.max_grad_norm {
            if grad_norm > max {
                let coef = max / (grad_norm + 1e-6);
                tch::no_grad(|| {
                    for g in self.grads.iter_mut().flatten() {
                        let _ = g.g_mul_scalar_(coef);
                    }
                });
                clipped = true;
            }
        }
        self.optim
            .update(&self.flat.buffers, &self.grads, lr_factor);
        tch::no_grad(|| {
            for g in self.grads.iter_mut().flatten() {
                let _ = g.zero_();
            }
        });
        let sent = self.pg.bytes_sent();
        let stats = StepStats {
            loss_sum: totals[1],
            loss: totals[1] * self.loss_scale,
            grad_norm,
            clipped,
            bytes_sent: sent - self.bytes_mark,
            peak_gathered_bytes: self.gathered.peak_bytes,
        };
        self.bytes_mark = sent;
        self.gathered.peak_bytes = self.gathered.bytes;
        self.loss_sum = 0.0;
        Ok(stats)
    }
}
