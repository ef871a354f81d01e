#include "core/comm_context.h"

#include "fsdp/error.h"

namespace fsdp::core {

CommContext::CommContext(Device& d)
    : device(d),
      all_gather_stream(d.create_stream("all-gather", StreamPriority::High)),
      reduce_scatter_stream(d.create_stream("reduce-scatter", StreamPriority::High)),
      events(d) {}

CommContext::~CommContext() {
  for (const Fp8Amax& m : fp8_amax) device.free(m.amax, all_gather_stream);
}

void CommContext::create_separate_comm(Mesh& mesh) {
  auto& slot = separate_comms_[mesh.comm().world_ranks()];
  if (!slot) slot = mesh.comm().split_groups(mesh.comm().size(), 1, mesh.comm().name() + "/rs");
}

Comm& CommContext::reduce_scatter_comm(Mesh& mesh) {
  if (!separate_reduce_scatter_group) return mesh.comm();
  auto it = separate_comms_.find(mesh.comm().world_ranks());
  FSDP_CHECK(it != separate_comms_.end() && it->second,
             "no separate reduce-scatter communicator for mesh '", mesh.name(), "'");
  return *it->second;
}

void CommContext::ensure_all_reduce_stream() {
  if (!all_reduce_stream.valid())
    all_reduce_stream = device.create_stream("all-reduce", StreamPriority::High);
}

void CommContext::create_post_forward_comm(Mesh& mesh, int size) {
  auto& slot = post_forward_comms_[{mesh.comm().world_ranks(), size}];
  if (!slot)
    slot = mesh.comm().split_groups(size, 1, mesh.comm().name() + "/post_forward" +
                                                 std::to_string(size));
}

Comm& CommContext::post_forward_comm(Mesh& mesh, int size) {
  auto it = post_forward_comms_.find({mesh.comm().world_ranks(), size});
  FSDP_CHECK(it != post_forward_comms_.end() && it->second,
             "no post-forward communicator of size ", size, " for mesh '", mesh.name(), "'");
  return *it->second;
}

// Note [All-gather ordering]
// A module's all-gather allocates its unsharded params on the all-gather stream; modules free
// theirs on compute (at reshard, or right after a copy-out). An allocation may reuse freed
// memory only where the free happens before it: a CUDA graph reuses memory along such
// orderings and no other (its streams run concurrently at every replay), and eager mode
// otherwise reuses a block only if its free happens to have run already, so that its peak
// depends on timing. So a module's all-gather waits for two compute positions:
// - where the newest module began its compute (after its wait for its own all-gather): every
//   module before that one has freed its buffers there, and the all-gather still overlaps
//   the newest module's compute. At most two modules' unsharded params are in flight, the
//   one computing and the next (FSDP2's bound), in forward and in backward alike;
// - the module's own last free in this step, so that backward's re-gather of the module
//   that ended the forward reuses that module's forward buffers rather than adding to them.
// Both positions were issued before the wait, so it never waits for work that waits for it.
void CommContext::order_all_gather() {
  if (compute_started_valid_) device.wait_event(all_gather_stream, compute_started_);
}

void CommContext::note_compute_started(Stream compute) {
  if (!compute_started_.valid()) compute_started_ = events.acquire();  // kept for good
  device.record_event(compute_started_, compute);
  compute_started_valid_ = true;
}

const char* CommContext::intern(std::string label) {
  labels_.push_back(std::move(label));
  return labels_.back().c_str();
}

}  // namespace fsdp::core
