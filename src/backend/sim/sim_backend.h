// The simulation backend: the unchanged engine (scheduler, models, trainer) on a simulated
// cluster, with virtual time and no arithmetic. See Note [Simulation backend] in
// sim_device.cpp and docs/simulate.md.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/sim/sim_calibration.h"
#include "fsdp/comm.h"
#include "fsdp/device.h"

namespace fsdp::sim {

// How the MoE layers' routing loads the experts (Note [Simulated values]).
struct MoeLoad {
  bool skewed = false;
  // Skewed: the share of all top-k assignments that the busiest expert gets (the routing's
  // max_load), in (1 / experts, 1]. Balanced: every expert's share is 1 / experts on average.
  double max_load = 0;
  int top_k = 1;  // the model's experts per token, which the share counts over
};

struct SimOptions {
  Calibration calibration;
  int gpus = 1;
  int gpus_per_node = 8;
  // The host's cost per call (the calibration's launch costs); off for a captured step,
  // whose replay costs the host nothing per op.
  bool host_costs = true;
  MoeLoad moe_load;
  uint64_t seed = 1;
  // Record every op's class, bytes, flops and time by label (SimWorld::cost_log).
  bool cost_log = false;
};

// One op class under one label, summed over the run (for calibration fits).
struct CostEntry {
  int64_t ops = 0;
  double bytes = 0, flops = 0, us = 0;
};
// (label, op class) -> totals.
using CostLog = std::map<std::pair<std::string, std::string>, CostEntry>;

struct SimShared;

// A simulated cluster of `gpus` GPUs, `gpus_per_node` to a node. One rank stands for all
// (Note [Symmetric ranks]): the last one, so make_device and make_world_comm make that
// rank's device and world communicator, and the caller drives it from one thread.
class SimWorld {
 public:
  explicit SimWorld(SimOptions options);
  ~SimWorld();
  int size() const;
  int simulated_rank() const { return size() - 1; }
  const SimOptions& options() const;
  std::unique_ptr<Device> make_device();
  std::unique_ptr<Comm> make_world_comm(Device& device);
  // The op totals so far (empty unless options.cost_log).
  CostLog cost_log() const;
  // The flops the device's GEMMs and attention did so far (for MFU).
  double flops_done() const;

 private:
  std::shared_ptr<SimShared> shared_;
};

}  // namespace fsdp::sim
