// `linear` for bf16 tensors on a CPU without bf16 arithmetic (trainer/model/src/gemm.rs): the
// product runs on the f32 kernels over the widened operands and is rounded to bf16, as a custom
// autograd function that saves the bf16 operands (the input activation and the weight itself,
// no copy) and widens them again in backward. Plain autograd over `x.to(f32)` would keep the
// widened f32 weight of every layer alive until backward: 1.4 GB for Qwen2.5-0.5B's layers.
// Errors follow shim_error.h.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "shim_error.h"

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor wide(const at::Tensor& t) { return t.to(at::kFloat); }

struct WidenedLinear : public torch::autograd::Function<WidenedLinear> {
  // x [.., in], w [out, in], b [out] or none; all bf16. Runs with autograd off.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const std::optional<at::Tensor>& b) {
    ctx->save_for_backward({x, w});
    ctx->saved_data["bias"] = b.has_value();
    const auto bias = b.has_value() ? std::optional<at::Tensor>(wide(*b)) : std::nullopt;
    return at::linear(wide(x), wide(w), bias).to(x.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& w = saved[1];
    const int64_t in = w.size(1);
    const int64_t out = w.size(0);
    const at::Tensor g = wide(grads[0]);
    at::Tensor gx, gw, gb;
    if (ctx->needs_input_grad(0)) {
      gx = at::matmul(g, wide(w)).to(x.scalar_type());
    }
    if (ctx->needs_input_grad(1)) {
      gw = at::mm(g.reshape({-1, out}).t(), wide(x).reshape({-1, in})).to(w.scalar_type());
    }
    if (ctx->saved_data["bias"].toBool() && ctx->needs_input_grad(2)) {
      gb = g.reshape({-1, out}).sum(0).to(grads[0].scalar_type());
    }
    return {gx, gw, gb};
  }
};

}  // namespace

extern "C" {

// `b` may be NULL (no bias). Writes the bf16 result, with its autograd node, to *out.
char* tc_widened_linear(const at::Tensor* x, const at::Tensor* w, const at::Tensor* b,
                        at::Tensor** out) {
  return tessera_shim::guarded([&] {
    *out = nullptr;
    const auto bias = b != nullptr ? std::optional<at::Tensor>(*b) : std::nullopt;
    *out = new at::Tensor(WidenedLinear::apply(*x, *w, bias));
  });
}

}  // extern "C"
