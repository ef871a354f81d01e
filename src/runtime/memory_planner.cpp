// Note [Memory plans] (memory_planner.h); the cost model is docs/memory.md's "Planner".
#include "runtime/memory_planner.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "fsdp/error.h"
#include "fsdp/out_of_memory.h"
#include "models/model_family.h"
#include "runtime/memory_estimate.h"

namespace fsdp::runtime {

namespace {

// ---- the cost model's rates: an H200's, as measured (bench/calibrations/h200.json and
// bench/runs/2026-12-05-checkpointing-3b). Only the ratios between the terms decide a
// plan, so another GPU's rates move the choice only where compute and the link trade places.
constexpr double kBf16FlopsPerS = 650e12;  // a step's GEMMs and attention: ours ran at 65-67% MFU
constexpr double kFp32FlopsPerS = 50e12;   // fp32 GEMMs (the calibration's default)
constexpr double kLinkBytesPerS = 200e9;   // NCCL's bus bandwidth over NVLink, 32-64 MiB messages
constexpr double kCollectiveBaseS = 12.6e-6;  // once per collective
// What recomputing costs, as a share of the step without it: full checkpointing on every block
// ran at 1.224x (its recompute stopping early), selective at 1.014x (3.0B shape, 2 x 8192
// tokens, one H200).
constexpr double kFullRecomputeShare = 0.224;
constexpr double kSelectiveRecomputeShare = 0.014;
// The fixed cost of a unit's forward and backward per micro-batch (hooks, the small kernels'
// launches that the GEMMs do not hide): what makes m micro-batches cost more than one.
constexpr double kUnitPassS = 60e-6;
// With m > 1 micro-batches every unit keeps fp32 unsharded grads across them: the compute
// stream zeroes them once (4 bytes a param), accumulates each micro-batch's grads into them
// (reads the grad and the accumulator, writes the accumulator: param dtype + 8 bytes a param,
// m times) and the reduce-scatter's copy-in reads them in fp32 instead of the grad (4 - param
// dtype bytes more), all memory-bound, at the calibration's accumulate bandwidth. Measured on
// one H100, the 3.0B shape at 2 x 8192 tokens: 2 micro-batches 714.62 ms against selective
// checkpointing's 689.48 (bench/runs/2026-12-07-memory-budget-h100), which the fixed cost per
// pass alone put the other way round.
constexpr double kMemoryBytesPerS = 3.3e12;
constexpr int kMaxMicroBatches = 1024;
constexpr int kMaxRingBuffers = 4;  // past the ring's usual 2, more buffers only cost memory

struct Candidate {
  nn::ActivationCheckpointConfig checkpoint;
  int micro_batches = 1;
  int k = 1;
  bool reshard_after_forward = true;
};

// The step's predicted time, in seconds on the rates above (Note [Memory plans]).
class StepCostModel {
 public:
  StepCostModel(const TrainConfig& c, const RankMemoryModel& memory)
      : world_(memory.shard_ranks()), units_(memory.unit_params()) {
    flops_per_token_ = models::flops_per_token(memory.model());
    layers_ = memory.model().layers;
    for (int64_t u : units_) params_ += static_cast<double>(u);
    rate_ = c.param_dtype == DType::F32 ? kFp32FlopsPerS : kBf16FlopsPerS;
  }

  double seconds(const TrainConfig& c, int64_t step_tokens) const {
    const int m = c.micro_batches;
    const double compute = flops_per_token_ * static_cast<double>(step_tokens) / rate_;
    int checkpointed = 0;
    for (int i = 0; i < layers_; ++i)
      checkpointed += c.activation_checkpoint.of_block(i) == ActivationCheckpoint::Full;
    double recompute = kFullRecomputeShare * compute * checkpointed / std::max(layers_, 1);
    if (c.activation_checkpoint.mode == ActivationCheckpoint::Selective)
      recompute = kSelectiveRecomputeShare * compute;
    // Per micro-batch: a third of the compute in forward, the rest and the recompute in
    // backward; the forward gathers every unit, the backward the blocks again when they
    // resharded (over the post-forward mesh's N ranks with reshard_after_forward=N); the last
    // micro-batch's backward reduce-scatters every unit (the others skip the sync).
    const double fwd = compute / 3 / m, bwd = (compute * 2 / 3 + recompute) / m;
    const double p = dtype_size(c.param_dtype), r = dtype_size(c.reduce_dtype);
    double ag_fwd = 0, ag_bwd = 0, rs = 0, rs_largest = 0;
    if (world_ > 1) {
      const double share = (world_ - 1.0) / world_;
      const int n = c.reshard_after_forward_size > 0 ? c.reshard_after_forward_size : world_;
      const double bwd_share = (n - 1.0) / n;
      for (size_t u = 0; u < units_.size(); ++u) {
        const double bytes = std::ceil(static_cast<double>(units_[u]) / world_) * world_;
        ag_fwd += kCollectiveBaseS + bytes * p * share / kLinkBytesPerS;
        const bool block = u + 1 < units_.size();  // the root stays gathered
        if (block && c.reshard_after_forward)
          ag_bwd += kCollectiveBaseS + bytes * p * bwd_share / kLinkBytesPerS;
        const double one_rs = kCollectiveBaseS + bytes * r * share / kLinkBytesPerS;
        rs += one_rs;
        rs_largest = std::max(rs_largest, one_rs);
      }
    }
    // Compute and collectives overlap (their own streams); the slower paces each pass. With k
    // RS buffers, a block's backward waits when the reduce-scatter k blocks back has not
    // finished: a stall per unit of what the RS takes beyond k blocks' backward.
    const double per_block_bwd = bwd / std::max(layers_, 1);
    const double stall = static_cast<double>(units_.size()) *
                         std::max(0.0, rs_largest - c.rs_max_input_buffers * per_block_bwd);
    double total = 0;
    if (m > 1) total += params_ * (4 + (4 - p) + m * (p + 8)) / kMemoryBytesPerS;
    for (int i = 0; i < m; ++i) {
      const double last_rs = i + 1 == m ? rs : 0;
      total += std::max(fwd, ag_fwd);
      total += std::min(std::max(bwd, ag_bwd + last_rs) + (i + 1 == m ? stall : 0),
                        bwd + ag_bwd + last_rs);
      total += 2 * kUnitPassS * static_cast<double>(units_.size());
    }
    return total;
  }

 private:
  int world_;
  std::vector<int64_t> units_;
  double flops_per_token_ = 0, rate_ = kBf16FlopsPerS;
  double params_ = 0;  // every unit's, unsharded: what the micro-batches' accumulators hold
  int layers_ = 1;
};

// Every checkpointing mode the family runs: none, selective (where it has a policy), every:N
// for each distinct count of checkpointed blocks, full.
std::vector<nn::ActivationCheckpointConfig> checkpoint_choices(const nn::ModelConfig& model) {
  std::vector<nn::ActivationCheckpointConfig> out;
  out.push_back({});
  if (models::family(model.kind).selective_checkpoint_refusal().empty())
    out.push_back({ActivationCheckpoint::Selective, 1});
  int last_count = -1;
  for (int n = std::max(model.layers, 2); n >= 2; --n) {  // fewest checkpointed blocks first
    const int count = (model.layers + n - 1) / n;
    if (count == last_count || count == model.layers) continue;
    last_count = count;
    out.push_back({ActivationCheckpoint::Full, n});
  }
  out.push_back({ActivationCheckpoint::Full, 1});
  return out;
}

// The micro-batch counts that split `step_tokens` evenly (into whole sequences for a token
// model).
std::vector<int> micro_batch_choices(int64_t step_tokens, const nn::ModelConfig& model) {
  const bool sequences = models::family(model.kind).batch_kind() == models::BatchKind::Tokens;
  const int64_t unit = sequences ? std::max<int64_t>(model.seq_len, 1) : 1;
  std::vector<int> out;
  if (step_tokens % unit != 0) return {1};
  const int64_t rows = step_tokens / unit;
  for (int m = 1; m <= kMaxMicroBatches && m <= rows; ++m)
    if (rows % m == 0) out.push_back(m);
  return out;
}

std::string spelled(const std::function<std::string(const std::string&)>& spell,
                    const std::string& option) {
  return spell ? spell(option) : option;
}

}  // namespace

std::string MemoryPlan::settings(
    const std::function<std::string(const std::string&)>& spell) const {
  const TrainConfig& c = config;
  std::string reshard = c.reshard_after_forward_size > 0
                            ? std::to_string(c.reshard_after_forward_size)
                            : std::string(c.reshard_after_forward ? "1" : "0");
  std::string out = detail::concat(
      spelled(spell, "activation_checkpointing"), " ", c.activation_checkpoint.to_string(), " ",
      spelled(spell, "micro_batches"), " ", c.micro_batches, " ",
      spelled(spell, "reduce_scatter_max_input_buffers"), " ", c.rs_max_input_buffers, " ",
      spelled(spell, "reshard_after_forward"), " ", reshard);
  if (c.offload_optimizer) out += detail::concat(" ", spelled(spell, "offload"), " optimizer");
  return out;
}

MemoryPlan plan_memory(const TrainConfig& config, int shard_ranks, int64_t budget_bytes,
                       const PlanFreedom& freedom) {
  FSDP_CHECK(budget_bytes > 0, "a memory budget must be > 0 bytes, got ", budget_bytes);
  const RankMemoryModel memory(config, shard_ranks);
  const StepCostModel cost(config, memory);
  const nn::ModelConfig& model = memory.model();
  const int64_t step_tokens = config.tokens * config.micro_batches;
  const int world = std::max(shard_ranks, 1) * std::max(config.hsdp_replicas, 1);

  std::vector<nn::ActivationCheckpointConfig> modes{config.activation_checkpoint};
  if (freedom.activation_checkpoint) modes = checkpoint_choices(model);
  std::vector<int> micro{config.micro_batches};
  if (freedom.micro_batches) micro = micro_batch_choices(step_tokens, model);
  std::vector<int> ks{config.rs_max_input_buffers};
  // On one rank the reduce-scatter is the identity and the ring's buffers are the grads
  // themselves: k buys nothing there.
  if (freedom.rs_max_input_buffers && shard_ranks > 1)
    for (int k = 1; k <= kMaxRingBuffers; ++k)
      if (k != config.rs_max_input_buffers) ks.push_back(k);
  std::vector<bool> reshard{config.reshard_after_forward};
  const bool int_reshard = config.reshard_after_forward_size > 0;  // an N given: kept
  if (freedom.reshard_after_forward && !int_reshard && shard_ranks > 1)
    reshard.push_back(!config.reshard_after_forward);

  // The offload is the outermost choice, and the last (PlanFreedom::offload_optimizer): the
  // same candidates with the states on the host, tried only when none on the device fits.
  std::vector<bool> offloads{config.offload_optimizer};
  if (freedom.offload_optimizer && !config.offload_optimizer) offloads.push_back(true);
  MemoryPlan best, smallest;
  double best_s = std::numeric_limits<double>::infinity(), fastest_s = best_s;
  smallest.predicted_peak_bytes = std::numeric_limits<int64_t>::max();
  int tried = 0;
  for (bool offload : offloads) {
    if (best.fits) break;
    for (const auto& mode : modes)
      for (int m : micro)
        for (int k : ks)
          for (bool raf : reshard) {
            TrainConfig c = config;
            c.activation_checkpoint = mode;
            c.micro_batches = m;
            c.tokens = step_tokens / m;
            c.rs_max_input_buffers = k;
            c.reshard_after_forward = raf;
            c.offload_optimizer = offload;
            try {
              check_train_config(c, world);
            } catch (const Error&) {
              continue;  // a combination the API refuses (selective on this family, ...)
            }
            ++tried;
            const int64_t peak = memory.estimate(c).device_bytes;
            const double s = cost.seconds(c, step_tokens);
            fastest_s = std::min(fastest_s, s);
            const bool fits = static_cast<double>(peak) * (1 + kPlanMargin) <=
                              static_cast<double>(budget_bytes);
            if (peak < smallest.predicted_peak_bytes) {
              smallest.config = c;
              smallest.predicted_peak_bytes = peak;
            }
            if (!fits) continue;
            // The fastest; of two as fast (k on one rank, say), the smaller peak.
            if (s < best_s || (s == best_s && peak < best.predicted_peak_bytes)) {
              best.config = c;
              best.predicted_peak_bytes = peak;
              best_s = s;
              best.relative_step_time = s;
              best.fits = true;
            }
          }
  }
  MemoryPlan plan = best.fits ? best : smallest;
  plan.budget_bytes = budget_bytes;
  plan.candidates = tried;
  if (plan.fits && fastest_s > 0) plan.relative_step_time = plan.relative_step_time / fastest_s;
  if (!plan.fits) plan.relative_step_time = 0;
  FSDP_CHECK(tried > 0, "the memory planner found no setting the run accepts");
  return plan;
}

std::string out_of_memory_advice(const TrainConfig& config, int shard_ranks, int64_t peak,
                                 int64_t capacity, int64_t live, uint64_t requested) {
  const auto size = [](int64_t bytes) { return byte_size_text(static_cast<uint64_t>(bytes)); };
  const std::string peak_text = "; the run's peak so far: " + size(peak);
  const bool planned = config.memory_budget_bytes > 0;
  const int64_t budget = planned ? config.memory_budget_bytes : capacity;
  const std::string try_less =
      detail::concat("try fewer ", option_spelling("tokens"), ", more ",
                     option_spelling("micro_batches"), " or ",
                     option_spelling("activation_checkpointing"));
  if (budget <= 0) return peak_text + "; " + try_less;
  // A device that refused below the budget holds the rest outside the run's allocations (the
  // CUDA context, libraries' workspaces, the pool's fragments): the run had at most `live`
  // plus the request, so advice for the whole budget would name settings that fail again.
  const int64_t reached = live + static_cast<int64_t>(requested);
  const bool short_of_budget = live > 0 && reached < budget;
  std::string out = detail::concat(
      peak_text, "; the budget: ", size(budget),
      planned ? " (" + option_spelling("memory_budget") : std::string(" (the device's"),
      short_of_budget ? ", of which the run's allocations could hold less than " + size(reached)
                      : std::string(),
      ")");
  const int64_t usable = short_of_budget ? live : budget;
  try {
    // What the model predicts for these settings against what they reached: a model that fell
    // short plans for a budget as much smaller.
    const int64_t predicted = estimate_rank_memory(config, shard_ranks).device_bytes;
    double scale = 1;
    if (peak > predicted && predicted > 0)
      scale = static_cast<double>(predicted) / static_cast<double>(peak);
    const MemoryPlan plan = plan_memory(
        config, shard_ranks, static_cast<int64_t>(static_cast<double>(usable) * scale));
    if (plan.fits)
      return out + "; what would fit: " + plan.settings(option_spelling) +
             " (a predicted peak of " + size(plan.predicted_peak_bytes) + ")";
    return out + "; no checkpointing, micro-batches, " +
           option_spelling("reduce_scatter_max_input_buffers") + " or " +
           option_spelling("reshard_after_forward") + " fits it (the least: " +
           size(plan.predicted_peak_bytes) + ", with " + plan.settings(option_spelling) + "): " +
           detail::concat("try fewer ", option_spelling("tokens"), " or more ranks");
  } catch (const Error&) {
    return out + "; " + try_less;  // the advice must not hide the error it advises on
  }
}

}  // namespace fsdp::runtime
