// What one root shares with all its FSDP states: streams, the RS ring, the event pool, the
// separate RS and post-forward communicators and the schedule's event log. (FSDP2's
// FSDPCommContext.)
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/rs_ring.h"
#include "fsdp/comm.h"
#include "fsdp/fsdp.h"
#include "fsdp/optim.h"

namespace fsdp::core {

class FsdpState;

class CommContext {
 public:
  explicit CommContext(Device& device);
  ~CommContext();
  CommContext(const CommContext&) = delete;
  CommContext& operator=(const CommContext&) = delete;

  Device& device;
  Stream all_gather_stream;
  Stream reduce_scatter_stream;
  // HSDP only (made at lazy init when a group's mesh has replicas): the all-reduce of each
  // reduce-scattered grad shard across replicas, and what follows it (Note [HSDP schedule]).
  Stream all_reduce_stream;
  RsRing ring;
  EventPool events;
  bool separate_reduce_scatter_group = false;
  std::vector<FsdpState*> post_forward_order;  // this iteration, for backward prefetch
  // Note [Symmetric collectives]: this iteration's forward hooks in order, and backward's
  // expected hooks (their reverse) with how far backward has got through them.
  struct HookCall {
    FsdpState* state;
    bool pre;  // pre-forward / pre-backward; else post-
  };
  std::vector<HookCall> forward_hooks;
  std::vector<HookCall> backward_plan;
  size_t backward_cursor = 0;
  bool backward_planned = false;
  std::vector<ScheduleEvent>* event_log = nullptr;
  ShardStepFn optimizer_in_backward;  // Note [Optimizer in backward]; empty when off
  GradShardReadyFn grad_shard_ready;  // Note [Early grad norm]; empty when off
  // Note [Optimizer in forward's owner]: null when off. It keeps which updates are pending.
  optim::OptimizerInForward* optimizer_in_forward = nullptr;
  ShardOffloadHooks offload_hooks;  // Note [Optimizer offload hooks]; empty when off
  // Whether work (accumulation, cast, optimizer) follows the newest ring entry's event on the
  // RS stream; finalize then joins the RS stream itself, not only the ring.
  bool rs_work_after_ring = false;
  // Whether all-reduces were issued since finalize last joined the all-reduce stream.
  bool all_reduce_pending = false;
  void ensure_all_reduce_stream();

  // Note [Float8 all-gather] (src/core/param_group_fp8.cpp): per mesh with fp8 weights, its
  // amax buffer (device fp32, a slot per weight, owned here), and which step's shards the
  // amaxes are of (below).
  struct Fp8Amax {
    Mesh* mesh = nullptr;
    float* amax = nullptr;
    int count = 0;
    const char* label = "";
  };
  std::vector<Fp8Amax> fp8_amax;
  // The amaxes are the current shards' while they were taken in this generation, which each
  // step's last backward ends (the optimizer is about to change the shards). The precompute
  // notes the generation it ran in; a group of a one-rank mesh, its own (fp8_amax_on_gather).
  int64_t fp8_amax_generation = 0;
  int64_t fp8_amax_precomputed = -1;

  // Note [All-gather ordering]: order_all_gather makes the all-gather stream wait for the
  // compute stream as it was when the newest module began its compute (noted by
  // note_compute_started); forget_compute_started at a step's start, where the all-gather
  // stream has just waited for everything before.
  void order_all_gather();
  void note_compute_started(Stream compute);
  void forget_compute_started() { compute_started_valid_ = false; }

  // The communicator RS uses for `mesh`: the mesh's own, or (separate group on) one split
  // off per distinct rank set. Creating one is collective over the mesh; lazy init makes
  // them in the same order on every rank.
  Comm& reduce_scatter_comm(Mesh& mesh);
  void create_separate_comm(Mesh& mesh);
  // Note [Post-forward mesh]: groups of `size` consecutive ranks of the mesh's shard group,
  // for reshard_after_forward=int. Collective over the shard group, like the RS ones.
  void create_post_forward_comm(Mesh& mesh, int size);
  Comm& post_forward_comm(Mesh& mesh, int size);

  void log(const char* op, const std::string& unit, const char* phase) {
    if (event_log) event_log->push_back({op, unit, phase});
  }
  // Labels outlive the timeline (Device::set_label keeps the pointer).
  const char* intern(std::string label);
  // Collectives issued on the separate RS communicators (the meshes count their own).
  int64_t separate_comm_issued(CollectiveKind kind) const {
    int64_t n = 0;
    for (const auto& [ranks, comm] : separate_comms_) n += comm->issued(kind);
    return n;
  }
  // Every communicator the context made (separate RS, post-forward), for counts.
  std::vector<const Comm*> own_comms() const {
    std::vector<const Comm*> out;
    for (const auto& [ranks, comm] : separate_comms_) out.push_back(comm.get());
    for (const auto& [key, comm] : post_forward_comms_) out.push_back(comm.get());
    return out;
  }
  // Collectives issued on the post-forward communicators.
  int64_t post_forward_comm_issued(CollectiveKind kind) const {
    int64_t n = 0;
    for (const auto& [key, comm] : post_forward_comms_) n += comm->issued(kind);
    return n;
  }

 private:
  std::map<std::vector<int>, std::unique_ptr<Comm>> separate_comms_;
  std::map<std::pair<std::vector<int>, int>, std::unique_ptr<Comm>> post_forward_comms_;
  std::deque<std::string> labels_;
  Event compute_started_;  // made on first use
  bool compute_started_valid_ = false;
};

}  // namespace fsdp::core
