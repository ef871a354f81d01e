#pragma once

#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "runtime/trainer.h"

namespace fsdp::tools {

struct TrainOptions {
  // The command's default is the fastest schedule: the optimizer inside backward.
  TrainOptions() {
    config.optimizer_in_backward = true;
    config.prefetch_next_step = true;
  }
  std::string backend = "auto";
  int world_size = 2;
  int nproc = 0;  // 0: every visible GPU
  std::string param_dtype = "fp32";
  double lr = 0;
  std::optional<uint64_t> chaos_seed;
  std::string json_path, trace_path;
  bool quiet = false;
  runtime::TrainConfig config;
  int effective_world = 1;
};

struct Summary {
  std::string backend;
  int world_size = 1;
  double step_ms_median = 0, tokens_per_s = 0, tflops_per_gpu = 0;
  int64_t peak_mem_bytes = 0;
  int64_t rs_inputs_in_flight_max = 0;
  double host_schedule_us_per_unit = 0;
  // From the timeline (--trace), max over ranks; `traced` false without one.
  bool traced = false;
  double exposed_comm_ms = 0, rs_recycle_stall_ms = 0, rs_drain_ms = 0, ag_rs_overlap_ms = 0;
  int streams_used = 0;
  float loss_first = 0, loss_last = 0;
  std::vector<float> losses;  // rank 0's, every step
};

void add_train_options(CLI::App& app, TrainOptions& options);
// The model the parsed flags describe, defaults filled in (for `fsdp export --init`).
nn::ModelConfig model_config_of(TrainOptions& options);
int run_train(TrainOptions& options);
Summary summarize(const std::string& backend, int world, const runtime::TrainConfig& c,
                  const std::vector<runtime::RankResult>& ranks);
void write_trace_file(const std::string& path, const std::vector<runtime::RankResult>& ranks);

}  // namespace fsdp::tools
