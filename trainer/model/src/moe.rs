//! The sparse MLP of a `qwen3_moe` decoder layer, as transformers' `Qwen3MoeSparseMoeBlock`
//! computes it: a bias-free router `mlp.gate` scores every token against each expert, softmax in
//! f32, the top `num_experts_per_tok` experts (their probabilities renormalised to sum to 1 when
//! `norm_topk_prob`), and each token's output is the routing-weighted sum of its experts'
//! SwiGLU MLPs (`mlp.experts.N.{gate,up,down}_proj`, the Hub's per-expert layout). Dropless:
//! every token reaches its k experts, there is no capacity limit.
//!
//! Expert compute: the (token, expert) pairs are sorted by expert, the hidden states gathered
//! once in that order, and each expert multiplies its contiguous run of tokens in one GEMM per
//! projection; the results are weighted and scattered back with one `index_add`. Memory grows
//! with the routed tokens (tokens × k rows), never with tokens × experts.
//!
//! Expert parallelism ([`ExpertGroup`]): the experts are split over the group's N ranks in
//! contiguous slices (rank r holds experts `[r·E/N, (r+1)·E/N)`), and a rank lists only its
//! own in its parameters. Each rank routes its own tokens, sends each (token, slot) row to the
//! rank holding its expert through one all-to-all (the per-expert row counts go first in a
//! small one), runs its experts over the rows it received from every rank, and sends the
//! results back the same way; the weighting and the scatter stay on the token's rank. Both
//! exchanges back-propagate as the reverse exchange, and every rank runs every local expert's
//! GEMMs even on zero rows, so each rank's backward reaches the same two exchanges per layer.
//!
//! The balance loss is transformers' `load_balancing_loss_func` (Switch Transformer's): over
//! every sparse layer's rows together, `E · Σ_e F_e · P_e` with `F_e` the share of top-k slots
//! that went to expert e and `P_e` its mean routing probability, padding excluded. Each layer
//! leaves its counts and probability sums in a [`RouterLog`]; `F` needs every layer's counts, so
//! the loss and its gradient are formed once the forward has run (see [`RouterLog::aux_loss`]
//! and [`RouterLog::side_loss`]).
use super::keys::{KeyPath, LinearKeys};
use super::lm_config::LmConfig;
use super::selective::CheapOps;
use super::{gemm, param};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tch::{Kind, Tensor};
use tessera_fsdp::dist::ProcessGroup;
use tessera_fsdp::{ComputeError, ParamMap, ParamSpec};

/// Expert parallelism's group: the ranks the experts of every sparse layer are split over
/// (`--expert-parallel N`: N consecutive ranks). Rank r of the group holds experts
/// `[r·E/N, (r+1)·E/N)`.
#[derive(Clone)]
pub struct ExpertGroup(pub Arc<ProcessGroup>);

impl std::fmt::Debug for ExpertGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ExpertGroup(rank {} of {})",
            self.0.rank(),
            self.0.world_size()
        )
    }
}

impl ExpertGroup {
    pub fn size(&self) -> usize {
        self.0.world_size()
    }

    /// The experts this rank holds, of `num_experts` (N divides it; `Vlm::new` checks).
    pub fn local_experts(&self, num_experts: usize) -> std::ops::Range<usize> {
        let per = num_experts / self.size();
        let first = self.0.rank() * per;
        first..first + per
    }
}

/// One expert's three projections.
struct Expert {
    gate_proj: LinearKeys,
    up_proj: LinearKeys,
    down_proj: LinearKeys,
}

/// A sparse layer's keys and shapes: `mlp.gate.weight` `[E, D]` and the experts.
pub(crate) struct SparseMlp {
    router: String,
    experts: Vec<Expert>,
    hidden_size: i64,
    top_k: i64,
    norm_topk_prob: bool,
    /// Expert parallelism: the group the experts are split over (this rank's slice only is
    /// listed and computed here).
    parallel: Option<ExpertGroup>,
}

/// The routing of one forward over `n` tokens: each token's `k` experts and their weights.
struct Routing {
    /// `[n, E]` f32 routing probabilities (softmax of the router logits).
    probs: Tensor,
    /// `[n, k]` i64 expert indices, best first.
    experts: Tensor,
    /// `[n, k]` weights in the compute dtype.
    weights: Tensor,
}

impl SparseMlp {
    pub(crate) fn new(cfg: &LmConfig, mlp: &KeyPath, parallel: Option<&ExpertGroup>) -> Self {
        let (d, ff) = (cfg.hidden_size, cfg.moe_intermediate_size());
        let experts = (0..cfg.num_experts())
            .map(|e| {
                let p = &(mlp / "experts") / e;
                Expert {
                    gate_proj: LinearKeys::new(&p / "gate_proj", ff, d, false),
                    up_proj: LinearKeys::new(&p / "up_proj", ff, d, false),
                    down_proj: LinearKeys::new(&p / "down_proj", d, ff, false),
                }
            })
            .collect();
        SparseMlp {
            router: (mlp / "gate").key("weight"),
            experts,
            hidden_size: d,
            top_k: cfg.experts_per_token(),
            norm_topk_prob: cfg.norm_topk_prob(),
            parallel: parallel.cloned(),
        }
    }

    /// The experts this rank holds: all of them, or its slice under expert parallelism.
    fn local_experts(&self) -> std::ops::Range<usize> {
        match &self.parallel {
            Some(group) => group.local_experts(self.experts.len()),
            None => 0..self.experts.len(),
        }
    }

    /// The router, then every expert's gate, up and down projection (frozen; the caller marks
    /// what trains); under expert parallelism this rank's experts only, each marked with its
    /// index so FSDP shards it over the ranks holding the same experts.
    pub(crate) fn specs(&self) -> Vec<ParamSpec> {
        let mut specs = vec![ParamSpec {
            name: self.router.clone(),
            shape: vec![self.experts.len() as i64, self.hidden_size],
            trainable: false,
            expert: None,
        }];
        for index in self.local_experts() {
            let e = &self.experts[index];
            for linear in [&e.gate_proj, &e.up_proj, &e.down_proj] {
                specs.extend(linear.specs(false).into_iter().map(|mut spec| {
                    spec.expert = self.parallel.as_ref().map(|_| index);
                    spec
                }));
            }
        }
        specs
    }

    fn route(&self, params: &ParamMap, x: &Tensor) -> Result<Routing, ComputeError> {
        let logits = gemm::linear(x, param(params, &self.router)?, None)?;
        let probs = logits.softmax(-1, Kind::Float);
        let (top, experts) = probs.topk(self.top_k, -1, true, true);
        let top = if self.norm_topk_prob {
            &top / top.sum_dim_intlist(-1, true, Kind::Float)
        } else {
            top
        };
        Ok(Routing {
            probs,
            experts,
            weights: top.to_kind(x.kind()),
        })
    }

    /// The block over tokens `x` `[n, D]`: their outputs `[n, D]` and, when `log` is given, the
    /// layer's routing recorded under `layer`.
    pub(crate) fn forward(
        &self,
        params: &ParamMap,
        x: &Tensor,
        log: Option<(&RouterLog, i64)>,
        cheap: CheapOps,
    ) -> Result<Tensor, ComputeError> {
        let (n, d) = x.size2()?;
        let clock = log
            .filter(|_| x.device() == tch::Device::Cpu)
            .map(|_| Instant::now());
        let routing = self.route(params, x)?;
        let num_experts = self.experts.len() as i64;
        // (token, slot) pairs sorted by expert: a stable sort keeps each expert's tokens in
        // token order.
        let flat_experts = routing.experts.reshape([-1]);
        let (_, order) = flat_experts.sort_stable(true, 0, false);
        let slot_token = Tensor::arange(n, (Kind::Int64, x.device())).repeat_interleave_self_int(
            self.top_k,
            0,
            None::<i64>,
        );
        let tokens = slot_token.index_select(0, &order);
        let weights = routing.weights.reshape([-1]).index_select(0, &order);
        let counts = flat_experts.bincount(None::<Tensor>, num_experts);
        if let Some((log, layer)) = log {
            log.put(
                layer,
                RouterRecord {
                    counts: counts.to_kind(Kind::Float),
                    prob_sum: routing.probs.sum_dim_intlist(0, false, Kind::Float),
                    tokens: n,
                },
            );
        }
        let counts = Vec::<i64>::try_from(&counts)?;
        let routed = x.index_select(0, &tokens);
        // Seconds in the experts' GEMMs and in the exchanges; the rest of the block (router,
        // sort, permutations, combine) is router + dispatch.
        let (y, spent) = match &self.parallel {
            None => {
                let started = Instant::now();
                let y = self.run_experts(params, &routed, &counts, 0, false, cheap)?;
                let experts = started.elapsed().as_secs_f64();
                (
                    y,
                    MoeTimes {
                        experts,
                        ..MoeTimes::default()
                    },
                )
            }
            Some(group) => self.exchange_and_run(params, &routed, &counts, &group.0, cheap)?,
        };
        let y = y * weights.unsqueeze(1);
        let out = Tensor::zeros([n, d], (x.kind(), x.device())).index_add(0, &tokens, &y);
        if let (Some((log, _)), Some(start)) = (log, clock) {
            let total = start.elapsed().as_secs_f64();
            log.add_times(MoeTimes {
                router: total - spent.experts - spent.exchange,
                ..spent
            });
        }
        Ok(out)
    }

    /// Expert parallelism's middle of the block: `routed` (this rank's (token, slot) rows,
    /// sorted by expert, `counts[e]` for expert e) goes to the ranks holding the experts, this
    /// rank's experts run over what every rank sent, and the results come back in `routed`'s
    /// order. Returns them and the seconds the experts and the exchanges took.
    fn exchange_and_run(
        &self,
        params: &ParamMap,
        routed: &Tensor,
        counts: &[i64],
        group: &ProcessGroup,
        cheap: CheapOps,
    ) -> Result<(Tensor, MoeTimes), ComputeError> {
        let exchanging = Instant::now();
        let ranks = group.world_size();
        let local = self.experts.len() / ranks;
        let what = "experts exchange";
        // Rank j gets the counts for its experts; row i of what comes back is rank i's counts
        // for this rank's experts.
        let ones = vec![1i64; ranks];
        let counts_t = Tensor::from_slice(counts).view([ranks as i64, local as i64]);
        let from = group.all_to_all(&counts_t, &ones, &ones, what)?;
        let from = Vec::<i64>::try_from(&from.reshape([-1]))?;
        let send: Vec<i64> = counts.chunks(local).map(|c| c.iter().sum()).collect();
        let recv: Vec<i64> = from.chunks(local).map(|c| c.iter().sum()).collect();
        let received = group.all_to_all(routed, &send, &recv, what)?;
        let mut exchange = exchanging.elapsed().as_secs_f64();
        // Received rows come by source rank, each source's sorted by expert; the experts want
        // them by expert. `order[i]` is the received row that goes to position i.
        let mut block_start = vec![0i64; ranks * local];
        let mut at = 0;
        for (start, &n) in block_start.iter_mut().zip(&from) {
            *start = at;
            at += n;
        }
        let mut order = Vec::with_capacity(at as usize);
        let mut per_expert = vec![0i64; local];
        for (e, total) in per_expert.iter_mut().enumerate() {
            for src in 0..ranks {
                let (start, n) = (block_start[src * local + e], from[src * local + e]);
                order.extend(start..start + n);
                *total += n;
            }
        }
        let device = routed.device();
        let order = Tensor::from_slice(&order).to_device(device);
        let by_expert = received.index_select(0, &order);
        let started = Instant::now();
        let first = group.rank() * local;
        let y = self.run_experts(params, &by_expert, &per_expert, first, true, cheap)?;
        let experts = started.elapsed().as_secs_f64();
        // Back to the received order (the inverse permutation), then home.
        let inverse = order.argsort(0, false);
        let y = y.index_select(0, &inverse);
        let exchanging = Instant::now();
        let back = group.all_to_all(&y, &recv, &send, what)?;
        exchange += exchanging.elapsed().as_secs_f64();
        let spent = MoeTimes {
            router: 0.0,
            experts,
            exchange,
        };
        Ok((back, spent))
    }

    /// Experts `first..first + counts.len()` over `xs`, whose rows are sorted by expert
    /// (`counts[j]` rows for expert `first + j`): their outputs in the same order. One GEMM
    /// per projection and expert; `keep_empty` runs an expert on zero rows too (expert
    /// parallelism needs every rank's graph to reach the combine exchange).
    fn run_experts(
        &self,
        params: &ParamMap,
        xs: &Tensor,
        counts: &[i64],
        first: usize,
        keep_empty: bool,
        cheap: CheapOps,
    ) -> Result<Tensor, ComputeError> {
        let mut outputs = Vec::with_capacity(counts.len());
        let mut start = 0;
        for (j, &count) in counts.iter().enumerate() {
            if count == 0 && !keep_empty {
                continue;
            }
            let expert = &self.experts[first + j];
            let rows = xs.narrow(0, start, count);
            let gate = gemm::linear(&rows, param(params, &expert.gate_proj.weight)?, None)?;
            let up = gemm::linear(&rows, param(params, &expert.up_proj.weight)?, None)?;
            outputs.push(gemm::linear(
                &cheap.swiglu(&gate, &up)?,
                param(params, &expert.down_proj.weight)?,
                None,
            )?);
            start += count;
        }
        if outputs.is_empty() {
            return Ok(xs.zeros_like());
        }
        Ok(Tensor::cat(&outputs, 0))
    }
}

/// One sparse layer's routing in a forward: top-k slots per expert (no gradient) and each
/// expert's summed routing probability (f32, carrying the forward's graph when it had one).
pub(crate) struct RouterRecord {
    /// `[E]` f32.
    pub(crate) counts: Tensor,
    /// `[E]` f32.
    pub(crate) prob_sum: Tensor,
    /// Tokens routed (padding excluded).
    pub(crate) tokens: i64,
}

/// Seconds the sparse blocks spent, by part (CPU; see [`RouterLog::times`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct MoeTimes {
    /// Router, sort, permutations and combine.
    pub router: f64,
    /// The experts' GEMMs.
    pub experts: f64,
    /// Expert parallelism's all-to-all exchanges (counts, dispatch, combine); 0 without.
    pub exchange: f64,
}

/// Every sparse layer's [`RouterRecord`] of the micro-batch's last forward, by layer index;
/// a recompute replaces a layer's record with the same numbers, now with the graph.
#[derive(Default)]
pub struct RouterLog {
    records: Mutex<BTreeMap<i64, RouterRecord>>,
    /// Seconds in the router and the dispatch, the experts and the exchanges, every forward
    /// and recompute of the micro-batch together; CPU only (CUDA kernels run
    /// asynchronously, so a host clock would time their launch).
    times: Mutex<MoeTimes>,
}

/// The balance numbers of one forward, for metrics.
#[derive(Clone, Debug, Default)]
pub struct RouterStats {
    /// transformers' `aux_loss` (without the coefficient).
    pub aux_loss: f64,
    /// Per sparse layer (in layer order): its index and the top-k slots each expert received.
    pub loads: Vec<(i64, Vec<f64>)>,
    /// Seconds in router + dispatch (the exchanges included) and in the experts' GEMMs (see
    /// [`RouterLog::times`]), and the part of the first spent in expert parallelism's
    /// all-to-all exchanges.
    pub router_s: f64,
    pub experts_s: f64,
    pub exchange_s: f64,
}

impl RouterLog {
    fn put(&self, layer: i64, record: RouterRecord) {
        let mut records = self
            .records
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        records.insert(layer, record);
    }

    fn with<T>(&self, f: impl FnOnce(&BTreeMap<i64, RouterRecord>) -> T) -> T {
        let records = self
            .records
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&records)
    }

    /// `(Σ_l counts_l, E / rows²)`: the global slot counts and the factor of the balance loss,
    /// rows being every layer's tokens together.
    fn totals(records: &BTreeMap<i64, RouterRecord>) -> Option<(Tensor, f64)> {
        let first = records.values().next()?;
        let experts = first.counts.size()[0] as f64;
        let rows: i64 = records.values().map(|r| r.tokens).sum();
        if rows == 0 {
            return None;
        }
        let counts = records
            .values()
            .map(|r| r.counts.detach())
            .reduce(|a, b| a + b)?;
        Some((counts, experts / (rows as f64 * rows as f64)))
    }

    /// transformers' `load_balancing_loss_func` over the recorded layers, differentiable
    /// through the probability sums (`None` without sparse layers).
    pub fn aux_loss(&self) -> Option<Tensor> {
        self.with(|records| {
            let (counts, factor) = Self::totals(records)?;
            let probs = records
                .values()
                .map(|r| r.prob_sum.shallow_clone())
                .reduce(|a, b| a + b)?;
            Some((counts * probs).sum(Kind::Float) * factor)
        })
    }

    /// Layer `layer`'s part of `weight` × the balance loss, for its backward: the loss is
    /// linear in each layer's probability sums once the counts are fixed, so this term gives
    /// the layer exactly its share of the gradient.
    pub(crate) fn side_loss(&self, layer: i64, weight: f64) -> Option<Tensor> {
        self.with(|records| {
            let (counts, factor) = Self::totals(records)?;
            let own = records.get(&layer)?;
            Some((counts * &own.prob_sum).sum(Kind::Float) * (factor * weight))
        })
    }

    /// The balance numbers of the recorded forward.
    pub fn stats(&self) -> Option<RouterStats> {
        let aux_loss = self.aux_loss()?.double_value(&[]);
        let loads = self.with(|records| {
            records
                .iter()
                .map(|(&l, r)| (l, Vec::<f64>::try_from(&r.counts.to_kind(Kind::Double))))
                .map(|(l, c)| c.map(|c| (l, c)))
                .collect::<Result<Vec<_>, _>>()
        });
        let times = self.times();
        Some(RouterStats {
            aux_loss,
            loads: loads.ok()?,
            router_s: times.router + times.exchange,
            experts_s: times.experts,
            exchange_s: times.exchange,
        })
    }

    fn add_times(&self, spent: MoeTimes) {
        let mut times = self
            .times
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        times.router += spent.router;
        times.experts += spent.experts;
        times.exchange += spent.exchange;
    }

    /// Seconds the sparse blocks spent by part since the context was made (CPU; zero on
    /// CUDA, whose kernels run asynchronously).
    pub fn times(&self) -> MoeTimes {
        *self
            .times
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Forgets every record (a new micro-batch).
    pub fn clear(&self) {
        let mut records = self
            .records
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        records.clear();
    }
}
