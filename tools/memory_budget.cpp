// `fsdp train --memory-budget GiB|auto`: the memory plan (Note [Memory plans] in
// src/runtime/memory_planner.h), applied once while the command resolves its options.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "fsdp/error.h"
#include "fsdp/launch.h"
#include "fsdp/out_of_memory.h"
#include "runtime/memory_estimate.h"
#include "runtime/memory_planner.h"
#include "tools/train_command.h"

namespace fsdp::tools {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kMaxBudgetGiB = 1 << 20;  // a PiB: beyond any device
// On a GPU, what `auto` leaves of the memory a fresh process finds free (its context and
// other processes' memory already taken) for what the run allocates outside its pool:
// cuBLAS's, cuDNN's and NCCL's workspaces. What the pool reserves beyond its used bytes is for
// the plan's margin (docs/memory.md).
constexpr int64_t kGpuReservedBytes = int64_t{1} << 30;

// The budget `--memory-budget` names, in bytes, and where `auto`'s came from ("" for a number).
int64_t budget_bytes(const TrainOptions& o, const TrainRun& run, int64_t capacity,
                     std::string& source) {
  const std::string& text = o.memory_budget;
  if (text == "auto") {
    if (run.backend == "cpu") {
      if (capacity <= 0) capacity = o.cpu_memory_mib << 20;
      FSDP_USER_CHECK(capacity > 0, "--memory-budget auto needs the device's memory, which the "
                      "CPU backend knows only from --cpu-memory-mib: give it, or a budget in GiB");
      source = "auto: the device's " + byte_size_text(static_cast<uint64_t>(capacity));
      return capacity;
    }
    if (run.backend == "sim") {  // the simulated GPU's, from its calibration
      FSDP_USER_CHECK(capacity > 0, "--memory-budget auto: the calibration gives no "
                      "device_memory_gib; give a budget in GiB");
      source = "auto: the calibration's " + byte_size_text(static_cast<uint64_t>(capacity));
      return capacity;
    }
    std::string of_total;
    if (capacity <= 0) {
      const GpuMemory m = visible_gpu_memory();
      capacity = m.free_bytes;
      of_total = " (of " + byte_size_text(static_cast<uint64_t>(m.total_bytes)) + ")";
    }
    FSDP_USER_CHECK(capacity > 0, "--memory-budget auto: the GPU's memory could not be read; "
                    "give a budget in GiB");
    FSDP_USER_CHECK(capacity > kGpuReservedBytes, "--memory-budget auto: the GPU has only ",
                    byte_size_text(static_cast<uint64_t>(capacity)), " free, less than the ",
                    byte_size_text(kGpuReservedBytes), " auto keeps for the libraries' "
                    "workspaces; free the GPU or give a budget in GiB");
    source = "auto: the GPU's " + byte_size_text(static_cast<uint64_t>(capacity)) + " free" +
             of_total + " less " + byte_size_text(kGpuReservedBytes) +
             " for the libraries' workspaces";
    return capacity - kGpuReservedBytes;
  }
  double gib = 0;
  size_t used = 0;
  try {
    gib = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  FSDP_USER_CHECK(used == text.size() && std::isfinite(gib) && gib > 0 && gib <= kMaxBudgetGiB,
                  "--memory-budget takes GiB (a number > 0, at most ", kMaxBudgetGiB,
                  ") or auto, got '", text, "'");
  const int64_t bytes = static_cast<int64_t>(gib * kGiB);
  FSDP_USER_CHECK(bytes > 0, "--memory-budget ", text, " GiB is less than a byte");
  return bytes;
}

// GiB to two places; a size under a GiB as byte_size_text gives it ("0.00 GiB" says nothing).
std::string gib_text(int64_t bytes) {
  if (bytes < int64_t{1} << 30) return byte_size_text(static_cast<uint64_t>(std::max<int64_t>(bytes, 0)));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / kGiB);
  return buf;
}

}  // namespace

void apply_memory_budget(const TrainOptions& o, TrainRun& run, int64_t capacity) {
  runtime::TrainConfig& c = run.config;
  const int shard = std::max(run.world / std::max(c.hsdp_replicas, 1), 1);
  if (o.memory_budget.empty() && !(o.memory_budget_opt && o.memory_budget_opt->count() > 0)) {
    c.predicted_peak_bytes = runtime::estimate_rank_memory(c, shard).device_bytes;
    return;
  }
  // The planner plans for a config the API accepts: its refusals first, in its own words
  // (the command spells them with its flags).
  runtime::check_train_config(c, run.world);
  std::string source;
  const int64_t budget = budget_bytes(o, run, capacity, source);
  const auto given = [](const CLI::Option* opt) { return opt && opt->count() > 0; };
  runtime::PlanFreedom freedom;
  freedom.activation_checkpoint = !given(o.activation_checkpointing_opt);
  freedom.micro_batches = !given(o.micro_batches_opt);
  freedom.rs_max_input_buffers = !given(o.rs_max_input_buffers_opt);
  freedom.reshard_after_forward = !given(o.reshard_after_forward_opt);
  freedom.offload_optimizer = !given(o.offload_opt);  // the last resort (Note [Memory plans])
  const runtime::MemoryPlan plan = runtime::plan_memory(c, shard, budget, freedom);
  const std::string budget_text =
      gib_text(budget) + (source.empty() ? std::string() : " (" + source + ")");
  FSDP_USER_CHECK(plan.fits, "--memory-budget ", budget_text, ": no setting the planner may "
                  "choose fits (the least it predicts is ", gib_text(plan.predicted_peak_bytes),
                  ", with ", plan.settings(flag_of), ", and ", runtime::kPlanMargin * 100,
                  "% kept for the model's error); lower --tokens, add ranks, or leave more of "
                  "these flags to the planner");
  c = plan.config;
  c.memory_plan = plan.settings(flag_of);
  c.predicted_peak_bytes = plan.predicted_peak_bytes;
  c.memory_budget_bytes = budget;
  char step[32];
  std::snprintf(step, sizeof step, "%.3f", plan.relative_step_time);
  run.memory_plan_line = "memory plan: " + c.memory_plan + ": a predicted peak of " +
                         gib_text(plan.predicted_peak_bytes) + " in a budget of " + budget_text +
                         ", a step " + step + "x the fastest setting's (" +
                         std::to_string(plan.candidates) + " settings tried" +
                         (plan.config.offload_optimizer && !given(o.offload_opt)
                              ? "; nothing fits with the optimizer on the device, and the host "
                                "step the offload adds is not in that ratio"
                              : "") +
                         ")";
}

}  // namespace fsdp::tools
