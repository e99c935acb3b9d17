//! The FSDP engine: runs a unit chain one unit at a time over sharded flat buffers.
use super::flat_param::{FlatParams, ShardSpec};
use super::gather::{BufferGroups, Gathered};
use super::optim::{AdamWConfig, ShardedAdamW};
use super::{FsdpError, Recompute, Strategy};
use crate::dist::{ProcessGroup, Work};
use crate::unit::{ChainLoss, ComputeError, ParamMap, ParamSource, Unit};
use std::collections::{BTreeMap, HashMap};
use std::time::Instant;
use tch::{Device, Kind, Tensor};

/// Everything FSDP needs besides the units and the process group.
#[derive(Clone, Debug)]
pub struct FsdpConfig {
    pub strategy: Strategy,
    pub adamw: AdamWConfig,
    /// Global grad-norm clipping threshold; None disables clipping (the norm is still reported).
    pub max_grad_norm: Option<f64>,
    /// Dtype of the trainable shards (master weights), their gradients and optimizer state.
    pub kind: Kind,
    /// Dtype of gathered parameters and of the compute (PyTorch FSDP's `param_dtype`); frozen
    /// shards are stored in it. `BFloat16` with `kind` f32 is mixed precision.
    pub compute_kind: Kind,
    /// Dtype gradients are reduced in across ranks (FSDP's `reduce_dtype`): the compute's
    /// gradients are cast to it before the reduce-scatter, and added into the `kind` shards.
    pub reduce_kind: Kind,
    pub device: Device,
    /// Issue the next unit's all-gather before computing the current unit.
    pub prefetch: bool,
    /// Before each micro-step, one tiny all-gather checks that all ranks run the same units, so
    /// a misaligned schedule fails at once naming the unit. Without it gloo pairs the ranks'
    /// next all-gathers regardless of unit: equal sizes would silently mix buffers, different
    /// sizes abort the process inside gloo ("Received data size doesn't match expected size"),
    /// and a rank waiting on a peer that runs something else times out.
    pub check_schedule: bool,
    /// `All`: backward re-gathers and recomputes each unit from its saved input (activation
    /// checkpointing). `None`: the forward keeps each trained unit's autograd graph and the
    /// backward runs through it (faster, activations held until backward). `Every(K)`: every
    /// K-th unit backward runs through recomputes, the others keep their graphs.
    pub recompute: Recompute,
}

impl Default for FsdpConfig {
    fn default() -> Self {
        FsdpConfig {
            strategy: Strategy::FullShard,
            adamw: AdamWConfig::default(),
            max_grad_norm: Some(1.0),
            kind: Kind::Float,
            compute_kind: Kind::Float,
            reduce_kind: Kind::Float,
            device: Device::Cpu,
            prefetch: true,
            check_schedule: true,
            recompute: Recompute::All,
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
    /// The part of `bytes_sent` that went to other machines' ranks under a hybrid strategy
    /// (the cross-node all-reduce of shard gradients); 0 otherwise.
    pub bytes_sent_across: u64,
    /// Most bytes of gathered buffers this rank held at once during the step.
    pub peak_gathered_bytes: u64,
}

struct PendingGrad {
    buffer: usize,
    out: Tensor,
    /// None at W=1: the gradient is already the whole reduction.
    work: Option<Work>,
}

/// A unit's forward with autograd on: the input leaf, the trainable parameter leaves (by
/// buffer) and the output, ready for backward.
struct Graph {
    input: Tensor,
    leaves: Vec<(usize, Tensor)>,
    output: Tensor,
}

/// One pass of one unit in a micro-batch's schedule: every running unit forward in chain
/// order, then the units from the first trained one on backward in reverse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pass {
    Forward(usize),
    Backward(usize),
}

impl Pass {
    fn unit(self) -> usize {
        match self {
            Pass::Forward(u) | Pass::Backward(u) => u,
        }
    }
}

/// A micro-batch's passes, and which units train and recompute.
struct Plan {
    /// Every running unit forward in chain order, then the backward units in reverse.
    schedule: Vec<Pass>,
    /// The running units from the first trained one on.
    backward_units: Vec<usize>,
    /// The backward units that recompute their forward in backward.
    recomputed: Vec<usize>,
    /// The last running unit, whose output is the loss.
    last: usize,
}

impl Plan {
    /// Whether `pass` reads gathered parameters. Without recompute a backward pass runs through
    /// the graph its forward kept, which holds the parameters it read: nothing to gather.
    fn needs_params(&self, pass: Pass) -> bool {
        match pass {
            Pass::Forward(_) => true,
            Pass::Backward(u) => self.recomputed.contains(&u),
        }
    }
}

/// What one micro-batch carries from pass to pass.
struct MicroStep {
    /// The inputs of the units that recompute, saved by their forward.
    saved: HashMap<usize, Tensor>,
    /// The graphs kept by the forwards of the units that do not.
    kept: HashMap<usize, Graph>,
    /// The last forward's output.
    x: Tensor,
    /// The gradient of the last backward's input.
    upstream: Option<Tensor>,
    /// Gradient reductions issued and not yet finished.
    pending: Vec<PendingGrad>,
    /// The last unit's output read as the loss and its parts.
    loss: ChainLoss,
}

impl MicroStep {
    fn new(input: &Tensor) -> Self {
        MicroStep {
            saved: HashMap::new(),
            kept: HashMap::new(),
            x: input.shallow_clone(),
            upstream: None,
            pending: Vec::new(),
            loss: ChainLoss::default(),
        }
    }
}

/// FSDP over a unit chain on one rank.
pub struct Fsdp<'a, C> {
    pub(super) units: &'a [Box<dyn Unit<C>>],
    /// The group parameters are sharded over: the whole job, or (hybrid) this rank's node.
    pub(super) pg: &'a ProcessGroup,
    /// Every rank of the job: schedule checks and the step's totals.
    pub(super) world: &'a ProcessGroup,
    /// Hybrid strategies: this rank and its counterparts (same local rank) on the other nodes.
    pub(super) replicas: Option<&'a ProcessGroup>,
    /// Expert parallelism: the ranks that hold the same experts as this one, which expert
    /// buffers are sharded over (see [`crate::ParamSpec::expert`]).
    pub(super) experts: Option<&'a ProcessGroup>,
    /// The job ranks of `experts`, in its rank order (where a checkpoint finds their shards).
    pub(super) expert_ranks: Vec<usize>,
    pub(super) across_mark: u64,
    pub(super) config: FsdpConfig,
    pub(super) flat: FlatParams,
    pub(super) grads: Vec<Option<Tensor>>,
    pub(super) optim: ShardedAdamW,
    pub(super) gathered: Gathered,
    pub(super) loss_sum: f64,
    pub(super) loss_scale: f64,
    pub(super) bytes_mark: u64,
    /// Seconds per component since the last `take_times` (see [`Unit::component`]), plus
    /// "gather_wait" and "reduce_wait".
    pub(super) times: BTreeMap<String, f64>,
}

impl<'a, C> Fsdp<'a, C> {
    /// Shards the parameters over the group's ranks; this rank reads from `init` only the slices
    /// its shards keep.
    pub fn new(
        units: &'a [Box<dyn Unit<C>>],
        pg: &'a ProcessGroup,
        init: &dyn ParamSource,
        config: FsdpConfig,
    ) -> Result<Self, FsdpError> {
        Self::build(units, pg, pg, None, None, init, config)
    }

    /// Expert parallelism: every parameter sharded over `world` (FULL_SHARD, SHARD_GRAD_OP) or
    /// replicated on it (NO_SHARD) as [`Fsdp::new`] does, except the experts' (units list
    /// only their own experts, each with [`crate::ParamSpec::expert`] set): those are
    /// sharded, or replicated, over `experts`, the ranks that hold the same experts (torchtitan's
    /// layout: expert weights sharded over the data-parallel ranks of one expert slice, their
    /// gradients reduced over those ranks only). `expert_ranks` are the job ranks of
    /// `experts` in its rank order. Hybrid strategies are refused.
    pub fn new_expert_parallel(
        units: &'a [Box<dyn Unit<C>>],
        world: &'a ProcessGroup,
        experts: &'a ProcessGroup,
        expert_ranks: &[usize],
        init: &dyn ParamSource,
        config: FsdpConfig,
    ) -> Result<Self, FsdpError> {
        if expert_ranks.len() != experts.world_size()
            || expert_ranks.get(experts.rank()) != Some(&world.rank())
        {
            return Err(FsdpError::Layout {
                name: "expert ranks".into(),
                message: format!(
                    "{expert_ranks:?} do not describe a group of {} ranks in which job rank {} \
                     is rank {}",
                    experts.world_size(),
                    world.rank(),
                    experts.rank()
                ),
            });
        }
        if config.strategy.is_hybrid() {
            return Err(FsdpError::Layout {
                name: format!("{:?}", config.strategy),
                message: "expert parallelism runs with FULL_SHARD, SHARD_GRAD_OP or NO_SHARD; \
                          hybrid strategies with experts are not implemented"
                    .into(),
            });
        }
        let mut fsdp = Self::build(units, world, world, None, Some(experts), init, config)?;
        fsdp.expert_ranks = expert_ranks.to_vec();
        Ok(fsdp)
    }

    /// HYBRID_SHARD: parameters and training state sharded over `node` (this machine's ranks),
    /// replicated over `replicas` (the ranks of the other machines with this local rank);
    /// `world` is every rank. Any strategy runs this way; hybrid ones are meant for it.
    pub fn new_hybrid(
        units: &'a [Box<dyn Unit<C>>],
        world: &'a ProcessGroup,
        node: &'a ProcessGroup,
        replicas: &'a ProcessGroup,
        init: &dyn ParamSource,
        config: FsdpConfig,
    ) -> Result<Self, FsdpError> {
        Self::build(units, world, node, Some(replicas), None, init, config)
    }

    fn build(
        units: &'a [Box<dyn Unit<C>>],
        world: &'a ProcessGroup,
        pg: &'a ProcessGroup,
        replicas: Option<&'a ProcessGroup>,
        experts: Option<&'a ProcessGroup>,
        init: &dyn ParamSource,
        config: FsdpConfig,
    ) -> Result<Self, FsdpError> {
        let spec = ShardSpec {
            rank: pg.rank(),
            world_size: pg.world_size(),
            expert_rank: experts.map_or(0, ProcessGroup::rank),
            expert_world_size: experts.map_or(1, ProcessGroup::world_size),
            sharded: config.strategy != Strategy::NoShard,
            kind: config.kind,
            compute_kind: config.compute_kind,
            device: config.device,
        };
        let flat = FlatParams::new(units, init, spec)?;
        let grads = flat
            .buffers
            .iter()
            .map(|b| b.trainable.then(|| b.shard.zeros_like()))
            .collect();
        let optim = ShardedAdamW::new(config.adamw.clone(), &flat.buffers);
        let bytes_mark = Self::sent(world, pg, replicas);
        Ok(Fsdp {
            units,
            pg,
            world,
            replicas,
            experts,
            expert_ranks: Vec::new(),
            across_mark: replicas.map_or(0, ProcessGroup::bytes_sent),
            config,
            flat,
            grads,
            optim,
            gathered: Gathered::default(),
            loss_sum: 0.0,
            loss_scale: 1.0,
            bytes_mark,
            times: BTreeMap::new(),
        })
    }

    /// Bytes sent through every distinct group this rank uses.
    fn sent(world: &ProcessGroup, pg: &ProcessGroup, replicas: Option<&ProcessGroup>) -> u64 {
        let own = if std::ptr::eq(world, pg) {
            0
        } else {
            pg.bytes_sent()
        };
        world.bytes_sent() + own + replicas.map_or(0, ProcessGroup::bytes_sent)
    }

    /// The run's recompute policy.
    pub fn recompute(&self) -> Recompute {
        self.config.recompute
    }

    /// Changes the recompute policy for the micro-batches to come (between steps).
    pub fn set_recompute(&mut self, policy: Recompute) {
        self.config.recompute = policy;
    }

    /// How many flat buffers this rank holds (one per unit and dtype/trainability class).
    pub fn buffer_count(&self) -> usize {
        self.flat.buffers.len()
    }

    /// Whether buffers are split over ranks. At W=1 every strategy holds whole buffers, so
    /// nothing is gathered or copied: units read the shards themselves.
    pub(super) fn sharded(&self) -> bool {
        self.config.strategy != Strategy::NoShard && self.pg.world_size() > 1
    }

    /// The groups buffers are sharded over (the expert-replica group for expert buffers).
    pub(super) fn groups(&self) -> BufferGroups<'a> {
        BufferGroups {
            dense: self.pg,
            experts: self.experts,
            shard: self.config.strategy != Strategy::NoShard,
        }
    }

    /// Seconds per component since the last call (forward + backward, recompute included),
    /// then starts again from zero.
    pub fn take_times(&mut self) -> BTreeMap<String, f64> {
        std::mem::take(&mut self.times)
    }

    fn book(&mut self, key: &str, since: Instant) {
        *self.times.entry(key.to_string()).or_default() += since.elapsed().as_secs_f64();
    }

    fn compute_err<E: Into<ComputeError>>(&self, unit: usize) -> impl Fn(E) -> FsdpError + '_ {
        move |source| FsdpError::Compute {
            rank: self.world.rank(),
            unit: self.units[unit].name().to_string(),
            source: source.into(),
        }
    }

    /// Unit `u`'s forward on `input`; a failure names the unit and this rank.
    pub(super) fn run_unit(
        &self,
        u: usize,
        params: &ParamMap,
        input: &Tensor,
        ctx: &C,
    ) -> Result<Tensor, FsdpError> {
        self.units[u]
            .forward(params, input, ctx)
            .map_err(self.compute_err(u))
    }

    /// Forward and backward of one micro-batch; gradients accumulate into the shards. `input` is
    /// the first unit's input; `loss_scale` multiplies the chain's scalar output (the summed token
    /// loss) before back-propagation: 1 / supervised tokens of the whole step over all ranks.
    /// Returns this rank's loss sum for the micro-batch, and the parts of it the model reports.
    pub fn forward_backward(
        &mut self,
        ctx: &C,
        input: &Tensor,
        loss_scale: f64,
    ) -> Result<ChainLoss, FsdpError> {
        self.loss_scale = loss_scale;
        let running = self.running_units(ctx)?;
        let Some(plan) = self.plan(&running) else {
            return Ok(ChainLoss::default());
        };
        let mut state = MicroStep::new(input);
        for p in 0..plan.schedule.len() {
            let pass = plan.schedule[p];
            let u = pass.unit();
            self.gather_for(&plan, p)?;
            let t = Instant::now();
            let issued_before = state.pending.len();
            match pass {
                Pass::Forward(_) => self.forward_pass(&plan, u, ctx, &mut state)?,
                Pass::Backward(_) => self.backward_pass(&plan, u, ctx, &mut state)?,
            }
            self.book(self.units[u].component(), t);
            let t = Instant::now();
            let done: Vec<PendingGrad> = state.pending.drain(..issued_before).collect();
            self.finish(done)?;
            self.release_after(&plan, p);
            self.book("reduce_wait", t);
        }
        let t = Instant::now();
        self.finish(state.pending)?;
        self.book("reduce_wait", t);
        self.loss_sum += state.loss.sum;
        Ok(state.loss)
    }

    /// The passes of a micro-batch over the `running` units; `None` when no unit runs.
    fn plan(&self, running: &[usize]) -> Option<Plan> {
        let &last = running.last()?;
        let trains = |i: usize| {
            self.flat.unit_buffers[i]
                .iter()
                .any(|&b| self.flat.buffers[b].trainable)
        };
        let backward_units: Vec<usize> = match running.iter().position(|&i| trains(i)) {
            Some(p) => running[p..].to_vec(),
            None => Vec::new(),
        };
        let mut schedule: Vec<Pass> = running.iter().map(|&i| Pass::Forward(i)).collect();
        schedule.extend(backward_units.iter().rev().map(|&i| Pass::Backward(i)));
        // Which of the backward units recompute (`every:K`: every K-th of them).
        let policy = self.config.recompute;
        let recomputed: Vec<usize> = backward_units
            .iter()
            .enumerate()
            .filter(|&(i, _)| policy.recomputes(i))
            .map(|(_, &u)| u)
            .collect();
        Some(Plan {
            schedule,
            backward_units,
            recomputed,
            last,
        })
    }

    /// Waits for the parameters pass `p` reads and, with prefetch, issues the all-gather of the
    /// next pass's.
    fn gather_for(&mut self, plan: &Plan, p: usize) -> Result<(), FsdpError> {
        let groups = self.groups();
        let t = Instant::now();
        let u = plan.schedule[p].unit();
        if plan.needs_params(plan.schedule[p]) {
            self.gathered
                .ready(&self.flat, u, self.units[u].name(), groups)?;
        }
        if self.config.prefetch {
            if let Some(&next) = plan.schedule.get(p + 1).filter(|&&s| plan.needs_params(s)) {
                let next = next.unit();
                self.gathered
                    .issue(&self.flat, next, self.units[next].name(), groups)?;
            }
        }
        self.book("gather_wait", t);
        Ok(())
    }

    /// Unit `u` forward: without autograd where it trains nothing or recomputes in backward
    /// (then its input is saved), else keeping its graph for the backward; the last unit's
    /// output is the loss.
    fn forward_pass(
        &self,
        plan: &Plan,
        u: usize,
        ctx: &C,
        state: &mut MicroStep,
    ) -> Result<(), FsdpError> {
        let recomputes = plan.recomputed.contains(&u);
        if plan.backward_units.contains(&u) && !recomputes {
            let first_trained = plan.backward_units.first() == Some(&u);
            let graph = self.graph(u, ctx, &state.x, !first_trained)?;
            state.x = graph.output.detach();
            state.kept.insert(u, graph);
        } else {
            if recomputes {
                state.saved.insert(u, state.x.shallow_clone());
            }
            let params = self.flat.param_map(u, &self.gathered.full);
            state.x = tch::no_grad(|| self.run_unit(u, &params, &state.x, ctx))?;
        }
        if u == plan.last {
            state.loss = self.chain_loss(u, &state.x)?;
        }
        Ok(())
    }

    /// Unit `u` backward: through the graph its forward kept, or one recomputed from its saved
    /// input; the upstream gradient becomes its input's.
    fn backward_pass(
        &self,
        plan: &Plan,
        u: usize,
        ctx: &C,
        state: &mut MicroStep,
    ) -> Result<(), FsdpError> {
        let graph = match state.kept.remove(&u) {
            Some(graph) => graph,
            None => {
                let input = state
                    .saved
                    .remove(&u)
                    .unwrap_or_else(|| state.x.shallow_clone());
                let first = plan.backward_units.first() == Some(&u);
                self.graph(u, ctx, &input, !first)?
            }
        };
        let upstream = state.upstream.take();
        state.upstream = self.backward_unit(u, ctx, graph, upstream, &mut state.pending)?;
        Ok(())
    }

    /// Frees the parameters of pass `p`'s unit, keeping the buffers the passes after it still
    /// read: the next one's under strategies that free after use, all of them otherwise.
    fn release_after(&mut self, plan: &Plan, p: usize) {
        let next = &plan.schedule[p + 1..];
        let next = match self.config.strategy {
            strategy if strategy.frees_after_use() => &next[..next.len().min(1)],
            _ => next,
        };
        let keep: Vec<usize> = next
            .iter()
            .filter(|&&s| plan.needs_params(s))
            .flat_map(|s| self.flat.unit_buffers[s.unit()].clone())
            .collect();
        let (u, groups) = (plan.schedule[p].unit(), self.groups());
        self.gathered.release(&self.flat, u, &keep, groups);
    }

    /// The units that run on `ctx`, in chain order; with several ranks (and the check on),
    /// first checked to be the same on every rank.
    pub(super) fn running_units(&self, ctx: &C) -> Result<Vec<usize>, FsdpError> {
        let running: Vec<usize> = (0..self.units.len())
            .filter(|&i| self.units[i].runs_on(ctx))
            .collect();
        if self.config.check_schedule && self.world.world_size() > 1 {
            self.check_alignment(&running)?;
        }
        Ok(running)
    }

    /// The last unit's output `y` read as the chain's loss (see [`Unit::forward`]): a scalar,
    /// or a vector of the loss and its parts.
    pub(super) fn chain_loss(&self, unit: usize, y: &Tensor) -> Result<ChainLoss, FsdpError> {
        let not_a_loss = || FsdpError::NotScalarLoss {
            rank: self.world.rank(),
            unit: self.units[unit].name().to_string(),
            shape: y.size(),
        };
        if y.dim() > 1 {
            return Err(not_a_loss());
        }
        let flat = y.detach().reshape([-1]).to_kind(Kind::Double);
        let values =
            Vec::<f64>::try_from(flat.to_device(Device::Cpu)).map_err(self.compute_err(unit))?;
        let (&sum, parts) = values.split_first().ok_or_else(not_a_loss)?;
        Ok(ChainLoss {
            sum,
            parts: parts.to_vec(),
        })
    }

    /// Runs unit `u` on `input` with autograd on: trainable buffers become leaves, the input a
    /// leaf that requires grad when the previous unit needs its gradient.
    fn graph(
        &self,
        u: usize,
        ctx: &C,
        input: &Tensor,
        need_input_grad: bool,
    ) -> Result<Graph, FsdpError> {
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
                    message: format!("buffer is not gathered for the graph of unit '{name}'"),
                })?;
            if self.flat.buffers[b].trainable {
                let leaf = full.detach().set_requires_grad(true);
                params.extend(self.flat.buffers[b].views(&leaf));
                leaves.push((b, leaf));
            } else {
                params.extend(self.flat.buffers[b].views(full));
            }
        }
        let input = input.detach().set_requires_grad(need_input_grad);
        let output = self.run_unit(u, &params, &input, ctx)?;
        Ok(Graph {
            input,
            leaves,
            output,
        })
    }

    /// Back-propagates `upstream` (or the loss scale for the last unit), plus the unit's side
    /// loss, through unit `u`'s graph and issues the reduction of its parameter grads. Returns the gradient of the
    /// unit's input when the previous unit needs it.
    fn backward_unit(
        &self,
        u: usize,
        ctx: &C,
        graph: Graph,
        upstream: Option<Tensor>,
        pending: &mut Vec<PendingGrad>,
    ) -> Result<Option<Tensor>, FsdpError> {
        let name = self.units[u].name();
        let Graph {
            input: x,
            leaves,
            output: y,
        } = graph;
        let need_input_grad = x.requires_grad();
        let root = match &upstream {
            None => {
                self.chain_loss(u, &y)?;
                y.reshape([-1]).get(0) * self.loss_scale
            }
            Some(g) => (&y * g).sum(y.kind()),
        };
        let root = match self.units[u].side_loss(ctx) {
            Some(side) => root.to_kind(side.kind()) + side,
            None => root,
        };
        let mut inputs: Vec<&Tensor> = Vec::new();
        if need_input_grad {
            inputs.push(&x);
        }
        inputs.extend(leaves.iter().map(|(_, t)| t));
        let mut grads =
            Tensor::f_run_backward(&[root], &inputs, false, false).map_err(self.compute_err(u))?;
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
            // No-op when the compute already runs in the reduce dtype (f32 runs).
            let grad = grad.to_kind(self.config.reduce_kind);
            let buffer = &self.flat.buffers[*b];
            let (group, split) = self.groups().of(buffer);
            let (out, work) = if split {
                let mut out = Tensor::empty([buffer.shard_len], (grad.kind(), grad.device()));
                let work = group.reduce_scatter_into(&mut out, &grad, name)?;
                (out, Some(work))
            } else if group.world_size() > 1 {
                let mut out = grad;
                let work = group.all_reduce_sum(&mut out, name)?;
                (out, Some(work))
            } else {
                (grad, None)
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
        for mut p in done {
            if let Some(work) = p.work {
                work.wait()?;
            }
            // Hybrid: the node's reduced shard gradient, summed with the other nodes'.
            if let Some(replicas) = self.replicas.filter(|r| r.world_size() > 1) {
                let unit = self.flat.buffers[p.buffer].unit_name.clone();
                replicas.all_reduce_sum(&mut p.out, &unit)?.wait()?;
            }
            if let Some(g) = &mut self.grads[p.buffer] {
                tch::no_grad(|| {
                    let _ = g.g_add_(&p.out);
                });
            }
        }
        Ok(())
    }

    /// One all-gather of every rank's run flags; the first unit the ranks disagree on fails.
    pub(super) fn check_alignment(&self, running: &[usize]) -> Result<(), FsdpError> {
        let n = self.units.len() as i64;
        let w = self.world.world_size();
        let flags: Vec<i64> = (0..self.units.len())
            .map(|i| i64::from(running.contains(&i)))
            .collect();
        let mine = Tensor::from_slice(&flags);
        let mut all = Tensor::zeros([n * w as i64], (Kind::Int64, Device::Cpu));
        self.world
            .all_gather_into(&mut all, &mine, "schedule check")?
            .wait()?;
        let all = Vec::<i64>::try_from(&all).map_err(self.compute_err(0))?;
        for (i, unit) in self.units.iter().enumerate() {
            let runs: Vec<usize> = (0..w)
                .filter(|r| all[r * self.units.len() + i] != 0)
                .collect();
            if !runs.is_empty() && runs.len() < w {
                return Err(FsdpError::Misaligned {
                    rank: self.world.rank(),
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
        // Each shard's norm counted once: by the rank that would write it to a checkpoint.
        let sq = self
            .grads
            .iter()
            .enumerate()
            .filter(|&(b, _)| self.writes_buffer(b))
            .filter_map(|(_, g)| g.as_ref())
            .map(sum_of_squares)
            .sum();
        let mut totals = Tensor::from_slice(&[sq, self.loss_sum]);
        self.world.all_reduce_sum(&mut totals, "step")?.wait()?;
        let totals = Vec::<f64>::try_from(&totals).map_err(self.compute_err(0))?;
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
            .update(&self.flat.buffers, &self.grads, lr_factor)
            .map_err(|source| FsdpError::Compute {
                rank: self.world.rank(),
                unit: "optimizer".into(),
                source: source.into(),
            })?;
        tch::no_grad(|| {
            for g in self.grads.iter_mut().flatten() {
                let _ = g.zero_();
            }
        });
        let sent = Self::sent(self.world, self.pg, self.replicas);
        let across = self.replicas.map_or(0, ProcessGroup::bytes_sent);
        let stats = StepStats {
            loss_sum: totals[1],
            loss: totals[1] * self.loss_scale,
            grad_norm,
            clipped,
            bytes_sent: sent - self.bytes_mark,
            bytes_sent_across: across - self.across_mark,
            peak_gathered_bytes: self.gathered.peak_bytes,
        };
        self.bytes_mark = sent;
        self.across_mark = across;
        self.gathered.peak_bytes = self.gathered.bytes;
        self.loss_sum = 0.0;
        Ok(stats)
    }
}

/// Elements per piece of [`sum_of_squares`]: small enough that the squared piece is a reused
/// 4 MB temporary, large enough that the per-piece overhead is nil.
const NORM_PIECE: i64 = 1 << 20;

/// Σ g² of one gradient buffer, in f64. Each 1 Mi-element piece is squared and summed in f32
/// (ATen's CPU sum is a cascade sum; bf16 pieces are widened first), the pieces added in f64:
/// 6e-10 from an f64 sum over 136 M elements (the test holds it to 1e-7). One squared copy of a whole buffer cost a full fine-tune 0.9 s a
/// step in page faults (the 545 MB embedding's), an f64 copy of every gradient 1.6 s; BLAS's
/// `dot` and ATen's `linalg_vector_norm` accumulate in plain f32, 1e-2 off over 136 M elements.
fn sum_of_squares(g: &Tensor) -> f64 {
    let n = g.numel() as i64;
    let flat = g.reshape([n]);
    let mut sum = 0.0;
    let mut start = 0;
    while start < n {
        let piece = flat.narrow(0, start, NORM_PIECE.min(n - start));
        let piece = match piece.kind() {
            Kind::Float | Kind::Double => piece,
            _ => piece.to_kind(Kind::Float),
        };
        sum += piece.square().sum(piece.kind()).double_value(&[]);
        start += NORM_PIECE;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Over several pieces (the last a partial one), f32 and bf16: within 1e-7 of an f64 sum.
    #[test]
    fn sum_of_squares_matches_an_f64_sum() {
        tch::manual_seed(3);
        // [5, 419,431]: 2 Mi + 3 elements, so three pieces, the last of 3 elements.
        let g = Tensor::randn([5, 419_431], (Kind::Float, Device::Cpu)) * 1e-3;
        for g in [g.shallow_clone(), g.to_kind(Kind::BFloat16)] {
            let want = g
                .to_kind(Kind::Double)
                .square()
                .sum(Kind::Double)
                .double_value(&[]);
            let got = sum_of_squares(&g);
            assert!(((got - want) / want).abs() < 1e-7, "{got} vs {want}");
        }
    }
}
