// The trainer on GPUs: the public launcher (include/fsdp/launch.h, Note [Launching on GPUs])
// runs train_rank on each rank; a rank's RankResult travels back to the parent as JSON.
#include "runtime/launch_cuda.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "fsdp/launch.h"

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
          {"max_expert_loads", r.max_expert_loads}};
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
  r.timeline = timeline_from_json(j["timeline"]);
  return r;
}

}  // namespace

std::vector<RankResult> run_cuda_training(const LaunchOptions& options, const TrainConfig& config,
                                          const std::function<void(const StepReport&)>& on_step,
                                          int& world_out) {
  const CudaLaunch launch = run_cuda_ranks_with_results(
      options, [&](int rank, Device& device, std::shared_ptr<Comm> world) {
        return to_json(train_rank(device, world, config, rank == 0 ? on_step : nullptr)).dump();
      });
  world_out = launch.world_size;
  if (launch.first_rank > 0) {  // only the process that ran rank 0 reports
    std::fflush(stdout);
    std::_Exit(0);
  }
  std::vector<RankResult> results;
  for (const std::string& r : launch.results) results.push_back(from_json(nlohmann::json::parse(r)));
  return results;
}

}  // namespace fsdp::runtime
