// Note [Simulated collectives]
// A collective of the simulated rank waits for its turn on the communicator (one at a time,
// in issue order, whatever the stream: Note [Collective semantics]), then takes the time
// collective_cost gives, NCCL's ring model over the members' placement:
//  - all-gather and reduce-scatter move (P - 1) / P of the message through every member;
//    all-reduce twice that; broadcast the message once. Within a node that is NVLink's;
//    across n nodes of l members, one ring per NIC enters each node once, so a node's l NICs
//    share what comes from the other nodes ((n - 1) / n of the message; the message for a
//    broadcast), and NVLink carries the rest; both run at once, so
//    the transfer takes the longer of the two, at the calibrated bus bandwidth for the
//    message size (links.nvlink, links.network: per GPU).
//  - The latency is the link's base (launch and synchronization: the network's when the
//    members span nodes) and a ring step per hop, (P - n) over NVLink and (n - 1) over the network;
//    all-reduce across nodes takes the tree's instead when that is shorter (2 (l - 1) NVLink
//    steps and 2 log2 n network steps), as NCCL picks for small messages at scale.
//  - An all-to-all sends each peer its bytes directly: NVLink to the peers on the node, the
//    NIC to the others, at once; one step of latency.
//  - A one-member collective that is not in place is a copy on the device.
// The transfer is a job on its bottleneck link's shared channel (Note [Shared channels]), so
// an all-gather and a reduce-scatter on separate communicators over the same link share its
// bandwidth while they overlap, and one over NVLink does not slow one over the network.
//
// Note [Simulated splits]
// split_groups (Note [Group splits]) says which members form each group, so the child's
// members and placement follow. A plain split(color, key) only says the simulated rank's
// color; the simulated rank is the last member of every communicator (it is the world's
// last rank, and stays last in every group split), so for the usual colors, rank / g and
// rank % s, its color is the number of groups less one: the groups have size() / (color + 1)
// members. They are taken as consecutive, unless a consecutive split into groups of color + 1
// was made from the same communicator before, which makes this one its complement (every
// (color + 1)-th member: MoE's expert-sharding mesh beside the ep groups). Keys are taken to
// order members by rank, as every split in the engine does.
#include "backend/sim/sim_comm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "backend/cpu/cpu_stream.h"
#include "fsdp/error.h"

namespace fsdp::sim {

namespace {

double d(int64_t n) { return static_cast<double>(n); }

}  // namespace

CommPlacement placement_of(const std::vector<int>& world_ranks, int gpus_per_node) {
  CommPlacement p;
  p.members = static_cast<int>(world_ranks.size());
  std::map<int, int> by_node;
  for (int r : world_ranks) ++by_node[r / std::max(gpus_per_node, 1)];
  p.nodes = std::max<int>(1, static_cast<int>(by_node.size()));
  p.per_node = 1;
  for (const auto& [node, n] : by_node) p.per_node = std::max(p.per_node, n);
  return p;
}

CollectiveCost collective_cost(const Calibration& c, SimCollective kind, const CommPlacement& p,
                               double bytes, double a2a_local_bytes, double a2a_remote_bytes) {
  CollectiveCost cost;
  const double P = p.members, n = p.nodes, l = p.per_node;
  const double a_nvl = c.nvlink.latency_us, a_net = c.network.latency_us;
  const double bw_nvl = c.nvlink.gbps(bytes) * 1e3, bw_net = c.network.gbps(bytes) * 1e3;  // B/us
  // `through`: the bytes that pass through each member; `from_outside`: those of them that
  // come from other nodes, which that node's l NICs share.
  auto transfer = [&](double through, double from_outside) {
    const double net = n > 1 ? from_outside / l : 0;
    const double nvl = l > 1 ? std::max(0.0, through - net) : 0;
    const double t_nvl = nvl / bw_nvl, t_net = net / bw_net;
    cost.network = t_net > t_nvl;
    cost.transfer_us = std::max(t_nvl, t_net);
  };
  const double ring_latency = (P - n) * a_nvl + (n - 1) * a_net;
  switch (kind) {
    case SimCollective::AllGather:
    case SimCollective::ReduceScatter:
      transfer(bytes * (P - 1) / P, bytes * (n - 1) / n);
      cost.latency_us = ring_latency;
      break;
    case SimCollective::AllReduce: {
      transfer(2 * bytes * (P - 1) / P, 2 * bytes * (n - 1) / n);
      cost.latency_us = 2 * ring_latency;
      if (n > 1)
        cost.latency_us = std::min(cost.latency_us,
                                   2 * ((l - 1) * a_nvl + std::ceil(std::log2(n)) * a_net));
      break;
    }
    case SimCollective::Broadcast:
      transfer(bytes, bytes);
      cost.latency_us = ring_latency;
      break;
    case SimCollective::AllToAll: {
      const double t_nvl = a2a_local_bytes / bw_nvl, t_net = a2a_remote_bytes / bw_net;
      cost.network = t_net > t_nvl;
      cost.transfer_us = std::max(t_nvl, t_net);
      cost.latency_us = a2a_remote_bytes > 0 ? a_net : a_nvl;
      break;
    }
  }
  cost.latency_us += n > 1 || (kind == SimCollective::AllToAll && a2a_remote_bytes > 0)
                         ? c.network.base_us
                         : c.nvlink.base_us;
  return cost;
}

SimComm::SimComm(SimDevice& device, std::shared_ptr<SimCommState> state)
    : Comm(state->member, state->world_ranks, state->name),
      device_(device),
      state_(std::move(state)) {}

void SimComm::launch(Stream s, const char* op, double bytes, const CollectiveCost& cost) {
  const Calibration& c = device_.calibration();
  device_.host_cost(c.collective_launch_us);
  if (device_.shared().options.cost_log) {
    std::lock_guard<std::mutex> lock(device_.shared().cost_mutex);
    const char* label = device_.current_label();
    CostEntry& e = device_.shared().costs[{label ? label : "", op}];
    ++e.ops;
    e.bytes += bytes;
    e.us += cost.latency_us + cost.transfer_us;
  }
  const int64_t seq = next_seq_++;
  SimShared* shared = &device_.shared();
  device_.enqueue(s, OpKind::Collective, [state = state_, seq, cost, shared,
                                          cancel = &device_.cancellation()] {
    {
      std::unique_lock<std::mutex> lock(state->mutex);
      state->cv.wait(lock, cancel, [&] { return state->finished == seq; });
    }
    cpu::restart_task_clock();  // queueing behind the previous collective is not its time
    try {
      shared->world->pass_time(cost.latency_us, cancel);
      if (cost.transfer_us > 0) {
        cpu::ClockParticipant* self = cpu::this_thread_participant();
        FSDP_CHECK(self != nullptr, "a simulated collective outside a stream");
        shared->world->clock->sleep_on_channel(*self, cost.network ? shared->network : shared->nvlink,
                                               cost.transfer_us, cancel);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(state->mutex);
      ++state->finished;
      state->cv.notify_all();
      throw;
    }
    cpu::stop_task_clock();
    std::lock_guard<std::mutex> lock(state->mutex);
    ++state->finished;
    state->cv.notify_all();
  });
}

void SimComm::launch_kind(Stream s, SimCollective kind, const char* op, double bytes) {
  const Calibration& c = device_.calibration();
  if (size() == 1) {  // a copy on the device (Note [Simulated collectives])
    device_.timed(s, OpKind::Collective, "one_rank_collective",
                  memory_us(c, "one_rank_collective", 2 * bytes), c.collective_launch_us, 2 * bytes);
    return;
  }
  launch(s, op, bytes, collective_cost(c, kind, state_->placement, bytes));
}

void SimComm::do_all_gather(const void* send, void* recv, int64_t count, DType t, Stream s) {
  const size_t chunk = static_cast<size_t>(count) * dtype_size(t);
  // Note [Simulated values]: every member sends what this one does.
  if (const std::vector<char>* v = device_.shadow_at(send, chunk)) {
    std::vector<char> all;
    for (int j = 0; j < size(); ++j) all.insert(all.end(), v->begin(), v->begin() + static_cast<std::ptrdiff_t>(chunk));
    device_.set_shadow(recv, std::move(all));
  }
  launch_kind(s, SimCollective::AllGather, "all_gather", d(count) * d(size()) * d(dtype_size(t)));
}

void SimComm::do_reduce_scatter(const void*, void*, int64_t count, DType t, ReduceOp, Stream s) {
  launch_kind(s, SimCollective::ReduceScatter, "reduce_scatter",
              d(count) * d(size()) * d(dtype_size(t)));
}

void SimComm::do_all_reduce(const void*, void*, int64_t count, DType t, ReduceOp, Stream s) {
  launch_kind(s, SimCollective::AllReduce, "all_reduce", d(count) * d(dtype_size(t)));
}

void SimComm::do_broadcast(void*, int64_t count, DType t, int root, Stream s) {
  FSDP_CHECK(root >= 0 && root < size(), "broadcast root ", root, " outside ", size(), " members");
  launch_kind(s, SimCollective::Broadcast, "broadcast", d(count) * d(dtype_size(t)));
}

void SimComm::do_all_to_all(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                            const std::vector<int64_t>& recv_counts, DType t, Stream s) {
  const double elem = d(dtype_size(t));
  const int me = rank();
  // Note [Simulated values]: each peer's chunk for us is our own chunk for us.
  int64_t my_offset = 0;
  for (int j = 0; j < me; ++j) my_offset += send_counts[j];
  const size_t mine = static_cast<size_t>(send_counts[me]) * dtype_size(t);
  const auto* base = static_cast<const char*>(send) + static_cast<size_t>(my_offset) * dtype_size(t);
  int64_t sent = 0;
  for (int64_t c : send_counts) sent += c;
  if (const std::vector<char>* v =
          device_.shadow_at(send, static_cast<size_t>(sent) * dtype_size(t))) {
    const char* src = v->data() + (base - static_cast<const char*>(send));
    std::vector<char> out;
    for (int j = 0; j < size(); ++j) {
      const size_t n = static_cast<size_t>(recv_counts[j]) * dtype_size(t);
      if (n == mine) out.insert(out.end(), src, src + mine);
      else out.insert(out.end(), n, 0);
    }
    device_.set_shadow(recv, std::move(out));
  }
  const Calibration& c = device_.calibration();
  const int node_size = device_.shared().options.gpus_per_node;
  const int my_node = state_->world_ranks[me] / node_size;
  double local = 0, remote = 0, total = 0;
  for (int j = 0; j < size(); ++j) {
    const double bytes = d(std::max(send_counts[j], recv_counts[j])) * elem;
    total += d(send_counts[j]) * elem;
    if (j == me) continue;
    (state_->world_ranks[j] / node_size == my_node ? local : remote) += bytes;
  }
  if (size() == 1) {
    device_.timed(s, OpKind::Collective, "one_rank_collective",
                  memory_us(c, "one_rank_collective", 2 * total), c.collective_launch_us, 2 * total);
    return;
  }
  launch(s, "all_to_all", total,
         collective_cost(c, SimCollective::AllToAll, state_->placement, total, local, remote));
}

std::unique_ptr<Comm> SimComm::do_split_groups(int group_size, int stride, int,
                                               const std::string& name) {
  const int m = rank();
  const int block = group_size * stride;
  auto child = std::make_shared<SimCommState>();
  child->name = name;
  const int first = m / block * block + m % stride;
  for (int i = 0; i < group_size; ++i) {
    const int member = first + i * stride;
    if (member == m) child->member = i;
    child->world_ranks.push_back(state_->world_ranks[static_cast<size_t>(member)]);
  }
  child->placement = placement_of(child->world_ranks, device_.shared().options.gpus_per_node);
  if (stride == 1) state_->block_splits.push_back(group_size);
  return std::make_unique<SimComm>(device_, std::move(child));
}

std::unique_ptr<Comm> SimComm::do_split(int color, int, const std::string& name) {
  if (color < 0) return nullptr;
  const int members = size();
  // Note [Simulated splits]
  FSDP_CHECK(rank() == members - 1, "simulated split of '", this->name(),
             "': the simulated rank must be the communicator's last member");
  const int groups = color + 1;
  FSDP_USER_CHECK(groups <= members && members % groups == 0, "the simulation backend cannot "
                  "split communicator '", this->name(), "' (", members, " members) by color ",
                  color, ": it simulates splits into equal groups only (Note [Simulated splits])");
  const std::vector<int>& made = state_->block_splits;
  const bool strided = groups > 1 && groups < members &&
                       std::find(made.begin(), made.end(), groups) != made.end();
  return strided ? do_split_groups(members / groups, groups, color, name)
                 : do_split_groups(members / groups, 1, color, name);
}

std::unique_ptr<Comm> SimWorld::make_world_comm(Device& device) {
  auto* sim = dynamic_cast<SimDevice*>(&device);
  FSDP_CHECK(sim != nullptr && &sim->shared() == shared_.get(),
             "make_world_comm needs this simulated world's device, got ", device.name());
  auto state = std::make_shared<SimCommState>();
  state->name = "world";
  for (int r = 0; r < size(); ++r) state->world_ranks.push_back(r);
  state->member = simulated_rank();
  state->placement = placement_of(state->world_ranks, shared_->options.gpus_per_node);
  return std::make_unique<SimComm>(*sim, std::move(state));
}

}  // namespace fsdp::sim
