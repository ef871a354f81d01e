// The fields of a rank's RankResult and of a step's StepReport, each declared once.
//
// Note [Result fields]
// A metric travels from the trainer to the user through several hands: the RankResult member
// the trainer sets, the JSON that carries it from a rank process to its launcher (CPU ranks
// as processes, GPU ranks; rank_result_json.cpp), the run's JSON summary
// (tools/train_command.cpp) and, for a per-step metric, the StepReport and the step line
// (tools/step_printer.cpp). Each of those reads the lists below, so a metric is one line here:
//  - FSDP_STEP_FIELDS: StepReport's members, and how the step line shows each.
//  - FSDP_STEP_COLUMNS: RankResult's per-step members; entry i is step i's StepReport value
//    (append_step adds a step's).
//  - FSDP_RANK_RESULT_FIELDS: RankResult's other members.
// Every RankResult member travels as JSON under its own name. Its SummaryRule says where it
// goes in the summary: rank 0's value, the max over ranks, the per-step max over ranks, rank
// 0's last entry, or `derived`, computed from it by the summary code (which names the keys
// it writes); the run's settings are the summary's other keys.
// tests/test_result_fields.cpp trains on CPU ranks as threads and as processes and checks that
// every field here is set (the few that stay at their default on the CPU backend are listed
// there with the reason), that every summary key named here is written, and that every field
// survives the trip through JSON.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "fsdp/device.h"

namespace fsdp::runtime {

// Types the lists name in one word (a macro argument cannot hold a comma).
using CountsByComm = std::map<std::string, std::vector<int64_t>>;  // name -> [CollectiveKind]
using ValLosses = std::vector<std::pair<int, float>>;              // (0-based step, loss)

// ---- how a step's value shows on the step line
enum class OnLine : uint8_t {
  No,       // not on the line
  Always,   // "label value"
  WhenSet,  // "label value" unless the value is the field's `absent` one (not measured)
  Window,   // step_ms: the mean over the steps since the last line, then tokens/s and MFU
};
struct LineRule {
  OnLine how = OnLine::No;
  const char* label = "";
  const char* format = "";  // printf, of a double
};
constexpr LineRule off_line() { return {}; }
constexpr LineRule on_line(const char* label, const char* format) {
  return {OnLine::Always, label, format};
}
constexpr LineRule on_line_when_set(const char* label, const char* format) {
  return {OnLine::WhenSet, label, format};
}
constexpr LineRule on_line_as_window(const char* label, const char* format) {
  return {OnLine::Window, label, format};
}

// ---- where a RankResult member goes in the run's JSON summary
enum class Summarized : uint8_t {
  No,
  Rank0,         // rank 0's value, under `keys`
  MaxOverRanks,  // the largest over the ranks (a number)
  MaxEachStep,   // per step, the largest over the ranks (a list of numbers)
  Rank0Last,     // rank 0's last entry, null when there is none or it is -1 (not measured)
  Derived,       // the summary code computes `keys` (space-separated) from it
};
struct SummaryRule {
  Summarized how = Summarized::No;
  const char* keys = "";
};
constexpr SummaryRule not_summarized() { return {}; }
constexpr SummaryRule rank0(const char* key) { return {Summarized::Rank0, key}; }
constexpr SummaryRule max_over_ranks(const char* key) { return {Summarized::MaxOverRanks, key}; }
constexpr SummaryRule max_each_step(const char* key) { return {Summarized::MaxEachStep, key}; }
constexpr SummaryRule rank0_last(const char* key) { return {Summarized::Rank0Last, key}; }
constexpr SummaryRule derived(const char* keys) { return {Summarized::Derived, keys}; }

// X(type, name, absent value, step line, doc): StepReport, what rank 0 reports to on_step
// after each step is read (Note [Asynchronous step read]: a step behind the work).
#define FSDP_STEP_FIELDS(X)                                                                      \
  X(int, step, 0, off_line(), "0-based")                                                         \
  X(float, loss, 0, on_line("loss", "%.6g"), "the mean over ranks and micro-batches")            \
  X(float, lr, 0, on_line("lr", "%.3g"), "the step's learning rate")                             \
  X(float, grad_norm, -1, on_line_when_set("grad_norm", "%.4g"),                                 \
    "the global norm before clipping; -1: not computed (optimizer in backward)")                 \
  X(int64_t, tokens, 0, off_line(), "this rank's tokens in the step (the line shows tokens/s)") \
  X(float, val_loss, -1, off_line(),                                                             \
    "the validation loss after this step, -1: not evaluated (the command prints it on a line "  \
    "of its own)")                                                                               \
  X(double, step_ms, 0, on_line_as_window("step_ms", "%.2f"),                                    \
    "host time from the previous step's read to this one's")                                     \
  X(double, max_expert_load, -1, on_line_when_set("max_expert_load", "%.3f"),                    \
    "MoE transformer: the busiest expert's share of this rank's routed tokens (max over MoE "   \
    "layers, last micro-batch); -1 for other models")                                            \
  X(double, exposed_comm_ms, -1, on_line_when_set("exposed_comm_ms", "%.3f"),                    \
    "from this step's timeline when tracing (config.timeline), -1 otherwise "                    \
    "(Note [Trace metrics])")                                                                    \
  X(double, rs_recycle_stall_ms, -1, on_line_when_set("rs_recycle_stall_ms", "%.3f"),            \
    "from this step's timeline when tracing, -1 otherwise")

// X(StepReport member, RankResult member, summary, doc): RankResult's per-step lists, one entry
// per finished step (a step that was not finite is left out).
#define FSDP_STEP_COLUMNS(X)                                                                    \
  X(loss, losses, derived("losses loss_first loss_last steps_done"), "each step's loss")       \
  X(lr, lrs, rank0("lrs"), "each step's learning rate")                                         \
  X(grad_norm, grad_norms, rank0("grad_norms"), "each step's grad norm, -1 where not computed") \
  X(step_ms, step_ms, derived("step_ms_median tokens_per_s tflops_per_gpu mfu"),                \
    "each step's time (the summary's median leaves out the warm-up steps)")                     \
  X(max_expert_load, max_expert_loads, rank0_last("max_expert_load"), "each step's max load")

// X(type, name, default, summary, doc): RankResult's other members.
#define FSDP_RANK_RESULT_FIELDS(X)                                                               \
  X(int, rank, 0, not_summarized(), "the rank that trained")                                     \
  X(ValLosses, val_losses, {}, derived("val_losses"),                                            \
    "(step, 0-based; validation loss) after each evaluation (the summary's steps are 1-based)")  \
  X(std::string, error, {}, derived("error"),                                                    \
    "set when a step's loss or grad norm was not finite (with return_on_nonfinite): the "        \
    "one-line message")                                                                          \
  X(int, failed_step, -1, derived("failed_step"),                                                \
    "the 0-based step that was not finite, with `error` (the summary's is 1-based)")             \
  X(std::vector<int64_t>, peak_bytes_by_step, {}, max_each_step("peak_mem_bytes_by_step"),       \
    "the device's peak memory since the first step, read when each step is read (a step is "    \
    "read while the next one runs, so entry i covers the start of step i + 1): flat memory "    \
    "means the entries stop growing after the first steps")                                      \
  X(double, host_schedule_us_per_unit, 0, max_over_ranks("host_schedule_us_per_unit"),           \
    "host time in forward+backward calls per unit")                                              \
  X(MemStats, memory, {}, derived("peak_mem_bytes rs_inputs_in_flight_max"),                     \
    "the device's memory statistics at the end")                                                 \
  X(int64_t, all_gathers_forward_first_step, 0, rank0("all_gathers_forward_first_step"),         \
    "all-gathers the first micro-batch's forward issued, on every communicator of the run")     \
  X(int64_t, all_gathers_backward_first_step, 0, rank0("all_gathers_backward_first_step"),       \
    "all-gathers the first micro-batch's backward issued")                                       \
  X(int64_t, reduce_scatters_first_step, 0, rank0("reduce_scatters_first_step"),                 \
    "reduce-scatters the first micro-batch's backward issued")                                   \
  X(CountsByComm, forward_by_comm_first_step, {}, rank0("forward_by_comm_first_step"),           \
    "per communicator (by name: \"dp/shard\", \"dp/replicate\", \"dp/shard/post_forward2\", "    \
    "...), the collectives of each kind (indexed by CollectiveKind) the first micro-batch's "    \
    "forward issued")                                                                            \
  X(CountsByComm, backward_by_comm_first_step, {}, rank0("backward_by_comm_first_step"),         \
    "the same for its backward")                                                                 \
  X(int64_t, param_count, 0, not_summarized(), "active params (Model::active_param_count)")      \
  X(int64_t, sharded_state_bytes, 0, not_summarized(),                                           \
    "the bytes of the sharded params (MemTag::ShardedState) after fully_shard")                  \
  X(int64_t, offload_host_bytes, 0, not_summarized(),                                            \
    "with the optimizer offload: the host bytes of its state (Note [Optimizer offload])")       \
  X(double, host_us_per_step, 0, max_over_ranks("host_us_per_step"),                             \
    "host time to issue a step (batch, scalars, and the step's work or its replay), mean over "  \
    "the timed steps after the warm-up (and after the capture, under a graph); the host's "      \
    "waits for the device are left out where the backend counts them (Device::host_wait_us)")   \
  X(std::string, memory_plan, {}, rank0("memory_plan"),                                          \
    "the settings a memory plan chose (TrainConfig::memory_plan; Note [Memory plans]), empty "  \
    "without a memory budget")                                                                   \
  X(int64_t, predicted_peak_bytes, 0, rank0("predicted_peak_bytes"),                             \
    "the device's peak the memory model predicts for the run (the plan's, or the estimate's "   \
    "without one), beside the measured peak_mem_bytes")                                          \
  X(int64_t, backend_peak_bytes, 0, max_over_ranks("backend_peak_bytes"),                        \
    "Device::backend_peak_bytes() at the end")                                                   \
  X(int64_t, backend_reserved_peak_bytes, 0, max_over_ranks("backend_reserved_peak_bytes"),      \
    "Device::backend_reserved_peak_bytes() at the end")                                          \
  X(int, captured_step, -1, not_summarized(), "the step recorded into the graph; -1: none")      \
  X(std::vector<std::string>, graph_streams, {}, rank0("graph_streams"),                         \
    "the streams the graph's work runs on")                                                      \
  X(bool, graph_op_times, false, not_summarized(),                                               \
    "replayed steps are timed op by op on the timeline")                                         \
  X(std::vector<std::vector<float>>, params, {}, not_summarized(),                               \
    "with collect_params: every param's full fp32 value after the last step")                    \
  X(Timeline, timeline, {},                                                                      \
    derived("exposed_comm_ms rs_recycle_stall_ms rs_drain_ms ag_rs_overlap_ms streams_used"),    \
    "with config.timeline: the ops and memory samples of the steps from the warm-up on")

// For the structs' bodies (runtime/trainer.h).
#define FSDP_DECLARE_STEP_FIELD(type, name, absent, line, doc) type name = absent;
#define FSDP_DECLARE_STEP_COLUMN(step_member, name, summary, doc) \
  std::vector<decltype(StepReport::step_member)> name;
#define FSDP_DECLARE_RESULT_FIELD(type, name, init, summary, doc) type name = init;

// ---- visitors over the lists

template <class Owner, class T>
struct StepField {
  const char* name;
  T Owner::*member;
  T absent;
  LineRule line;
  const char* doc;
  const T& of(const Owner& o) const { return o.*member; }
};

template <class Owner, class T>
struct ResultField {
  const char* name;
  T Owner::*member;
  SummaryRule summary;
  const char* doc;
  T& of(Owner& o) const { return o.*member; }
  const T& of(const Owner& o) const { return o.*member; }
};

template <class T>
struct is_number_list : std::false_type {};
template <class T>
struct is_number_list<std::vector<T>> : std::is_arithmetic<T> {};

// Whether a summary rule can apply to a member of type T (checked when the lists are read).
template <class T>
constexpr bool summary_fits(SummaryRule r) {
  switch (r.how) {
    case Summarized::MaxOverRanks: return std::is_arithmetic_v<T>;
    case Summarized::MaxEachStep:
    case Summarized::Rank0Last: return is_number_list<T>::value;
    default: return true;
  }
}

// f(StepField) for every StepReport member, in the list's order. (Report is StepReport; a
// parameter so that this header needs only its declaration.)
template <class Report, class F>
void for_each_step_field(F&& f) {
#define FSDP_VISIT_STEP_FIELD(type, name, absent, line, doc) \
  f(StepField<Report, type>{#name, &Report::name, static_cast<type>(absent), line, doc});
  FSDP_STEP_FIELDS(FSDP_VISIT_STEP_FIELD)
#undef FSDP_VISIT_STEP_FIELD
}

// f(ResultField) for every RankResult member: the per-step lists, then the others.
template <class Result, class F>
void for_each_result_field(F&& f) {
#define FSDP_VISIT_RESULT_FIELD(name, summary, doc)                                      \
  {                                                                                      \
    using T = decltype(Result::name);                                                    \
    static_assert(summary_fits<T>(summary), #name ": its summary rule does not fit its type"); \
    f(ResultField<Result, T>{#name, &Result::name, summary, doc});                       \
  }
#define FSDP_VISIT_STEP_COLUMN(step_member, name, summary, doc) \
  FSDP_VISIT_RESULT_FIELD(name, summary, doc)
#define FSDP_VISIT_OTHER_FIELD(type, name, init, summary, doc) \
  FSDP_VISIT_RESULT_FIELD(name, summary, doc)
  FSDP_STEP_COLUMNS(FSDP_VISIT_STEP_COLUMN)
  FSDP_RANK_RESULT_FIELDS(FSDP_VISIT_OTHER_FIELD)
#undef FSDP_VISIT_OTHER_FIELD
#undef FSDP_VISIT_STEP_COLUMN
#undef FSDP_VISIT_RESULT_FIELD
}

// Adds a read step's values to the result's per-step lists.
template <class Result, class Report>
void append_step(Result& result, const Report& step) {
#define FSDP_APPEND_STEP_COLUMN(step_member, name, summary, doc) \
  result.name.push_back(step.step_member);
  FSDP_STEP_COLUMNS(FSDP_APPEND_STEP_COLUMN)
#undef FSDP_APPEND_STEP_COLUMN
}

}  // namespace fsdp::runtime
