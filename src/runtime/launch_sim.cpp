#include "runtime/launch_sim.h"

#include <memory>

#include "fsdp/error.h"

namespace fsdp::runtime {

void check_simulated_config(const sim::Calibration& calibration, const TrainConfig& config) {
  // Note [Simulated fp8]: an fp8 GEMM costs its bf16 GEMM at the calibration's ratio.
  if (config.fp8 == Fp8Recipe::None) return;
  const bool rowwise = config.fp8 == Fp8Recipe::Rowwise;
  if ((rowwise ? calibration.fp8.rowwise : calibration.fp8.tensorwise) > 0) return;
  const std::string name = fp8_recipe_name(config.fp8);
  throw OptionError::of(OptionName{"fp8"}, " ", name, " cannot be simulated with calibration '",
                        calibration.source, "': it has no fp8 GEMM rate (gemm.fp8.", name, ")");
}

RankResult run_simulated_training(sim::SimWorld& world, const TrainConfig& config,
                                  const std::function<void(const StepReport&)>& on_step) {
  check_simulated_config(world.options().calibration, config);
  std::unique_ptr<Device> device = world.make_device();
  std::shared_ptr<Comm> comm = world.make_world_comm(*device);
  RankResult result = train_rank(*device, comm, config, on_step);
  comm.reset();
  device.reset();
  return result;
}

}  // namespace fsdp::runtime
