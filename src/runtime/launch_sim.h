// The trainer on a simulated cluster (the simulation backend, docs/simulate.md).
#pragma once

#include <functional>

#include "backend/sim/sim_backend.h"
#include "runtime/trainer.h"

namespace fsdp::runtime {

// What the simulation cannot run with this calibration, as an OptionError (fp8 recipes it
// has no rate for); run_simulated_training checks it first.
void check_simulated_config(const sim::Calibration& calibration, const TrainConfig& config);

// Trains the simulated rank of `world` (Note [Symmetric ranks]) on the calling thread, which
// must drive no other device, and returns its result.
RankResult run_simulated_training(sim::SimWorld& world, const TrainConfig& config,
                                  const std::function<void(const StepReport&)>& on_step = {});

}  // namespace fsdp::runtime
