// Activation checkpointing on the CUDA backend (Note [Activation checkpointing]): `fsdp train
// --activation-checkpointing` against the same run without it, eager and captured. The
// recompute runs the forward's own kernels on the same inputs, so with the CUDA-core attention
// (FSDP_ATTENTION=simt: cuDNN's fused attention backward may differ from run to run) every
// loss and grad norm is the same bits; the peak falls in the order none > selective > full.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../command_util.h"
#include "backend/cuda/cuda_backend.h"

namespace fsdp {
namespace {

nlohmann::json run_json(const std::string& args, const std::string& name) {
  const std::string path = ::testing::TempDir() + "/checkpointing_" + name + ".json";
  const testing::CommandResult r = testing::run_fsdp_command(
      "train --backend cuda --nproc 1 --steps 8 --warmup 2 --quiet --json " + path + " " + args);
  EXPECT_EQ(r.code, 0) << args << "\n" << r.output;
  std::ifstream in(path);
  if (r.code != 0 || !in) return nlohmann::json::object();
  return nlohmann::json::parse(in);
}

void expect_same_steps(const nlohmann::json& got, const nlohmann::json& want,
                       const std::string& what) {
  ASSERT_TRUE(want.contains("losses") && got.contains("losses")) << what;
  EXPECT_EQ(got["losses"], want["losses"]) << what;
  EXPECT_EQ(got["grad_norms"], want["grad_norms"]) << what;
}

void expect_checkpointing_is_bitwise(const std::string& args, const std::string& name) {
  setenv("FSDP_ATTENTION", "simt", 1);
  const nlohmann::json none = run_json(args, name + "_none");
  double previous_peak = none.value("peak_mem_bytes", 0.0);
  for (const char* mode : {"selective", "full"}) {
    const std::string with = args + " --activation-checkpointing " + mode;
    const nlohmann::json eager = run_json(with, name + "_" + mode);
    expect_same_steps(eager, none, with);
    EXPECT_EQ(eager["activation_checkpointing"], mode);
    const double peak = eager.value("peak_mem_bytes", 0.0);
    std::printf("%s: peak %.1f MiB (without checkpointing %.1f MiB), step_ms median %.3f (%.3f)\n",
                with.c_str(), peak / 1048576.0, none.value("peak_mem_bytes", 0.0) / 1048576.0,
                eager.value("step_ms_median", 0.0), none.value("step_ms_median", 0.0));
    EXPECT_LT(peak, previous_peak) << with;
    previous_peak = peak;
    // Captured: the recompute is more device work inside the same step.
    const nlohmann::json graph = run_json(with + " --cuda-graph", name + "_" + mode + "_graph");
    expect_same_steps(graph, none, with + " --cuda-graph");
  }
  unsetenv("FSDP_ATTENTION");
}

TEST(CudaActivationCheckpointing, TransformerIsBitwiseEagerAndCaptured) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  expect_checkpointing_is_bitwise(
      "--model transformer --layers 4 --dim 256 --heads 4 --kv-heads 2 --seq-len 128 "
      "--vocab 512 --tokens 1024 --param-dtype bf16 --micro-batches 2",
      "transformer");
}

TEST(CudaActivationCheckpointing, MoeTransformerWithCapacityIsBitwiseEagerAndCaptured) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  expect_checkpointing_is_bitwise(
      "--model moe-transformer --layers 4 --dim 256 --heads 4 --seq-len 128 --vocab 512 "
      "--experts 4 --top-k 2 --tokens 1024 --capacity-factor 1.25 --param-dtype bf16 "
      "--optimizer-in-forward 1",
      "moe_transformer");
}

}  // namespace
}  // namespace fsdp
