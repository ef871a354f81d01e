// --trace: the timelines of every rank as Chrome trace-event JSON, and the reader that
// `fsdp report` uses. Note [Trace file format] in trace_writer.h.
#include "trace_writer.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "fsdp/error.h"
#include "io/file_io.h"
#include "train_command.h"

namespace fsdp::tools {

namespace {

constexpr int kHostTid = 0;
int tid_of_stream(int stream) {
  return stream + 1;
}  // the host track (-1) becomes tid 0
int stream_of_tid(int tid) {
  return tid - 1;
}

constexpr const char* kKindNames[] = {"kernel", "copy", "collective", "wait", "optimizer", "host"};
static_assert(std::size(kKindNames) == static_cast<size_t>(OpKind::Host) + 1,
              "one name per OpKind");

const char* trace_kind_name(OpKind kind) {
  return kKindNames[static_cast<int>(kind)];
}

OpKind trace_kind_from_name(const std::string& name) {
  for (size_t i = 0; i < std::size(kKindNames); ++i)
    if (name == kKindNames[i]) return static_cast<OpKind>(i);
  FSDP_FAIL("trace event has unknown category '", name, "' (expected one of kernel, copy, ",
            "collective, wait, optimizer, host)");
}

// Host first, then the streams people look at first; the rest in creation order.
int track_sort_index(const std::string& name, int stream) {
  if (stream < 0) return 0;
  if (name == "compute") return 1;
  if (name == "all-gather") return 2;
  if (name == "reduce-scatter") return 3;
  return 4 + stream;
}

std::string headline(const runtime::TimelineMetrics& m) {
  char buf[160];
  std::snprintf(buf, sizeof buf,
                "exposed comm %.3f ms/step, rs recycle stall %.3f ms/step, "
                "AG/RS overlap %.3f ms/step",
                m.exposed_comm_ms, m.rs_recycle_stall_ms, m.ag_rs_overlap_ms);
  return buf;
}

nlohmann::json stall_to_json(const runtime::Stall& s) {
  return {{"ms", s.ms()},
          {"step", s.step},
          {"cause", runtime::stall_cause_name(s.cause)},
          {"waited_for", s.waited_for},
          {"label", s.label},
          {"start_us", s.start_us},
          {"end_us", s.end_us},
          {"cause_stream", s.cause_stream},
          {"cause_start_us", s.cause_start_us},
          {"cause_end_us", s.cause_end_us}};
}

void add_rank_events(const runtime::RankResult& r, const runtime::TimelineMetrics* metrics,
                     nlohmann::json& events) {
  const Timeline& t = r.timeline;
  auto metadata = [&](const char* name, nlohmann::json args) {
    events.push_back({{"ph", "M"}, {"pid", r.rank}, {"name", name}, {"args", std::move(args)}});
  };
  auto thread_metadata = [&](int stream, const std::string& name) {
    const int tid = tid_of_stream(stream);
    events.push_back({{"ph", "M"},
                      {"pid", r.rank},
                      {"tid", tid},
                      {"name", "thread_name"},
                      {"args", {{"name", name}}}});
    events.push_back({{"ph", "M"},
                      {"pid", r.rank},
                      {"tid", tid},
                      {"name", "thread_sort_index"},
                      {"args", {{"sort_index", track_sort_index(name, stream)}}}});
  };
  metadata("process_name", {{"name", "rank " + std::to_string(r.rank)}});
  metadata("process_sort_index", {{"sort_index", r.rank}});
  if (metrics) metadata("process_labels", {{"labels", headline(*metrics)}});
  thread_metadata(-1, "host");
  for (size_t s = 0; s < t.stream_names.size(); ++s)
    thread_metadata(static_cast<int>(s), t.stream_names[s]);

  for (const TimelineOp& op : t.ops) {
    const bool wait = op.kind == OpKind::Wait;
    nlohmann::json e = {{"ph", "X"},
                        {"pid", r.rank},
                        {"tid", op.stream < 0 ? kHostTid : tid_of_stream(op.stream)},
                        {"name", !wait                   ? op.label
                                 : op.waited_for.empty() ? std::string("wait")
                                                         : "wait for " + op.waited_for},
                        {"cat", trace_kind_name(op.kind)},
                        {"ts", op.start_us},
                        {"dur", std::max(0.0, op.end_us - op.start_us)}};
    if (wait) e["args"] = {{"label", op.label}, {"waited_for", op.waited_for}};
    events.push_back(std::move(e));
  }
  for (const MemSample& m : t.memory)
    events.push_back({{"ph", "C"},
                      {"pid", r.rank},
                      {"name", "allocated bytes"},
                      {"ts", m.time_us},
                      {"args", {{"bytes", m.bytes}}}});
}

template <typename T>
T field(const nlohmann::json& e, const char* key, size_t index) {
  FSDP_CHECK(e.contains(key), "trace event ", index, " has no '", key, "': ", e.dump());
  try {
    return e.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    FSDP_FAIL("trace event ", index, " has a '", key, "' of the wrong type: ", e.dump());
  }
}

}  // namespace

nlohmann::json metrics_to_json(const runtime::TimelineMetrics& m) {
  nlohmann::json stalls = nlohmann::json::array();
  for (const runtime::Stall& s : m.top_stalls) stalls.push_back(stall_to_json(s));
  return {{"steps", m.steps},
          {"exposed_comm_ms", m.exposed_comm_ms},
          {"exposed_ag_ms", m.exposed_ag_ms},
          {"rs_recycle_stall_ms", m.rs_recycle_stall_ms},
          {"rs_drain_ms", m.rs_drain_ms},
          {"other_comm_ms", m.other_comm_ms},
          {"ag_rs_overlap_ms", m.ag_rs_overlap_ms},
          {"host_span_ms", m.host_span_ms},
          {"host_schedule_us_per_unit", m.host_schedule_us_per_unit},
          {"streams_used", m.streams_used},
          {"ops", m.ops},
          {"top_stalls", std::move(stalls)}};
}

runtime::TimelineMetrics metrics_of_timeline(const Timeline& t, double host_schedule_us_per_unit,
                                             int top_stalls) {
  const int compute = runtime::find_stream(t, "compute");
  FSDP_CHECK(compute >= 0, "the timeline has no stream named 'compute' (it has ",
             t.stream_names.size(), " streams)");
  const size_t steps = runtime::find_steps(t, compute).size();
  runtime::TimelineMetrics m = runtime::compute_metrics(
      t, compute, static_cast<double>(std::max<size_t>(steps, 1)), top_stalls);
  m.host_schedule_us_per_unit = host_schedule_us_per_unit;
  return m;
}

nlohmann::json build_trace_json(const std::vector<runtime::RankResult>& ranks) {
  nlohmann::json events = nlohmann::json::array();
  nlohmann::json rank_data = nlohmann::json::array();
  for (const runtime::RankResult& r : ranks) {
    nlohmann::json entry = {{"rank", r.rank},
                            {"host_schedule_us_per_unit", r.host_schedule_us_per_unit},
                            {"metrics", nullptr}};
    // A rank without a compute stream (timeline off) still gets its tracks, without metrics.
    const bool measurable = runtime::find_stream(r.timeline, "compute") >= 0;
    runtime::TimelineMetrics m;
    if (measurable) {
      m = metrics_of_timeline(r.timeline, r.host_schedule_us_per_unit, kStallsKeptInTrace);
      entry["metrics"] = metrics_to_json(m);
    }
    if (r.captured_step >= 0) {
      // Note [Captured steps]; Note [Timeline inside CUDA graphs] in the CUDA backend.
      entry["cuda_graph"] = {
          {"captured_step", r.captured_step + 1},
          {"streams_used", r.graph_streams.size()},
          {"streams", r.graph_streams},
          {"per_op_times",
           r.graph_op_times
               ? "recorded: event-record nodes inside the graph time every op of each replay"
               : "unavailable: each replayed step is one op on the compute stream; the steps "
                 "before the capture ran eagerly and have per-op times"}};
      if (measurable) entry["metrics"]["streams_used"] = r.graph_streams.size();
    }
    add_rank_events(r, measurable ? &m : nullptr, events);
    rank_data.push_back(std::move(entry));
  }
  return {{"traceEvents", std::move(events)},
          {"displayTimeUnit", "ms"},
          {"otherData",
           {{"fsdp", {{"version", kTraceFormatVersion}, {"ranks", std::move(rank_data)}}}}}};
}

void write_trace_file(const std::string& path, const std::vector<runtime::RankResult>& ranks) {
  io::write_file_atomic(path, build_trace_json(ranks).dump() + "\n");  // Note [Output paths]
}

std::vector<TracedRank> parse_trace(const nlohmann::json& trace) {
  FSDP_CHECK(trace.is_object() && trace.contains("traceEvents") && trace["traceEvents"].is_array(),
             "not a Chrome trace: expected an object with a 'traceEvents' array");
  std::map<int, TracedRank> ranks;
  auto rank_entry = [&](int pid) -> TracedRank& {
    TracedRank& r = ranks[pid];
    r.rank = pid;
    return r;
  };
  const nlohmann::json& events = trace["traceEvents"];
  for (size_t i = 0; i < events.size(); ++i) {
    const nlohmann::json& e = events[i];
    const std::string ph = field<std::string>(e, "ph", i);
    if (ph != "X" && ph != "C" && ph != "M") continue;  // other event types are not ours
    TracedRank& r = rank_entry(field<int>(e, "pid", i));
    const std::string name = field<std::string>(e, "name", i);
    if (ph == "M") {
      if (name != "thread_name") continue;
      const int stream = stream_of_tid(field<int>(e, "tid", i));
      if (stream < 0) continue;  // the host track has no stream name
      auto& names = r.timeline.stream_names;
      if (static_cast<int>(names.size()) <= stream) names.resize(stream + 1);
      names[stream] = e.value("args", nlohmann::json::object()).value("name", "");
    } else if (ph == "C") {
      if (name != "allocated bytes") continue;
      const nlohmann::json args = e.value("args", nlohmann::json::object());
      r.timeline.memory.push_back({field<double>(e, "ts", i), args.value("bytes", int64_t{0})});
    } else {
      TimelineOp op;
      op.kind = trace_kind_from_name(field<std::string>(e, "cat", i));
      op.stream = stream_of_tid(field<int>(e, "tid", i));
      op.start_us = field<double>(e, "ts", i);
      op.end_us = op.start_us + field<double>(e, "dur", i);
      if (op.kind == OpKind::Wait) {
        const nlohmann::json args = e.value("args", nlohmann::json::object());
        op.label = args.value("label", "");
        op.waited_for = args.value("waited_for", "");
      } else {
        op.label = name;
      }
      r.timeline.ops.push_back(std::move(op));
    }
  }
  const nlohmann::json* fsdp = nullptr;
  if (trace.contains("otherData") && trace["otherData"].is_object() &&
      trace["otherData"].contains("fsdp"))
    fsdp = &trace["otherData"]["fsdp"];
  if (fsdp && fsdp->contains("ranks")) {
    for (const nlohmann::json& entry : (*fsdp)["ranks"]) {
      TracedRank& r = rank_entry(entry.value("rank", 0));
      r.host_schedule_us_per_unit = entry.value("host_schedule_us_per_unit", 0.0);
      if (entry.contains("metrics")) r.stored_metrics = entry["metrics"];
    }
  }
  std::vector<TracedRank> out;
  for (auto& [pid, r] : ranks) out.push_back(std::move(r));
  return out;
}

std::vector<TracedRank> read_trace_file(const std::string& path) {
  // Note [Reading files]: a regular file of at most 1 GiB (traces are parsed whole).
  const std::string text = io::read_bounded_file(path, uint64_t{1} << 30, "a trace file");
  nlohmann::json trace;
  try {
    trace = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    FSDP_FAIL("trace file '", path, "' is not valid JSON: ", e.what());
  }
  return parse_trace(trace);
}

}  // namespace fsdp::tools
