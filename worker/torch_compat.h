#pragma once

// Where LibTorch versions differ for libddp's internals (the public type
// that differs is in worker/collectives.h). Debian's 1.13 (CPU) is what CI
// builds; 2.x (often with CUDA) is what GPU users have.
#include <torch/version.h>

// Collectives (the c10d type of a backend) is public: worker/collectives.h.
#include "worker/collectives.h"

namespace ddprun::worker {

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
