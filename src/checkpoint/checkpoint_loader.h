// Loading into a rank's shards: from a sharded checkpoint saved at any world size
// (resharding by rows), or from a file of full weights (--init-from). Each rank reads only
// the byte ranges that hold its rows (whole 1 MiB chunks, to verify them).
#pragma once

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_format.h"
#include "checkpoint/sharded_state.h"
#include "fsdp/device.h"
#include "fsdp/nn/model.h"
#include "optim/lr_schedule.h"

namespace fsdp::checkpoint {

// What a checkpoint records of the run, and what a resume must match.
struct RunDescription {
  nn::ModelConfig model;
  DType param_dtype = DType::F32, reduce_dtype = DType::F32;
  std::string optimizer = "adamw";
  int world_size = 1;
  int64_t tokens = 0;
  uint64_t seed = 0;
  int micro_batches = 1;
  optim::LrSchedule schedule;  // with the peak lr (Note [Resumed schedule and data])
  float peak_lr = 0;
  std::string data = "synthetic";  // or the token file's path
  // The model's fields that decide its params' shapes (models::ModelFamily::shape_fields).
  nlohmann::json model_fields = nlohmann::json::object();
  // The family's Hugging Face names, for --init-from (Note [Hugging Face names]); not recorded.
  HfNames hf_names = nullptr;
};
nlohmann::json run_config_json(const RunDescription& run);
// Raises a one-line error naming the checkpoint when its run does not match: another model
// shape, a dtype mismatch, another optimizer. The world size may differ (resharding). Returns
// one line per other change that a resume allows but that changes the lr or the batches from
// those of an uninterrupted run (Note [Resumed schedule and data]).
std::vector<std::string> check_compatible(const CheckpointIndex& ckpt, const nlohmann::json& run_config);

// Loads params and (when state.optimizer) optimizer state and step counts; returns the
// checkpoint's train_state object. With no device, the views' pointers are host memory.
nlohmann::json load_checkpoint(const CheckpointIndex& ckpt, const ShardedState& state,
                               Device* device, Stream stream);

// Loads params from full weights (a file or a Hugging Face directory, WeightFiles), under
// their fqns or, where given and the file uses them, the family's Hugging Face names. With no
// device, the views' pointers are host memory.
void load_full_weights(const std::string& path, const ShardedState& state, Device* device,
                       Stream stream, const HfNames& names = {});

}  // namespace fsdp::checkpoint
