// --trace: the timelines of every rank as Chrome trace-event JSON (Perfetto opens it).
// One process per rank, one track (thread) per stream, plus the host track and a memory
// counter.
#include <fstream>

#include <nlohmann/json.hpp>

#include "fsdp/error.h"
#include "tools/train_command.h"

namespace fsdp::tools {

void write_trace_file(const std::string& path, const std::vector<runtime::RankResult>& ranks) {
  nlohmann::json events = nlohmann::json::array();
  for (const runtime::RankResult& r : ranks) {
    const Timeline& t = r.timeline;
    events.push_back({{"ph", "M"}, {"pid", r.rank}, {"name", "process_name"},
                      {"args", {{"name", "rank " + std::to_string(r.rank)}}}});
    events.push_back({{"ph", "M"}, {"pid", r.rank}, {"tid", 0}, {"name", "thread_name"},
                      {"args", {{"name", "host"}}}});
    for (size_t s = 0; s < t.stream_names.size(); ++s)
      events.push_back({{"ph", "M"}, {"pid", r.rank}, {"tid", static_cast<int>(s) + 1},
                        {"name", "thread_name"}, {"args", {{"name", t.stream_names[s]}}}});
    for (const TimelineOp& op : t.ops) {
      nlohmann::json e = {{"ph", "X"}, {"pid", r.rank}, {"tid", op.stream + 1},
                          {"name", op.kind == OpKind::Wait ? "wait for " + op.waited_for : op.label},
                          {"ts", op.start_us}, {"dur", op.end_us - op.start_us}};
      static const char* kinds[] = {"kernel", "copy", "collective", "wait", "optimizer", "host"};
      e["cat"] = kinds[static_cast<int>(op.kind)];
      events.push_back(std::move(e));
    }
    for (const MemSample& m : t.memory)
      events.push_back({{"ph", "C"}, {"pid", r.rank}, {"name", "allocated bytes"},
                        {"ts", m.time_us}, {"args", {{"bytes", m.bytes}}}});
  }
  std::ofstream out(path);
  FSDP_CHECK(out.good(), "cannot write --trace file '", path, "'");
  out << nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump() << "\n";
}

}  // namespace fsdp::tools
