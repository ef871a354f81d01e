// The learning rate of each step: linear warm-up, then cosine or linear decay to min_lr, or
// constant. Computed on the host; the optimizer reads it from device memory (Note [Step
// scalars] in fsdp/device.h).
#pragma once

#include <cstdint>
#include <string>

namespace fsdp::optim {

struct LrSchedule {
  std::string kind = "constant";  // constant | cosine | linear
  int warmup_steps = 0;           // linear from peak / warmup_steps up to the peak
  float min_lr = 0;               // where the decay ends, at the last step
  int total_steps = 1;

  // lr at 0-based step `step` for the peak lr `peak`. Warm-up: peak * (step + 1) /
  // warmup_steps. Then the decay runs over the remaining steps, reaching min_lr at the last.
  float at(int step, float peak) const;
};

// The command's AdamW lr for a model of width `dim`: 1e-3 up to width 256, then 1e-3 * 256 /
// dim. Adam moves every weight by about lr whatever its gradient's scale, so a layer's output
// moves by about lr * fan_in: the lr must shrink with the width (as muP scales it) or wide
// models overshoot in their first steps (Note [Command defaults] in tools/train_checks.cpp).
float default_adamw_lr(int64_t dim);

// Plain-sentence check of the fields against the peak (kind, peak > 0, 0 <= min_lr <= peak,
// warmup_steps >= 0).
void validate(const LrSchedule& s, float peak);

}  // namespace fsdp::optim
