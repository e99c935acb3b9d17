// Varlen causal attention over packed sequences for CUDA tensors, through ATen ops tch does
// not bind: `_flash_attention_forward` (bf16 / f16) or `_efficient_attention_forward` (f32),
// both given the sequences' cumulative lengths, so no [len x len] mask is ever built. Both ops
// have autograd formulas (FlashAttentionBackward0 / EfficientAttentionBackward0), so the
// returned tensor back-propagates into q, k and v like any other.
//
// Errors follow shim_error.h: NULL on success, else a heap C string freed with tc_free_error. The ops are declared in every libtorch build; on a CPU tensor they
// fail with a dispatcher error, so Rust calls this only for CUDA tensors.
#include <cstdint>
#include <optional>
#include <tuple>

#include <ATen/core/Tensor.h>
#include <ATen/ops/_efficient_attention_forward.h>
#include <ATen/ops/_flash_attention_forward.h>

#include "shim_error.h"

namespace {

// mem-efficient attention's `custom_mask_type`: causal, query i sees keys 0..=i of its sequence.
constexpr int64_t kCausalFromTopLeft = 1;

}  // namespace

extern "C" {

// q: [total, heads, head_dim]; k, v: [total, kv_heads, head_dim] (heads a multiple of
// kv_heads); cu_seqlens: [sequences + 1] int32 on q's device, 0 first and total last;
// max_len: the longest sequence. Writes the [total, heads, head_dim] output to *out.
char* tc_varlen_causal_attention(const at::Tensor* q, const at::Tensor* k, const at::Tensor* v,
                                 const at::Tensor* cu_seqlens, int64_t max_len, double scale,
                                 at::Tensor** out) {
  return tessera_shim::guarded([&] {
    *out = nullptr;
    TORCH_CHECK(q->is_cuda() && k->is_cuda() && v->is_cuda() && cu_seqlens->is_cuda(),
                "varlen attention takes CUDA tensors");
    TORCH_CHECK(q->dim() == 3 && k->dim() == 3 && v->dim() == 3,
                "varlen attention takes [total, heads, head_dim] tensors");
    TORCH_CHECK(cu_seqlens->scalar_type() == at::kInt && cu_seqlens->dim() == 1,
                "cu_seqlens must be a 1-D int32 tensor");
    TORCH_CHECK(k->size(1) > 0 && q->size(1) % k->size(1) == 0,
                "query heads must be a multiple of key/value heads");
    const at::Tensor query = q->contiguous();
    const at::Tensor key = k->contiguous();
    const at::Tensor value = v->contiguous();
    const at::Tensor cu = cu_seqlens->contiguous();
    const auto dtype = query.scalar_type();
    at::Tensor result;
    if (dtype == at::kBFloat16 || dtype == at::kHalf) {
      // Flash-attention 2 varlen: grouped-query heads natively, one sequence per cu_seqlens run.
      result = std::get<0>(at::_flash_attention_forward(
          query, key, value, cu, cu, max_len, max_len, /*dropout_p=*/0.0, /*is_causal=*/true,
          /*return_debug_mask=*/false, std::optional<double>(scale)));
    } else {
      // Memory-efficient kernel (f32 too): batch 1 of all tokens, sequences by cu_seqlens; it
      // wants as many key/value heads as query heads.
      const int64_t groups = query.size(1) / key.size(1);
      const at::Tensor key_full = groups > 1 ? key.repeat_interleave(groups, 1) : key;
      const at::Tensor value_full = groups > 1 ? value.repeat_interleave(groups, 1) : value;
      result = std::get<0>(at::_efficient_attention_forward(
                   query.unsqueeze(0), key_full.unsqueeze(0), value_full.unsqueeze(0),
                   /*bias=*/std::nullopt, cu, cu, std::optional<int64_t>(max_len),
                   std::optional<int64_t>(max_len), /*dropout_p=*/0.0, kCausalFromTopLeft,
                   /*compute_log_sumexp=*/true, std::optional<double>(scale)))
                   .squeeze(0);
    }
    *out = new at::Tensor(std::move(result));
  });
}

}  // extern "C"
