// `fsdp train`: options, checks, the run, the summary.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "fsdp/launch.h"
#include "runtime/trainer.h"

namespace fsdp::tools {

struct TrainOptions {
  TrainOptions() {
    config.prefetch_next_step = true;
    config.model.classes = 16;  // every model learns a target (Note [Command defaults])
    config.model.norm = true;
    config.optimizer.max_grad_norm = 1.0f;
    config.schedule.kind = "cosine";
  }
  std::string backend = "auto";
  int world_size = 2;
  int nproc = 0;  // 0: every visible GPU
  std::string param_dtype = "fp32";
  std::string reduce_dtype = "fp32";
  // Flags whose default depends on others (Note [Command defaults]): unset until given.
  std::optional<double> lr, min_lr;
  std::optional<int> warmup_steps;
  int optimizer_in_backward = -1;  // -1: on exactly when clipping is off
  int optimizer_in_forward = 0;
  int reshard_after_forward = 1, separate_rs_group = 0, prefetch_next_step = 1, norm = 1;
  double clip_grad_norm = 1.0, weight_decay = 0.01;
  std::optional<int64_t> chaos_seed;
  std::string json_path, trace_path;
  // --data DIR: token files of `fsdp prepare-data` (train_data.cpp).
  std::string data_dir;
  std::optional<int> eval_every;  // unset: a tenth of the steps with --data, none without
  int64_t eval_batches = 8;   // at most; fewer when val.bin holds fewer
  double unigram_entropy_nats = -1;  // of the corpus (meta.json), shown beside the val loss
  const CLI::Option* vocab_opt = nullptr;
  bool quiet = false;
  int log_every = 1;
  int micro_batches = 1;    // --micro-batches: --tokens splits into this many
  bool cuda_graph = false;  // --cuda-graph (Note [Captured steps])
  double peak_tflops = 989.0;  // H200 dense bf16, for MFU on GPUs
  runtime::TrainConfig config;
  int effective_world = 1;
  // Which flags the user gave (for checks that depend on it).
  const CLI::Option* world_size_opt = nullptr;
  const CLI::Option* nproc_opt = nullptr;
  // ---- multi-node launch and rendezvous (docs/launch.md); unset: the environment's, or one node
  std::optional<int> nnodes, node_rank, master_port;
  std::optional<std::string> master_addr;
  double timeout_s = 60;  // every rendezvous wait, and the bound on a collective
  // CPU ranks as processes over Gloo (--backend cpu --nproc; docs/cpu_processes.md): set by
  // the checks, with where they run.
  bool cpu_processes = false;
  CpuProcessOptions cpu_place;
};

struct Summary {
  std::string backend;
  int world_size = 1;
  double step_ms_median = 0, tokens_per_s = 0;
  double tflops_per_gpu = -1, mfu = -1;  // -1: not reported (the CPU backend)
  int64_t peak_mem_bytes = 0;
  int64_t rs_inputs_in_flight_max = 0;
  double host_schedule_us_per_unit = 0;
  // From the timeline (--trace), max over ranks; `traced` false without one.
  bool traced = false;
  double exposed_comm_ms = 0, rs_recycle_stall_ms = 0, rs_drain_ms = 0, ag_rs_overlap_ms = 0;
  int streams_used = 0;
  // Under --cuda-graph: the streams the graph runs on (rank 0), and host time per step.
  std::vector<std::string> graph_streams;
  double host_us_per_step = 0;
  int64_t backend_peak_bytes = 0;  // max over ranks of Device::backend_peak_bytes()
  int64_t backend_reserved_peak_bytes = 0;  // max over ranks, Device::backend_reserved_peak_bytes()
  std::vector<float> losses, lrs, grad_norms;  // rank 0's, every finished step
  std::vector<std::pair<int, float>> val_losses;  // (step, 0-based; validation loss)
  std::string error;                           // a non-finite step stopped the run
  int failed_step = -1;
  double max_expert_load = -1;  // moe-transformer: rank 0's, last step
  std::vector<int64_t> peak_mem_bytes_by_step;  // max over ranks (RankResult::peak_bytes_by_step)
};

void add_train_options(CLI::App& app, TrainOptions& options);
// The launch flags as the launcher takes them (include/fsdp/launch.h).
LaunchOptions launch_options_of(const TrainOptions& options);
// The model the parsed flags describe, defaults filled in (for `fsdp export --init`).
nn::ModelConfig model_config_of(TrainOptions& options);
int run_train(TrainOptions& options);
Summary summarize(const std::string& backend, int world, const runtime::TrainConfig& c,
                  const std::vector<runtime::RankResult>& ranks, double peak_tflops);
void write_trace_file(const std::string& path, const std::vector<runtime::RankResult>& ranks);

// train_checks.cpp: every check of the options that can run before training, each failing
// with a one-line UserError; fills in the "auto" defaults. Returns the backend it chose and
// sets `why` to the reason, for --backend auto.
std::string check_train_options(TrainOptions& options, std::string& why);
// train_data.cpp: with --data, the token-file batch sources, the validation batches and the
// vocabulary from the corpus's meta.json; one-line errors for bad data files.
void attach_token_data(TrainOptions& options);
// Bytes one rank needs, from the formula in docs/memory.md.
int64_t estimate_rank_bytes(const runtime::TrainConfig& c, int world);
// Fails with a one-line error if `path` cannot be written (checked before training).
void check_writable(const std::string& flag, const std::string& path);

}  // namespace fsdp::tools
