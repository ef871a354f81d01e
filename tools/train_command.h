// `fsdp train`: options, checks, the run, the summary.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

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

void add_train_options(CLI::App& app, TrainOptions& options);
// The launch flags as the launcher takes them (include/fsdp/launch.h).
LaunchOptions launch_options_of(const TrainOptions& options);
// The model the parsed flags describe, defaults filled in (for `fsdp export --init`).
nn::ModelConfig model_config_of(TrainOptions& options);
int run_train(TrainOptions& options);
// The results part of the run's JSON summary (Note [Result fields]): "backend", "world_size",
// and the keys the result fields' summary rules name; `fsdp train --json` adds the settings.
nlohmann::json summarize_results(const std::string& backend, int world,
                                 const runtime::TrainConfig& c,
                                 const std::vector<runtime::RankResult>& ranks,
                                 double peak_tflops);
void write_trace_file(const std::string& path, const std::vector<runtime::RankResult>& ranks);

// train_checks.cpp: every check of the options that can run before training, each failing
// with a one-line UserError; fills in the "auto" defaults. Returns the backend it chose and
// sets `why` to the reason, for --backend auto.
std::string check_train_options(TrainOptions& options, std::string& why);
// The same checks for `fsdp simulate` on `gpus` simulated GPUs (no backend to choose, no data).
void check_simulate_options(TrainOptions& options, int gpus);
// train_data.cpp: with --data, the token-file batch sources, the validation batches and the
// vocabulary from the corpus's meta.json; one-line errors for bad data files.
void attach_token_data(TrainOptions& options);
// Bytes one rank needs, from the formula in docs/memory.md.
int64_t estimate_rank_bytes(const runtime::TrainConfig& c, int world);
// Fails with a one-line error if `path` cannot be written (checked before training).
void check_writable(const std::string& flag, const std::string& path);

}  // namespace fsdp::tools
