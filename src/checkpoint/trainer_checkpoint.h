// The training loop's side of checkpoints: --init-from and --resume before the first step,
// a save after each step that is due, and the wait for the last save at the end.
//
// Note [Checkpoint hooks]
// A training loop makes one TrainerCheckpoint after fully_shard and its optimizer, calls
// start() for the first step to run, after_step() after each step, and finish() at the end:
//   - start() checks everything it can before training: the save dir is writable and has
//     room for a checkpoint, --resume names a complete checkpoint of this model and dtypes,
//     --init-from is a valid file. Then it loads. Rank 0 removes the incomplete step
//     directories that a crashed save left and that this run will write again (no other).
//   - after_step() waits for the previous save, copies this rank's shards to host memory
//     (the only stall), and hands the writes to a background thread (checkpoint_writer.h).
//   - The data needs no saved position: every batch source is a function of (seed, micro-batch
//     index) (Note [Batch sources]), so the step is the data loader's whole state; so is it
//     the lr schedule's (Note [Resumed schedule and data]). The train_state object the loop
//     passes is stored as it is.
//   - The trainer (src/runtime/trainer.cpp) calls these at its on_start / after_step hook
//     points, before the user's hooks: a TrainerCheckpoint is per rank and needs finish() at
//     the end, which TrainConfig's shared hooks don't give.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_loader.h"
#include "checkpoint/checkpoint_writer.h"
#include "fsdp/checkpoint.h"

namespace fsdp::checkpoint {

class TrainerCheckpoint {
 public:
  TrainerCheckpoint(const CheckpointOptions& options, const RunDescription& run, Device& device,
                    Stream stream, FsdpModule& root, optim::Optimizer& optimizer,
                    const ExpertLayout& experts = {});
  ~TrainerCheckpoint();

  // Returns the number of steps already done (0 without --resume); below total_steps.
  int start(int total_steps);
  const nlohmann::json& resumed_train_state() const { return resumed_state_; }
  // Prints (rank 0, verbose) what a resume changed of the lr schedule or the data (Note
  // [Resumed schedule and data]), once. The trainer calls it when the first step is read: by
  // then every rank has loaded, so that a bad checkpoint gets its one-line error alone.
  void state_changes();
  // Whether a save is due after `steps_done` steps of `total_steps`.
  bool due(int steps_done, int total_steps) const;
  // After `steps_done` steps of `total_steps`: saves when due. Returns the host stall in ms.
  double after_step(int steps_done, int total_steps, const nlohmann::json& train_state);
  // Waits for the last save (rethrows its error).
  void finish();
  double last_stall_ms() const { return last_stall_ms_; }

 private:
  void check_save_dir(int64_t start_step) const;

  CheckpointOptions options_;
  RunDescription run_;
  nlohmann::json run_json_;
  Device& device_;
  Stream stream_;
  FsdpModule& root_;
  ShardedState state_;
  std::unique_ptr<CheckpointWriter> writer_;
  std::unique_ptr<float[]> host_;  // this rank's shards, being written
  size_t host_floats_ = 0;
  bool copies_in_flight_ = false;  // device-to-host copies into host_ not yet synchronized
  nlohmann::json resumed_state_ = nlohmann::json::object();
  std::vector<std::string> changes_;  // to print
  double last_stall_ms_ = 0;
  bool lead_ = false;  // rank 0 of replica 0: prints, removes crashed saves' debris
};

}  // namespace fsdp::checkpoint
