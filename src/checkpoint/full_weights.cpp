#include "checkpoint/full_weights.h"

#include "checkpoint/checkpoint_format.h"
#include "checkpoint/checkpoint_loader.h"
#include "checkpoint/sharded_state.h"
#include "fsdp/error.h"
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

void fsdp::export_checkpoint(const std::string& checkpoint_dir, const std::string& out_path,
                             DType dtype) {
  using namespace fsdp::checkpoint;
  const CheckpointIndex ckpt = open_checkpoint(resolve_checkpoint_dir(checkpoint_dir));
  // Every tensor whole: one "rank" that holds all rows, loaded from every saved rank's file.
  std::vector<std::vector<float>> values;
  std::vector<FullTensor> tensors;
  const nlohmann::json& list = ckpt.index.at("tensors");
  values.reserve(list.size());
  ShardedState whole;
  for (const nlohmann::json& e : list) {
    ShardView v;
    v.fqn = e.at("name").get<std::string>();
    v.shape = e.at("shape").get<std::vector<int64_t>>();
    const int64_t rows = v.shape.empty() ? 1 : v.shape[0];
    v.cols = 1;
    for (size_t d = 1; d < v.shape.size(); ++d) v.cols *= v.shape[d];
    v.rows = {0, rows};
    values.emplace_back(static_cast<size_t>(rows * v.cols));
    v.param = values.back().data();
    whole.tensors.push_back(v);
    tensors.push_back({v.fqn, v.shape, values.back().data()});
  }
  load_checkpoint(ckpt, whole, /*device=*/nullptr, Stream{});
  // The family's names, for the model the checkpoint recorded (Note [Hugging Face names]).
  const nn::ModelConfig model = models::config_of_shape_fields(
      ckpt.index.value("config", nlohmann::json::object()).value("model", nlohmann::json::object()));
  write_full_weights(out_path, tensors, dtype, models::family(model.kind).hf_names(model));
}
