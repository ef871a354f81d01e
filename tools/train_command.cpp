// `fsdp train`: a training run on the CPU or CUDA backend, one line per step, a JSON summary.
#include "tools/train_command.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <mutex>

#include <nlohmann/json.hpp>

#include "backend/cuda/cuda_backend.h"
#include "fsdp/error.h"
#include "runtime/launch.h"
#include "runtime/launch_cuda.h"
#include "tools/trace_writer.h"

namespace fsdp::tools {

void add_train_options(CLI::App& app, TrainOptions& o) {
  app.add_option("--backend", o.backend, "cpu | cuda | auto")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  app.add_option("--world-size", o.world_size, "ranks (CPU backend: threads)");
  app.add_option("--nproc", o.nproc, "processes, one per GPU (CUDA backend; default: all GPUs)");
  app.add_option("--model", o.config.model.kind, "mlp | resmlp | moe")
      ->check(CLI::IsMember({"mlp", "resmlp", "moe"}));
  app.add_option("--layers", o.config.model.layers, "blocks");
  app.add_option("--dim", o.config.model.dim, "model width");
  app.add_option("--hidden", o.config.model.hidden, "expert hidden size (default: dim)");
  app.add_option("--experts", o.config.model.experts, "experts per MoE block");
  app.add_option("--classes", o.config.model.classes, "moe: classes of the head (default 16)");
  app.add_option("--tokens", o.config.tokens, "tokens per rank per step");
  app.add_option("--steps", o.config.steps, "training steps");
  app.add_option("--warmup", o.config.warmup, "steps left out of the timing statistics");
  app.add_option("--seed", o.config.seed, "seed for init and data");
  app.add_option("--param-dtype", o.param_dtype, "bf16 | fp32")->check(CLI::IsMember({"bf16", "fp32"}));
  app.add_option("--reshard-after-forward", o.config.reshard_after_forward, "0 | 1");
  app.add_option("--rs-max-input-buffers", o.config.rs_max_input_buffers,
                 "reduce-scatter input buffers in flight (k >= 1)");
  app.add_option("--separate-rs-group", o.config.separate_rs_group, "0 | 1");
  app.add_option("--optimizer", o.config.optimizer.kind, "adamw | sgd")->check(CLI::IsMember({"adamw", "sgd"}));
  app.add_option("--lr", o.lr, "learning rate");
  app.add_option("--optimizer-in-backward", o.config.optimizer_in_backward,
                 "0 | 1: step each group's shard right after its reduce-scatter");
  app.add_option("--prefetch-next-step", o.config.prefetch_next_step,
                 "0 | 1: start the next step's first all-gather before the step ends");
  app.add_option("--chaos", o.chaos_seed, "CPU backend: inject random delays with this seed");
  app.add_option("--json", o.json_path, "write a summary object to this file");
  app.add_option("--trace", o.trace_path, "write a Chrome trace of the timed steps");
  app.add_flag("--quiet", o.quiet, "no per-step lines");
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

void validate(TrainOptions& o) {
  FSDP_CHECK(o.world_size >= 1, "--world-size must be >= 1, got ", o.world_size);
  FSDP_CHECK(o.config.rs_max_input_buffers >= 1, "--rs-max-input-buffers must be >= 1, got ",
             o.config.rs_max_input_buffers);
  FSDP_CHECK(o.config.steps >= 1, "--steps must be >= 1, got ", o.config.steps);
  FSDP_CHECK(o.config.warmup >= 0 && o.config.warmup < o.config.steps,
             "--warmup must be in [0, steps), got ", o.config.warmup);
  FSDP_CHECK(o.config.tokens >= 1, "--tokens must be >= 1, got ", o.config.tokens);
  o.config.param_dtype = parse_dtype(o.param_dtype);
  if (o.lr > 0) o.config.optimizer.adamw.lr = o.config.optimizer.sgd_lr = static_cast<float>(o.lr);
  if (o.config.model.kind != "mlp" && o.config.model.classes == 0) o.config.model.classes = 16;
  o.config.timeline = !o.trace_path.empty();
}

std::string resolve_backend(const std::string& requested) {
  if (requested == "cpu") return "cpu";
  if (requested == "cuda") {
    FSDP_CHECK(cuda::compiled_with_cuda(), "--backend cuda: this build has no CUDA backend "
               "(nvcc or NCCL missing at build time)");
    return "cuda";
  }
  return cuda::compiled_with_cuda() && runtime::visible_gpu_count() > 0 ? "cuda" : "cpu";
}

}  // namespace

Summary summarize(const std::string& backend, int world, const runtime::TrainConfig& c,
                  const std::vector<runtime::RankResult>& ranks) {
  Summary s;
  s.backend = backend;
  s.world_size = world;
  const runtime::RankResult& r0 = ranks.at(0);
  // A resumed run has fewer steps than c.steps.
  std::vector<double> timed(
      r0.step_ms.begin() + std::min<size_t>(c.warmup, r0.step_ms.size()), r0.step_ms.end());
  s.step_ms_median = median(timed);
  s.tokens_per_s = s.step_ms_median > 0 ? c.tokens * world * 1000.0 / s.step_ms_median : 0;
  s.tflops_per_gpu = s.step_ms_median > 0
      ? 6.0 * r0.param_count * c.tokens / (s.step_ms_median * 1e-3) / 1e12 : 0;
  for (const auto& r : ranks) {
    s.peak_mem_bytes = std::max(s.peak_mem_bytes, r.memory.peak_bytes);
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
  s.losses = r0.losses;
  s.loss_first = r0.losses.front();
  s.loss_last = r0.losses.back();
  return s;
}

nlohmann::json summary_json(const Summary& s, const runtime::TrainConfig& c, const std::string& model) {
  return {{"backend", s.backend},
          {"world_size", s.world_size},
          {"model", model},
          {"layers", c.model.layers},
          {"dim", c.model.dim},
          {"tokens_per_rank", c.tokens},
          {"steps", c.steps},
          {"warmup", c.warmup},
          {"param_dtype", dtype_name(c.param_dtype)},
          {"reshard_after_forward", c.reshard_after_forward},
          {"optimizer_in_backward", c.optimizer_in_backward},
          {"prefetch_next_step", c.prefetch_next_step},
          {"step_ms_median", s.step_ms_median},
          {"tokens_per_s", s.tokens_per_s},
          {"tflops_per_gpu", s.tflops_per_gpu},
          {"peak_mem_bytes", s.peak_mem_bytes},
          {"rs_inputs_in_flight_max", s.rs_inputs_in_flight_max},
          {"rs_max_input_buffers", c.rs_max_input_buffers},
          {"separate_rs_group", c.separate_rs_group},
          {"host_schedule_us_per_unit", s.host_schedule_us_per_unit},
          {"loss_first", s.loss_first},
          {"loss_last", s.loss_last},
          {"losses", s.losses},
          {"exposed_comm_ms", s.traced ? nlohmann::json(s.exposed_comm_ms) : nlohmann::json()},
          {"rs_recycle_stall_ms", s.traced ? nlohmann::json(s.rs_recycle_stall_ms) : nlohmann::json()},
          {"rs_drain_ms", s.traced ? nlohmann::json(s.rs_drain_ms) : nlohmann::json()},
          {"ag_rs_overlap_ms", s.traced ? nlohmann::json(s.ag_rs_overlap_ms) : nlohmann::json()},
          {"streams_used", s.traced ? nlohmann::json(s.streams_used) : nlohmann::json()}};
}

int run_train(TrainOptions& o) {
  validate(o);
  o.config.checkpoint.verbose = !o.quiet;
  const std::string backend = resolve_backend(o.backend);
  std::mutex print_mutex;
  const int steps = o.config.steps;
  auto on_step = [&](const runtime::StepReport& r) {
    if (o.quiet) return;
    std::lock_guard<std::mutex> lock(print_mutex);
    const int width = 20, done = (r.step + 1) * width / steps;
    std::fprintf(stdout, "[%.*s%*s] step %d/%d  loss %.6g  step_ms %.2f  tokens/s %.0f", done,
                 "####################", width - done, "", r.step + 1, steps, r.loss, r.step_ms,
                 r.step_ms > 0 ? o.config.tokens * o.effective_world * 1000.0 / r.step_ms : 0);
    if (r.exposed_comm_ms >= 0)
      std::fprintf(stdout, "  exposed_comm_ms %.3f  rs_recycle_stall_ms %.3f", r.exposed_comm_ms,
                   r.rs_recycle_stall_ms);
    std::fputc('\n', stdout);
    std::fflush(stdout);
  };
  std::vector<runtime::RankResult> results;
  if (backend == "cpu") {
    o.effective_world = o.world_size;
    results.resize(o.world_size);
    cpu::CpuOptions cpu_options;
    cpu_options.chaos = o.chaos_seed.has_value();
    cpu_options.chaos_seed = o.chaos_seed.value_or(0);
    runtime::run_cpu_ranks(o.world_size, cpu_options,
                           [&](int rank, Device& device, std::shared_ptr<Comm> world) {
                             results[rank] = runtime::train_rank(
                                 device, world, o.config,
                                 rank == 0 ? std::function<void(const runtime::StepReport&)>(on_step)
                                           : nullptr);
                           });
  } else {
    results = runtime::run_cuda_training(o.nproc, o.config, on_step, o.effective_world);
  }
  const Summary s = summarize(backend, o.effective_world, o.config, results);
  std::printf("done: %s, %d ranks, step_ms median %.2f, tokens/s %.0f, peak mem %.1f MiB, "
              "rs inputs in flight max %lld (k=%d), loss %.6g -> %.6g\n",
              backend.c_str(), o.effective_world, s.step_ms_median, s.tokens_per_s,
              s.peak_mem_bytes / 1048576.0, static_cast<long long>(s.rs_inputs_in_flight_max),
              o.config.rs_max_input_buffers, s.loss_first, s.loss_last);
  if (!o.json_path.empty()) {
    std::ofstream out(o.json_path);
    FSDP_CHECK(out.good(), "cannot write --json file '", o.json_path, "'");
    out << summary_json(s, o.config, o.config.model.kind).dump(2) << "\n";
  }
  if (!o.trace_path.empty()) write_trace_file(o.trace_path, results);
  return 0;
}

nn::ModelConfig model_config_of(TrainOptions& options) {
  validate(options);
  return options.config.model;
}

}  // namespace fsdp::tools
