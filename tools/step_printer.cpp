#include "tools/step_printer.h"

#include <chrono>
#include <cmath>

namespace fsdp::tools {

void format_duration(double seconds, char* buf, size_t size) {
  const long s = std::lround(std::max(0.0, seconds));
  if (s >= 3600)
    std::snprintf(buf, size, "%ldh%02ldm", s / 3600, (s / 60) % 60);
  else if (s >= 60)
    std::snprintf(buf, size, "%ldm%02lds", s / 60, s % 60);
  else
    std::snprintf(buf, size, "%lds", s);
}

void StepPrinter::operator()(const runtime::StepReport& r) {
  std::lock_guard<std::mutex> lock(mutex_);
  elapsed_ms_ += r.step_ms;
  const int done = r.step + 1;
  const double mean_ms = elapsed_ms_ / done;
  char eta[32];
  format_duration(mean_ms * (o_.steps - done) / 1e3, eta, sizeof(eta));
  window_ms_ += r.step_ms;
  window_steps_ += 1;
  window_tokens_ += r.tokens;
  if (o_.quiet) {
    // Host clock for when to print only; nothing printed depends on it.
    const double now = std::chrono::duration<double>(
                           std::chrono::steady_clock::now().time_since_epoch()).count();
    if (!started_) {
      started_ = true;
      last_progress_ms_ = now;
      return;
    }
    if (now - last_progress_ms_ < o_.progress_interval_s || done == o_.steps) return;
    last_progress_ms_ = now;
    std::fprintf(out_, "progress: step %d/%d  loss %.6g  eta %s\n", done, o_.steps, r.loss, eta);
    std::fflush(out_);
    return;
  }
  if (done % o_.log_every != 0 && done != o_.steps && r.step != 0) return;
  const double step_ms = window_ms_ / window_steps_;
  const double tokens_per_s = window_ms_ > 0 ? window_tokens_ * o_.world * 1000.0 / window_ms_ : 0;
  const double rank_tokens = static_cast<double>(window_tokens_) / window_steps_;
  window_ms_ = 0;
  window_steps_ = 0;
  window_tokens_ = 0;
  // The step's fields in the order of FSDP_STEP_FIELDS (Note [Result fields]), then the ETA.
  std::fprintf(out_, "step %d/%d", done, o_.steps);
  runtime::for_each_step_field<runtime::StepReport>([&](const auto& field) {
    const runtime::LineRule& line = field.line;
    if (line.how == runtime::OnLine::No) return;
    if (line.how == runtime::OnLine::WhenSet && field.of(r) == field.absent) return;
    const double value = line.how == runtime::OnLine::Window ? step_ms : field.of(r);
    std::fprintf(out_, "  %s ", line.label);
    std::fprintf(out_, line.format, value);
    if (line.how != runtime::OnLine::Window) return;
    std::fprintf(out_, "  tokens/s %.0f", tokens_per_s);
    if (o_.flops_per_token > 0 && step_ms > 0) {
      const double tflops = o_.flops_per_token * rank_tokens / (step_ms * 1e-3) / 1e12;
      std::fprintf(out_, "  mfu %.1f%%", 100.0 * tflops / o_.peak_tflops);
    }
  });
  std::fprintf(out_, "  eta %s", eta);
  std::fputc('\n', out_);
  std::fflush(out_);
}

}  // namespace fsdp::tools
