// `fsdp report`: reads a --trace file back, recomputes the metrics from its events (so the
// numbers and the picture always come from the same ops, whichever writer made the file),
// and takes from otherData only what events cannot carry (host_schedule_us_per_unit).
#include "report_command.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <unistd.h>
#include <filesystem>
#include <iterator>

#if FSDP_HAVE_ZLIB
#include <zlib.h>
#endif

#include "fsdp/error.h"
#include "io/checked_json.h"
#include "io/file_io.h"
#include "svg_timeline.h"

namespace fsdp::tools {

namespace {

std::string printf_string(const char* format, double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, value);
  return buf;
}

// A left-aligned name column, then one right-aligned column per rank.
struct MetricRow {
  const char* name;
  const char* format;
  double (*get)(const runtime::TimelineMetrics&);
};

const MetricRow kRows[] = {
    {"exposed_comm_ms", "%.3f",
     [](const runtime::TimelineMetrics& m) { return m.exposed_comm_ms; }},
    {"  all-gather waits", "%.3f",
     [](const runtime::TimelineMetrics& m) { return m.exposed_ag_ms; }},
    {"  rs_recycle_stall_ms", "%.3f",
     [](const runtime::TimelineMetrics& m) { return m.rs_recycle_stall_ms; }},
    {"  rs_drain_ms", "%.3f", [](const runtime::TimelineMetrics& m) { return m.rs_drain_ms; }},
    {"  other comm waits", "%.3f",
     [](const runtime::TimelineMetrics& m) { return m.other_comm_ms; }},
    {"ag_rs_overlap_ms", "%.3f",
     [](const runtime::TimelineMetrics& m) { return m.ag_rs_overlap_ms; }},
    {"host_span_ms", "%.3f", [](const runtime::TimelineMetrics& m) { return m.host_span_ms; }},
    {"host_schedule_us_per_unit", "%.2f",
     [](const runtime::TimelineMetrics& m) { return m.host_schedule_us_per_unit; }},
    {"streams_used", "%.0f",
     [](const runtime::TimelineMetrics& m) { return static_cast<double>(m.streams_used); }},
    {"ops", "%.0f", [](const runtime::TimelineMetrics& m) { return static_cast<double>(m.ops); }},
    {"steps recorded", "%.0f", [](const runtime::TimelineMetrics& m) { return m.steps; }},
};

std::string stream_label(const Timeline& t, int stream) {
  if (stream == -2) return "";
  if (stream < 0) return "host";
  return stream < static_cast<int>(t.stream_names.size()) ? t.stream_names[stream]
                                                          : "stream " + std::to_string(stream);
}

// Where a time falls, in ms from the start of its step.
double ms_into_step(const std::vector<runtime::StepWindow>& steps, int step, double t_us) {
  for (const runtime::StepWindow& w : steps)
    if (w.index == step) return (t_us - w.start_us) * 1e-3;
  return t_us * 1e-3;
}

void append_stalls(std::string& out, const TracedRank& r, const runtime::TimelineMetrics& m,
                   int top) {
  const Timeline& t = r.timeline;
  const std::vector<runtime::StepWindow> steps =
      runtime::find_steps(t, runtime::find_stream(t, "compute"));
  out += "\ntop " + std::to_string(top) + " compute stalls, rank " + std::to_string(r.rank) +
         " (times in ms from the start of their step):\n";
  if (m.top_stalls.empty()) {
    out += "  none: the compute stream never waited\n";
    return;
  }
  char line[512];
  std::snprintf(line, sizeof line, "  %9s  %4s  %8s  %-10s  %s\n", "stall_ms", "step", "at",
                "cause", "waited for -> the op that caused it");
  out += line;
  for (const runtime::Stall& s : m.top_stalls) {
    std::string cause_op;
    if (s.cause_stream == -2) {
      cause_op = "(no op with that label was recorded)";
    } else {
      cause_op = "ran on " + stream_label(t, s.cause_stream) +
                 printf_string(" %.3f", ms_into_step(steps, s.step, s.cause_start_us)) +
                 printf_string("..%.3f", ms_into_step(steps, s.step, s.cause_end_us)) +
                 printf_string(", wait ended %.3f", ms_into_step(steps, s.step, s.end_us));
    }
    std::snprintf(line, sizeof line, "  %9.3f  %4d  %8.3f  %-10s  '%s' %s\n", s.ms(), s.step,
                  ms_into_step(steps, s.step, s.start_us), runtime::stall_cause_name(s.cause),
                  s.waited_for.c_str(), cause_op.c_str());
    out += line;
  }
}

// A count option's check: a short message for a negative value (CLI11's own range check
// prints the whole range, up to the largest double).
CLI::Validator non_negative_count() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        try {
          size_t used = 0;
          const long long n = std::stoll(value, &used);
          if (used == value.size() && n >= 0) return "";
        } catch (const std::exception&) {
        }
        return "must be a whole number >= 0, got " + value;
      },
      "N >= 0");
}

// Traces are read whole, and parsed whole into memory: a limit on both sides of gzip (a
// small .gz can hold a lot of text). A run's trace is ~200 bytes per op: 100 MB for 8 ranks of
// a few hundred steps.
constexpr uint64_t kMaxTraceBytes = uint64_t{1} << 30;

// The whole file, gunzipped when it is gzip-compressed (zlib reads plain files as they are).
std::string read_maybe_gzipped(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    FSDP_USER_FAIL("'", path, "' is a directory; give the trace file that `fsdp train --trace FILE` wrote");
  if (!std::filesystem::exists(path, ec)) FSDP_USER_FAIL("trace file '", path, "' does not exist");
  const io::ReadFile file(path);  // Note [Reading files]: a regular file, or an error
#if FSDP_HAVE_ZLIB
  FSDP_USER_CHECK(file.bytes() <= kMaxTraceBytes, "trace file '", path, "' holds ",
                  io::size_text(file.bytes()), ", more than the ", io::size_text(kMaxTraceBytes),
                  " that `fsdp report` reads");
  const int fd = ::dup(file.fd());
  FSDP_USER_CHECK(fd >= 0, "cannot read trace file '", path, "': ", std::strerror(errno));
  gzFile in = gzdopen(fd, "rb");
  if (!in) {
    ::close(fd);
    FSDP_USER_FAIL("cannot read trace file '", path, "': ", std::strerror(errno));
  }
  std::string text;
  char buf[1 << 16];
  int n;
  while ((n = gzread(in, buf, sizeof buf)) > 0) {
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > kMaxTraceBytes) {
      gzclose(in);
      FSDP_USER_FAIL("trace file '", path, "' decompresses to more than the ",
                     io::size_text(kMaxTraceBytes), " that `fsdp report` reads");
    }
  }
  int code = Z_OK;
  const std::string why = n < 0 ? gzerror(in, &code) : "";
  gzclose(in);
  if (n != 0) FSDP_USER_FAIL("trace file '", path, "' could not be decompressed: ", why);
  return text;
#else
  const std::string text = file.read_all(kMaxTraceBytes, "a trace file");
  FSDP_USER_CHECK(text.size() < 2 || static_cast<unsigned char>(text[0]) != 0x1f ||
                      static_cast<unsigned char>(text[1]) != 0x8b,
                  "trace file '", path, "' is gzip-compressed and this build has no zlib: gunzip it first");
  return text;
#endif
}

}  // namespace

std::vector<TracedRank> read_report_trace(const std::string& path) {
  // Note [Checked JSON]: one-line errors for text that is not JSON, or is nested too deep.
  return parse_trace(io::parse_json(read_maybe_gzipped(path), path).value, path);
}

CLI::App* add_report_command(CLI::App& app, ReportOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "report", "metrics and the longest stalls of a --trace file; --svg draws one step");
  cmd->add_option("trace", o.trace_path,
                  "trace file written by `fsdp train --trace` (.json, or .json.gz)")
      ->required();
  cmd->add_option("--svg", o.svg_path, "draw one step of one rank into this SVG file");
  cmd->add_option("--top", o.top, "stalls listed per rank")->check(non_negative_count());
  cmd->add_option("--rank", o.rank,
                  "the rank drawn [default: the trace's first: rank 0, or a simulated trace's one rank]")
      ->check(non_negative_count());
  cmd->add_option("--step", o.step,
                  "the recorded step drawn, 0 = first recorded (default: the last)");
  return cmd;
}

std::string format_report(const std::vector<TracedRank>& ranks, int top) {
  FSDP_USER_CHECK(!ranks.empty(), "the trace has no ranks");
  FSDP_USER_CHECK(top >= 0, "--top must be >= 0, got ", top);
  std::vector<runtime::TimelineMetrics> metrics;
  for (const TracedRank& r : ranks)
    metrics.push_back(metrics_of_timeline(r.timeline, r.host_schedule_us_per_unit, top));

  std::string out =
      "per step, ms unless named otherwise (definitions: src/runtime/trace_metrics.h)\n";
  char cell[64];
  std::snprintf(cell, sizeof cell, "%-28s", "metric");
  out += cell;
  for (const TracedRank& r : ranks) {
    std::snprintf(cell, sizeof cell, "%12s", ("rank " + std::to_string(r.rank)).c_str());
    out += cell;
  }
  out += "\n";
  for (const MetricRow& row : kRows) {
    std::snprintf(cell, sizeof cell, "%-28s", row.name);
    out += cell;
    for (const runtime::TimelineMetrics& m : metrics) {
      std::snprintf(cell, sizeof cell, "%12s", printf_string(row.format, row.get(m)).c_str());
      out += cell;
    }
    out += "\n";
  }
  if (top > 0)
    for (size_t i = 0; i < ranks.size(); ++i) append_stalls(out, ranks[i], metrics[i], top);
  return out;
}

std::string render_report_svg(const TracedRank& rank, int step, const std::string& source) {
  const Timeline& t = rank.timeline;
  FSDP_USER_CHECK(!t.ops.empty(), "rank ", rank.rank, " recorded no ops: nothing to draw");
  const std::vector<runtime::StepWindow> steps =
      runtime::find_steps(t, runtime::find_stream(t, "compute"));
  runtime::StepWindow window;
  std::string which;
  if (steps.empty()) {
    FSDP_USER_CHECK(step <= 0, "--step ", step, ": rank ", rank.rank,
               " recorded no optimizer op, so the trace has no steps to pick from");
    window.start_us = t.ops.front().start_us;
    window.end_us = t.ops.front().end_us;
    for (const TimelineOp& op : t.ops) {
      window.start_us = std::min(window.start_us, op.start_us);
      window.end_us = std::max(window.end_us, op.end_us);
    }
    which = "the whole timeline (no optimizer op recorded)";
  } else {
    const int index = step < 0 ? static_cast<int>(steps.size()) - 1 : step;
    FSDP_USER_CHECK(index < static_cast<int>(steps.size()), "--step ", step, ": rank ", rank.rank,
               " recorded steps 0..", steps.size() - 1);
    window = steps[index];
    which = "recorded step " + std::to_string(index) + " of 0.." + std::to_string(steps.size() - 1);
  }
  const std::string title = "fsdp timeline: rank " + std::to_string(rank.rank) + ", " + which +
                            (source.empty() ? "" : "  (" + source + ")");
  return render_step_svg(t, window, title);
}

int run_report(const ReportOptions& o) {
  const std::vector<TracedRank> ranks = read_report_trace(o.trace_path);
  FSDP_USER_CHECK(!ranks.empty(), "trace file '", o.trace_path, "' has no ranks");
  size_t max_steps = 0;
  for (const TracedRank& r : ranks)
    max_steps = std::max(
        max_steps,
        runtime::find_steps(r.timeline, runtime::find_stream(r.timeline, "compute")).size());
  std::printf("trace %s: %zu ranks, %zu recorded steps\n", o.trace_path.c_str(), ranks.size(),
              max_steps);
  std::fputs(format_report(ranks, o.top).c_str(), stdout);
  if (!o.svg_path.empty()) {
    auto it = o.rank < 0 ? ranks.begin()
                         : std::find_if(ranks.begin(), ranks.end(),
                                        [&](const TracedRank& r) { return r.rank == o.rank; });
    FSDP_USER_CHECK(it != ranks.end(), "--rank ", o.rank, ": the trace holds ranks ",
                    ranks.front().rank, "..", ranks.back().rank);
    const std::string svg = render_report_svg(*it, o.step, o.trace_path);
    io::write_file_atomic(o.svg_path, svg);  // Note [Output paths]
    std::printf("\nwrote %s (rank %d)\n", o.svg_path.c_str(), it->rank);
  }
  return 0;
}

}  // namespace fsdp::tools
