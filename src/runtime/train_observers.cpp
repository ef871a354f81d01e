#include "runtime/train_observers.h"

#include <chrono>

#include "runtime/evaluation.h"
#include "runtime/trace_metrics.h"

namespace fsdp::runtime {

namespace {

double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

using CommCounts = std::map<std::string, std::vector<int64_t>>;

CommCounts counts_by_comm(const ParallelModel& pm) {
  CommCounts out;
  for (const Comm* c : pm.comms()) {
    std::vector<int64_t>& v = out[c->name()];
    v.resize(kCollectiveKindCount);
    for (int k = 0; k < kCollectiveKindCount; ++k) v[k] += c->issued(static_cast<CollectiveKind>(k));
  }
  return out;
}

CommCounts minus(CommCounts a, const CommCounts& b) {
  for (auto& [name, v] : a)
    if (auto it = b.find(name); it != b.end())
      for (size_t k = 0; k < v.size(); ++k) v[k] -= it->second[k];
  return a;
}

int64_t total_of(const CommCounts& counts, CollectiveKind kind) {
  int64_t n = 0;
  for (const auto& [name, v] : counts) n += v[static_cast<int>(kind)];
  return n;
}

// The first micro-batch's collectives, by communicator and phase (RankResult's *_first_step).
class FirstStepCounts final : public TrainObserver {
 public:
  FirstStepCounts(const ParallelModel& pm, RankResult& result) : pm_(pm), result_(result) {}
  void before_first_forward() override { c0_ = counts_by_comm(pm_); }
  void after_first_forward() override { c1_ = counts_by_comm(pm_); }
  void after_first_backward() override {
    const CommCounts c2 = counts_by_comm(pm_);
    result_.forward_by_comm_first_step = minus(c1_, c0_);  // the forward made new comms
    result_.backward_by_comm_first_step = minus(c2, c1_);
    result_.all_gathers_forward_first_step =
        total_of(result_.forward_by_comm_first_step, CollectiveKind::AllGather);
    result_.all_gathers_backward_first_step =
        total_of(result_.backward_by_comm_first_step, CollectiveKind::AllGather);
    result_.reduce_scatters_first_step =
        total_of(result_.backward_by_comm_first_step, CollectiveKind::ReduceScatter);
  }

 private:
  const ParallelModel& pm_;
  RankResult& result_;
  CommCounts c0_, c1_;
};

// The timeline of every step after the warm-up, and each step's exposed communication.
class TimelineRecorder final : public TrainObserver {
 public:
  TimelineRecorder(const TrainConfig& c, Stream compute, RankResult& result)
      : config_(c), compute_(compute), result_(result) {}
  void after_issue(TrainState& s, int step, StepReport& report) override {
    if (step < config_.warmup) return;
    // Taken every step: the step's own metrics for the per-step line, and the CUDA
    // recorder's event pool stays small.
    Timeline part = s.device.take_timeline();
    const TimelineMetrics m = compute_metrics(part, compute_.id, 1, 0);
    report.exposed_comm_ms = m.exposed_comm_ms;
    report.rs_recycle_stall_ms = m.rs_recycle_stall_ms;
    Timeline& t = result_.timeline;
    if (t.stream_names.empty()) t.stream_names = part.stream_names;
    for (auto& op : part.ops) t.ops.push_back(std::move(op));
    for (auto& sample : part.memory) t.memory.push_back(sample);
  }
  void on_finish(TrainState& s) override { s.device.enable_timeline(false); }

 private:
  const TrainConfig& config_;
  Stream compute_;
  RankResult& result_;
};

// The validation loss after every eval_every-th step and the last (Note [Evaluation]).
class Evaluator final : public TrainObserver {
 public:
  Evaluator(const TrainConfig& c, Comm& world, RunContext& ctx, std::map<int, float>& val_by_step,
            double& excluded_ms)
      : config_(c), world_(world), ctx_(ctx), val_by_step_(val_by_step), excluded_ms_(excluded_ms),
        source_(c.eval_source(world.rank(), world.size())) {}
  void after_issue(TrainState& s, int step, StepReport&) override {
    if ((step + 1) % config_.eval_every != 0 && step + 1 != config_.steps) return;
    const double start_ms = now_ms();
    val_by_step_[step] = evaluate(s.device, world_, ctx_, s.model, *source_, config_.eval_batches,
                                  world_.rank() * config_.tokens, config_.tokens, step);
    excluded_ms_ += now_ms() - start_ms;  // the evaluation's time is nobody's step time
  }

 private:
  const TrainConfig& config_;
  Comm& world_;
  RunContext& ctx_;
  std::map<int, float>& val_by_step_;
  double& excluded_ms_;
  std::unique_ptr<BatchSource> source_;
};

// Checkpoints (Note [Checkpoint hooks]): --resume or --init-from loads at the start (a resume
// moves the first step), saves when due, and the last save is on disk at the end.
class Checkpointer final : public TrainObserver {
 public:
  // read_all reads every issued step; false when one was not finite (the run stops).
  Checkpointer(std::unique_ptr<checkpoint::TrainerCheckpoint> ckpt, const TrainConfig& c,
               std::function<bool()> read_all)
      : ckpt_(std::move(ckpt)), config_(c), read_all_(std::move(read_all)) {}
  void on_start(TrainState& s) override { s.next_step = ckpt_->start(config_.steps); }
  void after_read(int) override { ckpt_->state_changes(); }  // after the first: all have loaded
  void after_step(TrainState&, int step) override {
    // A save reads every step first (the copy to host waits for the step anyway), so that a
    // checkpoint never holds the state of a step that was not finite.
    if (!ckpt_->due(step + 1, config_.steps)) return;
    if (read_all_()) ckpt_->after_step(step + 1, config_.steps, nlohmann::json::object());
  }
  void on_finish(TrainState&) override { ckpt_->finish(); }

 private:
  std::unique_ptr<checkpoint::TrainerCheckpoint> ckpt_;
  const TrainConfig& config_;
  std::function<bool()> read_all_;
};

}  // namespace

std::unique_ptr<TrainObserver> first_step_counts(const ParallelModel& pm, RankResult& result) {
  return std::make_unique<FirstStepCounts>(pm, result);
}

std::unique_ptr<TrainObserver> timeline_recorder(const TrainConfig& c, Stream compute,
                                                 RankResult& result) {
  return std::make_unique<TimelineRecorder>(c, compute, result);
}

std::unique_ptr<TrainObserver> evaluator(const TrainConfig& c, Comm& world, RunContext& ctx,
                                         std::map<int, float>& val_by_step, double& excluded_ms) {
  return std::make_unique<Evaluator>(c, world, ctx, val_by_step, excluded_ms);
}

std::unique_ptr<TrainObserver> checkpointer(std::unique_ptr<checkpoint::TrainerCheckpoint> ckpt,
                                            const TrainConfig& c, std::function<bool()> read_all) {
  return std::make_unique<Checkpointer>(std::move(ckpt), c, std::move(read_all));
}

}  // namespace fsdp::runtime
