// `fsdp train --memory-budget auto` on the CUDA backend: the budget starts from the memory a
// fresh process finds free on the GPU (its context and other processes' memory taken), not
// from the card's total (docs/memory.md).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "../command_util.h"
#include "backend/cuda/cuda_backend.h"

namespace fsdp {
namespace {

TEST(CudaMemoryBudget, AutoStartsFromTheMemoryAFreshProcessFindsFree) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  // This process holds a context, so what it sees free bounds what the command's child sees.
  const GpuMemory here = cuda::device_memory(0);
  ASSERT_GT(here.free_bytes, 0);
  ASSERT_LT(here.free_bytes, here.total_bytes);
  const std::string json = ::testing::TempDir() + "/memory_budget_auto.json";
  const testing::CommandResult r = testing::run_fsdp_command(
      "train --backend cuda --nproc 1 --steps 2 --warmup 1 --quiet --model transformer "
      "--layers 2 --dim 256 --heads 4 --kv-heads 2 --seq-len 128 --vocab 512 --tokens 512 "
      "--param-dtype bf16 --memory-budget auto --json " + json);
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string marker = "in a budget of ";
  const size_t at = r.output.find(marker);
  ASSERT_NE(at, std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" free (of ", at), std::string::npos) << r.output;
  const double budget_gib = std::stod(r.output.substr(at + marker.size()));
  const double gib = 1024.0 * 1024.0 * 1024.0;
  // The budget is the child's free memory less 1 GiB: below this process's free memory less
  // that GiB (to the printed two places), and so below the card's total less it.
  EXPECT_LT(budget_gib, (here.free_bytes - gib) / gib + 0.01) << r.output;
  EXPECT_GT(budget_gib, 0.5 * here.free_bytes / gib) << r.output;
  std::ifstream in(json);
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(text.str());
  EXPECT_NE(j["memory_plan"].get<std::string>(), "") << j.dump();
  EXPECT_LT(j["predicted_peak_bytes"].get<double>() / gib, budget_gib) << j.dump();
}

}  // namespace
}  // namespace fsdp
