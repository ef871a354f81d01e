#include "runtime/parallel_model.h"

#include "core/fsdp_state.h"
#include "fsdp/error.h"
#include "models/model_family.h"

namespace fsdp::runtime {

std::vector<const Comm*> ParallelModel::comms() const {
  std::vector<const Comm*> out{world.get()};
  for (Mesh* m : {dp_mesh.get(), expert_mesh.get()}) {
    if (!m) continue;
    if (&m->comm() != world.get()) out.push_back(&m->comm());
    if (m->replicate_comm()) out.push_back(m->replicate_comm());
  }
  if (ep_comm) out.push_back(ep_comm.get());
  if (core::state_of(*model)->ctx)
    for (const Comm* c : core::state_of(*model)->ctx->own_comms()) out.push_back(c);
  return out;
}

ParallelModel parallelize_model(Device& device, std::shared_ptr<Comm> world,
                                const TrainConfig& config) {
  ParallelModel out;
  out.world = std::move(world);
  Comm& w = *out.world;
  const int rank = w.rank();
  // Expert parallelism (docs/moe.md): ep groups of consecutive ranks; the experts shard over
  // the ranks with the same ep rank.
  nn::ModelConfig model_config = models::resolved(config.model);
  const models::ModelFamily& family = models::family(model_config.kind);
  out.ep = family.expert_parallel_size(model_config);
  FSDP_USER_CHECK(out.ep >= 1 && w.size() % out.ep == 0, "ep (", out.ep,
                  ") must divide the number of data-parallel ranks (", w.size(), ")");
  model_config.ep_rank = rank % out.ep;
  model_config.moe_group_tokens = config.tokens;
  if (out.ep > 1) out.ep_comm = w.split_groups(out.ep, 1, "ep");
  out.model = models::build_model(model_config);
  out.model->set_expert_comm(out.ep_comm.get());
  nn::enable_fp8(*out.model, config.fp8);  // before fully_shard: it groups the fp8 weights
  nn::apply_activation_checkpointing(*out.model, config.activation_checkpoint);
  // HSDP (docs/hsdp.md): every mesh is replicate x shard, the same ranks in each role.
  const int replicas = config.hsdp_replicas;
  auto make_mesh = [&device, &w, replicas](const std::string& name, std::shared_ptr<Comm> one_d) {
    if (replicas == 0) return std::make_unique<Mesh>(name, device, std::move(one_d));
    return std::make_unique<Mesh>(make_hsdp_mesh(name, device, w, replicas, w.size() / replicas));
  };
  out.dp_mesh = make_mesh("dp", out.world);
  FullyShardOptions options;
  options.reshard_after_forward = config.reshard_after_forward;
  if (config.reshard_after_forward_size > 0)
    options.reshard_after_forward = config.reshard_after_forward_size;
  options.mp_policy = {config.param_dtype, config.reduce_dtype, config.fp8_all_gather};
  models::ParallelizeContext placement{device,  w,      *out.dp_mesh, make_mesh, replicas != 0,
                                       options, config.experts_on_own_mesh, nullptr};
  FsdpModule& root = family.parallelize(*out.model, placement);
  out.expert_mesh = std::move(placement.expert_mesh);
  out.root = &root;
  root.set_reduce_scatter_max_input_buffers(config.rs_max_input_buffers);
  root.set_separate_reduce_scatter_group(config.separate_rs_group);
  root.set_rs_reclaim_policy_for_testing(config.rs_policy);
  if (rank == 0 && config.event_log) root.set_event_log(config.event_log);
  if (config.customize) config.customize(*out.model, root);
  return out;
}

PlacedOptimizer place_optimizer(Device& device, Stream compute, FsdpModule& root,
                                const TrainConfig& config) {
  std::vector<optim::ParamSpan> spans;
  for (const ShardedGroupView& g : sharded_groups(root, !config.optimizer_in_backward))
    spans.push_back({g.param, g.grad, g.numel, g.mesh ? &g.mesh->comm() : nullptr, g.name});
  PlacedOptimizer out;
  optim::OffloadOptions offload = config.offload;
  if (offload.ranks_sharing_host == 0) offload.ranks_sharing_host = root.state().mesh.data_parallel_size();
  offload.simulated_host = !device.computes_values();
  // Note [Optimizer offload]: the host's memory is checked before any of it is taken.
  if (config.offload_optimizer) optim::check_offload_host_memory(spans, config.optimizer, offload);
  out.optimizer = std::make_unique<optim::Optimizer>(
      device, compute, spans, config.optimizer,
      config.offload_optimizer ? optim::StatePlacement::Host : optim::StatePlacement::Device);
  optim::Optimizer* opt = out.optimizer.get();
  if (config.offload_optimizer) {
    out.offload = std::make_unique<optim::OptimizerOffload>(*opt, compute, offload);
    root.set_shard_offload_hooks(out.offload->hooks());
  }
  optim::OptimizerOffload* off = out.offload.get();
  if (config.optimizer_in_backward)
    root.set_optimizer_in_backward(
        [opt](Stream s, int ordinal, float*, const void* grad, DType t, int64_t) {
          opt->step_one(s, ordinal, grad, t);
        });
  if (config.optimizer_in_forward) {  // Note [Optimizer in forward's owner]
    out.in_forward = std::make_unique<optim::OptimizerInForward>(*opt, compute);
    root.set_optimizer_in_forward(*out.in_forward);
  }
  // Note [Early grad norm]; an after_backward hook may change grads the early sums have read.
  if (!config.optimizer_in_backward && !config.after_backward)
    root.set_on_grad_shard_ready([opt, off](Stream s, int ordinal, const float* grad, int64_t) {
      opt->add_grad_square(s, ordinal, grad);  // Note [Early grad norm]
      if (off) off->grad_ready(s, ordinal);     // Note [Optimizer offload]: the grad goes down
    });
  return out;
}

}  // namespace fsdp::runtime
