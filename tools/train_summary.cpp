// The JSON summary's results part (Note [Result fields]) and the writing of output files,
// shared by `fsdp train` and `fsdp simulate`.
#include <algorithm>

#include <nlohmann/json.hpp>

#include "fsdp/error.h"
#include "io/file_io.h"
#include "models/model_family.h"
#include "runtime/rank_result_fields.h"
#include "runtime/rank_result_json.h"
#include "runtime/trace_metrics.h"
#include "tools/trace_writer.h"
#include "tools/train_command.h"

namespace fsdp::tools {

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

nlohmann::json number_or_null(bool has, double v) {
  return has ? nlohmann::json(v) : nlohmann::json();
}

// The fields whose rule is rank0, max_over_ranks, max_each_step or rank0_last
// (Note [Result fields]).
void add_ruled_fields(const std::vector<runtime::RankResult>& ranks, nlohmann::json& j) {
  using runtime::Summarized;
  const runtime::RankResult& r0 = ranks.at(0);
  runtime::for_each_result_field<runtime::RankResult>([&](const auto& field) {
    using T = std::remove_cvref_t<decltype(field.of(r0))>;
    const runtime::SummaryRule rule = field.summary;
    if (rule.how == Summarized::Rank0) j[rule.keys] = runtime::field_to_json(field.of(r0));
    if constexpr (std::is_arithmetic_v<T>) {
      if (rule.how == Summarized::MaxOverRanks) {
        T most = field.of(r0);
        for (const runtime::RankResult& r : ranks) most = std::max(most, field.of(r));
        j[rule.keys] = most;
      }
    }
    if constexpr (runtime::is_number_list<T>::value) {
      if (rule.how == Summarized::MaxEachStep) {
        T most;
        for (const runtime::RankResult& r : ranks) {
          const T& v = field.of(r);
          if (most.size() < v.size()) most.resize(v.size(), 0);
          for (size_t i = 0; i < v.size(); ++i) most[i] = std::max(most[i], v[i]);
        }
        j[rule.keys] = most;
      }
      if (rule.how == Summarized::Rank0Last) {
        const T& v = field.of(r0);
        j[rule.keys] = number_or_null(!v.empty() && v.back() >= 0, v.empty() ? 0 : v.back());
      }
    }
  });
}

}  // namespace

void write_output_file(const std::string& flag, const std::string& path, const std::string& text) {
  try {
    io::write_file_atomic(path, text);
  } catch (const UserError& e) {
    FSDP_USER_FAIL(flag, ": ", e.what());
  }
}

nlohmann::json summarize_results(const std::string& backend, int world,
                                 const runtime::TrainConfig& c,
                                 const std::vector<runtime::RankResult>& ranks,
                                 double peak_tflops) {
  nlohmann::json j = {{"backend", backend}, {"world_size", world}};
  add_ruled_fields(ranks, j);
  // ---- the derived keys, field by field (each field's rule names them)
  const runtime::RankResult& r0 = ranks.at(0);
  // losses
  j["losses"] = r0.losses;
  j["loss_first"] = number_or_null(!r0.losses.empty(), r0.losses.empty() ? 0 : r0.losses.front());
  j["loss_last"] = number_or_null(!r0.losses.empty(), r0.losses.empty() ? 0 : r0.losses.back());
  j["steps_done"] = r0.losses.size();
  // step_ms: rank 0's median after the warm-up
  const size_t skip = std::min<size_t>(static_cast<size_t>(c.warmup), r0.step_ms.size());
  const double step_ms_median = median(
      std::vector<double>(r0.step_ms.begin() + static_cast<std::ptrdiff_t>(skip), r0.step_ms.end()));
  const int64_t step_tokens = c.tokens * c.micro_batches;  // per rank
  j["step_ms_median"] = step_ms_median;
  j["tokens_per_s"] = step_ms_median > 0 ? step_tokens * world * 1000.0 / step_ms_median : 0;
  // Throughput against a GPU's peak means nothing on the CPU backend: reported on GPUs only.
  if (backend != "cpu" && step_ms_median > 0) {
    const double tflops =
        models::flops_per_token(c.model) * step_tokens / (step_ms_median * 1e-3) / 1e12;
    j["tflops_per_gpu"] = tflops;
    j["mfu"] = tflops / peak_tflops;
  }
  // val_losses: [{"step": N, "loss": L}], the validation loss after step N (1-based, as the
  // step line counts; bench/torch_llama.py writes the same)
  nlohmann::json val = nlohmann::json::array();
  for (const auto& [step, loss] : r0.val_losses)
    val.push_back({{"step", step + 1}, {"loss", loss}});
  j["val_losses"] = val;
  // error, failed_step: only when a step was not finite
  if (!r0.error.empty()) {
    j["error"] = r0.error;
    j["failed_step"] = r0.failed_step + 1;  // 1-based, as the step line counts
  }
  // memory: the largest peak over ranks, and the most RS inputs live at once
  int64_t peak = 0, rs_inputs = 0;
  for (const runtime::RankResult& r : ranks) {
    peak = std::max(peak, r.memory.peak_bytes);
    rs_inputs = std::max(rs_inputs, r.memory.tag_peak_live[static_cast<int>(MemTag::RsInput)]);
  }
  j["peak_mem_bytes"] = peak;
  j["rs_inputs_in_flight_max"] = rs_inputs;
  // timeline (--trace): the slowest rank paces the step, so the worst rank's metrics
  bool traced = false;
  runtime::TimelineMetrics worst;
  for (const runtime::RankResult& r : ranks) {
    if (!c.timeline || runtime::find_stream(r.timeline, "compute") < 0) continue;
    const runtime::TimelineMetrics m =
        metrics_of_timeline(r.timeline, r.host_schedule_us_per_unit, 0);
    traced = true;
    worst.exposed_comm_ms = std::max(worst.exposed_comm_ms, m.exposed_comm_ms);
    worst.rs_recycle_stall_ms = std::max(worst.rs_recycle_stall_ms, m.rs_recycle_stall_ms);
    worst.rs_drain_ms = std::max(worst.rs_drain_ms, m.rs_drain_ms);
    worst.ag_rs_overlap_ms = std::max(worst.ag_rs_overlap_ms, m.ag_rs_overlap_ms);
    worst.streams_used = std::max(worst.streams_used, m.streams_used);
  }
  // Under a graph the streams are known without a trace (which sees one op per replayed step):
  // those the graph's work runs on.
  if (!r0.graph_streams.empty()) worst.streams_used = static_cast<int>(r0.graph_streams.size());
  j["exposed_comm_ms"] = number_or_null(traced, worst.exposed_comm_ms);
  j["rs_recycle_stall_ms"] = number_or_null(traced, worst.rs_recycle_stall_ms);
  j["rs_drain_ms"] = number_or_null(traced, worst.rs_drain_ms);
  j["ag_rs_overlap_ms"] = number_or_null(traced, worst.ag_rs_overlap_ms);
  j["streams_used"] = number_or_null(traced || !r0.graph_streams.empty(), worst.streams_used);
  return j;
}

}  // namespace fsdp::tools
