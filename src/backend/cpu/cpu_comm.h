// In-process collectives for the CPU backend. See Note [CPU collectives] in cpu_comm.cpp.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cpu/cpu_device.h"
#include "backend/cpu/cpu_virtual_clock.h"
#include "fsdp/comm.h"

namespace fsdp::cpu {

enum class CollectiveOp : uint8_t { AllGather, ReduceScatter, AllReduce, Broadcast, AllToAll, Split };

// What one member brings to a rendezvous: enough to check that every member issued the same
// collective, and the buffers that the others read directly.
struct CollectiveCall {
  CollectiveOp op = CollectiveOp::AllGather;
  int64_t count = 0;
  DType dtype = DType::F32;
  ReduceOp reduce = ReduceOp::Sum;
  int root = 0;
  const void* send = nullptr;
  void* recv = nullptr;
  int color = 0, key = 0;  // Split
  std::vector<int64_t> send_counts = {}, recv_counts = {};  // AllToAll, per member
};

struct CommShared;

// One collective (communicator, sequence number) as the members meet it.
struct Rendezvous {
  explicit Rendezvous(int size)
      : calls(static_cast<size_t>(size)), present(static_cast<size_t>(size), false) {}
  std::vector<CollectiveCall> calls;  // indexed by member
  std::vector<bool> present;           // indexed by member: has it arrived?
  int arrived = 0;
  int departed = 0;
  // A member gave up before all had arrived (abort, or its device failed): nobody may read
  // its buffers any more, so the others give up too instead of exchanging.
  bool abandoned = false;
  int abandoned_by = -1;
  std::string abandon_reason;  // why it gave up: the timeout's message, or "aborted or failed"
  // Split: the new communicators' shared halves, made by the first member of each color.
  std::map<int, std::shared_ptr<CommShared>> split_children;
};

// The half of a communicator that its members share. Everything mutable is guarded by
// `mutex`; `cv` is notified on every change.
struct CommShared {
  CommShared(std::string comm_name, std::vector<int> ranks, double link_gbps, double timeout_s)
      : name(std::move(comm_name)),
        world_ranks(std::move(ranks)),
        link_gbps(link_gbps),
        timeout_s(timeout_s),
        finished(world_ranks.size(), 0) {}
  int size() const { return static_cast<int>(world_ranks.size()); }

  const std::string name;
  const std::vector<int> world_ranks;  // global rank of each member
  const double link_gbps;              // CpuOptions::link_gbps; split children inherit it
  const double timeout_s;              // CpuOptions::collective_timeout_s; likewise
  std::mutex mutex;
  ClockedCondition cv;
  std::vector<int64_t> finished;  // per member: collectives finished on that member's rank
  std::map<int64_t, std::shared_ptr<Rendezvous>> open;  // by sequence number
};

class CpuComm final : public Comm {
 public:
  // `member` is this rank's index in `shared` (its rank() in this communicator).
  CpuComm(CpuDevice& device, std::shared_ptr<CommShared> shared, int member, std::string name);

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

 private:
  // Takes the next sequence number now (issue order) and enqueues the collective on s.
  void launch(Stream s, const CollectiveCall& call);

  CpuDevice& device_;
  std::shared_ptr<CommShared> shared_;
  const int member_;
  int64_t next_seq_ = 0;  // host side: the rank thread issues collectives
};

}  // namespace fsdp::cpu
