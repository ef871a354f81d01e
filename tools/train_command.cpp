// `fsdp train`: a training run on the CPU or CUDA backend, one line per step, a JSON summary.
#include "tools/train_command.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include <nlohmann/json.hpp>

#include "fsdp/error.h"
#include "io/file_io.h"
#include "models/model_family.h"
#include "runtime/launch.h"
#include "runtime/launch_cuda.h"
#include "tools/step_printer.h"
#include "tools/trace_writer.h"

namespace fsdp::tools {

void add_train_options(CLI::App& app, TrainOptions& o) {
  app.option_defaults()->always_capture_default();
  app.add_option("--backend", o.backend, "cpu | cuda | auto (cuda when a GPU is visible)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  o.world_size_opt = app.add_option(
      "--world-size", o.world_size,
      "ranks; CPU backend: threads; CUDA backend: must equal the GPUs used (see --nproc)");
  o.nproc_opt = app.add_option("--nproc", o.nproc,
                               "processes per host: CUDA backend, one per GPU (0: every visible "
                               "GPU); CPU backend, ranks as processes over Gloo");
  app.add_option("--model", o.config.model.kind, "mlp | resmlp | moe | transformer | moe-transformer")
      ->check(CLI::IsMember({"mlp", "resmlp", "moe", "transformer", "moe-transformer"}));
  app.add_option("--layers", o.config.model.layers, "blocks");
  app.add_option("--dim", o.config.model.dim, "model width");
  app.add_option("--hidden", o.config.model.hidden,
                 "resmlp: MLP hidden size (0: 4*dim); moe: expert hidden size (0: dim)");
  app.add_option("--experts", o.config.model.experts, "moe: experts per block");
  app.add_option("--classes", o.config.model.classes,
                 "mlp, resmlp, moe: classes of the head the model learns (cross-entropy)");
  app.add_option("--norm", o.norm, "resmlp, moe: RMSNorm at the start of each block's branch (0 | 1)")
      ->check(CLI::Range(0, 1));
  app.add_option("--heads", o.config.model.heads, "transformer: attention heads");
  app.add_option("--kv-heads", o.config.model.kv_heads, "transformer: kv heads (0: heads)");
  app.add_option("--ffn-dim", o.config.model.ffn_dim,
                 "transformer: SwiGLU width (0: 8*dim/3 rounded up to 64)");
  app.add_option("--seq-len", o.config.model.seq_len, "transformer: tokens per sequence");
  o.vocab_opt = app.add_option("--vocab", o.config.model.vocab,
                               "transformer: vocabulary size [default: the corpus's with --data]");
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
  app.add_option("--micro-batches", o.micro_batches,
                 "split each step's --tokens into N micro-batches (gradient accumulation)");
  app.add_flag("--cuda-graph", o.cuda_graph,
               "CUDA backend: capture one whole step in a CUDA graph after the warm-up and replay "
               "it [default: off]");
  app.add_option("--steps", o.config.steps, "training steps");
  app.add_option("--warmup", o.config.warmup,
                 "steps left out of the timing statistics (the lr warm-up is --warmup-steps)");
  app.add_option("--seed", o.config.seed, "seed for init and data");
  app.add_option("--param-dtype", o.param_dtype, "bf16 | fp32")->check(CLI::IsMember({"bf16", "fp32"}));
  app.add_option("--reduce-dtype", o.reduce_dtype,
                 "bf16 | fp32: the dtype gradients are reduce-scattered (and averaged) in")
      ->check(CLI::IsMember({"bf16", "fp32"}));
  app.add_option("--reshard-after-forward", o.reshard_after_forward,
                 "0 | 1: free each block's gathered params after its forward; N >= 2: keep 1/N "
                 "of them, for a backward all-gather over N ranks (N divides the shard size)")
      ->check(CLI::NonNegativeNumber);
  // ---- HSDP (docs/hsdp.md)
  app.add_option("--hsdp", o.config.hsdp_replicas,
                 "R: HSDP, params sharded over world / R consecutive ranks and replicated R "
                 "times; grads reduce-scattered, then all-reduced across replicas");
  app.add_option("--rs-max-input-buffers", o.config.rs_max_input_buffers,
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
                 "(-1: on exactly when --clip-grad-norm is 0)")
      ->check(CLI::Range(-1, 1));
  app.add_option("--optimizer-in-forward", o.optimizer_in_forward,
                 "0 | 1: step each group's shard in the next forward, just before its "
                 "all-gather, on the all-gather stream (clipping works)")
      ->check(CLI::Range(0, 1));
  app.add_option("--prefetch-next-step", o.prefetch_next_step,
                 "0 | 1: start the next step's first all-gather before the step ends")
      ->check(CLI::Range(0, 1));
  app.add_option("--chaos", o.chaos_seed,
                               "CPU backend: inject random delays with this seed (>= 0)");
  app.add_option("--json", o.json_path, "write a summary object to this file");
  app.add_option("--trace", o.trace_path, "write a Chrome trace of the timed steps");
  app.add_option("--log-every", o.log_every, "print the step line every N steps (and the last)");
  app.add_option("--peak-tflops", o.peak_tflops,
                 "GPU peak TFLOP/s for MFU (989: H200 dense bf16)");
  app.add_flag("--quiet", o.quiet, "no step lines; a progress line about every 10 s");
  // ---- multi-node launch and rendezvous (docs/launch.md)
  app.add_option("--nnodes", o.nnodes,
                 "CUDA backend: nodes of the job; each runs this command with its own "
                 "--node-rank [default: 1]");
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
                 "full weights (safetensors; fqn or Hugging Face Llama names)");
}

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

nlohmann::json number_or_null(bool has, double v) {
  return has ? nlohmann::json(v) : nlohmann::json();
}

// [{"step": N, "loss": L}]: the validation loss after step N (1-based, as the step line counts;
// bench/torch_llama.py writes the same).
nlohmann::json val_losses_json(const std::vector<std::pair<int, float>>& v) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [step, loss] : v) out.push_back({{"step", step + 1}, {"loss", loss}});
  return out;
}

nlohmann::json summary_json(const Summary& s, const runtime::TrainConfig& c,
                            double unigram_entropy_nats) {
  nlohmann::json j = {
      {"backend", s.backend},
      {"world_size", s.world_size},
      {"model", c.model.kind},
      {"layers", c.model.layers},
      {"dim", c.model.dim},
      {"classes", c.model.classes},
      {"norm", c.model.norm},
      {"tokens_per_rank", c.tokens * c.micro_batches},
      {"micro_batches", c.micro_batches},
      {"cuda_graph", c.cuda_graph},
      {"graph_streams", s.graph_streams},
      {"host_us_per_step", s.host_us_per_step},
      {"backend_peak_bytes", s.backend_peak_bytes},
      {"backend_reserved_peak_bytes", s.backend_reserved_peak_bytes},
      {"steps", c.steps},
      {"steps_done", s.losses.size()},
      {"warmup", c.warmup},
      {"param_dtype", dtype_name(c.param_dtype)},
      {"reduce_dtype", dtype_name(c.reduce_dtype)},
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
      {"prefetch_next_step", c.prefetch_next_step},
      {"step_ms_median", s.step_ms_median},
      {"tokens_per_s", s.tokens_per_s},
      {"peak_mem_bytes", s.peak_mem_bytes},
      {"peak_mem_bytes_by_step", s.peak_mem_bytes_by_step},
      {"rs_inputs_in_flight_max", s.rs_inputs_in_flight_max},
      {"rs_max_input_buffers", c.rs_max_input_buffers},
      {"separate_rs_group", c.separate_rs_group},
      {"host_schedule_us_per_unit", s.host_schedule_us_per_unit},
      {"loss_first", number_or_null(!s.losses.empty(), s.losses.empty() ? 0 : s.losses.front())},
      {"loss_last", number_or_null(!s.losses.empty(), s.losses.empty() ? 0 : s.losses.back())},
      {"losses", s.losses},
      {"val_losses", val_losses_json(s.val_losses)},
      {"ep", c.model.ep},
      {"max_expert_load", number_or_null(s.max_expert_load >= 0, s.max_expert_load)},
      {"lrs", s.lrs},
      {"grad_norms", s.grad_norms},
      {"exposed_comm_ms", number_or_null(s.traced, s.exposed_comm_ms)},
      {"rs_recycle_stall_ms", number_or_null(s.traced, s.rs_recycle_stall_ms)},
      {"rs_drain_ms", number_or_null(s.traced, s.rs_drain_ms)},
      {"ag_rs_overlap_ms", number_or_null(s.traced, s.ag_rs_overlap_ms)},
      {"streams_used", number_or_null(s.traced || !s.graph_streams.empty(), s.streams_used)}};
  // Throughput against a GPU's peak means nothing on the CPU backend: reported on GPUs only.
  if (s.tflops_per_gpu >= 0) {
    j["tflops_per_gpu"] = s.tflops_per_gpu;
    j["mfu"] = s.mfu;
  }
  if (c.eval_every > 0) j["unigram_entropy_nats"] = unigram_entropy_nats;
  if (!s.error.empty()) {
    j["error"] = s.error;
    j["failed_step"] = s.failed_step + 1;  // 1-based, as the step line counts
  }
  return j;
}

// Writes `text` to `path` (Note [Output paths]); a failed write (a full disk, /dev/full) is an
// error.
void write_text(const std::string& flag, const std::string& path, const std::string& text) {
  try {
    io::write_file_atomic(path, text);
  } catch (const UserError& e) {
    FSDP_USER_FAIL(flag, ": ", e.what());
  }
}

// Note [Unreadable steps]: the summary of a run that a rank's error ended, from the steps rank
// 0 reported before it.
Summary summary_of_failed_run(const std::string& backend, int world,
                              const std::vector<runtime::StepReport>& reported,
                              const std::string& error, int failed_step) {
  Summary s;
  s.backend = backend;
  s.world_size = world;
  for (const runtime::StepReport& r : reported) {
    s.losses.push_back(r.loss);
    s.lrs.push_back(r.lr);
    s.grad_norms.push_back(r.grad_norm);
    if (r.val_loss >= 0) s.val_losses.push_back({r.step, r.val_loss});
  }
  s.error = error;
  s.failed_step = failed_step >= 0 ? failed_step : static_cast<int>(reported.size());
  return s;
}

}  // namespace

Summary summarize(const std::string& backend, int world, const runtime::TrainConfig& c,
                  const std::vector<runtime::RankResult>& ranks, double peak_tflops) {
  Summary s;
  s.backend = backend;
  s.world_size = world;
  const runtime::RankResult& r0 = ranks.at(0);
  const size_t skip = std::min<size_t>(static_cast<size_t>(c.warmup), r0.step_ms.size());
  std::vector<double> timed(r0.step_ms.begin() + skip, r0.step_ms.end());
  s.step_ms_median = median(timed);
  const int64_t step_tokens = c.tokens * c.micro_batches;  // per rank
  s.tokens_per_s = s.step_ms_median > 0 ? step_tokens * world * 1000.0 / s.step_ms_median : 0;
  if (backend != "cpu" && s.step_ms_median > 0) {
    s.tflops_per_gpu =
        models::flops_per_token(c.model) * step_tokens / (s.step_ms_median * 1e-3) / 1e12;
    s.mfu = s.tflops_per_gpu / peak_tflops;
  }
  s.graph_streams = r0.graph_streams;
  for (const auto& r : ranks) {
    s.peak_mem_bytes = std::max(s.peak_mem_bytes, r.memory.peak_bytes);
    if (s.peak_mem_bytes_by_step.size() < r.peak_bytes_by_step.size())
      s.peak_mem_bytes_by_step.resize(r.peak_bytes_by_step.size(), 0);
    for (size_t i = 0; i < r.peak_bytes_by_step.size(); ++i)
      s.peak_mem_bytes_by_step[i] = std::max(s.peak_mem_bytes_by_step[i], r.peak_bytes_by_step[i]);
    s.host_us_per_step = std::max(s.host_us_per_step, r.host_us_per_step);
    s.backend_peak_bytes = std::max(s.backend_peak_bytes, r.backend_peak_bytes);
    s.backend_reserved_peak_bytes =
        std::max(s.backend_reserved_peak_bytes, r.backend_reserved_peak_bytes);
    s.rs_inputs_in_flight_max = std::max(
        s.rs_inputs_in_flight_max, r.memory.tag_peak_live[static_cast<int>(MemTag::RsInput)]);
    s.host_schedule_us_per_unit = std::max(s.host_schedule_us_per_unit, r.host_schedule_us_per_unit);
    if (c.timeline && runtime::find_stream(r.timeline, "compute") >= 0) {
      // The slowest rank paces the step: report the worst.
      const runtime::TimelineMetrics m = metrics_of_timeline(r.timeline, r.host_schedule_us_per_unit, 0);
      s.traced = true;
      s.exposed_comm_ms = std::max(s.exposed_comm_ms, m.exposed_comm_ms);
      s.rs_recycle_stall_ms = std::max(s.rs_recycle_stall_ms, m.rs_recycle_stall_ms);
      s.rs_drain_ms = std::max(s.rs_drain_ms, m.rs_drain_ms);
      s.ag_rs_overlap_ms = std::max(s.ag_rs_overlap_ms, m.ag_rs_overlap_ms);
      s.streams_used = std::max(s.streams_used, m.streams_used);
    }
  }
  // Under a graph the streams are known without a trace (which sees one op per replayed step):
  // those the graph's work runs on.
  if (!s.graph_streams.empty()) s.streams_used = static_cast<int>(s.graph_streams.size());
  s.losses = r0.losses;
  s.lrs = r0.lrs;
  s.grad_norms = r0.grad_norms;
  s.val_losses = r0.val_losses;
  s.error = r0.error;
  s.failed_step = r0.failed_step;
  s.max_expert_load = r0.max_expert_loads.empty() ? -1 : r0.max_expert_loads.back();
  return s;
}

int run_train(TrainOptions& o) {
  std::string why;
  const std::string backend = check_train_options(o, why);
  o.config.checkpoint.verbose = !o.quiet;
  o.config.return_on_nonfinite = true;  // the summary is written first, then the error
  if (!why.empty()) std::printf("backend: %s (--backend auto: %s)\n", backend.c_str(), why.c_str());
  StepPrinterOptions po;
  po.steps = o.config.steps;
  po.world = o.effective_world;
  po.log_every = o.log_every;
  po.quiet = o.quiet;
  if (backend != "cpu") {
    po.flops_per_token = models::flops_per_token(o.config.model);
    po.peak_tflops = o.peak_tflops;
  }
  StepPrinter printer(po, stdout);
  std::vector<runtime::StepReport> reported;  // for the summary of a run that fails
  auto on_step = [&](const runtime::StepReport& r) {
    reported.push_back(r);
    printer(r);
    if (r.val_loss >= 0 && !o.quiet) {
      std::printf("  validation loss after step %d: %.4f nats/token (unigram entropy of the corpus: "
                  "%.4f)\n", r.step + 1, r.val_loss, o.unigram_entropy_nats);
      std::fflush(stdout);
    }
  };
  std::vector<runtime::RankResult> results;
  try {
    if (backend == "cpu") {
      cpu::CpuOptions cpu_options;
      cpu_options.chaos = o.chaos_seed.has_value();
      cpu_options.chaos_seed = static_cast<uint64_t>(o.chaos_seed.value_or(0));
      cpu_options.collective_timeout_s = o.timeout_s;  // threads and processes alike
      if (o.cpu_processes) {  // ranks as processes over Gloo (docs/cpu_processes.md)
        results = runtime::run_cpu_process_training(o.nproc, cpu_options, o.cpu_place, o.config, on_step);
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
                                     device, world, o.config,
                                     rank == 0 ? std::function<void(const runtime::StepReport&)>(on_step)
                                               : nullptr);
                               });
      }
    } else {
      results = runtime::run_cuda_training(launch_options_of(o), o.config, on_step, o.effective_world);
    }
  } catch (const Error& e) {
    // Note [Unreadable steps]: the run ended on an error; its summary is still written.
    const auto* step_error = dynamic_cast<const runtime::StepError*>(&e);
    if (!o.json_path.empty())
      write_text("--json", o.json_path,
                 summary_json(summary_of_failed_run(backend, o.effective_world, reported, e.what(),
                                                    step_error ? step_error->step() : -1),
                              o.config, o.unigram_entropy_nats)
                         .dump(2) +
                     "\n");
    throw;
  }
  const Summary s = summarize(backend, o.effective_world, o.config, results, o.peak_tflops);
  if (s.error.empty()) {
    std::printf("done: %s, %d ranks, step_ms median %.2f, tokens/s %.0f, peak mem %.1f MiB, "
                "rs inputs in flight max %lld (k=%d), loss %.6g -> %.6g\n",
                backend.c_str(), o.effective_world, s.step_ms_median, s.tokens_per_s,
                s.peak_mem_bytes / 1048576.0, static_cast<long long>(s.rs_inputs_in_flight_max),
                o.config.rs_max_input_buffers, s.losses.front(), s.losses.back());
    std::fflush(stdout);
  }
  if (!o.json_path.empty()) write_text("--json", o.json_path, summary_json(s, o.config, o.unigram_entropy_nats).dump(2) + "\n");
  if (!o.trace_path.empty()) {
    try {
      write_trace_file(o.trace_path, results);
    } catch (const UserError& e) {
      FSDP_USER_FAIL("--trace: ", e.what());
    }
  }
  if (!s.error.empty()) throw UserError(s.error);
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

nn::ModelConfig model_config_of(TrainOptions& options) {
  std::string why;
  check_train_options(options, why);
  return options.config.model;
}

}  // namespace fsdp::tools
