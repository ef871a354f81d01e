// `fsdp train`: a training run on the CPU or CUDA backend, one line per step, a JSON summary.
#include "tools/train_command.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include <nlohmann/json.hpp>

#include "fsdp/error.h"
#include "fsdp/out_of_memory.h"
#include "io/file_io.h"
#include "models/model_family.h"
#include "runtime/launch.h"
#include "runtime/launch_cuda.h"
#include "runtime/rank_result_fields.h"
#include "runtime/rank_result_json.h"
#include "tools/cli_validators.h"
#include "tools/job_file.h"
#include "tools/step_printer.h"
#include "tools/trace_writer.h"

namespace fsdp::tools {

void add_train_options(CLI::App& app, TrainOptions& o) {
  app.option_defaults()->always_capture_default();
  add_job_file_option(app);  // Note [Job files]
  app.add_option("--backend", o.backend, "cpu | cuda | auto (cuda when a GPU is visible)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  o.world_size_opt = app.add_option(
      "--world-size", o.world_size,
      "ranks; CPU backend: threads; CUDA backend: must equal the GPUs used (see --nproc)");
  o.nproc_opt = app.add_option("--nproc", o.nproc,
                               "processes per host: CUDA backend, one per GPU (0: every visible "
                               "GPU); CPU backend, ranks as processes over Gloo");
  o.model_opts.push_back(
      app.add_option("--model", o.config.model.kind,
                     "mlp | resmlp | moe | transformer | moe-transformer")
          ->check(CLI::IsMember({"mlp", "resmlp", "moe", "transformer", "moe-transformer"})));
  o.model_opts.push_back(app.add_option("--layers", o.config.model.layers, "blocks"));
  o.model_opts.push_back(app.add_option("--dim", o.config.model.dim, "model width"));
  app.add_option("--hidden", o.config.model.hidden,
                 "resmlp: MLP hidden size (0: 4*dim); moe: expert hidden size (0: dim)");
  app.add_option("--experts", o.config.model.experts, "moe: experts per block");
  app.add_option("--classes", o.config.model.classes,
                 "mlp, resmlp, moe: classes of the head the model learns (cross-entropy)");
  app.add_option("--norm", o.norm, "resmlp, moe: RMSNorm at the start of each block's branch (0 | 1)")
      ->check(CLI::Range(0, 1));
  o.model_opts.push_back(
      app.add_option("--heads", o.config.model.heads, "transformer: attention heads"));
  o.model_opts.push_back(
      app.add_option("--kv-heads", o.config.model.kv_heads, "transformer: kv heads (0: heads)"));
  o.model_opts.push_back(app.add_option("--ffn-dim", o.config.model.ffn_dim,
                                        "transformer: SwiGLU width (0: 8*dim/3 rounded up to 64)"));
  add_model_dialect_options(app, o);
  app.add_option("--seq-len", o.config.model.seq_len, "transformer: tokens per sequence");
  o.vocab_opt = app.add_option("--vocab", o.config.model.vocab,
                               "transformer: vocabulary size [default: the corpus's with --data]");
  o.model_opts.push_back(o.vocab_opt);
  app.add_option("--data", o.data_dir,
                 "transformer: train on DIR/train.bin, evaluate on DIR/val.bin (fsdp prepare-data)");
  app.add_option("--eval-every", o.eval_every,
                 "with --data: validation loss every N steps and after the last [default: steps / 10]");
  app.add_option("--eval-batches", o.eval_batches,
                 "with --data: validation batches per evaluation (at most)");
  app.add_option("--ep", o.config.model.ep, "moe-transformer: expert-parallel ranks (divides the ranks)");
  app.add_option("--top-k", o.config.model.top_k, "moe-transformer: experts per token");
  app.add_option("--moe-every", o.config.model.moe_every,
                 "moe-transformer: block i has the MoE layer when (i + 1) % N == 0 (default 2)");
  app.add_option("--expert-ffn-dim", o.config.model.expert_ffn_dim,
                 "moe-transformer: SwiGLU width of one expert (default: ffn-dim)");
  app.add_option("--capacity-factor", o.config.model.capacity_factor,
                 "moe-transformer: expert capacity factor (0: dropless)");
  app.add_option("--aux-loss-weight", o.config.model.aux_loss_weight,
                 "moe-transformer: load-balancing loss weight");
  app.add_option("--tokens", o.config.tokens, "tokens per rank per step");
  // ---- whole-step CUDA graphs and gradient accumulation (docs/cuda_graphs.md)
  o.micro_batches_opt = app.add_option(
      "--micro-batches", o.micro_batches,
      "split each step's --tokens into N micro-batches (gradient accumulation)");
  o.memory_budget_opt = app.add_option("--memory-budget", o.memory_budget,
                 "GiB | auto (the memory free on the device, less 1 GiB on a GPU): choose the "
                 "fastest --activation-checkpointing, --micro-batches, --rs-max-input-buffers "
                 "and --reshard-after-forward whose "
                 "predicted peak fits, of those not given (docs/memory.md, Planner) "
                 "[default: none, no plan]");
  app.add_flag("--cuda-graph", o.cuda_graph,
               "CUDA backend: capture one whole step in a CUDA graph after the warm-up and replay "
               "it [default: off]");
  app.add_option("--steps", o.config.steps, "training steps");
  app.add_option("--warmup", o.config.warmup,
                 "steps left out of the timing statistics (the lr warm-up is --warmup-steps)");
  app.add_option("--seed", o.config.seed, "seed for init and data")->check(uint64_text());
  app.add_option("--param-dtype", o.param_dtype, "bf16 | fp32")->check(CLI::IsMember({"bf16", "fp32"}));
  app.add_option("--reduce-dtype", o.reduce_dtype,
                 "bf16 | fp32: the dtype gradients are reduce-scattered (and averaged) in")
      ->check(CLI::IsMember({"bf16", "fp32"}));
  app.add_option("--fp8", o.fp8,
                 "none | tensorwise | rowwise: the blocks' Linear GEMMs in fp8 (E4M3 inputs and "
                 "weights, E5M2 gradients) with scales from each tensor's (or row's) amax; "
                 "needs --param-dtype bf16 (docs/fp8.md)")
      ->check(CLI::IsMember({"none", "tensorwise", "rowwise"}));
  app.add_option("--fp8-all-gather", o.fp8_all_gather,
                 "0 | 1: with --fp8 tensorwise, all-gather those weights as fp8 (half the bytes)")
      ->check(CLI::Range(0, 1));
  o.reshard_after_forward_opt = app.add_option("--reshard-after-forward", o.reshard_after_forward,
                 "0 | 1: free each block's gathered params after its forward; N >= 2: keep 1/N "
                 "of them, for a backward all-gather over N ranks (N divides the shard size)")
      ->check(CLI::NonNegativeNumber);
  o.activation_checkpointing_opt = app.add_option("--activation-checkpointing", o.activation_checkpointing,
                 "none | full | every:N | selective: blocks keep only their input and recompute "
                 "in backward (full: every block; every:N: blocks 0, N, 2N, ...), or keep the "
                 "GEMM and attention outputs and recompute the norms and SwiGLU (selective; "
                 "docs/memory.md)");
  // ---- HSDP (docs/hsdp.md)
  app.add_option("--hsdp", o.config.hsdp_replicas,
                 "R: HSDP, params sharded over world / R consecutive ranks and replicated R "
                 "times; grads reduce-scattered, then all-reduced across replicas");
  o.rs_max_input_buffers_opt = app.add_option("--rs-max-input-buffers", o.config.rs_max_input_buffers,
                 "reduce-scatter input buffers in flight (k >= 1)");
  app.add_option("--separate-rs-group", o.separate_rs_group,
                 "0 | 1: reduce-scatters on their own communicator")
      ->check(CLI::Range(0, 1));
  app.add_option("--optimizer", o.config.optimizer.kind, "adamw | sgd")
      ->check(CLI::IsMember({"adamw", "sgd"}));
  app.add_option("--lr", o.lr, "peak learning rate [default: adamw 1e-3 * min(1, 256 / dim) (transformer 1e-3), sgd 1e-2]");
  app.add_option("--lr-schedule", o.config.schedule.kind,
                 "after the warm-up: cosine | linear decay to --min-lr, or constant")
      ->check(CLI::IsMember({"cosine", "linear", "constant"}));
  app.add_option("--warmup-steps", o.warmup_steps, "linear lr warm-up steps [default: steps / 10]");
  app.add_option("--min-lr", o.min_lr, "lr at the last step [default: lr / 10]");
  app.add_option("--weight-decay", o.weight_decay, "AdamW's decoupled weight decay");
  app.add_option("--clip-grad-norm", o.clip_grad_norm,
                 "clip gradients to this global norm over all shards (0: no clipping)");
  app.add_option("--optimizer-in-backward", o.optimizer_in_backward,
                 "0 | 1: step each group's shard right after its reduce-scatter; cannot clip "
                 "(-1: on exactly when --clip-grad-norm is 0 and --optimizer-in-forward is not 1)")
      ->check(CLI::Range(-1, 1));
  app.add_option("--optimizer-in-forward", o.optimizer_in_forward,
                 "0 | 1: step each group's shard in the next forward, just before its "
                 "all-gather, on the all-gather stream (clipping works)")
      ->check(CLI::Range(0, 1));
  app.add_option("--zero-grad-set-to-none", o.zero_grad_set_to_none,
                 "0 | 1: free the grad shards after each step, as FSDP2's zero_grad(set_to_none="
                 "True) (-1: on unless --cuda-graph, --offload or the optimizer in forward or "
                 "backward, which keep them)")
      ->check(CLI::Range(-1, 1));
  o.offload_opt = app.add_option("--offload", o.offload,
                 "none | optimizer: fp32 master weights and the optimizer's state in host "
                 "memory, each group's step on the host once its grad has come down "
                 "(docs/memory.md)")
      ->check(CLI::IsMember({"none", "optimizer"}));
  app.add_option("--host-memory-limit-mib", o.host_memory_limit_mib,
                 "with --offload optimizer: the host memory its state may take, in MiB, for "
                 "all ranks of this host (0: /proc/meminfo's MemAvailable)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--prefetch-next-step", o.prefetch_next_step,
                 "0 | 1: start the next step's first all-gather before the step ends")
      ->check(CLI::Range(0, 1));
  app.add_option("--chaos", o.chaos_seed,
                               "CPU backend: inject random delays with this seed (>= 0)");
  app.add_option("--cpu-memory-mib", o.cpu_memory_mib,
                 "CPU backend: each rank's device memory in MiB; an allocation past it fails as "
                 "on a full GPU (0: no limit)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  app.add_option("--json", o.json_path, "write a summary object to this file");
  app.add_option("--trace", o.trace_path, "write a Chrome trace of the timed steps");
  app.add_option("--log-every", o.log_every, "print the step line every N steps (and the last)");
  app.add_option("--peak-tflops", o.peak_tflops,
                 "GPU peak TFLOP/s for MFU (989: H200 dense bf16)");
  app.add_flag("--quiet", o.quiet, "no step lines; a progress line about every 10 s");
  // ---- multi-node launch and rendezvous (docs/launch.md)
  app.add_option("--nnodes", o.nnodes,
                 "CUDA backend: nodes of the job; each runs this command with its own "
                 "--node-rank, and the job's secret in FSDP_STORE_SECRET or "
                 "FSDP_STORE_SECRET_FILE (docs/launch.md) [default: 1]");
  app.add_option("--node-rank", o.node_rank, "this node's index in [0, --nnodes) [default: 0]");
  app.add_option("--master-addr", o.master_addr,
                 "host of node 0, where the ranks meet [default: MASTER_ADDR; 127.0.0.1 on "
                 "one node]");
  app.add_option("--master-port", o.master_port,
                 "port of the rendezvous store on that host [default: MASTER_PORT; a free "
                 "port on one node]");
  app.add_option("--timeout", o.timeout_s,
                 "seconds any rank may wait for the others (rendezvous, collectives) before "
                 "the run fails naming the missing ranks");
  // ---- failures that end the run instead of hanging it (--timeout is above)
  app.add_flag("--check-collectives", o.config.check_collectives,
               "compare a fingerprint of every collective across ranks before it runs; a "
               "mismatch is an error naming both sides (a debug mode: it syncs) [default: off]");
  // ---- checkpoints (docs/checkpoint.md)
  app.add_option("--save-dir", o.config.checkpoint.save_dir, "save sharded checkpoints here");
  app.add_option("--save-every", o.config.checkpoint.save_every,
                 "save every N steps (and after the last); 0: after the last only");
  app.add_option("--keep-last", o.config.checkpoint.keep_last,
                 "keep the newest N complete checkpoints (0: all)");
  app.add_option("--resume", o.config.checkpoint.resume,
                 "a checkpoint, or a save dir (its latest complete checkpoint)");
  app.add_option("--init-from", o.config.checkpoint.init_from,
                 "full weights: a safetensors file (fqns or Hugging Face names), or a Hugging "
                 "Face model directory (model.safetensors, or model.safetensors.index.json and "
                 "its shards; its config.json sets the model)");
}

namespace {

// The run's settings: the summary's keys besides its results' (summarize_results).
nlohmann::json settings_json(const runtime::TrainConfig& c) {
  return {
      {"model", c.model.kind},
      {"layers", c.model.layers},
      {"dim", c.model.dim},
      {"classes", c.model.classes},
      {"norm", c.model.norm},
      {"tokens_per_rank", c.tokens * c.micro_batches},
      {"micro_batches", c.micro_batches},
      {"cuda_graph", c.cuda_graph},
      {"steps", c.steps},
      {"warmup", c.warmup},
      {"param_dtype", dtype_name(c.param_dtype)},
      {"reduce_dtype", dtype_name(c.reduce_dtype)},
      {"fp8", fp8_recipe_name(c.fp8)},
      {"optimizer", c.optimizer.kind},
      {"lr", c.optimizer.base_lr()},
      {"lr_schedule", c.schedule.kind},
      {"warmup_steps", c.schedule.warmup_steps},
      {"min_lr", c.schedule.min_lr},
      {"clip_grad_norm", c.optimizer.max_grad_norm},
      {"reshard_after_forward", c.reshard_after_forward_size > 0
                                    ? nlohmann::json(c.reshard_after_forward_size)
                                    : nlohmann::json(c.reshard_after_forward)},
      {"hsdp_replicas", c.hsdp_replicas > 0 ? c.hsdp_replicas : 1},
      {"optimizer_in_backward", c.optimizer_in_backward},
      {"optimizer_in_forward", c.optimizer_in_forward},
      {"offload", c.offload_optimizer ? "optimizer" : "none"},
      {"zero_grad_set_to_none", c.zero_grad_set_to_none},
      {"prefetch_next_step", c.prefetch_next_step},
      {"rs_max_input_buffers", c.rs_max_input_buffers},
      {"activation_checkpointing", c.activation_checkpoint.to_string()},
      {"separate_rs_group", c.separate_rs_group},
      {"ep", c.model.ep}};
}

// Note [Unreadable steps]: rank 0's result of a run that an error ended, from the steps it
// reported before.
runtime::RankResult result_of_failed_run(const runtime::TrainConfig& c,
                                         const std::vector<runtime::StepReport>& reported,
                                         const std::string& error, int failed_step) {
  runtime::RankResult r;
  r.memory_plan = c.memory_plan;  // the plan the run was made with (Note [Memory plans])
  r.predicted_peak_bytes = c.predicted_peak_bytes;
  for (const runtime::StepReport& step : reported) {
    runtime::append_step(r, step);
    if (step.val_loss >= 0) r.val_losses.push_back({step.step, step.val_loss});
  }
  r.error = error;
  r.failed_step = failed_step >= 0 ? failed_step : static_cast<int>(reported.size());
  return r;
}

}  // namespace

namespace {
int64_t total_params(const nn::ModelConfig& model) {
  int64_t n = 0;
  for (int64_t c : models::unit_param_counts(model)) n += c;
  return n;
}
}  // namespace

int run_train(const TrainOptions& o) {
  const TrainRun run = train_run_of(o);
  set_option_spelling(flag_of);  // Note [Out of memory]: advice in the flags' names
  const std::string& backend = run.backend;
  const runtime::TrainConfig& config = run.config;
  if (!run.why.empty())
    std::printf("backend: %s (--backend auto: %s)\n", backend.c_str(), run.why.c_str());
  if (!run.memory_plan_line.empty()) std::printf("%s\n", run.memory_plan_line.c_str());
  // Before the first step each rank makes (or loads) its params and, with --offload, pins the
  // optimizer's host state: at billions of params that takes a while, said here.
  if (const int64_t params = total_params(config.model); params >= int64_t{1000000000}) {
    std::printf("model: %.2fB params; setting up their shards%s before the first step\n",
                static_cast<double>(params) * 1e-9,
                config.offload_optimizer ? " and the optimizer's pinned host state" : "");
    std::fflush(stdout);
  }
  StepPrinterOptions po;
  po.steps = config.steps;
  po.world = run.world;
  po.log_every = o.log_every;
  po.quiet = o.quiet;
  if (backend != "cpu") {
    po.flops_per_token = models::flops_per_token(config.model);
    po.peak_tflops = o.peak_tflops;
  }
  StepPrinter printer(po, stdout);
  std::vector<runtime::StepReport> reported;  // for the summary of a run that fails
  auto on_step = [&](const runtime::StepReport& r) {
    reported.push_back(r);
    printer(r);
    if (r.val_loss >= 0 && !o.quiet) {
      std::printf("  validation loss after step %d: %.4f nats/token (unigram entropy of the corpus: "
                  "%.4f)\n", r.step + 1, r.val_loss, run.unigram_entropy_nats);
      std::fflush(stdout);
    }
  };
  auto write_summary = [&](nlohmann::json summary) {
    summary.update(settings_json(config));
    if (config.eval_every > 0) summary["unigram_entropy_nats"] = run.unigram_entropy_nats;
    write_output_file("--json", o.json_path, summary.dump(2) + "\n");
  };
  std::vector<runtime::RankResult> results;
  int world = run.world;  // the CUDA launcher sets it from the ranks it found
  try {
    if (backend == "cpu") {
      cpu::CpuOptions cpu_options;
      cpu_options.chaos = o.chaos_seed.has_value();
      cpu_options.chaos_seed = static_cast<uint64_t>(o.chaos_seed.value_or(0));
      cpu_options.collective_timeout_s = o.timeout_s;  // threads and processes alike
      cpu_options.memory_capacity_bytes = static_cast<size_t>(o.cpu_memory_mib) << 20;
      if (run.cpu_processes) {  // ranks as processes over Gloo (docs/cpu_processes.md)
        results =
            runtime::run_cpu_process_training(o.nproc, cpu_options, run.cpu_place, config, on_step);
        if (results.empty() || results[0].rank != 0) {  // only the process of rank 0 reports
          if (!results.empty())
            std::printf("ranks %d..%d finished\n", results.front().rank, results.back().rank);
          return 0;
        }
      } else {
        results.resize(o.world_size);
        runtime::run_cpu_ranks(o.world_size, cpu_options,
                               [&](int rank, Device& device, std::shared_ptr<Comm> world) {
                                 results[rank] = runtime::train_rank(
                                     device, world, config,
                                     rank == 0 ? std::function<void(const runtime::StepReport&)>(on_step)
                                               : nullptr);
                               });
      }
    } else {
      results = runtime::run_cuda_training(launch_options_of(o), config, on_step, world);
    }
  } catch (const Error& e) {
    // Note [Unreadable steps]: the run ended on an error; its summary is still written.
    const auto* step_error = dynamic_cast<const runtime::StepError*>(&e);
    if (!o.json_path.empty()) {
      const runtime::RankResult r0 =
          result_of_failed_run(config, reported, e.what(), step_error ? step_error->step() : -1);
      nlohmann::json summary = summarize_results(backend, world, config, {r0}, o.peak_tflops);
      // The ranks' memory statistics went down with them: unknown, not zero.
      summary["peak_mem_bytes"] = nullptr;
      summary["rs_inputs_in_flight_max"] = nullptr;
      write_summary(std::move(summary));
    }
    throw;
  }
  nlohmann::json summary = summarize_results(backend, world, config, results, o.peak_tflops);
  const std::string error = summary.value("error", std::string());
  if (error.empty()) {
    std::printf("done: %s, %d ranks, step_ms median %.2f, tokens/s %.0f, peak mem %.1f MiB, "
                "rs inputs in flight max %lld (k=%d), loss %.6g -> %.6g\n",
                backend.c_str(), world, summary["step_ms_median"].get<double>(),
                summary["tokens_per_s"].get<double>(),
                summary["peak_mem_bytes"].get<int64_t>() / 1048576.0,
                static_cast<long long>(summary["rs_inputs_in_flight_max"].get<int64_t>()),
                config.rs_max_input_buffers, summary["loss_first"].get<double>(),
                summary["loss_last"].get<double>());
    std::fflush(stdout);
  }
  if (!o.json_path.empty()) write_summary(std::move(summary));
  if (!o.trace_path.empty()) {
    try {
      write_trace_file(o.trace_path, results);
    } catch (const UserError& e) {
      FSDP_USER_FAIL("--trace: ", e.what());
    }
  }
  if (!error.empty()) throw UserError(error);
  return 0;
}

LaunchOptions launch_options_of(const TrainOptions& o) {
  LaunchOptions l;
  l.nproc = o.nproc;
  l.nnodes = o.nnodes;
  l.node_rank = o.node_rank;
  l.master_addr = o.master_addr;
  l.master_port = o.master_port;
  l.timeout_s = o.timeout_s;
  return l;
}

nn::ModelConfig model_config_of(const TrainOptions& options) {
  return train_run_of(options).config.model;
}

}  // namespace fsdp::tools
