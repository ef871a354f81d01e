// --trace: the timelines of every rank as Chrome trace-event JSON, and the reader that
// `fsdp report` uses. Note [Trace file format] in trace_writer.h.
#include "trace_writer.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>

#include "fsdp/error.h"
#include "io/checked_json.h"
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

std::optional<OpKind> trace_kind_from_name(const std::string& name) {
  for (size_t i = 0; i < std::size(kKindNames); ++i)
    if (name == kKindNames[i]) return static_cast<OpKind>(i);
  return std::nullopt;
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

// Note [Checked JSON]: a trace is input like any other file. Bounds past any trace we write:
// tracks (tid 0 is the host's, then one per stream), ranks, events.
constexpr int64_t kMaxTraceTid = 1024;
constexpr int64_t kMaxTraceRank = 1 << 20;
constexpr size_t kMaxTraceEvents = size_t{1} << 27;

double time_field(const io::JsonField& e, const char* key) {
  const io::JsonField f = e[key];
  const double v = f.number();
  if (!(v >= 0 && v <= 1e15)) f.fail("must be a time in [0, 1e15] microseconds");
  return v;
}

// args.<key> as a string, "" when args or the key is absent.
std::string arg_string(const io::JsonField& e, const char* key) {
  const std::optional<io::JsonField> args = e.find("args");
  if (!args) return "";
  if (!args->is_object()) args->fail("must be an object");
  const std::optional<io::JsonField> v = args->find(key);
  return v ? v->string(4096) : "";
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
  FSDP_USER_CHECK(compute >= 0, "the timeline has no stream named 'compute' (it has ",
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

std::vector<TracedRank> parse_trace(const nlohmann::json& trace, const std::string& file) {
  const io::JsonField root(trace, std::make_shared<const std::string>(file));
  if (!root.is_object() || !root.find("traceEvents"))
    root.fail("is not a Chrome trace: expected an object with a 'traceEvents' array");
  std::map<int, TracedRank> ranks;
  auto rank_entry = [&](const io::JsonField& pid) -> TracedRank& {
    const int rank = static_cast<int>(pid.integer(0, kMaxTraceRank));
    TracedRank& r = ranks[rank];
    r.rank = rank;
    return r;
  };
  auto stream_of = [](const io::JsonField& e) {
    return stream_of_tid(static_cast<int>(e["tid"].integer(0, kMaxTraceTid)));
  };
  for (const io::JsonField& e : root["traceEvents"].elements(kMaxTraceEvents)) {
    if (!e.is_object()) e.fail("must be an object (a trace event)");
    const std::string ph = e["ph"].string(16);
    if (ph != "X" && ph != "C" && ph != "M") continue;  // other event types are not ours
    TracedRank& r = rank_entry(e["pid"]);
    const std::string name = e["name"].string(4096);
    if (ph == "M") {
      if (name != "thread_name") continue;
      const int stream = stream_of(e);
      if (stream < 0) continue;  // the host track has no stream name
      auto& names = r.timeline.stream_names;
      if (static_cast<int>(names.size()) <= stream) names.resize(stream + 1);
      names[stream] = arg_string(e, "name");
    } else if (ph == "C") {
      if (name != "allocated bytes") continue;
      const std::optional<io::JsonField> args = e.find("args");
      int64_t value = 0;
      if (args) {
        if (!args->is_object()) args->fail("must be an object");
        if (const std::optional<io::JsonField> b = args->find("bytes"))
          value = b->integer(0, int64_t{1} << 60);
      }
      r.timeline.memory.push_back({time_field(e, "ts"), value});
    } else {
      TimelineOp op;
      const io::JsonField cat = e["cat"];
      const std::string cat_name = cat.string(64);
      const std::optional<OpKind> kind = trace_kind_from_name(cat_name);
      if (!kind)
        cat.fail("is '" + io::printable(cat_name) +
                 "', not one of kernel, copy, collective, wait, optimizer, host");
      op.kind = *kind;
      op.stream = stream_of(e);
      op.start_us = time_field(e, "ts");
      op.end_us = op.start_us + time_field(e, "dur");
      if (op.kind == OpKind::Wait) {
        op.label = arg_string(e, "label");
        op.waited_for = arg_string(e, "waited_for");
      } else {
        op.label = name;
      }
      r.timeline.ops.push_back(std::move(op));
    }
  }
  const std::optional<io::JsonField> other = root.find("otherData");
  const std::optional<io::JsonField> fsdp =
      other && other->is_object() ? other->find("fsdp") : std::nullopt;
  if (fsdp && fsdp->is_object())
    if (const std::optional<io::JsonField> entries = fsdp->find("ranks")) {
      for (const io::JsonField& entry : entries->elements(static_cast<size_t>(kMaxTraceRank))) {
        if (!entry.is_object()) entry.fail("must be an object (a rank's data)");
        const std::optional<io::JsonField> rank = entry.find("rank");
        TracedRank& r = rank ? rank_entry(*rank) : ranks[0];
        if (const std::optional<io::JsonField> h = entry.find("host_schedule_us_per_unit"))
          r.host_schedule_us_per_unit = h->number();
        if (const std::optional<io::JsonField> m = entry.find("metrics")) r.stored_metrics = m->raw();
      }
    }
  std::vector<TracedRank> out;
  for (auto& [pid, r] : ranks) out.push_back(std::move(r));
  return out;
}

std::vector<TracedRank> read_trace_file(const std::string& path) {
  // Note [Reading files]: a regular file of at most 1 GiB (traces are parsed whole).
  const std::string text = io::read_bounded_file(path, uint64_t{1} << 30, "a trace file");
  return parse_trace(io::parse_json(text, path).value, path);  // Note [Checked JSON]
}

}  // namespace fsdp::tools
