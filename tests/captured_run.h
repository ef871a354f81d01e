// Runs the trainer with --cuda-graph on CPU ranks, each rank's device and communicators
// wrapped in the CUDA-graph emulator (graph_emulator.h).
#pragma once

#include <memory>
#include <vector>

#include "graph_emulator.h"
#include "test_util.h"

namespace fsdp::testing {

struct CapturedRun {
  std::vector<runtime::RankResult> ranks;
  std::vector<int> replays;               // per rank
  std::vector<int64_t> graph_peak_bytes;  // per rank: kept state plus the graph's memory plan
};

inline CapturedRun run_captured(int world, runtime::TrainConfig c) {
  c.cuda_graph = true;
  CapturedRun run;
  run.ranks.resize(world);
  run.replays.resize(world);
  run.graph_peak_bytes.resize(world);
  runtime::run_cpu_ranks(world, {}, [&](int rank, Device& device, std::shared_ptr<Comm> comm) {
    GraphEmulatorDevice graphs(device);
    auto comm_in_graphs = std::make_shared<GraphEmulatorComm>(comm, graphs);
    run.ranks[rank] = runtime::train_rank(graphs, comm_in_graphs, c);
    run.replays[rank] = graphs.replays();
    run.graph_peak_bytes[rank] = graphs.bytes_before_capture() + graphs.graph_memory_bytes();
  });
  return run;
}

}  // namespace fsdp::testing
