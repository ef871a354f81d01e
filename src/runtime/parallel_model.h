// A rank's model, built by its family (src/models) and made into FSDP units on its meshes,
// and the optimizer placed on its shards: the part of training that happens once, before the
// first step.
#pragma once

#include <memory>
#include <vector>

#include "fsdp/comm.h"
#include "fsdp/fsdp.h"
#include "fsdp/nn/model.h"
#include "fsdp/optim.h"
#include "runtime/trainer.h"

namespace fsdp::runtime {

struct ParallelModel {
  std::shared_ptr<Comm> world;
  std::unique_ptr<Comm> ep_comm;  // the MoE layers' all-to-all group; null without ep
  std::unique_ptr<nn::Model> model;
  std::unique_ptr<Mesh> dp_mesh;
  std::unique_ptr<Mesh> expert_mesh;  // the experts' own mesh, where the family has one
  FsdpModule* root = nullptr;
  int ep = 1;

  // Every communicator the run issues collectives on: the world, the meshes' groups, the ep
  // group and the FSDP state's own (the separate RS group, post-forward groups).
  std::vector<const Comm*> comms() const;
};

// Expert parallelism, HSDP meshes and the family's placements (docs/moe.md, docs/hsdp.md),
// then the root's FSDP settings from the config.
ParallelModel parallelize_model(Device& device, std::shared_ptr<Comm> world,
                                const TrainConfig& config);

struct PlacedOptimizer {
  std::unique_ptr<optim::Optimizer> optimizer;
  // With the optimizer in forward, the owner of its deferred steps (Note [Optimizer in
  // forward's owner]), handed to the root; null otherwise. It must go before the optimizer.
  std::unique_ptr<optim::OptimizerInForward> in_forward;
  // With the optimizer offload, the owner of the host state and steps (Note [Optimizer
  // offload]); null otherwise. It must go before the optimizer.
  std::unique_ptr<optim::OptimizerOffload> offload;
};

// The optimizer over the root's sharded groups, where the config puts it: one multi-tensor
// step after backward (with the early grad norm, Note [Early grad norm]), each group's step
// in backward (Note [Optimizer in backward]) or in the next forward (Note [Optimizer in
// forward]).
PlacedOptimizer place_optimizer(Device& device, Stream compute, FsdpModule& root,
                                const TrainConfig& config);

}  // namespace fsdp::runtime
