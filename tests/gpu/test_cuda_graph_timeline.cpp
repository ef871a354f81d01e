// Per-op times inside CUDA graphs (Note [Timeline inside CUDA graphs]): a graph captured with
// the timeline on records its ops' events in the graph, and each replay puts those ops on the
// timeline. First the Device on its own, with spins of known minimum length, then a traced
// `fsdp train --cuda-graph` against the eager trace of the same flags.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../command_util.h"
#include "cuda_test_util.h"
#include "backend/cuda/cuda_backend.h"

namespace fsdp {
namespace {

// Event timestamps of different streams jitter by about 0.5 us.
constexpr double kJitterUs = 2.0;

class CudaGraphTimeline : public cuda_test::CudaTwoStreamTest {
 protected:
  void SetUp() override {
    CudaTwoStreamTest::SetUp();
    if (IsSkipped()) return;
    fork = device->create_event();
    join = device->create_event();
  }
  void TearDown() override {
    if (!device) return;
    device->synchronize();
    device->destroy_event(fork);
    device->destroy_event(join);
  }
  // "a" (200 us) on compute, forking "b" (300 us) on the side stream, then "c" (100 us) on
  // compute after b joins back.
  int capture_fork_join() {
    device->begin_capture(s);
    device->set_label("a");
    device->spin(s, 200);
    device->record_event(fork, s);
    device->set_label("fork");
    device->wait_event(side, fork);
    device->set_label("b");
    device->spin(side, 300);
    device->record_event(join, side);
    device->set_label("join");
    device->wait_event(s, join);
    device->set_label("c");
    device->spin(s, 100);
    return device->end_capture(s);
  }
  std::vector<TimelineOp> ops_labelled(const Timeline& t, const std::string& label,
                                       OpKind kind) {
    std::vector<TimelineOp> out;
    for (const TimelineOp& op : t.ops)
      if (op.label == label && op.kind == kind) out.push_back(op);
    std::sort(out.begin(), out.end(),
              [](const TimelineOp& x, const TimelineOp& y) { return x.start_us < y.start_us; });
    return out;
  }
  // The ops of `replays` replays, each where the graph's dependencies put it.
  void expect_replays(const Timeline& t, size_t replays) {
    const auto a = ops_labelled(t, "a", OpKind::Kernel);
    const auto b = ops_labelled(t, "b", OpKind::Kernel);
    const auto c = ops_labelled(t, "c", OpKind::Kernel);
    const auto joins = ops_labelled(t, "join", OpKind::Wait);
    ASSERT_EQ(a.size(), replays);
    ASSERT_EQ(b.size(), replays);
    ASSERT_EQ(c.size(), replays);
    ASSERT_EQ(joins.size(), replays);
    for (size_t r = 0; r < replays; ++r) {
      EXPECT_EQ(a[r].stream, s.id);
      EXPECT_EQ(b[r].stream, side.id);
      EXPECT_EQ(c[r].stream, s.id);
      // A spin lasts at least its length (it reads the GPU's clock until it has passed).
      EXPECT_GE(a[r].end_us - a[r].start_us, 200.0 - kJitterUs);
      EXPECT_GE(b[r].end_us - b[r].start_us, 300.0 - kJitterUs);
      EXPECT_GE(c[r].end_us - c[r].start_us, 100.0 - kJitterUs);
      EXPECT_GE(b[r].start_us, a[r].end_us - kJitterUs) << "b forks after a";
      EXPECT_GE(c[r].start_us, b[r].end_us - kJitterUs) << "c waits for b";
      EXPECT_EQ(joins[r].stream, s.id);
      EXPECT_EQ(joins[r].waited_for, "b");
      EXPECT_GE(joins[r].end_us, b[r].end_us - kJitterUs);
      EXPECT_LE(joins[r].start_us, a[r].end_us + kJitterUs) << "the wait starts after a";
      if (r > 0) {
        EXPECT_GE(a[r].start_us, c[r - 1].end_us - kJitterUs) << "replays in order";
      }
    }
  }
  Event fork, join;
};

TEST_F(CudaGraphTimeline, EachReplayTimesTheGraphsOps) {
  device->enable_timeline(true);
  const int graph = capture_fork_join();
  EXPECT_TRUE(device->graph_has_op_times(graph));
  EXPECT_TRUE(ops_labelled(device->take_timeline(), "a", OpKind::Kernel).empty())
      << "the capture runs nothing";
  device->set_label("replay");
  device->replay(graph, s);
  const Timeline one = device->take_timeline();
  expect_replays(one, 1);
  EXPECT_TRUE(ops_labelled(one, "replay", OpKind::Kernel).empty())
      << "a timed graph's ops replace the one replay op";
  // Two replays before a take: the first one's times are kept before the second records the
  // graph's events again.
  device->replay(graph, s);
  device->replay(graph, s);
  expect_replays(device->take_timeline(), 2);
  // A replay left untaken when the graph goes keeps its times too.
  device->replay(graph, s);
  device->destroy_graph(graph);
  expect_replays(device->take_timeline(), 1);
}

TEST_F(CudaGraphTimeline, AGraphCapturedWithoutTheTimelineIsOneOp) {
  const int graph = capture_fork_join();
  EXPECT_FALSE(device->graph_has_op_times(graph));
  device->enable_timeline(true);
  device->set_label("replay");
  device->replay(graph, s);
  const Timeline t = device->take_timeline();
  EXPECT_TRUE(ops_labelled(t, "a", OpKind::Kernel).empty());
  const auto replays = ops_labelled(t, "replay", OpKind::Kernel);
  ASSERT_EQ(replays.size(), 1u);
  EXPECT_GE(replays[0].end_us - replays[0].start_us, 500.0 - kJitterUs);  // a + b + c at least
  device->destroy_graph(graph);
}

// ---- the trainer: a traced captured run has every FSDP op of every replayed step

nlohmann::json run_trace(const std::string& args, const std::string& name) {
  const std::string path = ::testing::TempDir() + "/graph_trace_" + name + ".json";
  const testing::CommandResult r = testing::run_fsdp_command(
      "train --backend cuda --nproc 1 --steps 8 --warmup 2 --quiet --trace " + path + " " +
      args);
  EXPECT_EQ(r.code, 0) << args << "\n" << r.output;
  std::ifstream in(path);
  if (r.code != 0 || !in) return nlohmann::json::object();
  return nlohmann::json::parse(in);
}

bool is_fsdp_op(const std::string& name) {
  for (const char* prefix : {"AG ", "RS ", "fwd ", "bwd "})
    if (name.rfind(prefix, 0) == 0) return true;
  return false;
}

// How many times each FSDP op (all-gathers, reduce-scatters, forward and backward kernels)
// ran in the traced steps; waits are left out (a capture drops waits on earlier steps' events).
std::map<std::string, int> fsdp_op_counts(const nlohmann::json& trace) {
  std::map<std::string, int> counts;
  if (!trace.contains("traceEvents")) return counts;
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "X" && e["cat"] != "wait" && e["cat"] != "host" &&
        is_fsdp_op(e["name"].get<std::string>()))
      ++counts[e["name"].get<std::string>()];
  return counts;
}

// Ops of one stream never overlap, inside a graph as outside.
void expect_no_overlap_per_stream(const nlohmann::json& trace) {
  std::map<int, std::vector<std::pair<double, double>>> by_tid;
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "X" && e["cat"] != "wait" && e["cat"] != "host")
      by_tid[e["tid"].get<int>()].push_back(
          {e["ts"].get<double>(), e["ts"].get<double>() + e["dur"].get<double>()});
  for (auto& [tid, spans] : by_tid) {
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i)
      EXPECT_GE(spans[i].first, spans[i - 1].second - kJitterUs) << "track " << tid << " op " << i;
  }
}

TEST(CudaGraphTrainTrace, ReplayedStepsHaveEveryOpOfAnEagerStep) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  // The next step's prefetch (on by default, off under graphs) would move the first layer's
  // all-gather into the step before: off in both, so that every traced step issues the same.
  const std::string args = "--model mlp --layers 4 --dim 256 --tokens 512 --param-dtype bf16 "
                           "--rs-max-input-buffers 2 --prefetch-next-step 0";
  const nlohmann::json eager = run_trace(args, "eager");
  const nlohmann::json graph = run_trace(args + " --cuda-graph", "graph");
  ASSERT_TRUE(graph.contains("otherData"));
  const auto& entry = graph["otherData"]["fsdp"]["ranks"][0];
  EXPECT_EQ(entry["cuda_graph"]["per_op_times"].get<std::string>().rfind("recorded", 0), 0u)
      << entry["cuda_graph"].dump();
  EXPECT_EQ(entry["metrics"]["streams_used"], 3);
  const std::map<std::string, int> eager_counts = fsdp_op_counts(eager);
  std::map<std::string, int> graph_counts = fsdp_op_counts(graph);
  EXPECT_EQ(graph_counts, eager_counts) << "the 6 traced steps run the same FSDP ops";
  // Per layer and traced step: the forward all-gather's copy-in and the backward re-gather's,
  // one forward and one backward GEMM (the first layer computes no input grad).
  for (int layer = 0; layer < 4; ++layer) {
    const std::string name = "layers." + std::to_string(layer);
    EXPECT_EQ(graph_counts["AG copy-in " + name], 12) << name;
    EXPECT_EQ(graph_counts["fwd " + name + " gemm+relu"], 6) << name;
    EXPECT_EQ(graph_counts["bwd " + name + " gemm dW"], 6) << name;
  }
  expect_no_overlap_per_stream(graph);
}

}  // namespace
}  // namespace fsdp
