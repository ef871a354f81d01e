// `fsdp simulate`: the train command's model and schedule on a simulated cluster (the
// simulation backend, docs/simulate.md): step time, MFU, exposed communication, the RS
// recycle stall and peak memory per rank; --sweep over the schedule's settings.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "backend/sim/sim_backend.h"
#include "tools/train_command.h"

namespace fsdp::tools {

struct SimulateOptions {
  SimulateOptions();
  TrainOptions train;  // the model and schedule flags
  int gpus = 8;
  int gpus_per_node = 8;
  double nvlink_gbps = 0;  // 0: the calibration's
  double net_gbps = 0;     // per GPU, GB/s; 0: the calibration's
  std::string calibration_path;
  bool sweep = false;
  std::string moe_load = "balanced";
  double moe_max_load = 0;
  std::string cost_log_path;
  std::string rs_reclaim = "bounded";
};

// One simulated configuration's numbers (per rank, per step).
struct SimulatedStep {
  std::string setting;  // the swept flags, e.g. "--rs-max-input-buffers 2 --hsdp 8"
  double step_ms = 0, tokens_per_s_per_gpu = 0, mfu = 0;
  double exposed_comm_ms = 0, exposed_ag_ms = 0, rs_recycle_stall_ms = 0, rs_drain_ms = 0;
  double other_comm_ms = 0, ag_rs_overlap_ms = 0;
  int64_t peak_bytes = 0;
  int64_t rs_inputs_in_flight_max = 0;  // the most RS input buffers alive at once
  std::vector<int64_t> peak_bytes_by_step;  // the peak so far, read after each step
  bool fits = true;  // the peak fits the GPU's memory (when the calibration says how much)
};

CLI::App* add_simulate_command(CLI::App& app, SimulateOptions& options);
int run_simulate(SimulateOptions& options);

// The step of one configuration on the cluster of `sim` (for tests and the sweep).
SimulatedStep simulate_step(const sim::SimOptions& sim, const runtime::TrainConfig& config,
                            runtime::RankResult* result_out = nullptr,
                            sim::CostLog* costs_out = nullptr);
nlohmann::json to_json(const SimulatedStep& s);

}  // namespace fsdp::tools
