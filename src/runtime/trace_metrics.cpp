// Note [Trace metrics] in trace_metrics.h says what each number means.
#include "runtime/trace_metrics.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <utility>

#include "fsdp/error.h"

namespace fsdp::runtime {

namespace {

using Interval = std::pair<double, double>;

double length(double start_us, double end_us) {
  return end_us > start_us ? end_us - start_us : 0.0;
}

// Sorted, disjoint intervals covering the same time as `v`.
std::vector<Interval> union_of(std::vector<Interval> v) {
  std::sort(v.begin(), v.end());
  std::vector<Interval> out;
  for (const Interval& i : v) {
    if (i.second <= i.first) continue;
    if (!out.empty() && i.first <= out.back().second)
      out.back().second = std::max(out.back().second, i.second);
    else
      out.push_back(i);
  }
  return out;
}

double total_length(const std::vector<Interval>& disjoint) {
  double sum = 0;
  for (const Interval& i : disjoint) sum += i.second - i.first;
  return sum;
}

// Both inputs sorted and disjoint (union_of): a merge walk.
double intersection_length(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  double sum = 0;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    sum += length(std::max(a[i].first, b[j].first), std::min(a[i].second, b[j].second));
    // Drop whichever ends first: it cannot meet anything later in the other list.
    if (a[i].second < b[j].second)
      ++i;
    else
      ++j;
  }
  return sum;
}

// A step ends with the optimizer on the compute stream, or, when the optimizer runs inside
// backward (on the RS stream), with the trainer's "step end" marker on compute.
// A wait is never one: it carries whatever label was set last, "optimizer" included (the
// optimizer in backward sets it on the host between compute's ops).
bool is_optimizer(const TimelineOp& op) {
  if (op.kind == OpKind::Wait) return false;
  return op.kind == OpKind::Optimizer || op.label == "optimizer" || op.label == kStepEndLabel;
}

// The compute stream's ops in the order they ran. Ops of one stream never overlap, so start
// time is issue order; ties keep the recorded order.
std::vector<const TimelineOp*> ops_of_stream(const Timeline& t, int stream) {
  std::vector<const TimelineOp*> out;
  for (const TimelineOp& op : t.ops)
    if (op.stream == stream) out.push_back(&op);
  std::stable_sort(out.begin(), out.end(), [](const TimelineOp* a, const TimelineOp* b) {
    return a->start_us < b->start_us;
  });
  return out;
}

int step_of(const std::vector<StepWindow>& steps, double time_us) {
  for (const StepWindow& w : steps)
    if (time_us < w.end_us) return w.index;
  return steps.empty() ? 0 : steps.back().index;  // after the last optimizer: the last step
}

// The op a wait waited for: the last op with that label to end no later than the wait did
// (the wait cannot end before it), else the first to end after (clocks of different streams
// may disagree by a little).
void find_cause(const std::map<std::string, std::vector<const TimelineOp*>>& by_label, Stall& s) {
  auto it = by_label.find(s.waited_for);
  if (it == by_label.end()) return;
  const TimelineOp* best_before = nullptr;
  const TimelineOp* best_after = nullptr;
  for (const TimelineOp* op : it->second) {
    if (op->end_us <= s.end_us) {
      if (!best_before || op->end_us > best_before->end_us) best_before = op;
    } else if (!best_after || op->end_us < best_after->end_us) {
      best_after = op;
    }
  }
  const TimelineOp* cause = best_before ? best_before : best_after;
  s.cause_stream = cause->stream;
  s.cause_start_us = cause->start_us;
  s.cause_end_us = cause->end_us;
}

}  // namespace

const char* stall_cause_name(StallCause cause) {
  switch (cause) {
    case StallCause::AllGather:
      return "all-gather";
    case StallCause::RsRing:
      return "rs-ring";
    case StallCause::RsDrain:
      return "rs-drain";
    case StallCause::OtherComm:
      return "other-comm";
    case StallCause::NotComm:
      return "not-comm";
  }
  return "?";
}

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

bool is_all_gather_collective(const TimelineOp& op) {
  return op.kind == OpKind::Collective && starts_with(op.label, "AG ") &&
         !starts_with(op.label, "AG copy-in ") && !starts_with(op.label, "AG copy-out ");
}

bool is_reduce_scatter_collective(const TimelineOp& op) {
  // "RS accumulate X" as a collective is a mislabel (an op issued after the RS that kept
  // the sticky label), not a reduce-scatter.
  return op.kind == OpKind::Collective && starts_with(op.label, "RS ") &&
         !starts_with(op.label, "RS copy-in ") && !starts_with(op.label, "RS accumulate ");
}

int find_stream(const Timeline& t, std::string_view name) {
  for (size_t i = 0; i < t.stream_names.size(); ++i)
    if (t.stream_names[i] == name) return static_cast<int>(i);
  return -1;
}

std::vector<StepWindow> find_steps(const Timeline& t, int compute_stream_id) {
  std::vector<StepWindow> steps;
  if (t.ops.empty()) return steps;
  double first_start = t.ops.front().start_us;
  for (const TimelineOp& op : t.ops) first_start = std::min(first_start, op.start_us);
  double step_start = first_start;
  bool in_run = false;
  for (const TimelineOp* op : ops_of_stream(t, compute_stream_id)) {
    if (is_optimizer(*op)) {
      if (!in_run) steps.push_back({static_cast<int>(steps.size()), step_start, op->end_us});
      steps.back().end_us = std::max(steps.back().end_us, op->end_us);
      in_run = true;
    } else if (op->kind != OpKind::Wait) {
      if (in_run) step_start = steps.back().end_us;
      in_run = false;
    }
  }
  return steps;
}

std::vector<Stall> find_stalls(const Timeline& t, int compute_stream_id) {
  std::set<std::string> collective_labels;
  std::map<std::string, std::vector<const TimelineOp*>> ops_by_label;
  for (const TimelineOp& op : t.ops) {
    if (op.kind == OpKind::Collective) collective_labels.insert(op.label);
    if (op.kind != OpKind::Wait && op.kind != OpKind::Host) ops_by_label[op.label].push_back(&op);
  }
  const std::vector<const TimelineOp*> compute = ops_of_stream(t, compute_stream_id);
  // Walking backwards: is an "RS copy-in" still to come before this step's optimizer?
  std::vector<bool> copy_in_follows(compute.size(), false);
  bool seen = false;
  for (size_t i = compute.size(); i-- > 0;) {
    if (is_optimizer(*compute[i])) seen = false;
    copy_in_follows[i] = seen;
    if (compute[i]->kind != OpKind::Wait && starts_with(compute[i]->label, "RS copy-in "))
      seen = true;
  }
  const std::vector<StepWindow> steps = find_steps(t, compute_stream_id);
  std::vector<Stall> stalls;
  for (size_t i = 0; i < compute.size(); ++i) {
    const TimelineOp& op = *compute[i];
    if (op.kind != OpKind::Wait) continue;
    Stall s;
    s.start_us = op.start_us;
    s.end_us = op.end_us;
    s.label = op.label;
    s.waited_for = op.waited_for;
    if (starts_with(op.waited_for, "AG "))
      s.cause = StallCause::AllGather;
    else if (starts_with(op.waited_for, "RS "))
      s.cause = copy_in_follows[i] ? StallCause::RsRing : StallCause::RsDrain;
    else if (collective_labels.count(op.waited_for))
      s.cause = StallCause::OtherComm;
    s.step = step_of(steps, op.start_us);
    find_cause(ops_by_label, s);
    stalls.push_back(std::move(s));
  }
  return stalls;
}

TimelineMetrics compute_metrics(const Timeline& t, int compute_stream_id, double step_count,
                                int top_stalls) {
  FSDP_CHECK(compute_stream_id >= 0,
             "the timeline has no compute stream (streams: ", t.stream_names.size(), ")");
  FSDP_CHECK(step_count > 0, "metrics need a positive step count, got ", step_count);
  FSDP_CHECK(top_stalls >= 0, "top_stalls must be >= 0, got ", top_stalls);
  TimelineMetrics m;
  m.steps = step_count;
  m.ops = static_cast<int64_t>(t.ops.size());

  std::set<int> streams;
  std::vector<Interval> all_gathers, reduce_scatters, host_spans;
  for (const TimelineOp& op : t.ops) {
    if (op.stream >= 0) streams.insert(op.stream);
    if (is_all_gather_collective(op)) all_gathers.push_back({op.start_us, op.end_us});
    if (is_reduce_scatter_collective(op)) reduce_scatters.push_back({op.start_us, op.end_us});
    if (op.kind == OpKind::Host) host_spans.push_back({op.start_us, op.end_us});
  }
  m.streams_used = static_cast<int>(streams.size());
  const double per_step_ms = 1e-3 / step_count;
  m.ag_rs_overlap_ms =
      intersection_length(union_of(all_gathers), union_of(reduce_scatters)) * per_step_ms;
  m.host_span_ms = total_length(union_of(host_spans)) * per_step_ms;

  std::vector<Stall> stalls = find_stalls(t, compute_stream_id);
  for (const Stall& s : stalls) {
    const double ms = s.ms() / step_count;
    switch (s.cause) {
      case StallCause::AllGather:
        m.exposed_ag_ms += ms;
        break;
      case StallCause::RsRing:
        m.rs_recycle_stall_ms += ms;
        break;
      case StallCause::RsDrain:
        m.rs_drain_ms += ms;
        break;
      case StallCause::OtherComm:
        m.other_comm_ms += ms;
        break;
      case StallCause::NotComm:
        break;
    }
  }
  m.exposed_comm_ms = m.exposed_ag_ms + m.rs_recycle_stall_ms + m.rs_drain_ms + m.other_comm_ms;

  std::stable_sort(stalls.begin(), stalls.end(),
                   [](const Stall& a, const Stall& b) { return a.ms() > b.ms(); });
  if (static_cast<int>(stalls.size()) > top_stalls) stalls.resize(top_stalls);
  m.top_stalls = std::move(stalls);
  return m;
}

}  // namespace fsdp::runtime
