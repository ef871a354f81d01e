#include "checkpoint/row_reader.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "fsdp/dtype.h"
#include "fsdp/error.h"
#include "io/checked_json.h"
#include "io/file_io.h"
#include "io/shared_by_identity.h"

namespace fsdp::checkpoint {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}

namespace {

}  // namespace

std::shared_ptr<const RowReader> RowReader::open(const std::string& path) {
  auto make = [&] { return std::make_shared<const RowReader>(path); };
  io::FileIdentity id;
  if (!io::identity_of_path(path, id)) return make();  // its error, from the reader itself
  return io::shared_by_identity<RowReader>(path, {id}, make);
}

RowReader::RowReader(const std::string& path) : file_(std::make_unique<io::SafetensorsFile>(path)) {
  auto it = file_->metadata().find(kChunkCrcKey);
  if (it == file_->metadata().end()) return;
  has_crcs_ = true;
  const io::JsonDocument doc = io::parse_json(it->second, path + "' metadata '" + kChunkCrcKey);
  for (const auto& [name, list] : doc.root().members(file_->tensors().size() + 1)) {
    const io::TensorEntry* t = file_->find(name);
    if (!t) list.fail("names no tensor of the file");
    const uint64_t chunks = (t->end - t->begin + kChunkBytes - 1) / kChunkBytes;
    if (list.is_array() && list.raw().size() != chunks)
      list.fail("holds " + std::to_string(list.raw().size()) + " chunk checksums, the tensor's " +
                std::to_string(t->end - t->begin) + " bytes need " + std::to_string(chunks));
    crcs_[name] = list.uint32s(chunks);
  }
  for (const io::TensorEntry& t : file_->tensors())
    FSDP_USER_CHECK(crcs_.count(t.name), "'", path, "' has no chunk checksums for tensor '",
                    io::printable(t.name), "'");
}

const io::TensorEntry& RowReader::expect(const std::string& name, int64_t rows,
                                         int64_t cols) const {
  const io::TensorEntry& t = file_->at(name);
  const std::string& path = file_->path();
  FSDP_USER_CHECK(t.dtype == "F32" || t.dtype == "BF16", "'", path, "': tensor '",
                  io::printable(name), "' has dtype ", t.dtype, "; expected F32 or BF16");
  FSDP_USER_CHECK(t.rows() == rows && t.cols() == cols, "'", path, "': tensor '",
                  io::printable(name), "' has shape ", shape_text(t.shape), ", expected ", rows,
                  " rows of ", cols, " (another model shape, or a damaged or crafted file)");
  return t;
}

void RowReader::read_rows(const std::string& name, int64_t rows, int64_t cols, int64_t begin,
                          int64_t end, std::span<float> dst) const {
  const io::TensorEntry& t = expect(name, rows, cols);
  const std::string& path = file_->path();
  FSDP_USER_CHECK(begin >= 0 && begin <= end && end <= rows, "'", path, "': tensor '",
                  io::printable(name), "' has ", rows, " rows; rows [", begin, ", ", end,
                  ") were asked for");
  FSDP_CHECK(dst.size() == static_cast<size_t>((end - begin) * cols), "rows [", begin, ", ", end,
             ") of ", cols, " into ", dst.size(), " floats");
  if (begin == end) return;
  const uint64_t esize = io::safetensors_dtype_size(t.dtype);
  const uint64_t rb = static_cast<uint64_t>(cols) * esize, lo = begin * rb, hi = end * rb;
  const uint64_t n = dst.size();
  std::vector<char> buf;
  const char* src = nullptr;
  if (has_crcs_) {
    // Whole chunks, each verified (Note [Checkpoint checksums]).
    const std::vector<uint32_t>& crcs = crcs_.at(name);
    const uint64_t c0 = lo / kChunkBytes, c1 = (hi + kChunkBytes - 1) / kChunkBytes;
    const uint64_t first = c0 * kChunkBytes, last = std::min(c1 * kChunkBytes, t.end - t.begin);
    buf.resize(last - first);
    file_->read(t, first, last - first, buf.data());
    for (uint64_t k = c0; k < c1; ++k) {
      const uint64_t at = k * kChunkBytes - first;
      const uint64_t len = std::min(kChunkBytes, last - first - at);
      FSDP_USER_CHECK(io::crc32_of(buf.data() + at, len) == crcs[k], "'", path,
                      "' is corrupt: checksum mismatch in tensor '", io::printable(name),
                      "' at bytes [", k * kChunkBytes, ", ", k * kChunkBytes + len, ")");
    }
    src = buf.data() + (lo - first);
  } else if (t.dtype == "F32") {
    file_->read(t, lo, hi - lo, dst.data());
    return;
  } else {
    buf.resize(hi - lo);
    file_->read(t, lo, hi - lo, buf.data());
    src = buf.data();
  }
  if (t.dtype == "F32") {
    std::memcpy(dst.data(), src, n * sizeof(float));
  } else {
    for (uint64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      dst[i] = bf16_to_float(h);
    }
  }
}

const RowReader& RankFiles::at(int rank) {
  std::shared_ptr<const RowReader>& r = open_[rank];
  if (r) return *r;
  const std::string name = rank_file_name(rank);
  const std::string path = join_path(ckpt_.dir, name);
  auto rec = ckpt_.complete.files.find(name);
  FSDP_USER_CHECK(rec != ckpt_.complete.files.end(), "'", join_path(ckpt_.dir, kCompleteFile),
                  "' does not list '", name, "'");
  FSDP_USER_CHECK(io::path_exists(path), "checkpoint rank file '", path, "' is missing");
  std::shared_ptr<const RowReader> reader = RowReader::open(path);
  FSDP_USER_CHECK(reader->has_crcs(), "'", path, "' has no chunk checksums (", kChunkCrcKey, ")");
  FSDP_USER_CHECK(reader->file().file_bytes() == rec->second.bytes, "'", path, "' holds ",
                  reader->file().file_bytes(), " bytes, COMPLETE says ", rec->second.bytes,
                  " (truncated or changed)");
  FSDP_USER_CHECK(reader->file().header_bytes() == rec->second.crc_bytes &&
                      reader->file().header_crc() == rec->second.crc,
                  "'", path, "' is corrupt: header checksum mismatch");
  r = std::move(reader);
  return *r;
}

}  // namespace fsdp::checkpoint
