// The process group handle the c10d shims share (c10d_shim.cpp creates it, all_to_all.cpp
// runs an autograd collective on it).
#pragma once

#include <chrono>

#include <torch/csrc/distributed/c10d/Backend.hpp>

struct tc_pg {
  c10::intrusive_ptr<c10d::Backend> backend;
  std::chrono::milliseconds timeout;
};
