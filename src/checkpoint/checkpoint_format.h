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
// The CRCs catch accidents (a torn write, bit rot, a truncated or swapped file), not intent:
// anyone can write a file with valid CRCs (CRC-32 is no secret and has no key). So nothing a
// load does relies on them for its safety: every field of COMPLETE and index.json is checked
// for type and range (Note [Checked JSON]), index.json's shapes and row ranges for
// consistency (Note [Checkpoint index checks]), and every tensor read against the memory it
// is read into (RowReader::read_rows, row_reader.h). A crafted checkpoint gets a one-line
// error, or loads what it holds.
//
// Note [Checkpoint index checks]
// open_checkpoint() checks every param of index.json before anything trusts it: a unique
// name; a shape of at most 16 dims, each in [0, 2^48], whose product is at most 2^48; a row
// range [begin, end) with 0 <= begin <= end <= rows for each of the checkpoint's ranks; and
// the non-empty ranges, sorted, tile [0, rows) exactly (no hole, no overlap), so that the
// rank files together hold every row once. Each rank file's tensor must then hold exactly its
// range's rows, of the shape's row width (checked where it is read, and by export for every
// rank before it allocates the whole tensor): what export allocates is bounded by what the
// files hold.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/checked_json.h"

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

// Limits on what a checkpoint may hold (Note [Reading files], Note [Checkpoint index checks]).
inline constexpr uint64_t kMaxMarkerBytes = 32 << 20;  // COMPLETE: ~100 bytes per rank
inline constexpr uint64_t kMaxIndexBytes = 256 << 20;  // index.json: ~30 bytes per param per rank
inline constexpr int kMaxWorldSize = 1 << 20;
inline constexpr int64_t kMaxStep = int64_t{1} << 50;
inline constexpr uint64_t kMaxFileBytes = uint64_t{1} << 62;
inline constexpr int64_t kMaxDimSize = int64_t{1} << 48;

// One param of index.json, checked (Note [Checkpoint index checks]).
struct IndexTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  int64_t rows = 1, cols = 1;  // dim 0 (1 for a scalar), and the product of the others
  std::vector<std::pair<int64_t, int64_t>> ranks;  // each saved rank's global rows [begin, end)
  int64_t optimizer_step = -1;                     // -1: not recorded
};

// A checkpoint's index.json, verified against COMPLETE, with its params checked.
struct CheckpointIndex {
  std::string dir;
  CompleteMarker complete;
  io::JsonDocument index;  // read its other fields through index.root() (Note [Checked JSON])
  std::vector<IndexTensor> tensors;
  std::vector<std::string> state_names;  // the optimizer's
};
CheckpointIndex open_checkpoint(const std::string& dir);
// The same, parsed once for every rank thread of the process that resumes from it (Note
// [Shared readers] in row_reader.h): index.json may be large (kMaxIndexBytes).
std::shared_ptr<const CheckpointIndex> open_checkpoint_shared(const std::string& dir);

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
