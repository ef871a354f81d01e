// --cuda-graph where it cannot run: the CPU backend and models whose step cannot be captured
// refuse it with one plain line (docs/cuda_graphs.md). The captured runs themselves are tested
// on a GPU (tests/gpu/test_cuda_graph.cpp).
#include <gtest/gtest.h>

#include <algorithm>

#include "command_util.h"
#include "fsdp/error.h"
#include "test_util.h"
#include "tools/trace_writer.h"

namespace fsdp::testing {
namespace {

TEST(CudaGraphCpu, CommandRefusesTheCpuBackendInOneLine) {
  CommandResult r = run_fsdp_command("train --backend cpu --cuda-graph --steps 2");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.code, -1) << "crashed";
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_NE(r.output.find("--cuda-graph needs the CUDA backend"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(".cpp:"), std::string::npos) << r.output;
}

TEST(CudaGraphCpu, TrainerOnACpuDeviceRaisesAUserError) {
  runtime::TrainConfig c;
  c.model.kind = "mlp";
  c.model.layers = 2;
  c.model.dim = 8;
  c.tokens = 4;
  c.steps = 3;
  c.cuda_graph = true;
  try {
    run_fsdp(1, c);
    FAIL() << "a CPU device captured a CUDA graph";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot capture CUDA graphs"), std::string::npos)
        << e.what();
  }
}

// Dropless routing runs on the host (Note [MoE routing]); a capacity factor captures, so only
// dropless is refused, and before any step.
TEST(CudaGraphCpu, TheDroplessMoeTransformerIsRefusedBeforeAnyStep) {
  runtime::TrainConfig c;
  c.model.kind = "moe-transformer";
  c.model.capacity_factor = 0;
  c.cuda_graph = true;
  int steps = 0;
  c.after_step = [&steps](runtime::TrainState&) { ++steps; };
  try {
    run_fsdp(1, c);
    FAIL() << "the MoE transformer's dropless host routing was captured";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("with dropless routing"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(steps, 0);
}

// The trace says which step was captured, on which streams, and whether the replays were timed
// op by op (Note [Timeline inside CUDA graphs]) or each replay is one op.
TEST(CudaGraphCpu, TraceSaysWhetherPerOpTimesWereRecordedUnderAGraph) {
  runtime::RankResult r;
  r.captured_step = 4;
  r.graph_streams = {"compute", "all-gather", "reduce-scatter"};
  const nlohmann::json trace = tools::build_trace_json({r});
  const nlohmann::json& entry = trace["otherData"]["fsdp"]["ranks"][0]["cuda_graph"];
  EXPECT_EQ(entry["captured_step"], 5);  // 1-based, as the step lines count
  EXPECT_EQ(entry["streams_used"], 3);
  EXPECT_EQ(entry["per_op_times"].get<std::string>().rfind("unavailable", 0), 0u);
  r.graph_op_times = true;
  EXPECT_EQ(tools::build_trace_json({r})["otherData"]["fsdp"]["ranks"][0]["cuda_graph"]
                ["per_op_times"].get<std::string>().rfind("recorded", 0), 0u);
  // An eager run's trace has no such entry.
  EXPECT_FALSE(tools::build_trace_json({runtime::RankResult{}})["otherData"]["fsdp"]["ranks"][0]
                   .contains("cuda_graph"));
}

}  // namespace
}  // namespace fsdp::testing
