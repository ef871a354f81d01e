// The settings that make a run fit a memory budget, fastest first (docs/memory.md, "Planner").
//
// Note [Memory plans]
// A run's peak is decided by a few settings that cost time to lower it: activation
// checkpointing (a recompute), the RS ring's k (each buffer is one unit's grads), reshard after
// forward (off: no backward all-gather, every unit held from its forward to its backward) and
// micro-batches (activations of tokens / m, but each micro-batch gathers the params again, and
// with m > 1 every unit keeps fp32 unsharded grads across the micro-batches). plan_memory
// tries every combination of the settings it may choose (those the user left unset; the others
// stay as given), predicts each one's peak with the family's memory model (RankMemoryModel,
// docs/memory.md) and its step time with a cost model of relative costs (the recompute's
// measured share of a step, the collectives' bytes over the link, a fixed cost per unit and
// micro-batch), and keeps the fastest whose predicted peak, with the model's error margin,
// fits the budget; of two as fast, the smaller peak. The optimizer on the host is tried last,
// only when nothing fits on the device (PlanFreedom::offload_optimizer). The command applies
// the plan once, while it resolves its options, and prints it; the trainer's out-of-memory
// error asks it what would fit (Note [Out of memory]).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "runtime/trainer.h"

namespace fsdp::runtime {

// Which settings the planner may choose; false: the config's value is kept.
struct PlanFreedom {
  bool activation_checkpoint = true;
  bool rs_max_input_buffers = true;
  bool reshard_after_forward = true;
  bool micro_batches = true;
  // The optimizer on the host (Note [Optimizer offload]): its states leave the device, but
  // its host step is far slower than any device-only setting (docs/memory.md), so it is
  // chosen only when none of those fits, and then with the fastest of them that fits. Off
  // unless asked: the offload has its own refusals (with the optimizer in backward, ...).
  bool offload_optimizer = false;
};

// The share of the budget the planner keeps free for the memory model's error: a plan fits
// when its predicted peak x (1 + kPlanMargin) is within the budget.
constexpr double kPlanMargin = 0.05;

struct MemoryPlan {
  bool fits = false;      // some choice fits; otherwise `config` is the smallest peak found
  TrainConfig config;     // the given config with the chosen settings
  int64_t budget_bytes = 0;
  int64_t predicted_peak_bytes = 0;
  // The predicted step time against that of the fastest choice regardless of memory (1: no
  // cost paid to fit; 0 when nothing fits).
  double relative_step_time = 1;
  int candidates = 0;  // the combinations tried
  // The chosen settings, each as `spell(option) value` ("--micro-batches 3"), in a fixed
  // order: activation checkpointing, micro-batches, RS input buffers, reshard after forward,
  // and the offload when the plan puts the optimizer on the host.
  std::string settings(const std::function<std::string(const std::string&)>& spell) const;
};

// The fastest settings of `config` (tokens per micro-batch x micro-batches per rank per step,
// as trained) whose predicted peak fits `budget_bytes`, for a rank whose params shard over
// `shard_ranks` ranks. Settings that would break the API's rules (check_train_config) are not
// tried.
MemoryPlan plan_memory(const TrainConfig& config, int shard_ranks, int64_t budget_bytes,
                       const PlanFreedom& freedom = {});

// Note [Out of memory]: what the trainer's out-of-memory error says after what did not fit:
// the run's peak so far (`peak`), the budget (the plan's, else the device's `capacity`; 0:
// unknown) and the planner's answer for it with every setting free, in the front end's
// spelling of the options (option_spelling). When the run's own settings were predicted to fit
// yet did not, the budget is planned for as much smaller as the prediction fell short; when the
// device refused `requested` bytes beside `live` in use, short of the budget, the plan is for
// `live` (the rest of the device is not the run's to use).
std::string out_of_memory_advice(const TrainConfig& config, int shard_ranks, int64_t peak,
                                 int64_t capacity, int64_t live, uint64_t requested);

}  // namespace fsdp::runtime
