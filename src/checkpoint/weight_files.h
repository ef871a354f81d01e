// Full weights to load (--init-from): one safetensors file, or a Hugging Face model directory
// holding model.safetensors, or model.safetensors.index.json and the shards it names.
//
// Note [Weight directories]
// Opening checks everything before a value is read, each failure one line naming the file:
//   - the index is a regular file of at most kMaxHfIndexBytes (Note [Reading files]), JSON nested at most 64 deep, an
//     object whose "weight_map" maps each tensor name to a shard's file name;
//   - a shard's name is a plain file name in the directory (no '/', not "." or ".."): an
//     index cannot point outside its directory; at most kMaxShards distinct shards;
//   - every shard exists and passes Note [Safetensors validation]; it holds every tensor the
//     index puts in it, and no tensor the index does not list or lists in another shard.
// Reads are by rows (RowReader), so each rank reads only its rows of each tensor, from the
// shard that holds it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <span>

#include "checkpoint/checkpoint_format.h"
#include "checkpoint/row_reader.h"

namespace fsdp::checkpoint {

inline constexpr const char* kHfWeightsFile = "model.safetensors";
inline constexpr const char* kHfIndexFile = "model.safetensors.index.json";
inline constexpr uint64_t kMaxHfIndexBytes = 64 << 20;
inline constexpr size_t kMaxShards = 4096;

class WeightFiles {
 public:
  // A safetensors file, or a directory as above; one-line errors (Note [Weight directories]).
  explicit WeightFiles(const std::string& path);
  const std::string& path() const { return path_; }

  // The tensor `name`, or nullptr.
  const io::TensorEntry* find(const std::string& name) const;
  // The file that holds tensor `name` (for messages).
  const std::string& file_of(const std::string& name) const;
  // Tensor `name`, which must be F32 or BF16 of `rows` rows of `cols` elements (RowReader::expect).
  const io::TensorEntry& expect(const std::string& name, int64_t rows, int64_t cols) const;
  // Rows [begin, end) of tensor `name` (of `rows` x `cols`) into dst, as fp32; every dimension
  // is checked against dst by RowReader::read_rows.
  void read_rows(const std::string& name, int64_t rows, int64_t cols, int64_t begin, int64_t end,
                 std::span<float> dst) const;
  // Every tensor's name, in order.
  std::vector<std::string> names() const;

 private:
  void add_file(const std::string& file);

  std::string path_;
  std::vector<std::shared_ptr<const RowReader>> files_;
  struct Where {
    const RowReader* file = nullptr;
    const io::TensorEntry* entry = nullptr;
  };
  std::map<std::string, Where> tensors_;
};

}  // namespace fsdp::checkpoint
