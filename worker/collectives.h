#pragma once

// The c10d type of libddp's collectives (ProcessGroup::collectives).
#include <torch/version.h>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#endif

namespace ddprun::worker {

// In 1.13 a backend (ProcessGroupGloo, ProcessGroupNCCL) *is* a
// c10d::ProcessGroup; from 2.0 it is a c10d::Backend wrapped by one. libddp
// holds the backend directly: both types offer broadcast and allreduce on
// std::vector<at::Tensor>& with the same options structs.
#if TORCH_VERSION_MAJOR >= 2
using Collectives = ::c10d::Backend;
#else
using Collectives = ::c10d::ProcessGroup;
#endif

}  // namespace ddprun::worker
