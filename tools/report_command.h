// `fsdp report TRACE.json[.gz] [--svg OUT.svg] [--top N]`: the metrics of Note [Trace metrics]
// per rank, the longest compute stalls with the ops that caused them, and one step of one
// rank drawn as an SVG.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "trace_writer.h"

namespace fsdp::tools {

struct ReportOptions {
  std::string trace_path;
  std::string svg_path;  // empty: no picture
  int top = 5;           // stalls listed per rank
  int rank = -1;         // the rank drawn; -1: the trace's first (rank 0 of a real run)
  int step = -1;         // the recorded step drawn (0 = first recorded); -1: the last one
};

// Adds the `report` subcommand to `app`; run_report when the returned command parsed().
CLI::App* add_report_command(CLI::App& app, ReportOptions& options);
int run_report(const ReportOptions& options);

// The trace at `path`, gzip-compressed or not; a directory or a missing file is a one-line
// fsdp::Error.
std::vector<TracedRank> read_report_trace(const std::string& path);
// What run_report prints, without the SVG line: the metrics table and the top stalls.
std::string format_report(const std::vector<TracedRank>& ranks, int top);
// The SVG of one recorded step of one rank (Note [Trace metrics] for what a step is); when
// the rank recorded no optimizer op, the whole timeline is drawn as one step.
std::string render_report_svg(const TracedRank& rank, int step, const std::string& source);

}  // namespace fsdp::tools
