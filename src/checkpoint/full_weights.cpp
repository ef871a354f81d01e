#include "checkpoint/full_weights.h"

#include <cstdlib>
#include <map>
#include <optional>

#include "checkpoint/checkpoint_format.h"
#include "checkpoint/checkpoint_loader.h"
#include "checkpoint/row_reader.h"
#include "checkpoint/sharded_state.h"
#include "fsdp/error.h"
#include "io/checked_json.h"
#include "io/file_io.h"
#include "models/model_family.h"

namespace fsdp::checkpoint {

void write_full_weights(const std::string& path, const std::vector<FullTensor>& tensors,
                        DType dtype, const HfNames& names) {
  FSDP_USER_CHECK(dtype == DType::F32 || dtype == DType::BF16, "export writes fp32 or bf16, not ",
             dtype_name(dtype));
  std::vector<std::vector<uint16_t>> bf16;  // converted copies, when dtype is bf16
  std::vector<io::TensorToWrite> out;
  nlohmann::json crcs = nlohmann::json::object();
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
        bf16.emplace_back(n);
        for (size_t i = 0; i < n; ++i) bf16.back()[i] = float_to_bf16(src[i]);
        data = bf16.back().data();
      }
      crcs[p.name] = chunk_crcs(data, n * dtype_size(dtype));
      out.push_back({p.name, dtype == DType::BF16 ? "BF16" : "F32", shape, data});
      at += p.rows;
    }
    FSDP_CHECK(at == rows, "the Hugging Face tensors of '", t.fqn, "' hold ", at, " rows, not ",
               rows);
  }
  io::write_safetensors(path, out, {{"format", "pt"}, {kChunkCrcKey, crcs.dump()}});
}

}  // namespace fsdp

namespace {
// MemAvailable of /proc/meminfo, in bytes; 0 when unknown.
int64_t available_memory_bytes() {
  std::string text;
  try {
    text = fsdp::io::read_bounded_file("/proc/meminfo", 1 << 20, "/proc/meminfo");
  } catch (const fsdp::Error&) {
    return 0;
  }
  const size_t at = text.find("MemAvailable:");
  return at == std::string::npos ? 0 : std::atoll(text.c_str() + at + 13) * 1024;
}
}  // namespace

void fsdp::export_checkpoint(const std::string& checkpoint_dir, const std::string& out_path,
                             DType dtype) {
  using namespace fsdp::checkpoint;
  const CheckpointIndex ckpt = open_checkpoint(resolve_checkpoint_dir(checkpoint_dir));
  // Note [Checkpoint index checks]: before anything is allocated, every rank file must hold
  // its range's rows of each param, of the param's row width; so what is allocated below is
  // what the files hold, whatever index.json says.
  RankFiles files(ckpt);
  for (const IndexTensor& e : ckpt.tensors)
    for (int r = 0; r < static_cast<int>(e.ranks.size()); ++r)
      if (e.ranks[r].first < e.ranks[r].second)
        files.at(r).expect(e.name, e.ranks[r].second - e.ranks[r].first, e.cols);
  // Every tensor whole, in fp32, in memory at once (and a bf16 copy for --dtype bf16): what a
  // machine cannot hold is refused now, not met as an allocation failure later.
  double need = 0;
  for (const IndexTensor& e : ckpt.tensors) need += static_cast<double>(e.rows * e.cols) * 6;
  const double available = static_cast<double>(available_memory_bytes());
  FSDP_USER_CHECK(available <= 0 || need <= 0.9 * available, "exporting '", ckpt.dir,
                  "' needs about ", io::size_text(static_cast<uint64_t>(need)),
                  " of memory (every param whole), more than the ",
                  io::size_text(static_cast<uint64_t>(available)), " this machine has available");
  // Every tensor whole: one "rank" that holds all rows, loaded from every saved rank's file.
  std::vector<std::vector<float>> values;
  std::vector<FullTensor> tensors;
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
  // The family's names, for the model the checkpoint recorded (Note [Hugging Face names]).
  nlohmann::json fields = nlohmann::json::object();  // Note [Checked JSON]: look before reading
  if (const std::optional<io::JsonField> config = ckpt.index.root().find("config");
      config && config->is_object())
    if (const std::optional<io::JsonField> m = config->find("model"); m && m->is_object())
      fields = m->raw();
  const nn::ModelConfig model = models::config_of_shape_fields(fields);
  write_full_weights(out_path, tensors, dtype, models::family(model.kind).hf_names(model));
}
