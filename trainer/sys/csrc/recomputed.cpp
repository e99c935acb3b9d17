// Selective activation recompute (`--recompute selective`): a custom autograd function around a
// piece of the forward written in Rust (trainer/model/src/selective.rs). Its forward runs the
// piece with autograd off and saves only the piece's inputs; its backward runs the piece again
// with autograd on and differentiates that graph. A RMSNorm or a SwiGLU activation then keeps
// its inputs (a matmul's output, or the residual stream, both kept anyway) instead of its
// intermediates. The gradient is the one autograd computes over the same ops.
//
// The Rust closure is owned by the autograd node: its box travels in a one-byte tensor whose
// deleter drops it, stored in the node's saved data, so it lives exactly as long as the graph.
// Errors follow shim_error.h; a failing closure reports through `err` (a caller-sized buffer).
#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "shim_error.h"

extern "C" {
// Runs the closure over `n_inputs` tensors and writes `n_outputs` new heap tensors (owned by
// the caller) to `outputs`. Returns false on failure, with a NUL-terminated message in `err`.
typedef bool (*tc_piece_fn)(void* closure, at::Tensor* const* inputs, int64_t n_inputs,
                            at::Tensor** outputs, int64_t n_outputs, char* err, size_t err_cap);
// Drops the closure.
typedef void (*tc_piece_drop)(void* closure);
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr size_t kErrCap = 4096;

struct Piece {
  void* closure;
  tc_piece_fn call;
  tc_piece_drop drop;
  int64_t n_outputs;

  variable_list run(const variable_list& inputs) const {
    std::vector<at::Tensor*> in;
    in.reserve(inputs.size());
    for (const auto& t : inputs) {
      in.push_back(const_cast<at::Tensor*>(&t));
    }
    std::vector<at::Tensor*> out(static_cast<size_t>(n_outputs), nullptr);
    std::string err(kErrCap, '\0');
    const bool ok = call(closure, in.data(), static_cast<int64_t>(in.size()), out.data(),
                         n_outputs, err.data(), kErrCap);
    variable_list result;
    for (at::Tensor* t : out) {
      if (t != nullptr) {
        result.push_back(std::move(*t));
        delete t;
      }
    }
    if (!ok) {
      throw std::runtime_error(err.c_str());
    }
    return result;
  }
};

// The tensor that owns `piece`: freeing its storage drops the closure and the Piece.
at::Tensor owner(Piece* piece) {
  return at::from_blob(
      piece, {1}, [](void* p) {
        auto* owned = static_cast<Piece*>(p);
        owned->drop(owned->closure);
        delete owned;
      },
      at::TensorOptions().dtype(at::kByte));
}

struct Recomputed : public torch::autograd::Function<Recomputed> {
  // `holder` is the owner tensor (no gradient); `inputs` the piece's tensors.
  // (A TensorList, not a variable_list: only the former counts as the function's inputs.)
  static variable_list forward(AutogradContext* ctx, const at::Tensor& holder,
                               at::TensorList inputs) {
    ctx->saved_data["piece"] = holder;
    const variable_list in = inputs.vec();
    ctx->save_for_backward(in);
    return static_cast<const Piece*>(holder.data_ptr())->run(in);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor holder = ctx->saved_data["piece"].toTensor();
    const auto* piece = static_cast<const Piece*>(holder.data_ptr());
    const variable_list saved = ctx->get_saved_variables();
    variable_list inputs;
    variable_list wrt;
    std::vector<size_t> wrt_at;
    for (size_t i = 0; i < saved.size(); ++i) {
      at::Tensor t = saved[i].detach();
      // Input 0 of the function is the holder; the piece's inputs follow.
      if (ctx->needs_input_grad(i + 1)) {
        t.requires_grad_(true);
        wrt.push_back(t);
        wrt_at.push_back(i);
      }
      inputs.push_back(t);
    }
    variable_list outputs;
    {
      at::AutoGradMode grad_on(true);
      outputs = piece->run(inputs);
    }
    variable_list roots;
    variable_list root_grads;
    for (size_t i = 0; i < outputs.size() && i < grads.size(); ++i) {
      if (outputs[i].requires_grad() && grads[i].defined()) {
        roots.push_back(outputs[i]);
        root_grads.push_back(grads[i]);
      }
    }
    variable_list result(saved.size() + 1);
    if (!roots.empty() && !wrt.empty()) {
      const variable_list g = torch::autograd::grad(roots, wrt, root_grads,
                                                    /*retain_graph=*/false,
                                                    /*create_graph=*/false,
                                                    /*allow_unused=*/true);
      for (size_t k = 0; k < wrt_at.size(); ++k) {
        result[wrt_at[k] + 1] = g[k];
      }
    }
    return result;
  }
};

}  // namespace

extern "C" {

// Runs the piece over `inputs` and writes its `n_outputs` results (new heap tensors carrying
// the recomputing node when autograd is on) to `outputs`. Takes ownership of `closure` in every
// case: it is dropped with the node, or before returning when no node keeps it.
char* tc_recomputed(void* closure, tc_piece_fn call, tc_piece_drop drop,
                    const at::Tensor* const* inputs, int64_t n_inputs, at::Tensor** outputs,
                    int64_t n_outputs) {
  // Until the owner tensor holds the piece, the closure is dropped here on failure.
  bool owned = false;
  char* err = tessera_shim::guarded([&] {
    auto piece = std::make_unique<Piece>(Piece{closure, call, drop, n_outputs});
    at::Tensor holder = owner(piece.get());
    piece.release();
    owned = true;
    variable_list in;
    in.reserve(static_cast<size_t>(n_inputs));
    for (int64_t i = 0; i < n_inputs; ++i) {
      in.push_back(*inputs[i]);
    }
    variable_list out = Recomputed::apply(holder, at::TensorList(in));
    if (static_cast<int64_t>(out.size()) != n_outputs) {
      throw std::runtime_error("the piece returned " + std::to_string(out.size()) +
                               " tensors, " + std::to_string(n_outputs) + " expected");
    }
    for (int64_t i = 0; i < n_outputs; ++i) {
      outputs[i] = new at::Tensor(std::move(out[static_cast<size_t>(i)]));
    }
  });
  if (!owned) {
    drop(closure);
  }
  return err;
}

}  // extern "C"
