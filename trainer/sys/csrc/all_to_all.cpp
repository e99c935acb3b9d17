// All-to-all with a gradient, for expert parallelism: rank r sends `in_splits[j]` rows of its
// input to rank j and receives `out_splits[j]` rows from rank j, in rank order. The backward
// of that exchange is the reverse exchange of the output's gradient (each row's gradient goes
// back to the rank the row came from), so the op is an autograd Function: libtorch calls its
// backward inside the unit's backward, where every rank of the group reaches it in the same
// order (one dispatch and one combine per sparse layer, ordered by their data dependency).
//
// Synchronous: the forward and the backward wait for the collective (with the group's
// timeout), so a dead peer fails the op and the error names the exchange and the rank. Errors
// follow shim_error.h; inside backward they surface through libtorch's backward error.
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "c10d_group.h"
#include "shim_error.h"

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor exchange(tc_pg* pg, const at::Tensor& input, const std::vector<int64_t>& out_splits,
                    const std::vector<int64_t>& in_splits) {
  const auto ranks = static_cast<size_t>(pg->backend->getSize());
  TORCH_CHECK(out_splits.size() == ranks && in_splits.size() == ranks,
              "all-to-all over ", ranks, " ranks was given ", in_splits.size(), " send and ",
              out_splits.size(), " receive counts");
  TORCH_CHECK(input.dim() >= 1, "all-to-all takes rows: a tensor of at least one dimension");
  const int64_t sending = std::accumulate(in_splits.begin(), in_splits.end(), int64_t{0});
  TORCH_CHECK(sending == input.size(0), "all-to-all sends ", sending, " rows but the input has ",
              input.size(0));
  at::Tensor in = input.contiguous();
  auto sizes = in.sizes().vec();
  sizes[0] = std::accumulate(out_splits.begin(), out_splits.end(), int64_t{0});
  at::Tensor out = at::empty(sizes, in.options());
  std::vector<int64_t> out_rows(out_splits);
  std::vector<int64_t> in_rows(in_splits);
  c10d::AllToAllOptions opts;
  opts.timeout = pg->timeout;
  // A failure names the exchange whichever layer raised it (gloo's "Connection closed by
  // peer" says neither), so the trainer can tell a lost peer from a failing kernel.
  const std::string where = "all-to-all on rank " + std::to_string(pg->backend->getRank());
  try {
    auto work = pg->backend->alltoall_base(out, in, out_rows, in_rows, opts);
    if (!work->wait(pg->timeout)) {
      throw std::runtime_error("did not complete");
    }
  } catch (const c10::Error& e) {
    throw std::runtime_error(where + ": " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw std::runtime_error(where + ": " + e.what());
  }
  return out;
}

struct AllToAll : public torch::autograd::Function<AllToAll> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, int64_t pg,
                            std::vector<int64_t> out_splits, std::vector<int64_t> in_splits) {
    ctx->saved_data["pg"] = pg;
    ctx->saved_data["out_splits"] = out_splits;
    ctx->saved_data["in_splits"] = in_splits;
    return exchange(reinterpret_cast<tc_pg*>(pg), input, out_splits, in_splits);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* pg = reinterpret_cast<tc_pg*>(ctx->saved_data["pg"].toInt());
    auto out_splits = ctx->saved_data["out_splits"].toIntVector();
    auto in_splits = ctx->saved_data["in_splits"].toIntVector();
    // Gradients are materialised (zeros for an unused output), so every rank sends.
    at::Tensor back = exchange(pg, grads[0], in_splits, out_splits);
    return {back, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

extern "C" {

// `input` rows to the group's ranks (`in_splits[j]` to rank j), the rows received written to
// `*out` (`out_splits[j]` from rank j); `n` is the group's size. Differentiable.
char* tc_all_to_all(tc_pg* pg, const at::Tensor* input, const int64_t* out_splits,
                    const int64_t* in_splits, int64_t n, at::Tensor** out) {
  return tessera_shim::guarded([&] {
    *out = nullptr;
    std::vector<int64_t> outs(out_splits, out_splits + n);
    std::vector<int64_t> ins(in_splits, in_splits + n);
    at::Tensor result =
        AllToAll::apply(*input, reinterpret_cast<int64_t>(pg), std::move(outs), std::move(ins));
    *out = new at::Tensor(std::move(result));
  });
}

}  // extern "C"
