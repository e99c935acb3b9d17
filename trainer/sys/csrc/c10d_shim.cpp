// tessera's C ABI over PyTorch's c10d (TCPStore, ProcessGroupGloo, ProcessGroupNCCL).
//
// Errors follow shim_error.h (NULL on success, else a heap C string freed with tc_free_error,
// defined here for every shim). Tensors cross as `torch::Tensor*` (what a tch
// Tensor wraps), so no data is copied. Collectives return a work handle that Rust waits on with
// a timeout; the handle keeps the c10d Work (which itself holds references to the tensors).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include "shim_error.h"
#include "c10d_group.h"
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#ifdef TESSERA_CUDA
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

struct tc_store {
  c10::intrusive_ptr<c10d::Store> store;
  uint16_t port;
};

struct tc_work {
  c10::intrusive_ptr<c10d::Work> work;
};

namespace {

using tessera_shim::dup_message;
using tessera_shim::guarded;

char* start(tc_pg* pg, tc_work** out, c10::intrusive_ptr<c10d::Work> (*issue)(tc_pg*, void*),
            void* args) {
  return guarded([&] {
    *out = nullptr;
    auto work = issue(pg, args);
    *out = new tc_work{std::move(work)};
  });
}

// c10d's flight recorder (a process-wide ring of the last 2,000 collectives, on by default)
// registers each group's status in a std::map before taking its lock (PyTorch 2.11,
// FlightRecorderDetail.hpp), so two groups of one process whose first collectives run on two
// threads at once corrupt that map: the in-process thread ranks of the tests crashed with
// SIGSEGV in _Rb_tree_insert_and_rebalance about once in 8 runs. tessera never dumps the
// recorder, so it is switched off before the first group exists (the singleton reads
// TORCH_FR_BUFFER_SIZE once). A TORCH_FR_BUFFER_SIZE the user set is left as it is.
void quiet_flight_recorder() {
  static std::once_flag once;
  std::call_once(once, [] { setenv("TORCH_FR_BUFFER_SIZE", "0", /*overwrite=*/0); });
}

}  // namespace

extern "C" {

void tc_free_error(char* err) { std::free(err); }

char* tc_store_new(const char* host, uint16_t port, int is_server, int world_size,
                   int64_t timeout_ms, const char* prefix, tc_store** out) {
  return guarded([&] {
    *out = nullptr;
    c10d::TCPStoreOptions opts;
    opts.port = port;
    opts.isServer = is_server != 0;
    opts.numWorkers = static_cast<std::size_t>(world_size);
    // The process group's own rendezvous synchronises the ranks; not waiting here lets the
    // server report an OS-assigned port (port 0) before the clients connect.
    opts.waitWorkers = false;
    opts.timeout = std::chrono::milliseconds(timeout_ms);
    auto tcp = c10::make_intrusive<c10d::TCPStore>(std::string(host), opts);
    uint16_t bound = tcp->getPort();
    c10::intrusive_ptr<c10d::Store> store =
        c10::make_intrusive<c10d::PrefixStore>(std::string(prefix), tcp);
    *out = new tc_store{std::move(store), bound};
  });
}

uint16_t tc_store_port(const tc_store* store) { return store->port; }

void tc_store_free(tc_store* store) { delete store; }

// Sets `key` to the `len` bytes at `data` (the liveness heartbeats).
char* tc_store_set(tc_store* store, const char* key, const uint8_t* data, int64_t len) {
  return guarded([&] {
    std::vector<uint8_t> value(data, data + len);
    store->store->set(std::string(key), value);
  });
}

// Copies `key`'s value into `buf` (at most `cap` bytes) and its length into `*len`, or sets
// `*len` to -1 when the key is not set yet. Never waits for the key.
char* tc_store_get_if_set(tc_store* store, const char* key, uint8_t* buf, int64_t cap,
                          int64_t* len) {
  return guarded([&] {
    *len = -1;
    std::string k(key);
    if (!store->store->check({k})) {
      return;
    }
    auto value = store->store->get(k);
    auto n = std::min<int64_t>(cap, static_cast<int64_t>(value.size()));
    std::copy(value.begin(), value.begin() + n, buf);
    *len = static_cast<int64_t>(value.size());
  });
}

char* tc_pg_gloo_new(tc_store* store, int rank, int world_size, const char* hostname,
                     int64_t timeout_ms, tc_pg** out) {
  return guarded([&] {
    *out = nullptr;
    quiet_flight_recorder();
    auto timeout = std::chrono::milliseconds(timeout_ms);
    auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
    if (hostname != nullptr && hostname[0] != '\0') {
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(hostname));
    } else {
      opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    }
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store->store, rank, world_size, opts);
    *out = new tc_pg{pg, timeout};
  });
}

int tc_nccl_available() {
#ifdef TESSERA_CUDA
  return 1;
#else
  return 0;
#endif
}

char* tc_pg_nccl_new(tc_store* store, int rank, int world_size, int64_t timeout_ms, tc_pg** out) {
#ifdef TESSERA_CUDA
  return guarded([&] {
    *out = nullptr;
    quiet_flight_recorder();
    auto timeout = std::chrono::milliseconds(timeout_ms);
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = timeout;
    auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store->store, rank, world_size, opts);
    *out = new tc_pg{pg, timeout};
  });
#else
  (void)store;
  (void)rank;
  (void)world_size;
  (void)timeout_ms;
  *out = nullptr;
  return dup_message("tessera was built without the `cuda` feature: ProcessGroupNCCL is absent");
#endif
}

void tc_pg_free(tc_pg* pg) { delete pg; }

struct pair_args {
  at::Tensor* out;
  at::Tensor* in;
};

char* tc_all_gather_base(tc_pg* pg, at::Tensor* out_full, at::Tensor* in_shard, tc_work** work) {
  pair_args args{out_full, in_shard};
  return start(pg, work, [](tc_pg* p, void* a) {
    auto* t = static_cast<pair_args*>(a);
    c10d::AllgatherOptions opts;
    opts.timeout = p->timeout;
    return p->backend->_allgather_base(*t->out, *t->in, opts);
  }, &args);
}

char* tc_reduce_scatter_base(tc_pg* pg, at::Tensor* out_shard, at::Tensor* in_full,
                             tc_work** work) {
  pair_args args{out_shard, in_full};
  return start(pg, work, [](tc_pg* p, void* a) {
    auto* t = static_cast<pair_args*>(a);
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = c10d::ReduceOp::SUM;
    opts.timeout = p->timeout;
    return p->backend->_reduce_scatter_base(*t->out, *t->in, opts);
  }, &args);
}

char* tc_all_reduce_sum(tc_pg* pg, at::Tensor* tensor, tc_work** work) {
  return start(pg, work, [](tc_pg* p, void* a) {
    std::vector<at::Tensor> tensors{*static_cast<at::Tensor*>(a)};
    c10d::AllreduceOptions opts;
    opts.reduceOp = c10d::ReduceOp::SUM;
    opts.timeout = p->timeout;
    return p->backend->allreduce(tensors, opts);
  }, tensor);
}

struct broadcast_args {
  at::Tensor* tensor;
  int root;
};

char* tc_broadcast(tc_pg* pg, at::Tensor* tensor, int root, tc_work** work) {
  broadcast_args args{tensor, root};
  return start(pg, work, [](tc_pg* p, void* a) {
    auto* t = static_cast<broadcast_args*>(a);
    std::vector<at::Tensor> tensors{*t->tensor};
    c10d::BroadcastOptions opts;
    opts.rootRank = t->root;
    opts.timeout = p->timeout;
    return p->backend->broadcast(tensors, opts);
  }, &args);
}

char* tc_barrier(tc_pg* pg, tc_work** work) {
  return start(pg, work, [](tc_pg* p, void*) {
    c10d::BarrierOptions opts;
    opts.timeout = p->timeout;
    return p->backend->barrier(opts);
  }, nullptr);
}

// Waits for the work; a timeout or a failed collective comes back as the error string.
char* tc_work_wait(tc_work* work, int64_t timeout_ms) {
  return guarded([&] {
    if (!work->work->wait(std::chrono::milliseconds(timeout_ms))) {
      throw std::runtime_error("collective did not complete");
    }
  });
}

void tc_work_free(tc_work* work) { delete work; }

}  // extern "C"
