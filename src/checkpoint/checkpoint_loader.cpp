#include "checkpoint/checkpoint_loader.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <sstream>

#include "checkpoint/row_reader.h"
#include "checkpoint/weight_files.h"
#include "fsdp/error.h"
#include "io/checked_json.h"
#include "io/file_io.h"

namespace fsdp::checkpoint {

namespace {

// Copies loaded rows to the shard: on the device, or in host memory without one.
void upload(Device* d, Stream s, float* dst_rows, const std::vector<float>& host) {
  if (host.empty()) return;
  if (d)
    d->copy_from_host(s, dst_rows, host.data(), host.size() * sizeof(float));
  else
    std::memcpy(dst_rows, host.data(), host.size() * sizeof(float));
}

}  // namespace

nlohmann::json run_config_json(const RunDescription& r) {
  // "model" is compared on resume (a mismatch is refused): every field that decides a param's
  // shape, as the model's family names them.
  const nlohmann::json& model = r.model_fields;
  // Note [Resumed schedule and data]: the lr is a pure function of (schedule, peak, step) and
  // the batches of (data, seed, tokens, micro-batches, step), so the step is their whole state
  // and these fields say which functions they were. A resume that changes them is allowed (a
  // longer run changes the cosine's end) and stated in one line per field.
  const nlohmann::json schedule = {{"kind", r.schedule.kind},
                                   {"warmup_steps", r.schedule.warmup_steps},
                                   {"min_lr", r.schedule.min_lr},
                                   {"total_steps", r.schedule.total_steps},
                                   {"peak_lr", r.peak_lr}};
  return {{"model", model},
          {"param_dtype", dtype_name(r.param_dtype)},
          {"reduce_dtype", dtype_name(r.reduce_dtype)},
          {"optimizer", r.optimizer},
          {"world_size", r.world_size},
          {"tokens_per_rank", r.tokens},
          {"seed", r.seed},
          {"micro_batches", r.micro_batches},
          {"lr_schedule", schedule},
          {"data", r.data}};
}

std::vector<std::string> check_compatible(const CheckpointIndex& ckpt, const nlohmann::json& run) {
  const io::JsonField saved = ckpt.index.root()["config"];
  if (!saved.is_object()) saved.fail("must be an object (the run's configuration)");
  // Note [Checked JSON]: what the checkpoint says, as text for a message, whatever it holds.
  auto text = [](const nlohmann::json& v) { return io::printable(v.dump(), 200); };
  auto saved_value = [&](const io::JsonField& object, const std::string& key) {
    const std::optional<io::JsonField> f = object.find(key);
    return f ? f->raw() : nlohmann::json();
  };
  const std::optional<io::JsonField> saved_model = saved.find("model");
  if (saved_model && !saved_model->is_object()) saved_model->fail("must be an object");
  const nlohmann::json saved_fields = saved_model ? saved_model->raw() : nlohmann::json::object();
  // Both sides' fields: a field only one side has (a model option at its default is left
  // out) differs too. A run that describes no model compares none.
  nlohmann::json keys = run["model"];
  if (!keys.empty())
    for (const auto& [key, value] : saved_fields.items()) keys[key] = value;
  for (const auto& item : keys.items()) {
    const std::string& key = item.key();
    const nlohmann::json ours = run["model"].value(key, nlohmann::json());
    const nlohmann::json before = saved_fields.value(key, nlohmann::json());
    FSDP_USER_CHECK(before == ours, "checkpoint '", ckpt.dir, "' is of another model shape: its ",
                    key, " is ", text(before), ", this run's ", ours.dump());
  }
  auto saved_string = [&](const char* key) {
    const std::optional<io::JsonField> f = saved.find(key);
    return f ? f->string(64) : std::string("?");
  };
  for (const char* key : {"param_dtype", "reduce_dtype"})
    FSDP_USER_CHECK(saved_string(key) == run[key].get<std::string>(), "checkpoint '", ckpt.dir,
                    "' was saved with ", key, " ", io::printable(saved_string(key)),
                    ", this run uses ", run[key].get<std::string>(), " (dtype mismatch)");
  FSDP_USER_CHECK(saved_string("optimizer") == run["optimizer"].get<std::string>(), "checkpoint '",
                  ckpt.dir, "' holds ", io::printable(saved_string("optimizer")),
                  " state, this run uses ", run["optimizer"].get<std::string>());
  std::vector<std::string> changes;  // Note [Resumed schedule and data]
  for (const char* key : {"lr_schedule", "data", "seed", "tokens_per_rank", "micro_batches"}) {
    const nlohmann::json before = saved_value(saved, key);
    if (before != run[key])
      changes.push_back(detail::concat("resuming with another ", key, ": the checkpoint's ",
                                       text(before), ", this run's ", run[key].dump()));
  }
  return changes;
}

nlohmann::json load_checkpoint(const CheckpointIndex& ckpt, const ShardedState& state,
                               Device* device, Stream stream) {
  const std::string index_path = join_path(ckpt.dir, kIndexFile);
  std::map<std::string, const IndexTensor*> entries;
  for (const IndexTensor& e : ckpt.tensors) entries[e.name] = &e;
  FSDP_USER_CHECK(entries.size() == state.tensors.size(), "checkpoint '", ckpt.dir, "' holds ",
                  entries.size(), " params, this model has ", state.tensors.size(),
                  " (another model shape)");
  if (state.optimizer)
    FSDP_USER_CHECK(ckpt.state_names == state.state_names, "'", index_path,
                    "' holds optimizer state ", io::printable(nlohmann::json(ckpt.state_names).dump(), 200),
                    ", this run needs ", nlohmann::json(state.state_names).dump());

  RankFiles files(ckpt);
  std::vector<float> host;
  std::optional<int64_t> optimizer_steps;
  for (const ShardView& v : state.tensors) {
    auto it = entries.find(v.fqn);
    FSDP_USER_CHECK(it != entries.end(), "checkpoint '", ckpt.dir, "' has no param '", v.fqn,
                    "' (another model shape)");
    const IndexTensor& e = *it->second;
    FSDP_USER_CHECK(e.shape == v.shape, "checkpoint '", ckpt.dir, "' holds '", v.fqn, "' of shape ",
                    shape_text(e.shape), ", this model's is ", shape_text(v.shape),
                    " (another model shape)");
    FSDP_USER_CHECK(e.dtype == "F32", "'", index_path, "': '", v.fqn, "' has dtype ",
                    io::printable(e.dtype), ", expected F32 (dtype mismatch)");
    std::vector<std::string> names{v.fqn};
    std::vector<float*> dsts{v.param};
    if (state.optimizer)
      for (size_t k = 0; k < state.state_names.size(); ++k) {
        names.push_back(v.fqn + "." + state.state_names[k]);
        dsts.push_back(v.states[k]);
      }
    for (size_t k = 0; k < names.size(); ++k) {
      host.assign(static_cast<size_t>(v.rows.rows() * v.cols), 0.0f);
      for (int r = 0; r < static_cast<int>(e.ranks.size()); ++r) {
        // Note [Checkpoint index checks]: the ranks' ranges tile the rows, so every row of
        // this rank's shard is read from exactly one file.
        const auto [rb, re] = e.ranks[r];
        const int64_t b = std::max(rb, v.rows.begin), end = std::min(re, v.rows.end);
        if (b >= end) continue;
        files.at(r).read_rows(names[k], re - rb, v.cols, b - rb, end - rb,
                              std::span<float>(host).subspan(
                                  static_cast<size_t>((b - v.rows.begin) * v.cols),
                                  static_cast<size_t>((end - b) * v.cols)));
      }
      upload(device, stream, dsts[k], host);
    }
    if (state.optimizer) {
      // One count for the whole optimizer (its tensors step together); every param records it.
      const int64_t steps = e.optimizer_step;
      FSDP_USER_CHECK(steps >= 0 && (!optimizer_steps || *optimizer_steps == steps), "'",
                      index_path, "': '", v.fqn, "' has optimizer step ", steps,
                      optimizer_steps ? ", other params " + std::to_string(*optimizer_steps) : "",
                      " (corrupt index)");
      optimizer_steps = steps;
    }
  }
  if (optimizer_steps) state.optimizer->set_step_count(*optimizer_steps);
  if (device) device->synchronize_stream(stream);
  const std::optional<io::JsonField> ts = ckpt.index.root().find("train_state");
  return ts ? ts->raw() : nlohmann::json::object();
}

void load_full_weights(const std::string& path, const ShardedState& state, Device* device,
                       Stream stream, const HfNames& names) {
  const WeightFiles files(path);
  // The family's Hugging Face names when the file uses them, else the fqns (Note [Hugging
  // Face names]): any param's first Hugging Face tensor in the file decides.
  bool hf = false;
  if (names)
    for (const ShardView& v : state.tensors) {
      const auto pieces = names(v.fqn, v.shape.empty() ? 1 : v.shape[0]);
      if (!pieces.empty() && pieces[0].name != v.fqn && files.find(pieces[0].name)) hf = true;
    }
  std::set<std::string> used;
  std::vector<float> host;
  for (const ShardView& v : state.tensors) {
    const int64_t rows = v.shape.empty() ? 1 : v.shape[0];
    std::vector<HfTensor> pieces{{v.fqn, rows}};
    if (hf) {
      pieces = names(v.fqn, rows);
      FSDP_USER_CHECK(!pieces.empty(), "'", path, "' uses Hugging Face names, which have none "
                      "for this model's param '", v.fqn, "'");
    }
    int64_t at = 0;  // global row of the stacked pieces
    host.assign(static_cast<size_t>(v.rows.rows() * v.cols), 0.0f);
    for (const HfTensor& p : pieces) {
      files.expect(p.name, p.rows, v.cols);  // every dimension, before a row is read
      used.insert(p.name);
      const int64_t b = std::max(at, v.rows.begin), e = std::min(at + p.rows, v.rows.end);
      if (b < e)
        files.read_rows(p.name, p.rows, v.cols, b - at, e - at,
                        std::span<float>(host).subspan(static_cast<size_t>((b - v.rows.begin) * v.cols),
                                                       static_cast<size_t>((e - b) * v.cols)));
      at += p.rows;
    }
    FSDP_USER_CHECK(at == rows, "'", path, "': the tensors of '", v.fqn, "' hold ", at,
                    " rows, this model's have ", rows, " (another model shape)");
    upload(device, stream, v.param, host);
  }
  for (const std::string& name : files.names())
    FSDP_USER_CHECK(used.count(name), "'", files.file_of(name), "' holds tensor '",
                    io::printable(name), "' that this model does not have (another model shape)");
  if (device) device->synchronize_stream(stream);
}

}  // namespace fsdp::checkpoint
