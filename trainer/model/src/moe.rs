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
//! The balance loss is transformers' `load_balancing_loss_func` (Switch Transformer's): over
//! every sparse layer's rows together, `E · Σ_e F_e · P_e` with `F_e` the share of top-k slots
//! that went to expert e and `P_e` its mean routing probability, padding excluded. Each layer
//! leaves its counts and probability sums in a [`RouterLog`]; `F` needs every layer's counts, so
//! the loss and its gradient are formed once the forward has run (see [`RouterLog::aux_loss`]
//! and [`RouterLog::side_loss`]).
use super::keys::{KeyPath, LinearKeys};
use super::lm_config::LmConfig;
use super::{gemm, param};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;
use tch::{Kind, Tensor};
use tessera_fsdp::{ComputeError, ParamMap, ParamSpec};

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
    pub(crate) fn new(cfg: &LmConfig, mlp: &KeyPath) -> Self {
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
        }
    }

    /// The router, then every expert's gate, up and down projection (frozen; the caller marks
    /// what trains).
    pub(crate) fn specs(&self) -> Vec<ParamSpec> {
        let mut specs = vec![ParamSpec {
            name: self.router.clone(),
            shape: vec![self.experts.len() as i64, self.hidden_size],
            trainable: false,
        }];
        for e in &self.experts {
            for linear in [&e.gate_proj, &e.up_proj, &e.down_proj] {
                specs.extend(linear.specs(false));
            }
        }
        specs
    }

    fn route(&self, params: &ParamMap, x: &Tensor) -> Result<Routing, ComputeError> {
        let logits = gemm::linear(x, param(params, &self.router), None)?;
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
        let dispatched = clock.map(|c| (c, Instant::now()));
        let mut outputs = Vec::with_capacity(self.experts.len());
        let mut start = 0;
        for (expert, &count) in self.experts.iter().zip(&counts) {
            if count == 0 {
                continue;
            }
            let xs = routed.narrow(0, start, count);
            let gate = gemm::linear(&xs, param(params, &expert.gate_proj.weight), None)?;
            let up = gemm::linear(&xs, param(params, &expert.up_proj.weight), None)?;
            outputs.push(gemm::linear(
                &(gate.silu() * up),
                param(params, &expert.down_proj.weight),
                None,
            )?);
            start += count;
        }
        if outputs.is_empty() {
            return Ok(x.zeros_like());
        }
        let y = Tensor::cat(&outputs, 0) * weights.unsqueeze(1);
        let out = Tensor::zeros([n, d], (x.kind(), x.device())).index_add(0, &tokens, &y);
        if let (Some((log, _)), Some((start, dispatched))) = (log, dispatched) {
            log.add_times(
                (dispatched - start).as_secs_f64(),
                dispatched.elapsed().as_secs_f64(),
            );
        }
        Ok(out)
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

/// Every sparse layer's [`RouterRecord`] of the micro-batch's last forward, by layer index;
/// a recompute replaces a layer's record with the same numbers, now with the graph.
#[derive(Default)]
pub struct RouterLog {
    records: Mutex<BTreeMap<i64, RouterRecord>>,
    /// Seconds in the router and the dispatch (sort, gather), then in the experts and the
    /// combine, every forward and recompute of the micro-batch together; CPU only (CUDA
    /// kernels run asynchronously, so a host clock would time their launch).
    times: Mutex<(f64, f64)>,
}

/// The balance numbers of one forward, for metrics.
#[derive(Clone, Debug, Default)]
pub struct RouterStats {
    /// transformers' `aux_loss` (without the coefficient).
    pub aux_loss: f64,
    /// Per sparse layer (in layer order): its index and the top-k slots each expert received.
    pub loads: Vec<(i64, Vec<f64>)>,
    /// Seconds in router + dispatch and in experts + combine (see [`RouterLog::times`]).
    pub router_s: f64,
    pub experts_s: f64,
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
        let (router_s, experts_s) = self.times();
        Some(RouterStats {
            aux_loss,
            loads: loads.ok()?,
            router_s,
            experts_s,
        })
    }

    fn add_times(&self, router: f64, experts: f64) {
        let mut times = self
            .times
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        times.0 += router;
        times.1 += experts;
    }

    /// Seconds in the router and dispatch, and in the experts and combine, since the
    /// context was made (CPU; zero on CUDA).
    pub fn times(&self) -> (f64, f64) {
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
