#pragma once

// The one place where LibTorch versions differ for libddp. Debian's 1.13
// (CPU) is what CI builds; 2.x (often with CUDA) is what GPU users have.
#include <torch/version.h>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

namespace ddprun::worker {

// In 1.13 a backend (ProcessGroupGloo, ProcessGroupNCCL) *is* a
// c10d::ProcessGroup; from 2.0 it is a c10d::Backend wrapped by one. libddp
// holds the backend directly: both types offer broadcast and allreduce on
// std::vector<at::Tensor>& with the same options structs.
#if TORCH_VERSION_MAJOR >= 2
}  // namespace ddprun::worker
#include <torch/csrc/distributed/c10d/Backend.hpp>
namespace ddprun::worker {
using Collectives = ::c10d::Backend;
#else
using Collectives = ::c10d::ProcessGroup;
#endif

// LibTorch 2.x's Store has a clone() (pure virtual from 2.5) that gives each
// thread of ProcessGroupNCCL its own client.
#if TORCH_VERSION_MAJOR >= 2
#define DDPRUN_STORE_HAS_CLONE 1
#else
#define DDPRUN_STORE_HAS_CLONE 0
#endif

// c10::Allocator::allocate is const in 1.13 and not from 2.x, where
// copy_data is pure virtual too.
#if TORCH_VERSION_MAJOR >= 2
#define DDPRUN_ALLOCATE_CONST
#define DDPRUN_ALLOCATOR_HAS_COPY_DATA 1
#else
#define DDPRUN_ALLOCATE_CONST const
#define DDPRUN_ALLOCATOR_HAS_COPY_DATA 0
#endif

}  // namespace ddprun::worker
