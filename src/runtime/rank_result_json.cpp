// See rank_result_json.h. Floats travel as JSON numbers, which nlohmann writes with enough
// digits to read back the same float.
#include "runtime/rank_result_json.h"

#include "fsdp/error.h"

namespace fsdp::runtime {

namespace {

template <size_t N>
void counts_from_json(const nlohmann::json& j, const char* what, int64_t (&out)[N]) {
  const auto v = j.at(what).get<std::vector<int64_t>>();
  FSDP_CHECK(v.size() == N, "'", what, "' holds ", v.size(), " counts, not ", N);
  std::copy(v.begin(), v.end(), out);
}

template <class T>
void field_from_json(const nlohmann::json& j, T& value) {
  j.get_to(value);
}

void field_from_json(const nlohmann::json& j, MemStats& m) {
  m.current_bytes = j.at("current").get<int64_t>();
  m.peak_bytes = j.at("peak").get<int64_t>();
  counts_from_json(j, "tag_bytes", m.tag_bytes);
  counts_from_json(j, "tag_peak_bytes", m.tag_peak_bytes);
  counts_from_json(j, "tag_live", m.tag_live);
  counts_from_json(j, "tag_peak_live", m.tag_peak_live);
}

void field_from_json(const nlohmann::json& j, Timeline& t) {
  t.stream_names = j.at("streams").get<std::vector<std::string>>();
  for (const auto& o : j.at("ops")) {
    const int kind = o.at(2).get<int>();
    FSDP_CHECK(kind >= 0 && kind <= static_cast<int>(OpKind::Host), "an op of kind ", kind);
    t.ops.push_back({o.at(0).get<std::string>(), o.at(1).get<int>(), static_cast<OpKind>(kind),
                     o.at(3).get<double>(), o.at(4).get<double>(), o.at(5).get<std::string>()});
  }
  for (const auto& m : j.at("memory"))
    t.memory.push_back({m.at(0).get<double>(), m.at(1).get<int64_t>()});
}

void field_from_json(const nlohmann::json& j, CountsByComm& counts) {
  FSDP_CHECK(j.is_object(), "counts by communicator are not an object");
  for (const auto& [comm, by_kind] : j.items()) {
    FSDP_CHECK(by_kind.is_object() && by_kind.size() == kCollectiveKindCount, "the counts of '",
               comm, "' are not one per collective kind");
    std::vector<int64_t>& v = counts[comm];
    v.resize(kCollectiveKindCount);
    for (int k = 0; k < kCollectiveKindCount; ++k)
      v[k] = by_kind.at(collective_name(static_cast<CollectiveKind>(k))).get<int64_t>();
  }
}

}  // namespace

nlohmann::json field_to_json(const CountsByComm& counts) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [comm, v] : counts) {
    FSDP_CHECK(v.size() == kCollectiveKindCount, "the counts of '", comm, "' are not one per kind");
    nlohmann::json& by_kind = j[comm] = nlohmann::json::object();
    for (int k = 0; k < kCollectiveKindCount; ++k)
      by_kind[collective_name(static_cast<CollectiveKind>(k))] = v[k];
  }
  return j;
}

nlohmann::json field_to_json(const MemStats& m) {
  return {{"current", m.current_bytes}, {"peak", m.peak_bytes},
          {"tag_bytes", m.tag_bytes},   {"tag_peak_bytes", m.tag_peak_bytes},
          {"tag_live", m.tag_live},     {"tag_peak_live", m.tag_peak_live}};
}

nlohmann::json field_to_json(const Timeline& t) {
  nlohmann::json ops = nlohmann::json::array(), memory = nlohmann::json::array();
  for (const TimelineOp& op : t.ops)
    ops.push_back(
        {op.label, op.stream, static_cast<int>(op.kind), op.start_us, op.end_us, op.waited_for});
  for (const MemSample& m : t.memory) memory.push_back({m.time_us, m.bytes});
  return {{"streams", t.stream_names}, {"ops", ops}, {"memory", memory}};
}

std::string rank_result_to_json(const RankResult& r) {
  nlohmann::json j = nlohmann::json::object();
  for_each_result_field<RankResult>(
      [&](const auto& field) { j[field.name] = field_to_json(field.of(r)); });
  return j.dump();
}

RankResult rank_result_from_json(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  FSDP_CHECK(j.is_object(), "a rank's result is not a JSON object");
  RankResult r;
  size_t read = 0;
  for_each_result_field<RankResult>([&](const auto& field) {
    const auto it = j.find(field.name);
    FSDP_CHECK(it != j.end(), "a rank's result has no '", field.name, "'");
    try {
      field_from_json(*it, field.of(r));
    } catch (const nlohmann::json::exception& e) {
      FSDP_FAIL("a rank's result: '", field.name, "': ", e.what());
    }
    ++read;
  });
  if (read != j.size())
    for (const auto& [key, value] : j.items()) {
      bool known = false;
      for_each_result_field<RankResult>(
          [&](const auto& field) { known = known || key == field.name; });
      FSDP_CHECK(known, "a rank's result has a field this build does not know: '", key, "'");
    }
  return r;
}

}  // namespace fsdp::runtime
