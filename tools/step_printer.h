// The step line of `fsdp train`: loss, lr, grad norm, tokens/s, MFU (GPUs), ETA.
#pragma once

#include <cstdio>
#include <mutex>

#include "runtime/trainer.h"

namespace fsdp::tools {

struct StepPrinterOptions {
  int steps = 1;
  int world = 1;
  int log_every = 1;     // a line every N steps (and the last)
  bool quiet = false;    // no step lines; a progress line about every 10 s instead
  double flops_per_token = 0;  // > 0: MFU against peak_tflops (GPU runs)
  double peak_tflops = 0;
  double progress_interval_s = 10;
};

class StepPrinter {
 public:
  StepPrinter(StepPrinterOptions o, std::FILE* out) : o_(o), out_(out) {}
  // Rank 0's report of one step (Note [Asynchronous step read]: a step behind the work).
  void operator()(const runtime::StepReport& r);

 private:
  StepPrinterOptions o_;
  std::FILE* out_;
  std::mutex mutex_;
  double elapsed_ms_ = 0;        // sum of the reported steps' times
  // Since the last step line: the time and the steps, so a line shows their mean (steps read
  // together, e.g. after an evaluation synchronized the device, do not show as 0 ms and inf).
  double window_ms_ = 0;
  int window_steps_ = 0;
  int64_t window_tokens_ = 0;
  double last_progress_ms_ = 0;  // host clock of the last quiet progress line
  bool started_ = false;
};

// "1h02m", "3m05s", "12s"
void format_duration(double seconds, char* buf, size_t size);

}  // namespace fsdp::tools
