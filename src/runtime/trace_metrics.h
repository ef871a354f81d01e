// Numbers read off one rank's Timeline: how much communication the compute stream waited
// for, how much of that the RS ring's reclaim caused, how much AG and RS overlapped.
//
// Note [Timeline]
// What a backend records while Device::enable_timeline(true) is on (include/fsdp/device.h):
//  - One TimelineOp per enqueued op, on the track of its stream, labelled with the device's
//    sticky label at enqueue time (set_label; the engine's labels are "AG copy-in X", "AG X",
//    "AG copy-out X", "RS copy-in X", "RS X", "RS accumulate X" from param_group*.cpp, and
//    "fwd X gemm", "bwd X gemm dW", ... from the modules). Host spans (kind Host) go on
//    stream -1.
//  - A Wait op (wait_event) spans the time its stream was blocked; its waited_for is the label
//    of the last op enqueued on the recording stream before record_event. The CPU backend
//    measures the blocked task; CUDA spans from the end of the stream's previous op to an event
//    recorded right after the wait (cuda_timeline.h).
//  - Times are microseconds on one host clock shared by all ranks, so ranks line up.
//  - Memory samples (allocated bytes) are taken when alloc/free are called.
// The trainer records from step == warmup on and takes the timeline at the end of the run.
//
// Note [Trace metrics]
// The compute stream is the one named "compute". Every quantity below is measured on the
// recorded timeline and divided by the number of recorded steps (`step_count`).
//  - A *stall* is a Wait op on the compute stream: its start..end is the time the stream was
//    blocked (Note [Stream semantics]; both backends record waits that way).
//  - A stall is on communication when its waited_for (the label of the op the awaited event
//    followed) starts with "AG " or "RS " (which includes "RS accumulate X", the last op
//    before the RS-done event), or names an op recorded with kind Collective.
//  - exposed_comm_ms: the total length of stalls on communication. It splits exactly into
//      exposed_ag_ms        waited_for starts with "AG "
//      rs_recycle_stall_ms  waited_for starts with "RS ", and an "RS copy-in" op follows the
//                           wait on the compute stream before the step's optimizer: the ring
//                           reclaimed a buffer so the next group could reduce-scatter
//      rs_drain_ms          waited_for starts with "RS ", and no "RS copy-in" follows before
//                           the optimizer: finalize_backward draining the ring
//      other_comm_ms        any other collective
//    Every ring reclaim comes just before the copy-in it makes room for, and the drain comes
//    after the last copy-in of the step, so "is a copy-in still to come in this step" tells
//    them apart without knowing the model.
//  - ag_rs_overlap_ms: the length of time where some AG collective and some RS collective
//    run at once, on any streams (the intersection of the two unions of intervals). AG
//    collectives are kind Collective with a label "AG X" (not "AG copy-in/out"); RS ones
//    "RS X" (not "RS copy-in", "RS accumulate").
//  - streams_used: distinct streams (not the host track) with at least one op.
//  - Steps: a step ends with the optimizer, so the steps are the runs of consecutive ops on
//    the compute stream labelled "optimizer" (or of kind Optimizer); step i spans from the
//    end of run i-1 (the first op of the timeline for i = 0) to the end of run i.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fsdp/device.h"

namespace fsdp::runtime {

enum class StallCause : uint8_t { AllGather, RsRing, RsDrain, OtherComm, NotComm };
const char* stall_cause_name(StallCause cause);  // "all-gather", "rs-ring", ...

struct Stall {
  double start_us = 0, end_us = 0;
  std::string label;       // the wait op's own label (the device's label when it was issued)
  std::string waited_for;  // the op the awaited event followed
  StallCause cause = StallCause::NotComm;
  int step = 0;  // index of the recorded step it falls in
  // The op that the event followed, found by label: the last one to end no later than the
  // wait did (the first one after, if none). cause_stream is -2 when no op has that label.
  int cause_stream = -2;
  double cause_start_us = 0, cause_end_us = 0;

  double ms() const { return end_us > start_us ? (end_us - start_us) * 1e-3 : 0.0; }
  bool on_comm() const { return cause != StallCause::NotComm; }
};

struct StepWindow {
  int index = 0;
  double start_us = 0, end_us = 0;
};

struct TimelineMetrics {
  double steps = 0;  // the step_count the per-step numbers are divided by
  // per step, ms (Note [Trace metrics])
  double exposed_comm_ms = 0;
  double exposed_ag_ms = 0;
  double rs_recycle_stall_ms = 0;
  double rs_drain_ms = 0;
  double other_comm_ms = 0;
  double ag_rs_overlap_ms = 0;
  double host_span_ms = 0;  // host-track spans (scheduling work), when the backend records any
  // Computed by the trainer from host clocks, not from the timeline: callers that have the
  // RankResult copy it in (0 when unknown).
  double host_schedule_us_per_unit = 0;
  int streams_used = 0;
  int64_t ops = 0;                // every recorded op, all tracks, all steps
  std::vector<Stall> top_stalls;  // the longest compute-stream waits, longest first
};

// The label of the op the trainer puts on the compute stream at the end of every step.
constexpr const char* kStepEndLabel = "step end";

bool starts_with(std::string_view s, std::string_view prefix);
// "AG X" / "RS X" collectives, not their copies or the RS accumulate.
bool is_all_gather_collective(const TimelineOp& op);
bool is_reduce_scatter_collective(const TimelineOp& op);

// The id of the stream called `name`, or -1.
int find_stream(const Timeline& t, std::string_view name);
// The recorded steps (Note [Trace metrics]); empty when no optimizer op was recorded.
std::vector<StepWindow> find_steps(const Timeline& t, int compute_stream_id);
// Every wait on the compute stream, classified, in time order.
std::vector<Stall> find_stalls(const Timeline& t, int compute_stream_id);

TimelineMetrics compute_metrics(const Timeline& t, int compute_stream_id, double step_count,
                                int top_stalls = 10);

}  // namespace fsdp::runtime
