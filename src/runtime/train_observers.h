// What a run does besides training, watching its steps (Note [Trainer observers]).
#pragma once

#include <functional>
#include <map>
#include <memory>

#include "checkpoint/trainer_checkpoint.h"
#include "runtime/batch_source.h"
#include "runtime/parallel_model.h"
#include "runtime/trainer.h"

namespace fsdp::runtime {

// Note [Trainer observers]
// Trainer::step() runs one step: the lr, the batches, every micro-batch's forward and
// backward, the grad norm and the optimizer, eager or replayed from a CUDA graph; and reads
// the step before it (Note [Asynchronous step read]). What a run does besides training
// watches the steps from outside, as an observer, in the order they were added: the first
// step's collective counts, the timeline, evaluation and checkpoints. Each sees the state it
// needs (TrainState) at fixed points, so the step itself stays the same whichever are on.
class TrainObserver {
 public:
  virtual ~TrainObserver() = default;
  virtual void on_start(TrainState&) {}
  // Around the first step's first micro-batch.
  virtual void before_first_forward() {}
  virtual void after_first_forward() {}
  virtual void after_first_backward() {}
  // After step `step`'s work is issued, before it is read; `report` is the step's line.
  virtual void after_issue(TrainState&, int /*step*/, StepReport& /*report*/) {}
  // Once step `step`'s values were read (finite).
  virtual void after_read(int /*step*/) {}
  // After step `step` was issued and the steps before it read.
  virtual void after_step(TrainState&, int /*step*/) {}
  virtual void on_finish(TrainState&) {}
};

// The first micro-batch's collectives, by communicator and phase (RankResult's *_first_step).
std::unique_ptr<TrainObserver> first_step_counts(const ParallelModel& pm, RankResult& result);
// The timeline of every step after the warm-up, and each step's exposed communication.
std::unique_ptr<TrainObserver> timeline_recorder(const TrainConfig& c, Stream compute,
                                                 RankResult& result);
// The validation loss after every eval_every-th step and the last (Note [Evaluation]); its
// time is added to excluded_ms (nobody's step time).
std::unique_ptr<TrainObserver> evaluator(const TrainConfig& c, Comm& world, RunContext& ctx,
                                         std::map<int, float>& val_by_step, double& excluded_ms);
// Checkpoints (Note [Checkpoint hooks]); read_all reads every issued step, false when one was
// not finite (the run stops).
std::unique_ptr<TrainObserver> checkpointer(std::unique_ptr<checkpoint::TrainerCheckpoint> ckpt,
                                            const TrainConfig& c, std::function<bool()> read_all);

}  // namespace fsdp::runtime
