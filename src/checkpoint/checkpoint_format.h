// The on-disk layout of a checkpoint (docs/checkpoint.md):
//   DIR/step-000123/rank-00000.safetensors ...   each rank's shards (params, optimizer state)
//   DIR/step-000123/index.json                   global shapes, each rank's rows, the run
//   DIR/step-000123/COMPLETE                     written last, by rank 0, with the checksums
//
// Note [Checkpoint checksums]
// CRC-32 (zlib) over every byte a load trusts, so a reader verifies exactly what it reads:
//   - COMPLETE holds, for every other file, its size and the CRC of its header (index.json:
//     of the whole file), and a CRC of its own content;
//   - each rank file's safetensors metadata holds the CRC of every 1 MiB chunk of every
//     tensor (key "fsdp.chunk_crc32"). A rank that reads rows of a tensor reads the chunks
//     that hold them, whole, and verifies each; it never reads the rest of the file.
// Exported weights carry the same chunk CRCs; files from elsewhere have none and are read
// with the header checks of Note [Safetensors validation] only.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"

namespace fsdp::checkpoint {

inline constexpr const char* kIndexFile = "index.json";
inline constexpr const char* kCompleteFile = "COMPLETE";
inline constexpr const char* kFormat = "fsdp-sharded-checkpoint";
inline constexpr int kFormatVersion = 1;
inline constexpr uint64_t kChunkBytes = 1 << 20;
inline constexpr const char* kChunkCrcKey = "fsdp.chunk_crc32";

std::string step_dir_name(int64_t step);  // "step-000123"
std::string rank_file_name(int rank);     // "rank-00000.safetensors"
std::string join_path(const std::string& dir, const std::string& name);

// The CRC of each kChunkBytes chunk of `bytes` bytes.
std::vector<uint32_t> chunk_crcs(const void* data, uint64_t bytes);

struct FileRecord {
  uint64_t bytes = 0;
  uint64_t crc_bytes = 0;  // how many leading bytes `crc` covers
  uint32_t crc = 0;
};

struct CompleteMarker {
  int64_t step = 0;
  int world = 0;
  std::map<std::string, FileRecord> files;
};
std::string complete_marker_text(const CompleteMarker& m);
// Reads and verifies DIR/COMPLETE; errors name the file and the problem.
CompleteMarker read_complete_marker(const std::string& dir);

// Complete checkpoints (with a COMPLETE file) in a save dir, by step; and all step dirs.
std::vector<std::pair<int64_t, std::string>> list_step_dirs(const std::string& save_dir,
                                                            bool complete_only);
// A checkpoint dir itself, or a save dir's latest complete checkpoint; errors otherwise
// ("not a checkpoint", "incomplete checkpoint", "no complete checkpoint").
std::string resolve_checkpoint_dir(const std::string& dir);

// A checkpoint's index.json, verified against COMPLETE.
struct CheckpointIndex {
  std::string dir;
  CompleteMarker complete;
  nlohmann::json index;
};
CheckpointIndex open_checkpoint(const std::string& dir);

// A safetensors file read by rows, into fp32, with every chunk read verified where the file
// carries chunk CRCs (required when `require_crcs`).
class RowReader {
 public:
  RowReader(const std::string& path, bool require_crcs);
  const io::SafetensorsFile& file() const { return *file_; }
  // Rows [begin, end) of tensor `name` into dst ((end - begin) * cols floats); F32 or BF16.
  void read_rows(const std::string& name, int64_t begin, int64_t end, float* dst) const;

 private:
  std::unique_ptr<io::SafetensorsFile> file_;
  std::map<std::string, std::vector<uint32_t>> crcs_;
};

// Note [Hugging Face names]
// A model family may name its params as Hugging Face's checkpoints do (models::ModelFamily::
// hf_names, src/models): each param is one or more Hugging Face tensors stacked on its dim 0
// (the transformer's wqkv is q_proj, k_proj and v_proj; a tied head has no tensor of its own).
// Export writes those names; --init-from reads whichever naming the file uses, the family's
// or the fqns.
struct HfTensor {
  std::string name;
  int64_t rows = 0;
};
// The Hugging Face tensors of param `fqn` (of `rows` rows on dim 0), stacked on dim 0; empty
// when the family has no name for it. An empty map: the model has no Hugging Face names.
using HfNames = std::function<std::vector<HfTensor>(const std::string& fqn, int64_t rows)>;

}  // namespace fsdp::checkpoint
