// See rank_result_json.h. Floats travel as JSON numbers, which nlohmann writes with enough
// digits to read back the same float.
#include "runtime/rank_result_json.h"

#include <nlohmann/json.hpp>

namespace fsdp::runtime {

namespace {

nlohmann::json timeline_to_json(const Timeline& t) {
  nlohmann::json ops = nlohmann::json::array(), memory = nlohmann::json::array();
  for (const TimelineOp& op : t.ops)
    ops.push_back({op.label, op.stream, static_cast<int>(op.kind), op.start_us, op.end_us, op.waited_for});
  for (const MemSample& m : t.memory) memory.push_back({m.time_us, m.bytes});
  return {{"streams", t.stream_names}, {"ops", ops}, {"memory", memory}};
}

Timeline timeline_from_json(const nlohmann::json& j) {
  Timeline t;
  t.stream_names = j["streams"].get<std::vector<std::string>>();
  for (const auto& o : j["ops"])
    t.ops.push_back({o[0], o[1], static_cast<OpKind>(o[2].get<int>()), o[3], o[4], o[5]});
  for (const auto& m : j["memory"]) t.memory.push_back({m[0], m[1]});
  return t;
}

nlohmann::json to_json(const RankResult& r) {
  nlohmann::json collectives = nlohmann::json::array();
  for (int64_t n : r.collectives_first_step) collectives.push_back(n);
  const MemStats& m = r.memory;
  return {{"rank", r.rank},
          {"timeline", timeline_to_json(r.timeline)},
          {"losses", r.losses},
          {"lrs", r.lrs},
          {"grad_norms", r.grad_norms},
          {"error", r.error},
          {"failed_step", r.failed_step},
          {"step_ms", r.step_ms},
          {"host_us", r.host_schedule_us_per_unit},
          {"peak", m.peak_bytes},
          {"rs_live", m.tag_peak_live[static_cast<int>(MemTag::RsInput)]},
          {"params", r.param_count},
          {"max_expert_loads", r.max_expert_loads},
          {"val_losses", r.val_losses},
          {"peak_bytes_by_step", r.peak_bytes_by_step},
          {"host_us_per_step", r.host_us_per_step},
          {"backend_peak", r.backend_peak_bytes},
          {"backend_reserved_peak", r.backend_reserved_peak_bytes},
          {"captured_step", r.captured_step},
          {"graph_streams", r.graph_streams},
          {"graph_op_times", r.graph_op_times},
          {"collectives", collectives},
          {"ag_fwd", r.all_gathers_forward_first_step},
          {"ag_bwd", r.all_gathers_backward_first_step},
          {"rs", r.reduce_scatters_first_step},
          {"sharded_bytes", r.sharded_state_bytes},
          {"param_values", r.params}};
}

RankResult from_json(const nlohmann::json& j) {
  RankResult r;
  r.rank = j["rank"];
  r.losses = j["losses"].get<std::vector<float>>();
  r.lrs = j["lrs"].get<std::vector<float>>();
  r.grad_norms = j["grad_norms"].get<std::vector<float>>();
  r.error = j["error"].get<std::string>();
  r.failed_step = j["failed_step"];
  r.step_ms = j["step_ms"].get<std::vector<double>>();
  r.host_schedule_us_per_unit = j["host_us"];
  r.memory.peak_bytes = j["peak"];
  r.memory.tag_peak_live[static_cast<int>(MemTag::RsInput)] = j["rs_live"];
  r.param_count = j["params"];
  r.max_expert_loads = j["max_expert_loads"].get<std::vector<double>>();
  r.val_losses = j["val_losses"].get<std::vector<std::pair<int, float>>>();
  r.peak_bytes_by_step = j["peak_bytes_by_step"].get<std::vector<int64_t>>();
  r.host_us_per_step = j["host_us_per_step"];
  r.backend_peak_bytes = j["backend_peak"];
  r.backend_reserved_peak_bytes = j["backend_reserved_peak"];
  r.captured_step = j["captured_step"];
  r.graph_streams = j["graph_streams"].get<std::vector<std::string>>();
  r.graph_op_times = j["graph_op_times"];
  for (int k = 0; k < kCollectiveKindCount; ++k) r.collectives_first_step[k] = j["collectives"][k];
  r.all_gathers_forward_first_step = j["ag_fwd"];
  r.all_gathers_backward_first_step = j["ag_bwd"];
  r.reduce_scatters_first_step = j["rs"];
  r.sharded_state_bytes = j["sharded_bytes"];
  r.params = j["param_values"].get<std::vector<std::vector<float>>>();
  r.timeline = timeline_from_json(j["timeline"]);
  return r;
}

}  // namespace

std::string rank_result_to_json(const RankResult& r) { return to_json(r).dump(); }

RankResult rank_result_from_json(const std::string& text) {
  return from_json(nlohmann::json::parse(text));
}

}  // namespace fsdp::runtime
