// The Comm interface: NCCL-like collectives over the ranks of one communicator.
//
// Note [Collective semantics]
// Collectives are enqueued on a Device stream like any other op (Note [Stream semantics]).
// One communicator runs one collective at a time, in the order the host issued them, as NCCL
// does: two collectives on the same communicator never overlap, even on different streams.
// Two communicators progress independently, so a reduce-scatter on a split-off communicator
// can run under an all-gather on the first. Every rank must issue the same collectives in
// the same order on a communicator (docs/design.md, invariant 4); the CPU backend checks
// this and raises a clear error on a mismatch.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/device.h"
#include "fsdp/dtype.h"

namespace fsdp {

// Max: the fp8 scales' amax (docs/fp8.md); NaN wins, as NCCL's max of a NaN gives NaN.
enum class ReduceOp : uint8_t { Sum, Avg, Max };
const char* reduce_op_name(ReduceOp op);  // "sum" | "avg" | "max"
enum class CollectiveKind : uint8_t { AllGather, ReduceScatter, AllReduce, Broadcast, AllToAll, Count };
constexpr int kCollectiveKindCount = static_cast<int>(CollectiveKind::Count);
const char* collective_name(CollectiveKind kind);

class Comm {
 public:
  virtual ~Comm() = default;

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(world_ranks_.size()); }
  const std::string& name() const { return name_; }
  // The ranks of the launch (global ranks) that this communicator spans, in rank order.
  const std::vector<int>& world_ranks() const { return world_ranks_; }

  // recv holds size() * count elements; send may be recv + rank() * count (in place). Over one
  // rank, in place, all_gather and reduce_scatter launch nothing (Note [One-rank collectives]).
  void all_gather(const void* send, void* recv, int64_t count, DType t, Stream s);
  // send holds size() * count elements, rank-major; recv gets this rank's reduced chunk.
  void reduce_scatter(const void* send, void* recv, int64_t count, DType t, ReduceOp op,
                      Stream s);
  void all_reduce(const void* send, void* recv, int64_t count, DType t, ReduceOp op, Stream s);
  void broadcast(void* buf, int64_t count, DType t, int root, Stream s);
  // All-to-all with per-peer counts (elements; uneven and zero counts allowed): send holds
  // send_counts[0] elements for member 0, then send_counts[1] for member 1, ...; recv gets
  // recv_counts[j] elements from member j, in member order. recv_counts[j] must equal member
  // j's send_counts[rank()]; send and recv must not overlap. Both backends check the counts
  // of every pair (the CPU backend raises a one-line error on a mismatch).
  void all_to_all(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                  const std::vector<int64_t>& recv_counts, DType t, Stream s);

  // Collective over this communicator: ranks with the same color form a new communicator,
  // ordered by (key, rank). A negative color takes no part and gets nullptr.
  std::unique_ptr<Comm> split(int color, int key, const std::string& name);
  // Note [Group splits]
  // split() into equal groups of `group_size` members spaced `stride` apart: member m joins
  // the members b * stride * group_size + m % stride + i * stride (i < group_size), where
  // b = m / (stride * group_size), in member order. stride 1: consecutive members; stride s
  // with group_size size() / s: every s-th member. It is split(color, rank()) with that
  // group's color; what it adds is that the backend learns the layout, which the simulation
  // backend needs: it runs one rank for all, so it cannot learn the others' colors.
  // size() must be a multiple of stride * group_size.
  std::unique_ptr<Comm> split_groups(int group_size, int stride, const std::string& name);

  // How many collectives of each kind this rank issued (for exact-count tests).
  int64_t issued(CollectiveKind kind) const { return issued_[static_cast<int>(kind)]; }
  void reset_issued() {
    for (auto& n : issued_) n = 0;
  }

 protected:
  Comm(int rank, std::vector<int> world_ranks, std::string name)
      : rank_(rank), world_ranks_(std::move(world_ranks)), name_(std::move(name)) {}

  virtual void do_all_gather(const void* send, void* recv, int64_t count, DType t, Stream s) = 0;
  virtual void do_reduce_scatter(const void* send, void* recv, int64_t count, DType t,
                                 ReduceOp op, Stream s) = 0;
  virtual void do_all_reduce(const void* send, void* recv, int64_t count, DType t, ReduceOp op,
                             Stream s) = 0;
  virtual void do_broadcast(void* buf, int64_t count, DType t, int root, Stream s) = 0;
  virtual void do_all_to_all(const void* send, const std::vector<int64_t>& send_counts,
                             void* recv, const std::vector<int64_t>& recv_counts, DType t,
                             Stream s) = 0;
  virtual std::unique_ptr<Comm> do_split(int color, int key, const std::string& name) = 0;
  // `color` is the group's, as split_groups computed it; the default is do_split.
  virtual std::unique_ptr<Comm> do_split_groups(int group_size, int stride, int color,
                                                const std::string& name) {
    (void)group_size;
    (void)stride;
    return do_split(color, rank(), name);
  }

 private:
  int rank_;
  std::vector<int> world_ranks_;
  std::string name_;
  int64_t issued_[kCollectiveKindCount] = {};
};

}  // namespace fsdp
