//! Qwen2 / Qwen2.5 causal LM (transformers `Qwen2ForCausalLM`): token embedding, decoder
//! layers h = x + attn(rms(x)), out = h + down(silu(gate(rms(h))) · up(rms(h))) with RMSNorm in
//! f32, RoPE (rotate_half), grouped-query attention, q/k/v bias and no o_proj bias; final
//! RMSNorm and `lm_head` (tied to `model.embed_tokens.weight` when the checkpoint has no
//! `lm_head.weight`). LoRA adapters (see [`super::lora`]) add to the seven linear layers.
use super::attention::{attend, attend_spans, Span};
use super::config::{LoraConfig, Qwen2Config};
use super::gemm;
use super::keys::{KeyPath, LinearKeys};
use super::lora;
use super::param;
use super::rope::apply_rotary;
use super::varlen::{attend_varlen, Varlen};
use tch::{Kind, Tensor};
use tessera_fsdp::{ParamMap, ParamSpec};

pub(super) const EMBED: &str = "model.embed_tokens.weight";
pub(super) const NORM: &str = "model.norm.weight";
pub(super) const LM_HEAD: &str = "lm_head.weight";

fn frozen(name: String, shape: Vec<i64>) -> ParamSpec {
    ParamSpec {
        name,
        shape,
        trainable: false,
    }
}

pub(super) fn embed_specs(cfg: &Qwen2Config) -> Vec<ParamSpec> {
    vec![frozen(EMBED.into(), vec![cfg.vocab_size, cfg.hidden_size])]
}

/// Final norm + output projection; with tied embeddings the projection is `EMBED` itself.
pub(super) fn head_specs(cfg: &Qwen2Config, tied: bool) -> Vec<ParamSpec> {
    vec![
        frozen(NORM.into(), vec![cfg.hidden_size]),
        frozen(
            output_weight(tied).into(),
            vec![cfg.vocab_size, cfg.hidden_size],
        ),
    ]
}

/// Name of the output projection the head reads.
pub(super) fn output_weight(tied: bool) -> &'static str {
    if tied {
        EMBED
    } else {
        LM_HEAD
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
    v_proj: LinearKeys,
    o_proj: LinearKeys,
    gate_proj: LinearKeys,
    up_proj: LinearKeys,
    down_proj: LinearKeys,
    hidden_size: i64,
}

impl DecoderLayer {
    pub(crate) fn new(cfg: &Qwen2Config, i: i64) -> Self {
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
            q_proj: LinearKeys::new(&attn / "q_proj", q, d, true),
            k_proj: LinearKeys::new(&attn / "k_proj", kv, d, true),
            v_proj: LinearKeys::new(&attn / "v_proj", kv, d, true),
            o_proj: LinearKeys::new(&attn / "o_proj", d, q, false),
            gate_proj: LinearKeys::new(&mlp / "gate_proj", ff, d, false),
            up_proj: LinearKeys::new(&mlp / "up_proj", ff, d, false),
            down_proj: LinearKeys::new(&mlp / "down_proj", d, ff, false),
            hidden_size: d,
        }
    }

    /// The seven linear layers in checkpoint order (the modules LoRA can target).
    fn linears(&self) -> [&LinearKeys; 7] {
        [
            &self.q_proj,
            &self.k_proj,
            &self.v_proj,
            &self.o_proj,
            &self.gate_proj,
            &self.up_proj,
            &self.down_proj,
        ]
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
        cfg: &Qwen2Config,
        lora: Option<&LoraConfig>,
        params: &ParamMap,
        x: &Tensor,
        inputs: &LayerInputs,
    ) -> Tensor {
        let (rows, len, d) = x.size3().expect("decoder hidden is [rows, len, D]");
        let (heads, kv_heads, hd) = (cfg.num_attention_heads, cfg.kv_heads(), cfg.head_dim());
        let i = self.index;
        let salt = |k: u64| ((i as u64) << 8 | k).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let lin = Linear {
            params,
            lora,
            dropout_seed: inputs.dropout_seed,
        };

        let residual = x;
        let h = rms_norm(x, param(params, &self.input_layernorm), cfg.rms_norm_eps);
        let q = lin
            .apply(&h, &self.q_proj, salt(0))
            .view([rows, len, heads, hd])
            .transpose(1, 2);
        let k = lin
            .apply(&h, &self.k_proj, salt(1))
            .view([rows, len, kv_heads, hd])
            .transpose(1, 2);
        let v = lin
            .apply(&h, &self.v_proj, salt(2))
            .view([rows, len, kv_heads, hd])
            .transpose(1, 2);
        let q = apply_rotary(&q, inputs.cos, inputs.sin);
        let k = apply_rotary(&k, inputs.cos, inputs.sin);
        let attn = match (inputs.varlen, inputs.mask) {
            (Some(varlen), _) => attend_varlen(&q, &k, &v, varlen),
            (None, Some(mask)) => attend(&q, &k, &v, Some(mask)),
            (None, None) => attend_spans(&q, &k, &v, inputs.spans),
        };
        let attn = attn.transpose(1, 2).reshape([rows, len, heads * hd]);
        let h = residual + lin.apply(&attn, &self.o_proj, salt(3));

        let residual = &h;
        let m = rms_norm(
            &h,
            param(params, &self.post_attention_layernorm),
            cfg.rms_norm_eps,
        );
        let gate = lin.apply(&m, &self.gate_proj, salt(4)).silu();
        let up = lin.apply(&m, &self.up_proj, salt(5));
        let out = residual + lin.apply(&(gate * up), &self.down_proj, salt(6));
        debug_assert_eq!(out.size(), vec![rows, len, d]);
        out
    }
}

impl DecoderLayer {
    /// Inference over new tokens `x` `[1, len, D]` that follow the `kv.len()` tokens already
    /// cached (positions `kv.len()..kv.len() + len`, `(cos, sin)` built for those): the same
    /// computation as [`Self::forward`] on one unpacked sample, attending causally over the
    /// cached keys and values plus the new ones, which it appends to `kv`. No dropout.
    pub(crate) fn forward_cached(
        &self,
        cfg: &Qwen2Config,
        lora: Option<&LoraConfig>,
        params: &ParamMap,
        x: &Tensor,
        (cos, sin): (&Tensor, &Tensor),
        kv: &mut LayerKv,
    ) -> Tensor {
        let (rows, len, _) = x.size3().expect("decoder hidden is [1, len, D]");
        let (heads, kv_heads, hd) = (cfg.num_attention_heads, cfg.kv_heads(), cfg.head_dim());
        let lin = Linear {
            params,
            lora,
            dropout_seed: None,
        };
        let residual = x;
        let h = rms_norm(x, param(params, &self.input_layernorm), cfg.rms_norm_eps);
        let split = |t: Tensor, n: i64| t.view([rows, len, n, hd]).transpose(1, 2);
        let q = split(lin.apply(&h, &self.q_proj, 0), heads);
        let k = split(lin.apply(&h, &self.k_proj, 0), kv_heads);
        let v = split(lin.apply(&h, &self.v_proj, 0), kv_heads);
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
        let h = residual + lin.apply(&attn, &self.o_proj, 0);
        let residual = &h;
        let m = rms_norm(
            &h,
            param(params, &self.post_attention_layernorm),
            cfg.rms_norm_eps,
        );
        let gate = lin.apply(&m, &self.gate_proj, 0).silu();
        let up = lin.apply(&m, &self.up_proj, 0);
        residual + lin.apply(&(gate * up), &self.down_proj, 0)
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
pub(super) fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Tensor {
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
}

struct Linear<'a> {
    params: &'a ParamMap,
    lora: Option<&'a LoraConfig>,
    dropout_seed: Option<u64>,
}

impl Linear<'_> {
    fn apply(&self, x: &Tensor, keys: &LinearKeys, salt: u64) -> Tensor {
        let w = param(self.params, &keys.weight);
        let b = keys.bias.as_deref().map(|b| param(self.params, b));
        let base = gemm::linear(x, w, b);
        match self.lora {
            Some(cfg) if lora::targets(cfg, &keys.path) => {
                base + lora::delta(
                    cfg,
                    self.params,
                    &keys.path,
                    x,
                    self.dropout_seed.map(|s| s ^ salt),
                )
            }
            _ => base,
        }
    }
}

/// Token embeddings `[rows, len, D]` for `input_ids` `[rows, len]`.
pub(super) fn embed(params: &ParamMap, input_ids: &Tensor) -> Tensor {
    Tensor::embedding(param(params, EMBED), input_ids, -1, false, false)
}

/// Full logits `[.., vocab]` of final hidden states (for evaluation and tests; training uses
/// the chunked loss in [`super::loss`]).
pub(super) fn logits(cfg: &Qwen2Config, params: &ParamMap, tied: bool, hidden: &Tensor) -> Tensor {
    let h = rms_norm(hidden, param(params, NORM), cfg.rms_norm_eps);
    gemm::matmul(&h, &param(params, output_weight(tied)).tr())
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
