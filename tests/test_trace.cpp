// Trace metrics on hand-built timelines (exact values), the --trace file written and read
// back, the report's SVG checked as XML, and the CPU trainer's real timeline measured.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <array>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "fsdp/error.h"
#include "runtime/trace_metrics.h"
#include "command_util.h"
#include "test_util.h"

#include "tools/report_command.h"
#include "tools/svg_timeline.h"
#include "tools/train_command.h"
#include "tools/trace_writer.h"

namespace fsdp::trace_test {
namespace {

using runtime::StallCause;

constexpr int kCompute = 0, kAllGather = 1, kReduceScatter = 2;

TimelineOp op(const std::string& label, int stream, OpKind kind, double start, double end,
              const std::string& waited_for = "") {
  return TimelineOp{label, stream, kind, start, end, waited_for};
}

TimelineOp wait_op(int stream, double start, double end, const std::string& waited_for) {
  return op("next op", stream, OpKind::Wait, start, end, waited_for);
}

// Two steps with every kind of stall, in us. Step 0 ends with the optimizer at 1100,
// step 1 at 1250.
//   AG stall 105 (5..110), RS ring stall 300 (520..820: an RS copy-in follows), RS drain
//   stall 170 (840..1010: none follows), other-collective stall 25, a non-comm wait 30.
//   AG/RS collectives overlap 100 (700..800) + 60 (840..900); a mislabelled "RS accumulate"
//   collective on compute (1105..1110) overlaps "AG L2" but is not a reduce-scatter.
Timeline two_step_timeline(double shift = 0) {
  Timeline t;
  t.stream_names = {"compute", "all-gather", "reduce-scatter", "init"};
  t.ops = {
      op("schedule", -1, OpKind::Host, 0, 50),
      op("AG copy-in L0", kAllGather, OpKind::Kernel, 0, 10),
      op("AG L0", kAllGather, OpKind::Collective, 10, 110),
      wait_op(kCompute, 5, 110, "AG L0"),
      op("fwd L0 gemm", kCompute, OpKind::Kernel, 110, 300),
      op("bwd L0 gemm dW", kCompute, OpKind::Kernel, 300, 500),
      op("RS copy-in L1", kCompute, OpKind::Copy, 500, 520),
      wait_op(kReduceScatter, 400, 520, "RS copy-in L1"),  // not the compute stream: no stall
      op("RS L1", kReduceScatter, OpKind::Collective, 520, 800),
      op("RS accumulate L1", kReduceScatter, OpKind::Kernel, 800, 820),
      op("AG copy-in L1", kAllGather, OpKind::Kernel, 690, 700),  // not a collective
      op("AG L1", kAllGather, OpKind::Collective, 700, 900),
      wait_op(kCompute, 520, 820, "RS accumulate L1"),
      op("RS copy-in L0", kCompute, OpKind::Copy, 820, 840),
      op("RS L0", kReduceScatter, OpKind::Collective, 840, 1000),
      op("RS accumulate L0", kReduceScatter, OpKind::Kernel, 1000, 1010),
      wait_op(kCompute, 840, 1010, "RS accumulate L0"),
      op("optimizer", kCompute, OpKind::Optimizer, 1010, 1100),
      // step 1
      op("zero_grad", kCompute, OpKind::Kernel, 1100, 1105),
      op("RS accumulate L0", kCompute, OpKind::Collective, 1105, 1110),  // sticky-label mislabel
      op("AG L2", kAllGather, OpKind::Collective, 1100, 1110),
      wait_op(kCompute, 1110, 1140, "upload"),
      op("all-reduce loss", kReduceScatter, OpKind::Collective, 1120, 1160),
      wait_op(kCompute, 1140, 1165, "all-reduce loss"),
      // A copy-in of the next step must not turn step 0's drain into a ring reclaim.
      op("RS copy-in L2", kCompute, OpKind::Copy, 1180, 1190),
      op("optimizer", kCompute, OpKind::Optimizer, 1200, 1250),
  };
  for (TimelineOp& o : t.ops) {
    o.start_us += shift;
    o.end_us += shift;
  }
  t.memory = {{0 + shift, 1000}, {300 + shift, 5000}, {1000 + shift, 2000}};
  return t;
}

TEST(TraceMetrics, ExposedCommSplitsIntoItsCausesExactly) {
  const runtime::TimelineMetrics m = runtime::compute_metrics(two_step_timeline(), kCompute, 2);
  EXPECT_EQ(m.steps, 2);
  EXPECT_NEAR(m.exposed_ag_ms, 0.105 / 2, 1e-12);
  EXPECT_NEAR(m.rs_recycle_stall_ms, 0.300 / 2, 1e-12);
  EXPECT_NEAR(m.rs_drain_ms, 0.170 / 2, 1e-12);
  EXPECT_NEAR(m.other_comm_ms, 0.025 / 2, 1e-12);
  EXPECT_NEAR(m.exposed_comm_ms, 0.600 / 2, 1e-12);  // the non-comm wait is left out
  EXPECT_NEAR(m.ag_rs_overlap_ms, 0.160 / 2, 1e-12);
  EXPECT_NEAR(m.host_span_ms, 0.050 / 2, 1e-12);
  EXPECT_EQ(m.streams_used, 3);  // "init" has no op; the host track is not a stream
  EXPECT_EQ(m.ops, 26);
}

TEST(TraceMetrics, TopStallsAreLongestFirstWithTheirCause) {
  const runtime::TimelineMetrics m =
      runtime::compute_metrics(two_step_timeline(), kCompute, 2, /*top_stalls=*/4);
  ASSERT_EQ(m.top_stalls.size(), 4u);
  const runtime::Stall& ring = m.top_stalls[0];
  EXPECT_EQ(ring.cause, StallCause::RsRing);
  EXPECT_EQ(ring.waited_for, "RS accumulate L1");
  EXPECT_NEAR(ring.ms(), 0.300, 1e-12);
  EXPECT_EQ(ring.step, 0);
  EXPECT_EQ(ring.cause_stream, kReduceScatter);
  EXPECT_EQ(ring.cause_start_us, 800);
  EXPECT_EQ(ring.cause_end_us, 820);
  EXPECT_EQ(m.top_stalls[1].cause, StallCause::RsDrain);
  EXPECT_EQ(m.top_stalls[2].cause, StallCause::AllGather);
  EXPECT_EQ(m.top_stalls[3].cause, StallCause::NotComm);
  EXPECT_EQ(m.top_stalls[3].step, 1);
  EXPECT_EQ(m.top_stalls[3].cause_stream, -2);  // nothing was labelled "upload"
}

TEST(TraceMetrics, StepsAreOptimizerRuns) {
  Timeline t = two_step_timeline();
  // A multi-kernel optimizer is still one step.
  t.ops.push_back(op("optimizer", kCompute, OpKind::Optimizer, 1250, 1260));
  const std::vector<runtime::StepWindow> steps = runtime::find_steps(t, kCompute);
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0].start_us, 0);
  EXPECT_EQ(steps[0].end_us, 1100);
  EXPECT_EQ(steps[1].start_us, 1100);
  EXPECT_EQ(steps[1].end_us, 1260);
  EXPECT_EQ(runtime::find_stream(t, "reduce-scatter"), kReduceScatter);
  EXPECT_EQ(runtime::find_stream(t, "nope"), -1);
}

TEST(TraceMetrics, OverlapCountsEachInstantOnce) {
  Timeline t;
  t.stream_names = {"compute", "all-gather", "reduce-scatter", "all-gather-2"};
  t.ops = {op("AG a", kAllGather, OpKind::Collective, 0, 100),
           op("AG b", 3, OpKind::Collective, 50, 150),  // overlaps AG a: one union
           op("RS a", kReduceScatter, OpKind::Collective, 0, 200),
           op("RS copy-in a", kCompute, OpKind::Collective, 0, 200),  // not a reduce-scatter
           op("optimizer", kCompute, OpKind::Optimizer, 200, 210)};
  const runtime::TimelineMetrics m = runtime::compute_metrics(t, kCompute, 1);
  EXPECT_NEAR(m.ag_rs_overlap_ms, 0.150, 1e-12);
  EXPECT_EQ(m.streams_used, 4);
  EXPECT_EQ(m.exposed_comm_ms, 0);
}

TEST(TraceMetrics, RejectsMissingComputeStreamAndZeroSteps) {
  EXPECT_THROW(runtime::compute_metrics(two_step_timeline(), -1, 1), Error);
  EXPECT_THROW(runtime::compute_metrics(two_step_timeline(), kCompute, 0), Error);
}

// ---- the trace file

std::vector<runtime::RankResult> synthetic_ranks() {
  std::vector<runtime::RankResult> ranks(2);
  for (int r = 0; r < 2; ++r) {
    ranks[r].rank = r;
    ranks[r].host_schedule_us_per_unit = 12.5 + r;
    ranks[r].timeline = two_step_timeline(r * 3.0);
  }
  // Labels are user text: the file and the picture must survive any of it.
  ranks[0].timeline.ops.push_back(op("fwd a<b & \"c\" 'd'", kCompute, OpKind::Kernel, 1165, 1180));
  return ranks;
}

TEST(TraceFile, HasOneProcessPerRankNamedTracksAndEveryOp) {
  const nlohmann::json trace =
      nlohmann::json::parse(tools::build_trace_json(synthetic_ranks()).dump());
  std::set<std::string> process_names, thread_names, op_names;
  int counters = 0;
  for (const nlohmann::json& e : trace["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") process_names.insert(e["args"]["name"]);
    if (e["ph"] == "M" && e["name"] == "thread_name" && e["pid"] == 0)
      thread_names.insert(e["args"]["name"]);
    if (e["ph"] == "X" && e["pid"] == 0) op_names.insert(e["name"]);
    counters += e["ph"] == "C" && e["name"] == "allocated bytes";
  }
  EXPECT_EQ(process_names, (std::set<std::string>{"rank 0", "rank 1"}));
  EXPECT_EQ(thread_names,
            (std::set<std::string>{"host", "compute", "all-gather", "reduce-scatter", "init"}));
  for (const char* name : {"AG L0", "wait for AG L0", "wait for RS accumulate L1", "schedule",
                           "optimizer", "fwd a<b & \"c\" 'd'"})
    EXPECT_TRUE(op_names.count(name)) << name;
  EXPECT_EQ(counters, 6);
  const nlohmann::json& stored = trace["otherData"]["fsdp"]["ranks"][1];
  EXPECT_EQ(stored["rank"], 1);
  EXPECT_EQ(stored["host_schedule_us_per_unit"], 13.5);
  EXPECT_NEAR(stored["metrics"]["rs_recycle_stall_ms"].get<double>(), 0.150, 1e-12);
  EXPECT_EQ(stored["metrics"]["top_stalls"][0]["cause"], "rs-ring");
}

TEST(TraceFile, ReadsBackTheSameTimelinesAndMetrics) {
  const std::vector<runtime::RankResult> ranks = synthetic_ranks();
  const std::string path = ::testing::TempDir() + "trace_roundtrip.json";
  tools::write_trace_file(path, ranks);
  const std::vector<tools::TracedRank> back = tools::read_trace_file(path);
  ASSERT_EQ(back.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    const Timeline& a = ranks[r].timeline;
    const Timeline& b = back[r].timeline;
    EXPECT_EQ(back[r].rank, r);
    EXPECT_EQ(back[r].host_schedule_us_per_unit, ranks[r].host_schedule_us_per_unit);
    EXPECT_EQ(b.stream_names, a.stream_names);
    ASSERT_EQ(b.ops.size(), a.ops.size());
    for (size_t i = 0; i < a.ops.size(); ++i) {
      EXPECT_EQ(b.ops[i].label, a.ops[i].label) << i;
      EXPECT_EQ(b.ops[i].waited_for, a.ops[i].waited_for) << i;
      EXPECT_EQ(b.ops[i].stream, a.ops[i].stream) << i;
      EXPECT_EQ(b.ops[i].kind, a.ops[i].kind) << i;
      EXPECT_DOUBLE_EQ(b.ops[i].start_us, a.ops[i].start_us) << i;
      EXPECT_NEAR(b.ops[i].end_us, a.ops[i].end_us, 1e-9) << i;
    }
    ASSERT_EQ(b.memory.size(), a.memory.size());
    EXPECT_EQ(b.memory[1].bytes, 5000);
    // What the report recomputes is what the writer stored.
    const runtime::TimelineMetrics m =
        tools::metrics_of_timeline(b, back[r].host_schedule_us_per_unit, 16);
    EXPECT_NEAR(m.exposed_comm_ms, back[r].stored_metrics["exposed_comm_ms"].get<double>(), 1e-9);
    EXPECT_NEAR(m.rs_drain_ms, back[r].stored_metrics["rs_drain_ms"].get<double>(), 1e-9);
    EXPECT_EQ(m.streams_used, back[r].stored_metrics["streams_used"].get<int>());
  }
}

TEST(TraceFile, BadFilesGiveClearErrors) {
  EXPECT_THROW(tools::read_trace_file(::testing::TempDir() + "no_such_trace.json"), Error);
  EXPECT_THROW(tools::parse_trace(nlohmann::json::array()), Error);
  nlohmann::json bad = {{"traceEvents",
                         {{{"ph", "X"},
                           {"pid", 0},
                           {"tid", 1},
                           {"name", "x"},
                           {"cat", "gizmo"},
                           {"ts", 0},
                           {"dur", 1}}}}};
  EXPECT_THROW(tools::parse_trace(bad), Error);
}

// ---- the SVG

// Well-formed enough for any XML parser: one root, balanced tags, quoted attributes, and
// '&' only in the five predefined entities. Returns "" or what is wrong.
std::string xml_problem(const std::string& xml) {
  auto entity_ok = [&](size_t amp) {
    for (const char* e : {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"})
      if (xml.compare(amp, std::strlen(e), e) == 0) return true;
    return false;
  };
  std::vector<std::string> open;
  int roots = 0;
  size_t i = 0;
  while (i < xml.size()) {
    if (xml[i] == '&' && !entity_ok(i)) return "bad entity at " + std::to_string(i);
    if (xml[i] != '<') {
      if (xml[i] == '>') return "stray '>' at " + std::to_string(i);
      if (open.empty() && !std::isspace(static_cast<unsigned char>(xml[i])))
        return "text outside the root at " + std::to_string(i);
      ++i;
      continue;
    }
    if (xml.compare(i, 2, "<?") == 0) {
      const size_t end = xml.find("?>", i);
      if (end == std::string::npos) return "unclosed <?";
      i = end + 2;
      continue;
    }
    size_t j = i + 1;
    char quote = 0;
    for (; j < xml.size() && (quote || xml[j] != '>'); ++j) {
      if (quote && xml[j] == '<') return "'<' in an attribute at " + std::to_string(j);
      if (quote && xml[j] == '&' && !entity_ok(j)) return "bad entity in an attribute";
      if (xml[j] == '"' || xml[j] == '\'') quote = quote == xml[j] ? 0 : (quote ? quote : xml[j]);
    }
    if (j >= xml.size()) return "unclosed tag at " + std::to_string(i);
    std::string tag = xml.substr(i + 1, j - i - 1);
    i = j + 1;
    if (tag.empty()) return "empty tag";
    if (tag[0] == '/') {
      if (open.empty() || open.back() != tag.substr(1))
        return "mismatched </" + tag.substr(1) + ">";
      open.pop_back();
      continue;
    }
    const bool self_closing = tag.back() == '/';
    const std::string name = tag.substr(0, tag.find_first_of(" \t\n/"));
    if (open.empty() && ++roots > 1) return "more than one root element";
    if (!self_closing) open.push_back(name);
  }
  if (!open.empty()) return "unclosed <" + open.back() + ">";
  return roots == 1 ? "" : "no root element";
}

TEST(TraceSvg, CheckerCatchesBrokenXml) {
  EXPECT_EQ(xml_problem("<svg><rect/><text>a &amp; b</text></svg>"), "");
  EXPECT_NE(xml_problem("<svg><text>a & b</text></svg>"), "");
  EXPECT_NE(xml_problem("<svg><text>a</svg></text>"), "");
  EXPECT_NE(xml_problem("<svg><g></svg>"), "");
  EXPECT_NE(xml_problem("<svg a=\"<\"></svg>"), "");
}

TEST(TraceSvg, LastStepIsWellFormedWithTracksLegendAndStalls) {
  const std::vector<runtime::RankResult> ranks = synthetic_ranks();
  const std::vector<tools::TracedRank> back = tools::parse_trace(tools::build_trace_json(ranks));
  const std::string svg = tools::render_report_svg(back[0], /*step=*/-1, "synthetic & <test>");
  EXPECT_EQ(xml_problem(svg), "") << svg;
  for (const char* text :
       {">compute<", ">all-gather<", ">reduce-scatter<", ">allocated<", "recorded step 1 of 0..1",
        "synthetic &amp; &lt;test&gt;", "fwd a&lt;b &amp; &quot;c&quot; &apos;d&apos;",
        "time in the step (ms)", "compute stalled on communication"})
    EXPECT_NE(svg.find(text), std::string::npos) << text;
  // The last step has the other-collective stall (25 us) drawn red; its own numbers head it.
  EXPECT_NE(svg.find("#e15759"), std::string::npos);
  EXPECT_NE(svg.find("other 0.025"), std::string::npos);
  EXPECT_EQ(svg.find(">host<"), std::string::npos);  // no host op in the last step
  const std::string first = tools::render_report_svg(back[0], 0, "");
  EXPECT_EQ(xml_problem(first), "");
  for (const char* text :
       {">host<", "0.30 ms RS accumulate L1", "RS ring 0.300", "AG/RS overlap 0.160"})
    EXPECT_NE(first.find(text), std::string::npos) << text;
  EXPECT_THROW(tools::render_report_svg(back[0], 2, ""), Error);
}

TEST(TraceReport, TableNamesEveryMetricAndTheStallsCauses) {
  const std::vector<tools::TracedRank> back =
      tools::parse_trace(tools::build_trace_json(synthetic_ranks()));
  const std::string text = tools::format_report(back, 2);
  for (const char* s : {"exposed_comm_ms", "rs_recycle_stall_ms", "rs_drain_ms", "ag_rs_overlap_ms",
                        "streams_used", "ops", "rank 0", "rank 1", "rs-ring", "rs-drain",
                        "'RS accumulate L1' ran on reduce-scatter", "0.300"})
    EXPECT_NE(text.find(s), std::string::npos) << s << "\n" << text;
}

// ---- the command and the real trainer

std::pair<int, std::string> run_command(const std::string& args) {
  const testing::CommandResult r = testing::run_fsdp_command(args);
  return {r.code, r.output};
}

TEST(TraceReport, CommandPrintsTheTableAndWritesTheSvg) {
  const std::string trace = ::testing::TempDir() + "trace_cli.json";
  const std::string svg = ::testing::TempDir() + "trace_cli.svg";
  std::remove(svg.c_str());
  tools::write_trace_file(trace, synthetic_ranks());
  auto [code, out] = run_command("report " + trace + " --svg " + svg + " --top 2 --rank 1");
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("exposed_comm_ms"), std::string::npos) << out;
  EXPECT_NE(out.find("wrote " + svg), std::string::npos) << out;
  std::ifstream in(svg);
  std::stringstream content;
  content << in.rdbuf();
  EXPECT_EQ(xml_problem(content.str()), "");
  EXPECT_NE(content.str().find("rank 1"), std::string::npos);
  for (const std::string& args :
       {"report " + trace + " --svg " + svg + " --rank 7",
        std::string("report /no/such/trace.json"), "report " + trace + " --step 9 --svg " + svg}) {
    auto [bad_code, bad_out] = run_command(args);
    EXPECT_NE(bad_code, 0) << args;
    EXPECT_NE(bad_out.find("error"), std::string::npos) << bad_out;
  }
}

// A traced mlp on CPU ranks: 3 blocks of 64, 16 tokens, 3 steps of which 2 recorded.
runtime::TrainConfig traced_mlp() {
  runtime::TrainConfig config;
  config.model.kind = "mlp";
  config.model.layers = 3;
  config.model.dim = 64;
  config.tokens = 16;
  config.steps = 3;
  config.warmup = 1;
  config.timeline = true;
  return config;
}

// With the optimizer in backward, the compute stream's waits carry the label the optimizer
// set last ("optimizer"); they are waits, not optimizer runs, so a step is still one window.
TEST(TraceEndToEnd, OptimizerInBackwardStepsAreCountedOnce) {
  runtime::TrainConfig config = traced_mlp();
  config.steps = 5;
  config.optimizer_in_backward = true;
  config.optimizer.max_grad_norm = 0;
  for (const runtime::RankResult& r : testing::run_fsdp(2, config)) {
    const int compute = runtime::find_stream(r.timeline, "compute");
    EXPECT_EQ(runtime::find_steps(r.timeline, compute).size(), 4u);
  }
}

TEST(TraceEndToEnd, CpuTrainerTimelineGivesSaneMetrics) {
  runtime::TrainConfig config = traced_mlp();
  config.rs_max_input_buffers = 1;
  const std::vector<runtime::RankResult> ranks = testing::run_fsdp(2, config);
  for (const runtime::RankResult& r : ranks) {
    const Timeline& t = r.timeline;
    const int compute = runtime::find_stream(t, "compute");
    ASSERT_GE(compute, 0);
    const std::vector<runtime::StepWindow> steps = runtime::find_steps(t, compute);
    ASSERT_EQ(steps.size(), 2u) << "timeline recording starts at step == warmup";
    const runtime::TimelineMetrics m =
        tools::metrics_of_timeline(t, r.host_schedule_us_per_unit, 8);
    EXPECT_GE(m.exposed_ag_ms, 0);
    EXPECT_GE(m.rs_recycle_stall_ms, 0);
    EXPECT_GE(m.rs_drain_ms, 0);
    EXPECT_GE(m.ag_rs_overlap_ms, 0);
    EXPECT_GE(m.streams_used, 3);
    EXPECT_LE(m.streams_used, 4);
    EXPECT_LE(m.exposed_comm_ms * m.steps, (steps.back().end_us - steps.front().start_us) * 1e-3);
    // With one RS buffer (k = 1) each step reclaims before every reduce-scatter but the first
    // and drains the one left: one drain wait per step, copy-ins - 1 ring waits per step.
    int copy_ins = 0, ring = 0, drain = 0;
    for (const TimelineOp& o : t.ops)
      copy_ins += o.stream == compute && runtime::starts_with(o.label, "RS copy-in ");
    for (const runtime::Stall& s : runtime::find_stalls(t, compute)) {
      ring += s.cause == StallCause::RsRing;
      drain += s.cause == StallCause::RsDrain;
    }
    EXPECT_EQ(drain, 2);
    EXPECT_EQ(ring, copy_ins - 2);
    EXPECT_GT(copy_ins, 2);
  }
  const std::vector<tools::TracedRank> back = tools::parse_trace(tools::build_trace_json(ranks));
  const std::string svg = tools::render_report_svg(back[0], -1, "cpu");
  EXPECT_EQ(xml_problem(svg), "");
  for (const char* text : {">compute<", ">all-gather<", ">reduce-scatter<"})
    EXPECT_NE(svg.find(text), std::string::npos) << text;
}

}  // namespace
}  // namespace fsdp::trace_test
