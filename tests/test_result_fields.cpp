// Note [Result fields]: a training on CPU ranks, as threads and as processes (whose results
// travel to the launcher as JSON), sets every field of the lists; every summary key the lists
// name is written; a result survives the trip through JSON; a malformed one is an error
// naming its field.
#include <gtest/gtest.h>

#include <algorithm>
#include <concepts>
#include <cstring>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "fsdp/error.h"
#include "runtime/rank_result_json.h"
#include "test_util.h"
#include "tools/train_command.h"

namespace fsdp::testing {
namespace {

// The fields a CPU run leaves at their default, and why. Every other field must be set.
const std::map<std::string, std::string> kDefaultOnCpu = {
    {"captured_step",
     "set under --cuda-graph only, which the CPU backend refuses "
     "(tests/test_cuda_graph_cpu.cpp emulates a capture)"},
    {"graph_streams", "under --cuda-graph only"},
    {"graph_op_times", "under --cuda-graph only"},
    {"error", "set only when a step is not finite (tests/test_train_nonfinite.cpp)"},
    {"failed_step", "set only when a step is not finite"},
    {"offload_host_bytes", "with the optimizer offload only (tests/test_optimizer_offload.cpp)"},
    {"memory_plan", "set only with a memory budget (tests/test_memory_planner.cpp)"},
};

// A moe-transformer with expert parallelism (every communicator kind, the expert loads),
// traced (the timeline, the per-step trace metrics), evaluated (validation losses), its params
// collected: every field has something to hold.
runtime::TrainConfig every_field_config() {
  runtime::TrainConfig c = tiny_moe_transformer_config(/*ep=*/2, /*experts=*/4, /*steps=*/3);
  c.timeline = true;
  const nn::ModelConfig model = c.model;
  c.eval_source = [model](int, int) { return runtime::make_synthetic_tokens(model, 7); };
  c.eval_every = 2;
  c.eval_batches = 1;
  c.optimizer.max_grad_norm = 1.0f;  // the grad norm is computed (the optimizer after backward)
  return c;
}

// Whether `v` is still the default `d` (compared as values, not through the code under test).
template <class T>
bool is_default(const T& v, const T& d) {
  if constexpr (std::is_same_v<T, MemStats>)
    return std::memcmp(&v, &d, sizeof(T)) == 0;  // int64 counters only
  else if constexpr (std::is_same_v<T, Timeline>)
    return v.stream_names.empty() && v.ops.empty() && v.memory.empty();
  else
    return v == d;
}

// The fields of `r` still at their default, leaving out kDefaultOnCpu's.
std::vector<std::string> unset_fields(const runtime::RankResult& r) {
  const runtime::RankResult fresh;
  std::vector<std::string> unset;
  runtime::for_each_result_field<runtime::RankResult>([&](const auto& field) {
    if (kDefaultOnCpu.count(field.name)) return;
    if (std::string(field.name) == "rank") return;  // rank 0's is the default; checked below
    if (is_default(field.of(r), field.of(fresh))) unset.push_back(field.name);
  });
  return unset;
}

class EveryResultField : public ::testing::TestWithParam<RanksAs> {};

TEST_P(EveryResultField, IsSetByATrainingOnTheCpuBackend) {
  FSDP_SKIP_WITHOUT_PROCESSES(GetParam());
  const std::vector<runtime::RankResult> results =
      run_fsdp(2, every_field_config(), {}, GetParam());
  ASSERT_EQ(results.size(), 2u);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(results[rank].rank, rank);
    std::ostringstream unset;
    for (const std::string& name : unset_fields(results[rank])) unset << ' ' << name;
    EXPECT_EQ(unset.str(), "") << "rank " << rank << " left these fields at their default";
    // The reasons above still hold: what the CPU backend does not set stays unset.
    const runtime::RankResult fresh;
    runtime::for_each_result_field<runtime::RankResult>([&](const auto& field) {
      if (!kDefaultOnCpu.count(field.name)) return;
      EXPECT_TRUE(is_default(field.of(results[rank]), field.of(fresh)))
          << field.name << " is set on the CPU backend now: take it off kDefaultOnCpu";
    });
  }
  // Every name kDefaultOnCpu lists is a field.
  std::set<std::string> names;
  runtime::for_each_result_field<runtime::RankResult>([&](const auto& f) { names.insert(f.name); });
  for (const auto& [name, why] : kDefaultOnCpu) EXPECT_TRUE(names.count(name)) << name;
}

INSTANTIATE_TEST_SUITE_P(RanksAs, EveryResultField,
                         ::testing::Values(RanksAs::Threads, RanksAs::Processes),
                         [](const auto& info) { return std::string(ranks_as_name(info.param)); });

// Every StepReport field is set (not its absent value) in some step rank 0 reports.
TEST(EveryStepField, IsSetInSomeStepOfATrainingOnTheCpuBackend) {
  std::vector<runtime::StepReport> reports;
  runtime::run_cpu_ranks(2, {}, [&](int rank, Device& device, std::shared_ptr<Comm> comm) {
    runtime::train_rank(device, comm, every_field_config(), [&](const runtime::StepReport& r) {
      if (rank == 0) reports.push_back(r);
    });
  });
  ASSERT_EQ(reports.size(), 3u);
  runtime::for_each_step_field<runtime::StepReport>([&](const auto& field) {
    bool set = false;
    for (const runtime::StepReport& r : reports) set = set || field.of(r) != field.absent;
    EXPECT_TRUE(set) << field.name << " (" << field.doc << ") is never set";
  });
}

// ---- the summary and the trip through JSON, on the results of ranks as threads

// Every key the lists' summary rules name is in the run's summary, with a value, but for those
// written only on GPUs or after a step that was not finite.
TEST(ResultFieldsSummary, HasEveryKeyTheListsName) {
  const runtime::TrainConfig c = every_field_config();
  const std::vector<runtime::RankResult> results = run_fsdp(2, c);
  const nlohmann::json s = tools::summarize_results("cpu", 2, c, results, 989.0);
  const std::set<std::string> not_here = {"tflops_per_gpu", "mfu", "error", "failed_step"};
  std::set<std::string> named = {"backend", "world_size"};  // the run's, beside its results'
  runtime::for_each_result_field<runtime::RankResult>([&](const auto& field) {
    std::istringstream keys(field.summary.keys);
    for (std::string key; keys >> key;) {
      if (not_here.count(key)) continue;
      named.insert(key);
      ASSERT_TRUE(s.contains(key)) << key << " (from " << field.name << ")";
      EXPECT_FALSE(s[key].is_null()) << key << " (from " << field.name << ")";
    }
  });
  // And no key comes from elsewhere.
  std::set<std::string> written;
  for (const auto& [key, value] : s.items()) written.insert(key);
  EXPECT_EQ(written, named);
  // The first step's counts are rank 0's (the experts' all-to-alls are on "ep").
  EXPECT_EQ(s["forward_by_comm_first_step"],
            runtime::field_to_json(results[0].forward_by_comm_first_step));
  const int all_to_all = static_cast<int>(CollectiveKind::AllToAll);
  EXPECT_EQ(s["forward_by_comm_first_step"]["ep"]["all_to_all"].get<int64_t>(),
            results[0].forward_by_comm_first_step.at("ep").at(all_to_all));
  EXPECT_GT(s["forward_by_comm_first_step"]["ep"]["all_to_all"].get<int64_t>(), 0);
  EXPECT_EQ(s["reduce_scatters_first_step"], results[0].reduce_scatters_first_step);
  // The per-step max over ranks, and the max.
  const auto& p0 = results[0].peak_bytes_by_step;
  const auto& p1 = results[1].peak_bytes_by_step;
  ASSERT_EQ(p0.size(), 3u);
  ASSERT_EQ(p1.size(), 3u);
  for (size_t i = 0; i < 3; ++i)
    EXPECT_EQ(s["peak_mem_bytes_by_step"][i].get<int64_t>(), std::max(p0[i], p1[i]));
  EXPECT_EQ(s["backend_peak_bytes"].get<int64_t>(),
            std::max(results[0].backend_peak_bytes, results[1].backend_peak_bytes));
  EXPECT_EQ(s["max_expert_load"].get<double>(), results[0].max_expert_loads.back());
}

TEST(ResultFieldsJson, EveryFieldSurvivesTheTrip) {
  const std::vector<runtime::RankResult> results = run_fsdp(2, every_field_config());
  for (const runtime::RankResult& r : results) {
    const std::string text = runtime::rank_result_to_json(r);
    const runtime::RankResult back = runtime::rank_result_from_json(text);
    EXPECT_EQ(runtime::rank_result_to_json(back), text);
    runtime::for_each_result_field<runtime::RankResult>([&](const auto& field) {
      if constexpr (std::equality_comparable<std::remove_cvref_t<decltype(field.of(r))>>) {
        EXPECT_TRUE(field.of(back) == field.of(r)) << field.name;
      }
    });
    EXPECT_EQ(std::memcmp(&back.memory, &r.memory, sizeof(MemStats)), 0);
    ASSERT_EQ(back.timeline.ops.size(), r.timeline.ops.size());
    EXPECT_EQ(back.timeline.ops.back().label, r.timeline.ops.back().label);
  }
}

std::string error_reading(const nlohmann::json& j) {
  try {
    runtime::rank_result_from_json(j.dump());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ResultFieldsJson, AMalformedResultIsAnErrorNamingTheField) {
  const nlohmann::json good = nlohmann::json::parse(runtime::rank_result_to_json({}));
  EXPECT_EQ(error_reading(good), "");
  nlohmann::json missing = good;
  missing.erase("backward_by_comm_first_step");
  EXPECT_NE(error_reading(missing).find("has no 'backward_by_comm_first_step'"), std::string::npos)
      << error_reading(missing);
  nlohmann::json unknown = good;
  unknown["collectives_first_step"] = {1, 2, 3, 4, 5};
  EXPECT_NE(error_reading(unknown).find("does not know: 'collectives_first_step'"),
            std::string::npos)
      << error_reading(unknown);
  nlohmann::json wrong = good;
  wrong["losses"] = "many";
  EXPECT_NE(error_reading(wrong).find("'losses': "), std::string::npos) << error_reading(wrong);
  nlohmann::json counts = good;
  counts["memory"]["tag_live"] = {1};
  EXPECT_NE(error_reading(counts).find("'tag_live' holds 1 counts"), std::string::npos)
      << error_reading(counts);
  nlohmann::json kind = good;
  kind["timeline"]["ops"] = {{"op", 0, 99, 0.0, 1.0, ""}};
  EXPECT_NE(error_reading(kind).find("an op of kind 99"), std::string::npos) << error_reading(kind);
  nlohmann::json by_kind = good;
  by_kind["forward_by_comm_first_step"] = {{"world", {{"all_gather", 1}}}};
  EXPECT_NE(error_reading(by_kind).find("the counts of 'world' are not one per collective kind"),
            std::string::npos)
      << error_reading(by_kind);
  EXPECT_NE(error_reading(nlohmann::json::array({1, 2})).find("not a JSON object"),
            std::string::npos);
}

}  // namespace
}  // namespace fsdp::testing
