#include "launcher/cli/nproc.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ddprun::launcher {
namespace {

using ::testing::HasSubstr;

GpuProbe Host(int gpus, int cpus) {
  GpuProbe probe;
  probe.device_nodes = gpus;
  probe.cpus = cpus;
  return probe;
}

TEST(NprocTest, NumbersAndCpu) {
  EXPECT_EQ(*ResolveNprocPerNode("3", Host(8, 16)), 3);
  EXPECT_EQ(*ResolveNprocPerNode("cpu", Host(8, 16)), 16);
  EXPECT_FALSE(ResolveNprocPerNode("0", Host(0, 4)).ok());
  EXPECT_FALSE(ResolveNprocPerNode("two", Host(0, 4)).ok());
}

TEST(NprocTest, GpuAndAutoCountDeviceNodes) {
  EXPECT_EQ(*ResolveNprocPerNode("gpu", Host(4, 64)), 4);
  EXPECT_EQ(*ResolveNprocPerNode("auto", Host(4, 64)), 4);
}

TEST(NprocTest, AutoWithoutGpusIsTheCpuCountAsTorchrun) {
  EXPECT_EQ(*ResolveNprocPerNode("auto", Host(0, 12)), 12);
}

TEST(NprocTest, GpuWithoutGpusIsAClearError) {
  absl::StatusOr<int> n = ResolveNprocPerNode("gpu", Host(0, 12));
  ASSERT_FALSE(n.ok());
  EXPECT_THAT(n.status().message(), HasSubstr("no GPU found"));
  EXPECT_THAT(n.status().message(), HasSubstr("--nproc-per-node auto"));
}

TEST(NprocTest, CudaVisibleDevicesNarrows) {
  GpuProbe p = Host(8, 64);
  p.cuda_visible_devices = "0,3";
  EXPECT_EQ(CountGpus(p), 2);
  p.cuda_visible_devices = "";
  EXPECT_EQ(CountGpus(p), 0);
  EXPECT_EQ(*ResolveNprocPerNode("auto", p), 64);
  p.cuda_visible_devices = "-1";
  EXPECT_EQ(CountGpus(p), 0);
  // CUDA stops at the first invalid entry.
  p.cuda_visible_devices = "1,2,-1,3";
  EXPECT_EQ(CountGpus(p), 2);
  p.cuda_visible_devices = "0,9";
  EXPECT_EQ(CountGpus(p), 1);
  p.cuda_visible_devices = "GPU-1a2b,MIG-3c4d";
  EXPECT_EQ(CountGpus(p), 2);
}

TEST(NprocTest, NvidiaVisibleDevicesNarrows) {
  GpuProbe p = Host(4, 8);
  p.nvidia_visible_devices = "all";
  EXPECT_EQ(CountGpus(p), 4);
  p.nvidia_visible_devices = "none";
  EXPECT_EQ(CountGpus(p), 0);
  p.nvidia_visible_devices = "void";
  EXPECT_EQ(CountGpus(p), 0);
  p.nvidia_visible_devices = "0,1";
  EXPECT_EQ(CountGpus(p), 2);
  // Set in a CUDA image on a host without GPUs: still none.
  GpuProbe bare = Host(0, 8);
  bare.nvidia_visible_devices = "all";
  EXPECT_EQ(CountGpus(bare), 0);
}

}  // namespace
}  // namespace ddprun::launcher
