#include "core/comm_context.h"

#include "fsdp/error.h"

namespace fsdp::core {

CommContext::CommContext(Device& d)
    : device(d),
      all_gather_stream(d.create_stream("all-gather", StreamPriority::High)),
      reduce_scatter_stream(d.create_stream("reduce-scatter", StreamPriority::High)),
      events(d) {}

void CommContext::create_separate_comm(Mesh& mesh) {
  auto& slot = separate_comms_[mesh.comm().world_ranks()];
  if (!slot) slot = mesh.comm().split(0, mesh.rank(), mesh.comm().name() + "/rs");
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
    slot = mesh.comm().split(mesh.rank() / size, mesh.rank(),
                             mesh.comm().name() + "/post_forward" + std::to_string(size));
}

Comm& CommContext::post_forward_comm(Mesh& mesh, int size) {
  auto it = post_forward_comms_.find({mesh.comm().world_ranks(), size});
  FSDP_CHECK(it != post_forward_comms_.end() && it->second,
             "no post-forward communicator of size ", size, " for mesh '", mesh.name(), "'");
  return *it->second;
}

const char* CommContext::intern(std::string label) {
  labels_.push_back(std::move(label));
  return labels_.back().c_str();
}

}  // namespace fsdp::core
