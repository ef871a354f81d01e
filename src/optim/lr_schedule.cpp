#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "fsdp/error.h"

namespace fsdp::optim {

float LrSchedule::at(int step, float peak) const {
  if (step < warmup_steps) return peak * static_cast<float>(step + 1) / static_cast<float>(warmup_steps);
  if (kind == "constant") return peak;
  const int decay_steps = total_steps - warmup_steps - 1;
  if (decay_steps <= 0) return peak;
  const double progress = std::clamp(static_cast<double>(step - warmup_steps) / decay_steps, 0.0, 1.0);
  const double factor = kind == "cosine" ? 0.5 * (1.0 + std::cos(std::numbers::pi * progress))
                                         : 1.0 - progress;
  return static_cast<float>(min_lr + (static_cast<double>(peak) - min_lr) * factor);
}

float default_adamw_lr(int64_t dim) {
  return 1e-3f * std::min(1.0f, 256.0f / static_cast<float>(std::max<int64_t>(dim, 1)));
}

// Note [Options checked once]: lr is the peak lr, lr_schedule the schedule's kind.
void validate(const LrSchedule& s, float peak) {
  const OptionName lr{"lr"};
  FSDP_OPTION_CHECK(s.kind == "constant" || s.kind == "cosine" || s.kind == "linear",
                    OptionName{"lr_schedule"}, " must be constant, cosine or linear, not '",
                    s.kind, "'");
  FSDP_OPTION_CHECK(std::isfinite(peak) && peak > 0, lr, " must be a positive number, got ", peak);
  FSDP_OPTION_CHECK(std::isfinite(s.min_lr) && s.min_lr >= 0 && s.min_lr <= peak,
                    OptionName{"min_lr"}, " must be between 0 and ", lr, " (", peak, "), got ",
                    s.min_lr);
  FSDP_OPTION_CHECK(s.warmup_steps >= 0, OptionName{"warmup_steps"}, " must be >= 0, got ",
                    s.warmup_steps);
}

}  // namespace fsdp::optim
