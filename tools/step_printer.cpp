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
  std::fprintf(out_, "step %d/%d  loss %.6g  lr %.3g", done, o_.steps, r.loss, r.lr);
  if (r.grad_norm >= 0) std::fprintf(out_, "  grad_norm %.4g", r.grad_norm);
  std::fprintf(out_, "  step_ms %.2f  tokens/s %.0f", step_ms, tokens_per_s);
  if (o_.flops_per_token > 0 && step_ms > 0) {
    const double tflops = o_.flops_per_token * rank_tokens / (step_ms * 1e-3) / 1e12;
    std::fprintf(out_, "  mfu %.1f%%", 100.0 * tflops / o_.peak_tflops);
  }
  if (r.max_expert_load >= 0) std::fprintf(out_, "  max_expert_load %.3f", r.max_expert_load);
  std::fprintf(out_, "  eta %s", eta);
  if (r.exposed_comm_ms >= 0)
    std::fprintf(out_, "  exposed_comm_ms %.3f  rs_recycle_stall_ms %.3f", r.exposed_comm_ms,
                 r.rs_recycle_stall_ms);
  std::fputc('\n', out_);
  std::fflush(out_);
}

}  // namespace fsdp::tools
