#include "runtime/launch_sim.h"

#include <memory>

#include "fsdp/error.h"

namespace fsdp::runtime {

RankResult run_simulated_training(sim::SimWorld& world, const TrainConfig& config,
                                  const std::function<void(const StepReport&)>& on_step) {
  // The simulation's calibration has no fp8 GEMM or cast yet (docs/fp8.md).
  if (config.fp8 != Fp8Recipe::None)
    throw OptionError::of(OptionName{"fp8"}, " ", fp8_recipe_name(config.fp8),
                          " cannot be simulated yet (the calibration has no fp8 ops)");
  std::unique_ptr<Device> device = world.make_device();
  std::shared_ptr<Comm> comm = world.make_world_comm(*device);
  RankResult result = train_rank(*device, comm, config, on_step);
  comm.reset();
  device.reset();
  return result;
}

}  // namespace fsdp::runtime
