#include "runtime/launch_sim.h"

#include <memory>

namespace fsdp::runtime {

RankResult run_simulated_training(sim::SimWorld& world, const TrainConfig& config,
                                  const std::function<void(const StepReport&)>& on_step) {
  std::unique_ptr<Device> device = world.make_device();
  std::shared_ptr<Comm> comm = world.make_world_comm(*device);
  RankResult result = train_rank(*device, comm, config, on_step);
  comm.reset();
  device.reset();
  return result;
}

}  // namespace fsdp::runtime
