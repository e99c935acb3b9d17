//! The decoder-only causal LM of every family tessera trains (transformers'
//! `Qwen2ForCausalLM`, `Qwen3ForCausalLM` and `LlamaForCausalLM`): token embedding, decoder
//! layers h = x + attn(rms(x)), out = h + down(silu(gate(rms(h))) · up(rms(h))) with RMSNorm in
//! f32, RoPE (rotate_half), grouped-query attention; final RMSNorm and `lm_head` (tied to
//! `model.embed_tokens.weight` when the config says so). The families differ only in the
//! switches `LmConfig` reads from config.json (see `lm_config.rs`): which linear layers have a
//! bias, and whether queries and keys go through a per-head RMSNorm (`q_norm`, `k_norm`,
//! Qwen3) before RoPE; `head_dim` and the RoPE base come from the config too. A `qwen3_moe`
//! layer's MLP slot holds the sparse block of `moe.rs` instead of the dense SwiGLU where the
//! config says so. LoRA adapters (see [`super::lora`]) add to the attention projections and
//! the dense MLP's three (never to experts).
use super::attention::{attend, attend_spans, Span};
use super::config::LoraConfig;
use super::gemm;
use super::keys::{KeyPath, LinearKeys};
use super::lm_config::LmConfig;
use super::lora;
use super::moe::{ExpertGroup, RouterLog, SparseMlp};
use super::param;
use super::rope::apply_rotary;
use super::selective::CheapOps;
use super::varlen::{attend_varlen, Varlen};
use tch::{Kind, Tensor};
use tessera_fsdp::{ComputeError, ParamMap, ParamSpec};

fn frozen(name: String, shape: Vec<i64>) -> ParamSpec {
    ParamSpec {
        name,
        shape,
        trainable: false,
        expert: None,
    }
}

/// Decoder layer `i`'s checkpoint keys and shapes, built once: [`DecoderLayer::specs`] and
/// [`DecoderLayer::forward`] both read them.
pub(crate) struct DecoderLayer {
    index: i64,
    input_layernorm: String,
    post_attention_layernorm: String,
    q_proj: LinearKeys,
    k_proj: LinearKeys,
    /// Qwen3's per-head norms of queries and keys (`[head_dim]` each), applied before RoPE.
    qk_norm: Option<(String, String)>,
    v_proj: LinearKeys,
    o_proj: LinearKeys,
    mlp: Mlp,
    hidden_size: i64,
    head_dim: i64,
}

/// What fills a layer's MLP slot.
enum Mlp {
    /// SwiGLU: down(silu(gate(x)) · up(x)).
    Dense {
        gate_proj: LinearKeys,
        up_proj: LinearKeys,
        down_proj: LinearKeys,
    },
    /// The router and experts of a `qwen3_moe` sparse layer.
    Sparse(SparseMlp),
}

impl DecoderLayer {
    pub(crate) fn new(cfg: &LmConfig, i: i64) -> Self {
        Self::with_experts(cfg, i, None)
    }

    /// Layer `i`, its sparse MLP (if it has one) holding this rank's slice of the experts of
    /// `parallel` (all of them without).
    pub(crate) fn with_experts(cfg: &LmConfig, i: i64, parallel: Option<&ExpertGroup>) -> Self {
        let d = cfg.hidden_size;
        let q = cfg.num_attention_heads * cfg.head_dim();
        let kv = cfg.kv_heads() * cfg.head_dim();
        let ff = cfg.intermediate_size;
        let p = KeyPath::new("model") / "layers" / i;
        let attn = &p / "self_attn";
        let mlp = &p / "mlp";
        DecoderLayer {
            index: i,
            input_layernorm: (&p / "input_layernorm").key("weight"),
            post_attention_layernorm: (&p / "post_attention_layernorm").key("weight"),
            q_proj: LinearKeys::new(&attn / "q_proj", q, d, cfg.qkv_bias()),
            k_proj: LinearKeys::new(&attn / "k_proj", kv, d, cfg.qkv_bias()),
            qk_norm: cfg.qk_norm().then(|| {
                (
                    (&attn / "q_norm").key("weight"),
                    (&attn / "k_norm").key("weight"),
                )
            }),
            v_proj: LinearKeys::new(&attn / "v_proj", kv, d, cfg.qkv_bias()),
            o_proj: LinearKeys::new(&attn / "o_proj", d, q, cfg.o_bias()),
            mlp: if cfg.is_sparse_layer(i) {
                Mlp::Sparse(SparseMlp::new(cfg, &mlp, parallel))
            } else {
                Mlp::Dense {
                    gate_proj: LinearKeys::new(&mlp / "gate_proj", ff, d, cfg.mlp_bias()),
                    up_proj: LinearKeys::new(&mlp / "up_proj", ff, d, cfg.mlp_bias()),
                    down_proj: LinearKeys::new(&mlp / "down_proj", d, ff, cfg.mlp_bias()),
                }
            },
            hidden_size: d,
            head_dim: cfg.head_dim(),
        }
    }

    /// The linear layers in checkpoint order that LoRA can target: the four attention
    /// projections and a dense MLP's three.
    fn linears(&self) -> Vec<&LinearKeys> {
        let mut linears = vec![&self.q_proj, &self.k_proj, &self.v_proj, &self.o_proj];
        if let Mlp::Dense {
            gate_proj,
            up_proj,
            down_proj,
        } = &self.mlp
        {
            linears.extend([gate_proj, up_proj, down_proj]);
        }
        linears
    }

    pub(crate) fn index(&self) -> i64 {
        self.index
    }

    /// Whether the layer's MLP is the sparse block.
    pub(crate) fn is_sparse(&self) -> bool {
        matches!(self.mlp, Mlp::Sparse(_))
    }

    /// The layer's base weights (frozen) followed by its LoRA adapters (trainable), if any.
    pub(crate) fn specs(&self, lora: Option<&LoraConfig>) -> Vec<ParamSpec> {
        let d = self.hidden_size;
        let mut specs = vec![
            frozen(self.input_layernorm.clone(), vec![d]),
            frozen(self.post_attention_layernorm.clone(), vec![d]),
        ];
        for linear in self.linears() {
            specs.extend(linear.specs(false));
        }
        if let Some((q_norm, k_norm)) = &self.qk_norm {
            specs.push(frozen(q_norm.clone(), vec![self.head_dim]));
            specs.push(frozen(k_norm.clone(), vec![self.head_dim]));
        }
        if let Mlp::Sparse(sparse) = &self.mlp {
            specs.extend(sparse.specs());
        }
        if let Some(lora) = lora {
            specs.extend(self.adapter_specs(lora));
        }
        specs
    }

    /// The LoRA adapters (trainable) `lora` puts on this layer's linear layers.
    pub(crate) fn adapter_specs(&self, lora: &LoraConfig) -> Vec<ParamSpec> {
        lora::adapter_specs(&self.linears(), lora)
    }

    /// The layer over `x` `[rows, len, D]`.
    pub(crate) fn forward(
        &self,
        cfg: &LmConfig,
        lora: Option<&LoraConfig>,
        params: &ParamMap,
        x: &Tensor,
        inputs: &LayerInputs,
    ) -> Result<Tensor, ComputeError> {
        let (rows, len, d) = x.size3()?;
        let (heads, hd) = (cfg.num_attention_heads, cfg.head_dim());
        let i = self.index;
        let salt = |k: u64| ((i as u64) << 8 | k).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let lin = Linear {
            params,
            lora,
            dropout_seed: inputs.dropout_seed,
        };

        let cheap = inputs.cheap;
        let residual = x;
        let h = cheap.rms_norm(x, param(params, &self.input_layernorm)?, cfg.rms_norm_eps)?;
        let (q, k, v) = self.qkv(cfg, &lin, &h, salt, cheap)?;
        let q = apply_rotary(&q, inputs.cos, inputs.sin);
        let k = apply_rotary(&k, inputs.cos, inputs.sin);
        let attn = match (inputs.varlen, inputs.mask) {
            (Some(varlen), _) => attend_varlen(&q, &k, &v, varlen)?,
            (None, Some(mask)) => attend(&q, &k, &v, Some(mask)),
            (None, None) => attend_spans(&q, &k, &v, inputs.spans),
        };
        let attn = attn.transpose(1, 2).reshape([rows, len, heads * hd]);
        let h = residual + lin.apply(&attn, &self.o_proj, salt(3))?;

        let residual = &h;
        let m = cheap.rms_norm(
            &h,
            param(params, &self.post_attention_layernorm)?,
            cfg.rms_norm_eps,
        )?;
        let mlp = match &self.mlp {
            Mlp::Sparse(sparse) => {
                // Padding never reaches the router: it would count in the balance loss and
                // cost expert compute, and nothing real attends to it.
                let flat = m.reshape([rows * len, d]);
                let log = inputs.router_log.map(|log| (log, i));
                match inputs.real_index {
                    Some(real) => {
                        let y = sparse.forward(params, &flat.index_select(0, real), log, cheap)?;
                        flat.zeros_like().index_copy(0, real, &y)
                    }
                    None => sparse.forward(params, &flat, log, cheap)?,
                }
                .view([rows, len, d])
            }
            Mlp::Dense { .. } => self.dense_mlp(&lin, &m, salt, cheap)?,
        };
        Ok(residual + mlp)
    }

    /// The dense SwiGLU over `m`; `salt(k)` seeds the LoRA dropout of projection k (4 gate,
    /// 5 up, 6 down).
    fn dense_mlp(
        &self,
        lin: &Linear,
        m: &Tensor,
        salt: impl Fn(u64) -> u64,
        cheap: CheapOps,
    ) -> Result<Tensor, ComputeError> {
        let Mlp::Dense {
            gate_proj,
            up_proj,
            down_proj,
        } = &self.mlp
        else {
            return Ok(m.zeros_like());
        };
        let gate = lin.apply(m, gate_proj, salt(4))?;
        let up = lin.apply(m, up_proj, salt(5))?;
        lin.apply(&cheap.swiglu(&gate, &up)?, down_proj, salt(6))
    }
}

impl DecoderLayer {
    /// Queries, keys and values `[rows, heads, len, head_dim]` of the normed hidden `h`
    /// `[rows, len, D]`, before RoPE: each projected and split into heads, queries and keys
    /// then through their per-head RMSNorm when the family has one (Qwen3). `salt(k)` seeds
    /// the LoRA dropout of projection k (0 q, 1 k, 2 v).
    fn qkv(
        &self,
        cfg: &LmConfig,
        lin: &Linear,
        h: &Tensor,
        salt: impl Fn(u64) -> u64,
        cheap: CheapOps,
    ) -> Result<(Tensor, Tensor, Tensor), ComputeError> {
        let (rows, len, _) = h.size3()?;
        let (heads, kv_heads, hd) = (cfg.num_attention_heads, cfg.kv_heads(), cfg.head_dim());
        let split = |t: Tensor, n: i64| t.view([rows, len, n, hd]);
        let q = split(lin.apply(h, &self.q_proj, salt(0))?, heads);
        let k = split(lin.apply(h, &self.k_proj, salt(1))?, kv_heads);
        let v = split(lin.apply(h, &self.v_proj, salt(2))?, kv_heads);
        let (q, k) = match &self.qk_norm {
            Some((q_norm, k_norm)) => {
                let eps = cfg.rms_norm_eps;
                let q = cheap.rms_norm(&q, param(lin.params, q_norm)?, eps)?;
                (q, cheap.rms_norm(&k, param(lin.params, k_norm)?, eps)?)
            }
            None => (q, k),
        };
        Ok((q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)))
    }
}

impl DecoderLayer {
    /// Inference over new tokens `x` `[1, len, D]` that follow the `kv.len()` tokens already
    /// cached (positions `kv.len()..kv.len() + len`, `(cos, sin)` built for those): the same
    /// computation as [`Self::forward`] on one unpacked sample, attending causally over the
    /// cached keys and values plus the new ones, which it appends to `kv`. No dropout.
    pub(crate) fn forward_cached(
        &self,
        cfg: &LmConfig,
        lora: Option<&LoraConfig>,
        params: &ParamMap,
        x: &Tensor,
        (cos, sin): (&Tensor, &Tensor),
        kv: &mut LayerKv,
    ) -> Result<Tensor, ComputeError> {
        let (rows, len, d) = x.size3()?;
        let (heads, hd) = (cfg.num_attention_heads, cfg.head_dim());
        let lin = Linear {
            params,
            lora,
            dropout_seed: None,
        };
        let residual = x;
        let h = rms_norm(x, param(params, &self.input_layernorm)?, cfg.rms_norm_eps);
        let (q, k, v) = self.qkv(cfg, &lin, &h, |_| 0, CheapOps::default())?;
        let q = apply_rotary(&q, cos, sin);
        let k = apply_rotary(&k, cos, sin);
        let past = kv.len();
        let (k, v) = kv.append(k, v);
        // Query t (absolute position past + t) sees keys 0..=past + t; one query sees them all.
        let mask = (len > 1).then(|| {
            let total = past + len;
            Tensor::ones([len, total], (Kind::Bool, x.device())).tril(past)
        });
        let attn =
            attend(&q, &k, &v, mask.as_ref())
                .transpose(1, 2)
                .reshape([rows, len, heads * hd]);
        let h = residual + lin.apply(&attn, &self.o_proj, 0)?;
        let residual = &h;
        let m = rms_norm(
            &h,
            param(params, &self.post_attention_layernorm)?,
            cfg.rms_norm_eps,
        );
        let mlp = match &self.mlp {
            Mlp::Sparse(sparse) => sparse
                .forward(
                    params,
                    &m.reshape([rows * len, d]),
                    None,
                    CheapOps::default(),
                )?
                .view([rows, len, d]),
            Mlp::Dense { .. } => self.dense_mlp(&lin, &m, |_| 0, CheapOps::default())?,
        };
        Ok(residual + mlp)
    }
}

/// One decoder layer's cached keys and values, `[1, kv_heads, len, head_dim]` each (after
/// RoPE), for generation.
#[derive(Default)]
pub(crate) struct LayerKv {
    kv: Option<(Tensor, Tensor)>,
}

impl LayerKv {
    /// Tokens cached so far.
    pub(crate) fn len(&self) -> i64 {
        self.kv.as_ref().map_or(0, |(k, _)| k.size()[2])
    }

    /// Appends the new keys and values; returns all of them.
    fn append(&mut self, k: Tensor, v: Tensor) -> (Tensor, Tensor) {
        let (k, v) = match self.kv.take() {
            Some((pk, pv)) => (Tensor::cat(&[pk, k], 2), Tensor::cat(&[pv, v], 2)),
            None => (k, v),
        };
        self.kv = Some((k.shallow_clone(), v.shallow_clone()));
        (k, v)
    }
}

/// RMSNorm as transformers computes it: in f32, x·rsqrt(mean(x²) + eps), cast back, · weight.
/// On CUDA libtorch's fused kernel computes the same in one pass (f32 inside; the weight
/// product is rounded to x's dtype once instead of twice, under one bf16 ulp apart): the
/// unfused form's casts and elementwise kernels took about a tenth of a stage-1 step on an
/// H100 (BENCHMARKS.md, GPU). The CPU keeps transformers' exact order of operations.
pub(crate) fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Tensor {
    if x.device().is_cuda() {
        let last = x.size().last().copied().unwrap_or(1);
        return x.rms_norm([last], Some(weight), eps);
    }
    let xf = x.to_kind(Kind::Float);
    let var = xf.pow_tensor_scalar(2).mean_dim(-1, true, Kind::Float);
    let normed = (xf * (var + eps).rsqrt()).to_kind(x.kind());
    normed * weight
}

/// Per-micro-batch inputs a decoder layer needs (built once by `VlmCtx`).
pub(super) struct LayerInputs<'a> {
    /// Dense block-causal mask; with neither it nor `varlen`, attention runs span by span
    /// over `spans`.
    pub mask: Option<&'a Tensor>,
    pub spans: &'a [Vec<Span>],
    /// The packed samples as varlen sequences (CUDA): preferred over `mask`.
    pub varlen: Option<&'a Varlen>,
    pub cos: &'a Tensor,
    pub sin: &'a Tensor,
    /// `Some(seed)` applies LoRA dropout with a mask drawn from that seed (so FSDP's recompute
    /// draws the same mask); `None` runs without dropout (evaluation).
    pub dropout_seed: Option<u64>,
    /// Flat indices of the real (not padding) tokens of `[rows * len]`; `None` when all are.
    pub real_index: Option<&'a Tensor>,
    /// Where sparse layers record their routing (the balance loss and the expert loads).
    pub router_log: Option<&'a RouterLog>,
    /// Whether the norms and activations recompute in backward (`--recompute selective`).
    pub cheap: CheapOps,
}

struct Linear<'a> {
    params: &'a ParamMap,
    lora: Option<&'a LoraConfig>,
    dropout_seed: Option<u64>,
}

impl Linear<'_> {
    fn apply(&self, x: &Tensor, keys: &LinearKeys, salt: u64) -> Result<Tensor, ComputeError> {
        let w = param(self.params, &keys.weight)?;
        let b = keys
            .bias
            .as_deref()
            .map(|b| param(self.params, b))
            .transpose()?;
        let base = gemm::linear(x, w, b)?;
        Ok(match self.lora {
            Some(cfg) if lora::targets(cfg, &keys.path) => {
                base + lora::delta(
                    cfg,
                    self.params,
                    &keys.path,
                    x,
                    self.dropout_seed.map(|s| s ^ salt),
                )?
            }
            _ => base,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::rms_norm;
    use tch::{Device, Kind, Tensor};

    /// The op the CUDA path runs (`aten::rms_norm`, fused there) computes transformers' RMSNorm:
    /// checked on the CPU, where the same op runs its composite form, against the unfused
    /// order of operations `rms_norm` keeps there: equal within f32 rounding in f32, and within
    /// two bf16 ulps in bf16 (the weight product may be rounded once instead of twice).
    #[test]
    fn aten_rms_norm_matches_transformers_order_of_operations() {
        tch::manual_seed(3);
        let x = Tensor::randn([4, 7, 64], (Kind::Float, Device::Cpu)) * 3.0;
        let w = Tensor::randn([64], (Kind::Float, Device::Cpu));
        let eps = 1e-6;
        let fused = x.rms_norm([64], Some(&w), eps);
        let diff = (&fused - rms_norm(&x, &w, eps))
            .abs()
            .max()
            .double_value(&[]);
        assert!(diff < 1e-5, "f32: {diff}");

        let (xb, wb) = (x.to_kind(Kind::BFloat16), w.to_kind(Kind::BFloat16));
        let ours = rms_norm(&xb, &wb, eps).to_kind(Kind::Float);
        let fused = xb.rms_norm([64], Some(&wb), eps).to_kind(Kind::Float);
        // One bf16 ulp of each value: 2^(exponent - 7).
        let ulp = ours.abs().clamp_min(1e-30).log2().floor().exp2() / 128.0;
        let excess = ((&fused - &ours).abs() - ulp * 2.01)
            .max()
            .double_value(&[]);
        assert!(excess <= 0.0, "bf16: {excess} past two ulps");
    }
}
