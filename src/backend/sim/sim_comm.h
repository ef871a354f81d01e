// Simulated communicators: the members are known, one of them runs (Note [Symmetric
// ranks]), and each collective takes the link model's time (Note [Simulated collectives] in
// sim_comm.cpp).
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cpu/cpu_virtual_clock.h"
#include "backend/sim/sim_device.h"
#include "fsdp/comm.h"

namespace fsdp::sim {

// Where a communicator's members sit: how many nodes it spans and how many members share a
// node (the most on any one node).
struct CommPlacement {
  int members = 1, nodes = 1, per_node = 1;
};
CommPlacement placement_of(const std::vector<int>& world_ranks, int gpus_per_node);

enum class SimCollective : uint8_t { AllGather, ReduceScatter, AllReduce, Broadcast, AllToAll };

// The time of one collective on an idle link: a latency, then a transfer of `transfer_us` at
// the full bandwidth of its bottleneck link (network when `network`), which it shares with
// the other transfers on that link while they overlap (Note [Shared channels]).
struct CollectiveCost {
  double latency_us = 0, transfer_us = 0;
  bool network = false;
};
// `bytes`: NCCL's message size (the all-gather's output, the reduce-scatter's input, the
// all-reduce's buffer); for an all-to-all, the bytes sent to peers on this node and on others.
CollectiveCost collective_cost(const Calibration& c, SimCollective kind, const CommPlacement& p,
                               double bytes, double a2a_local_bytes = 0,
                               double a2a_remote_bytes = 0);

struct SimCommState {
  std::string name;
  std::vector<int> world_ranks;
  int member = 0;  // the simulated rank's index
  CommPlacement placement;
  // One collective at a time, in issue order (Note [Collective semantics]).
  std::mutex mutex;
  cpu::ClockedCondition cv;
  int64_t finished = 0;
  std::vector<int> block_splits;  // group sizes of the consecutive splits made from it
};

class SimComm final : public Comm {
 public:
  SimComm(SimDevice& device, std::shared_ptr<SimCommState> state);
  const SimCommState& state() const { return *state_; }

 protected:
  void do_all_gather(const void* send, void* recv, int64_t count, DType t, Stream s) override;
  void do_reduce_scatter(const void* send, void* recv, int64_t count, DType t, ReduceOp op,
                         Stream s) override;
  void do_all_reduce(const void* send, void* recv, int64_t count, DType t, ReduceOp op,
                     Stream s) override;
  void do_broadcast(void* buf, int64_t count, DType t, int root, Stream s) override;
  void do_all_to_all(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                     const std::vector<int64_t>& recv_counts, DType t, Stream s) override;
  std::unique_ptr<Comm> do_split(int color, int key, const std::string& name) override;
  std::unique_ptr<Comm> do_split_groups(int group_size, int stride, int color,
                                        const std::string& name) override;

 private:
  // Takes the next turn on the communicator now and enqueues the collective on s.
  void launch(Stream s, const char* op, double bytes, const CollectiveCost& cost);
  void launch_kind(Stream s, SimCollective kind, const char* op, double bytes);

  SimDevice& device_;
  std::shared_ptr<SimCommState> state_;
  int64_t next_seq_ = 0;
};

}  // namespace fsdp::sim
