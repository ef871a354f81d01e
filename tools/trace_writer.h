// The --trace file: Chrome trace-event JSON that Perfetto and chrome://tracing open, and that
// `fsdp report` reads back. write_trace_file itself is declared in train_command.h.
//
// Note [Trace file format]
//  - One process per rank: pid = rank, process_name "rank R", process_labels with the
//    headline metrics (Perfetto shows them next to the name).
//  - One thread per track: tid 0 is the host track (stream -1), tid s + 1 is stream s, named
//    by Timeline::stream_names. Tracks sort host, compute, all-gather, reduce-scatter, rest.
//  - Every op is a complete event ("ph": "X", ts/dur in us): name = its label, cat = its
//    kind ("kernel", "copy", "collective", "wait", "optimizer", "host"). A wait is named
//    "wait for <waited_for>" and keeps its own label and waited_for in args.
//  - Memory is the counter track "allocated bytes" of each process (args.bytes).
//  - otherData.fsdp: {"version": 1, "ranks": [{"rank", "host_schedule_us_per_unit",
//    "metrics": <metrics_to_json>}]}. The metrics are those of Note [Trace metrics], as
//    compute_metrics gives them for the whole recorded timeline of that rank.
//  - Read back (parse_trace), every field is checked (Note [Checked JSON]): tid in [0, 1024],
//    pid in [0, 2^20], ts and dur in [0, 1e15] us, args an object; a trace read whole is at
//    most 1 GiB, before and after gunzip.
// Includes of sibling tool headers are relative to this folder so that tests can compile the
// tool sources directly (see tests/test_trace.cpp).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/trace_metrics.h"
#include "runtime/trainer.h"

namespace fsdp::tools {

constexpr int kTraceFormatVersion = 1;

// How many stalls the trace keeps per rank in otherData.
constexpr int kStallsKeptInTrace = 16;

nlohmann::json build_trace_json(const std::vector<runtime::RankResult>& ranks);
nlohmann::json metrics_to_json(const runtime::TimelineMetrics& m);

// One rank as read back from a trace file.
struct TracedRank {
  int rank = 0;
  Timeline timeline;
  double host_schedule_us_per_unit = 0;  // from otherData; 0 when absent
  nlohmann::json stored_metrics;         // otherData's metrics object, or null
};

// Rebuilds each rank's Timeline from the events; ranks in increasing order. Every field is
// checked (Note [Checked JSON]): a trace that is not of this format is a one-line UserError
// naming `file` and the event's place ("traceEvents[12].tid must be an integer in ...").
std::vector<TracedRank> parse_trace(const nlohmann::json& trace,
                                    const std::string& file = "the trace");
std::vector<TracedRank> read_trace_file(const std::string& path);

// compute_metrics with the conventions the writer and the report share: the stream named
// "compute", steps counted from the optimizer runs (at least 1).
runtime::TimelineMetrics metrics_of_timeline(const Timeline& t, double host_schedule_us_per_unit,
                                             int top_stalls);

}  // namespace fsdp::tools
