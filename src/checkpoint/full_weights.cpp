#include "checkpoint/full_weights.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>

#include "checkpoint/checkpoint_format.h"
#include "checkpoint/checkpoint_loader.h"
#include "checkpoint/row_reader.h"
#include "checkpoint/sharded_state.h"
#include "checkpoint/weight_files.h"
#include "fsdp/error.h"
#include "io/checked_json.h"
#include "io/file_io.h"
#include "models/model_family.h"

namespace fsdp::checkpoint {

namespace {

// A file's tensors: each param under its names (Note [Hugging Face names]), in `dtype`.
struct Converted {
  std::vector<io::TensorToWrite> tensors;
  std::vector<std::vector<uint16_t>> bf16;  // the converted copies that `tensors` point into
  std::vector<uint64_t> bytes;              // each tensor's
};

Converted convert(const std::vector<FullTensor>& tensors, DType dtype, const HfNames& names) {
  FSDP_USER_CHECK(dtype == DType::F32 || dtype == DType::BF16, "export writes fp32 or bf16, not ",
             dtype_name(dtype));
  Converted c;
  for (const FullTensor& t : tensors) {
    const int64_t rows = t.shape.empty() ? 1 : t.shape[0];
    int64_t cols = 1;
    for (size_t d = 1; d < t.shape.size(); ++d) cols *= t.shape[d];
    std::vector<HfTensor> pieces{{t.fqn, rows}};
    if (names) {  // Note [Hugging Face names]
      pieces = names(t.fqn, rows);
      FSDP_USER_CHECK(!pieces.empty(), "no Hugging Face name for param '", t.fqn, "'");
      // The shapes come from a checkpoint's index: pieces that do not split the rows exactly
      // (wo's columns past wqkv's rows, an odd w13) are refused, never read past.
      int64_t split = 0;
      for (const HfTensor& p : pieces) {
        FSDP_USER_CHECK(p.rows >= 0, "cannot split '", t.fqn, "' of ", rows, " rows into ", p.name);
        split += p.rows;
      }
      FSDP_USER_CHECK(split == rows, "cannot split '", t.fqn, "' of ", rows,
                      " rows into Hugging Face tensors of ", split, " rows in all");
    }
    int64_t at = 0;
    for (const HfTensor& p : pieces) {
      std::vector<int64_t> shape = t.shape.empty() ? std::vector<int64_t>{1} : t.shape;
      shape[0] = p.rows;
      const float* src = t.data + at * cols;
      const size_t n = static_cast<size_t>(p.rows * cols);
      const void* data = src;
      if (dtype == DType::BF16) {
        c.bf16.emplace_back(n);
        for (size_t i = 0; i < n; ++i) c.bf16.back()[i] = float_to_bf16(src[i]);
        data = c.bf16.back().data();
      }
      c.tensors.push_back({p.name, dtype == DType::BF16 ? "BF16" : "F32", shape, data});
      c.bytes.push_back(n * dtype_size(dtype));
      at += p.rows;
    }
    FSDP_CHECK(at == rows, "the Hugging Face tensors of '", t.fqn, "' hold ", at, " rows, not ",
               rows);
  }
  return c;
}

// The metadata of a file of `tensors` (Note [Checkpoint checksums]).
std::map<std::string, std::string> file_metadata(const std::vector<io::TensorToWrite>& tensors,
                                                 const std::vector<uint64_t>& bytes) {
  nlohmann::json crcs = nlohmann::json::object();
  for (size_t i = 0; i < tensors.size(); ++i)
    crcs[tensors[i].name] = chunk_crcs(tensors[i].data, bytes[i]);
  return {{"format", "pt"}, {kChunkCrcKey, crcs.dump()}};
}

}  // namespace

void write_full_weights(const std::string& path, const std::vector<FullTensor>& tensors,
                        DType dtype, const HfNames& names) {
  const Converted c = convert(tensors, dtype, names);
  io::write_safetensors(path, c.tensors, file_metadata(c.tensors, c.bytes));
}

void write_hf_directory(const std::string& dir, const std::vector<FullTensor>& tensors, DType dtype,
                        const HfNames& names, const nlohmann::json& config,
                        uint64_t max_shard_bytes) {
  namespace fs = std::filesystem;
  FSDP_USER_CHECK(config.is_object(), "this model has no Hugging Face config to export");
  FSDP_USER_CHECK(max_shard_bytes >= 1, "the shard size must be at least 1 byte");
  std::error_code ec;
  FSDP_USER_CHECK(!fs::exists(dir, ec) || (fs::is_directory(dir, ec) && fs::is_empty(dir, ec)), "'",
                  dir, "' exists and is not an empty directory; export writes a new one");
  const Converted c = convert(tensors, dtype, names);
  // Shards in order, each up to max_shard_bytes (a larger tensor alone), as Hugging Face's
  // save_pretrained cuts them; one shard is model.safetensors, with no index.
  std::vector<std::pair<size_t, size_t>> shards;  // [first, end) tensors
  uint64_t in_shard = 0, total = 0;
  for (size_t i = 0; i < c.tensors.size(); ++i) {
    if (shards.empty() || (in_shard > 0 && in_shard + c.bytes[i] > max_shard_bytes)) {
      shards.push_back({i, i});
      in_shard = 0;
    }
    shards.back().second = i + 1;
    in_shard += c.bytes[i];
    total += c.bytes[i];
  }
  // Into a temporary sibling renamed at the end: the directory appears whole or not at all.
  const fs::path final_dir = fs::absolute(fs::path(dir)).lexically_normal();
  const std::string tmp = (final_dir.parent_path() /
                           (final_dir.filename().string() + ".tmp-" + std::to_string(::getpid())))
                              .string();
  fs::remove_all(tmp, ec);
  FSDP_USER_CHECK(fs::create_directories(tmp, ec), "cannot create '", tmp, "': ", ec.message());
  try {
    nlohmann::json map = nlohmann::json::object();
    for (size_t s = 0; s < shards.size(); ++s) {
      char name[64];
      std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
      const std::string file = shards.size() == 1 ? kHfWeightsFile : name;
      const auto [first, end] = shards[s];
      const std::vector<io::TensorToWrite> part(c.tensors.begin() + first, c.tensors.begin() + end);
      const std::vector<uint64_t> bytes(c.bytes.begin() + first, c.bytes.begin() + end);
      io::write_safetensors(join_path(tmp, file), part, file_metadata(part, bytes));
      for (const io::TensorToWrite& t : part) map[t.name] = file;
    }
    if (shards.size() > 1)
      io::write_file_atomic(
          join_path(tmp, kHfIndexFile),
          nlohmann::json{{"metadata", {{"total_size", total}}}, {"weight_map", map}}.dump(2) +
              "\n");
    io::write_file_atomic(join_path(tmp, "config.json"), config.dump(2) + "\n");
    io::write_file_atomic(join_path(tmp, "generation_config.json"),
                          nlohmann::json{{"_from_model_config", true}}.dump(2) + "\n");
    if (fs::exists(final_dir, ec)) fs::remove(final_dir, ec);  // empty, checked above
    fs::rename(tmp, final_dir, ec);
    FSDP_USER_CHECK(!ec, "cannot rename '", tmp, "' to '", dir, "': ", ec.message());
    io::fsync_directory(final_dir.parent_path().string());
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
}

}  // namespace fsdp

namespace fsdp::checkpoint {
namespace {

// MemAvailable of /proc/meminfo, in bytes; 0 when unknown.
int64_t available_memory_bytes() {
  std::string text;
  try {
    text = io::read_bounded_file("/proc/meminfo", 1 << 20, "/proc/meminfo");
  } catch (const Error&) {
    return 0;
  }
  const size_t at = text.find("MemAvailable:");
  return at == std::string::npos ? 0 : std::atoll(text.c_str() + at + 13) * 1024;
}

// Every tensor of a checkpoint whole (one "rank" that holds all rows, read from every saved
// rank's file), and the model it recorded.
nn::ModelConfig read_whole_checkpoint(const std::string& checkpoint_dir,
                                      std::vector<std::vector<float>>& values,
                                      std::vector<FullTensor>& tensors) {
  const CheckpointIndex ckpt = open_checkpoint(resolve_checkpoint_dir(checkpoint_dir));
  // Note [Checkpoint index checks]: before anything is allocated, every rank file must hold
  // its range's rows of each param, of the param's row width; so what is allocated below is
  // what the files hold, whatever index.json says.
  RankFiles files(ckpt);
  for (const IndexTensor& e : ckpt.tensors)
    for (int r = 0; r < static_cast<int>(e.ranks.size()); ++r)
      if (e.ranks[r].first < e.ranks[r].second)
        files.at(r).expect(e.name, e.ranks[r].second - e.ranks[r].first, e.cols);
  // Every tensor whole, in fp32, in memory at once (and a bf16 copy for bf16): what a machine
  // cannot hold is refused now, not met as an allocation failure later.
  double need = 0;
  for (const IndexTensor& e : ckpt.tensors) need += static_cast<double>(e.rows * e.cols) * 6;
  const double available = static_cast<double>(available_memory_bytes());
  FSDP_USER_CHECK(available <= 0 || need <= 0.9 * available, "exporting '", ckpt.dir,
                  "' needs about ", io::size_text(static_cast<uint64_t>(need)),
                  " of memory (every param whole), more than the ",
                  io::size_text(static_cast<uint64_t>(available)), " this machine has available");
  values.reserve(ckpt.tensors.size());
  ShardedState whole;
  for (const IndexTensor& e : ckpt.tensors) {
    ShardView v;
    v.fqn = e.name;
    v.shape = e.shape;
    v.cols = e.cols;
    v.rows = {0, e.rows};
    values.emplace_back(static_cast<size_t>(e.rows * e.cols));
    v.param = values.back().data();
    whole.tensors.push_back(v);
    tensors.push_back({v.fqn, v.shape, values.back().data()});
  }
  load_checkpoint(ckpt, whole, /*device=*/nullptr, Stream{});
  nlohmann::json fields = nlohmann::json::object();  // Note [Checked JSON]: look before reading
  if (const std::optional<io::JsonField> config = ckpt.index.root().find("config");
      config && config->is_object())
    if (const std::optional<io::JsonField> m = config->find("model"); m && m->is_object())
      fields = m->raw();
  return models::config_of_shape_fields(fields);
}

}  // namespace
}  // namespace fsdp::checkpoint

void fsdp::export_checkpoint(const std::string& checkpoint_dir, const std::string& out_path,
                             DType dtype) {
  using namespace fsdp::checkpoint;
  std::vector<std::vector<float>> values;
  std::vector<FullTensor> tensors;
  const nn::ModelConfig model = read_whole_checkpoint(checkpoint_dir, values, tensors);
  // The family's names, for the model the checkpoint recorded (Note [Hugging Face names]).
  write_full_weights(out_path, tensors, dtype, models::family(model.kind).hf_names(model));
}

void fsdp::export_checkpoint_hf(const std::string& checkpoint_dir, const std::string& out_dir,
                                DType dtype, uint64_t max_shard_bytes) {
  using namespace fsdp::checkpoint;
  std::vector<std::vector<float>> values;
  std::vector<FullTensor> tensors;
  const nn::ModelConfig model = read_whole_checkpoint(checkpoint_dir, values, tensors);
  const models::ModelFamily& family = models::family(model.kind);
  const nlohmann::json hf = family.hf_config(model, dtype);
  FSDP_USER_CHECK(hf.is_object(), "checkpoint '", checkpoint_dir, "' is of model '", model.kind,
                  "', which has no Hugging Face config: export it as one file instead");
  write_hf_directory(out_dir, tensors, dtype, family.hf_names(model), hf, max_shard_bytes);
}
