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

// The flags as parsed; nothing writes them after (the run they describe is a TrainRun).
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
  std::string fp8 = "none";  // none | tensorwise | rowwise (docs/fp8.md)
  int fp8_all_gather = 1;
  std::string activation_checkpointing = "none";  // none | full | every:N | selective
  // Flags whose default depends on others (Note [Command defaults]): unset until given.
  std::optional<double> lr, min_lr;
  std::optional<int> warmup_steps;
  int optimizer_in_backward = -1;  // -1: on exactly when clipping is off
  int optimizer_in_forward = 0;
  int zero_grad_set_to_none = -1;  // -1: on wherever it applies (Note [Grads set to none])
  std::string offload = "none";     // --offload none | optimizer (Note [Optimizer offload])
  int64_t host_memory_limit_mib = 0;  // --host-memory-limit-mib (0: MemAvailable)
  int reshard_after_forward = 1, separate_rs_group = 0, prefetch_next_step = 1, norm = 1;
  double clip_grad_norm = 1.0, weight_decay = 0.01;
  std::optional<int64_t> chaos_seed;
  int64_t cpu_memory_mib = 0;  // --cpu-memory-mib: each CPU rank's device memory (0: no limit)
  std::string json_path, trace_path;
  // --data DIR: token files of `fsdp prepare-data` (train_data.cpp).
  std::string data_dir;
  std::optional<int> eval_every;  // unset: a tenth of the steps with --data, none without
  int64_t eval_batches = 8;   // at most; fewer when val.bin holds fewer
  const CLI::Option* vocab_opt = nullptr;
  // --hf-config FILE (or --init-from DIR's config.json) sets the model (hf_model_options.cpp);
  // the flags that would set it too, to refuse them beside it.
  std::string hf_config;
  std::vector<const CLI::Option*> model_opts;
  bool quiet = false;
  int log_every = 1;
  int micro_batches = 1;    // --micro-batches: --tokens splits into this many
  // --memory-budget GiB | auto: the planner chooses the settings below that the user left
  // unset (Note [Memory plans]); empty: no plan.
  std::string memory_budget;
  const CLI::Option* memory_budget_opt = nullptr;
  const CLI::Option* activation_checkpointing_opt = nullptr;
  const CLI::Option* micro_batches_opt = nullptr;
  const CLI::Option* rs_max_input_buffers_opt = nullptr;
  const CLI::Option* reshard_after_forward_opt = nullptr;
  const CLI::Option* offload_opt = nullptr;
  bool cuda_graph = false;  // --cuda-graph (Note [Captured steps])
  double peak_tflops = 989.0;  // H200 dense bf16, for MFU on GPUs
  runtime::TrainConfig config;  // the flags that the config holds as they are
  // Which flags the user gave (for checks that depend on it).
  const CLI::Option* world_size_opt = nullptr;
  const CLI::Option* nproc_opt = nullptr;
  // ---- multi-node launch and rendezvous (docs/launch.md); unset: the environment's, or one node
  std::optional<int> nnodes, node_rank, master_port;
  std::optional<std::string> master_addr;
  double timeout_s = 60;  // every rendezvous wait, and the bound on a collective
};

// What `fsdp train` runs: the flags with every default resolved (Note [Command defaults]).
struct TrainRun {
  std::string backend;  // "cpu" or "cuda"
  std::string why;      // why --backend auto chose it; empty when --backend names it
  runtime::TrainConfig config;
  int world = 1;  // the ranks: threads, processes or GPUs
  // CPU ranks as processes over Gloo (--backend cpu --nproc; docs/cpu_processes.md), and
  // where they run.
  bool cpu_processes = false;
  CpuProcessOptions cpu_place;
  double unigram_entropy_nats = -1;  // of the --data corpus (meta.json), beside the val loss
  bool model_from_hf = false;  // a config.json set the model: the vocabulary is the model's
  std::string memory_plan_line;  // with --memory-budget: the plan, as the command prints it
};

void add_train_options(CLI::App& app, TrainOptions& options);
// hf_model_options.cpp: the transformer's Hugging Face dialect flags (--rope-theta,
// --tie-embeddings, ...) and --hf-config; and, first of the checks, the model of a Hugging
// Face config (--hf-config, or --init-from DIR with a config.json) with its weights' files
// opened and checked, one-line errors before anything runs.
void add_model_dialect_options(CLI::App& app, TrainOptions& options);
void apply_hf_model(const TrainOptions& options, TrainRun& run);
// The launch flags as the launcher takes them (include/fsdp/launch.h).
LaunchOptions launch_options_of(const TrainOptions& options);
// The model the parsed flags describe, defaults filled in (for `fsdp export --init`).
nn::ModelConfig model_config_of(const TrainOptions& options);
int run_train(const TrainOptions& options);
// The results part of the run's JSON summary (Note [Result fields]): "backend", "world_size",
// and the keys the result fields' summary rules name; `fsdp train --json` adds the settings.
nlohmann::json summarize_results(const std::string& backend, int world,
                                 const runtime::TrainConfig& c,
                                 const std::vector<runtime::RankResult>& ranks,
                                 double peak_tflops);
void write_trace_file(const std::string& path, const std::vector<runtime::RankResult>& ranks);
// Writes `text` to `path` atomically (Note [Output paths]); a failed write (a full disk,
// /dev/full) is one line naming `flag`. train_summary.cpp.
void write_output_file(const std::string& flag, const std::string& path, const std::string& text);

// train_checks.cpp: the run the flags describe, made once, in three parts:
//   check_train_options: the flags' own ranges and the model's sizes (it changes nothing);
//   resolve_train_run: the one place the "auto" defaults are resolved (Note [Command
//   defaults]), a Hugging Face config.json read, the backend chosen and --data read;
//   then the resolved run against the API's rules (runtime::check_train_config), the
//   backend and the machine's capacity.
// Every failure is one line: a UserError, and an OptionError of the API spelled with the
// flags' names (Note [Options checked once]).
TrainRun train_run_of(const TrainOptions& options);
void check_train_options(const TrainOptions& options);
TrainRun resolve_train_run(const TrainOptions& options);
// The same for `fsdp simulate` on `gpus` simulated GPUs (no backend to choose, no data): the
// resolved config.
// With --memory-budget the plan is applied (auto: `capacity`, the calibration's GPU memory) and
// its line set in `plan_line`.
runtime::TrainConfig simulate_config_of(const TrainOptions& options, int gpus,
                                        int64_t capacity = 0, std::string* plan_line = nullptr);
// train_data.cpp: with --data, the token-file batch sources, the validation batches and the
// vocabulary from the corpus's meta.json; one-line errors for bad data files.
void attach_token_data(const TrainOptions& options, TrainRun& run);
// memory_budget.cpp: with --memory-budget, the memory plan (Note [Memory plans]) applied to
// run.config: the unset flags among --activation-checkpointing, --micro-batches,
// --rs-max-input-buffers and --reshard-after-forward chosen; a budget nothing fits is one line.
// `capacity`: the device's memory for `auto` (0: ask the backend: a GPU's, --cpu-memory-mib).
void apply_memory_budget(const TrainOptions& options, TrainRun& run, int64_t capacity = 0);
// Bytes one rank needs, from the formula in docs/memory.md.
int64_t estimate_rank_bytes(const runtime::TrainConfig& c, int world);
// cuBLASLt's fp8 GEMMs take sizes in multiples of 16 (docs/fp8.md): with --fp8 on CUDA, the
// tokens per micro-batch and every fp8 weight's rows and columns, else one line.
void check_fp8_sizes_for_cuda(const runtime::TrainConfig& c);
// Fails with a one-line error if `path` cannot be written (checked before training).
void check_writable(const std::string& flag, const std::string& path);
// The flag that sets the API's option `option` ("micro_batches" -> "--micro-batches"; Note
// [Options checked once]).
std::string flag_of(const std::string& option);

}  // namespace fsdp::tools
