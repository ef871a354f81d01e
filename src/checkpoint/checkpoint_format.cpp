#include "checkpoint/checkpoint_format.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "fsdp/dtype.h"
#include "fsdp/error.h"
#include "io/file_io.h"

namespace fsdp::checkpoint {

namespace fs = std::filesystem;

std::string step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%06lld", static_cast<long long>(step));
  return buf;
}

std::string rank_file_name(int rank) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "rank-%05d.safetensors", rank);
  return buf;
}

std::string join_path(const std::string& dir, const std::string& name) {
  return dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
}

std::vector<uint32_t> chunk_crcs(const void* data, uint64_t bytes) {
  std::vector<uint32_t> out;
  const char* p = static_cast<const char*>(data);
  for (uint64_t at = 0; at < bytes; at += kChunkBytes)
    out.push_back(io::crc32_of(p + at, std::min(kChunkBytes, bytes - at)));
  return out;
}

namespace {

nlohmann::json parse_json(const std::string& text, const std::string& path) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    FSDP_USER_FAIL("'", path, "' is corrupt: not valid JSON");
  }
}

nlohmann::json marker_body(const CompleteMarker& m) {
  nlohmann::json files = nlohmann::json::object();
  for (const auto& [name, r] : m.files)
    files[name] = {{"bytes", r.bytes}, {"crc_bytes", r.crc_bytes}, {"crc32", r.crc}};
  return {{"format", kFormat}, {"step", m.step}, {"world_size", m.world}, {"files", files}};
}

// Parses "step-000123" (digits only after the dash); -1 otherwise.
int64_t parse_step_name(const std::string& name) {
  if (name.size() <= 5 || name.compare(0, 5, "step-") != 0) return -1;
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || v > (int64_t{1} << 50)) return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

}  // namespace

std::string complete_marker_text(const CompleteMarker& m) {
  nlohmann::json body = marker_body(m);
  body["crc32"] = io::crc32_of(body.dump().data(), body.dump().size());
  return body.dump(1) + "\n";
}

CompleteMarker read_complete_marker(const std::string& dir) {
  const std::string path = join_path(dir, kCompleteFile);
  nlohmann::json j = parse_json(io::read_whole_file(path), path);
  try {
    FSDP_USER_CHECK(j.is_object() && j.value("format", "") == kFormat, "'", path,
               "' is not an fsdp checkpoint marker");
    const uint32_t crc = j.at("crc32").get<uint32_t>();
    j.erase("crc32");
    const std::string body = j.dump();
    FSDP_USER_CHECK(io::crc32_of(body.data(), body.size()) == crc, "'", path,
               "' is corrupt: checksum mismatch");
    CompleteMarker m;
    m.step = j.at("step").get<int64_t>();
    m.world = j.at("world_size").get<int>();
    for (const auto& [name, r] : j.at("files").items())
      m.files[name] = {r.at("bytes").get<uint64_t>(), r.at("crc_bytes").get<uint64_t>(),
                       r.at("crc32").get<uint32_t>()};
    return m;
  } catch (const nlohmann::json::exception&) {
    FSDP_USER_FAIL("'", path, "' is corrupt: missing or mistyped fields");
  }
}

std::vector<std::pair<int64_t, std::string>> list_step_dirs(const std::string& save_dir,
                                                            bool complete_only) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(save_dir, ec)) {
    const int64_t step = parse_step_name(e.path().filename().string());
    if (step < 0 || !e.is_directory(ec)) continue;
    const std::string dir = join_path(save_dir, e.path().filename().string());
    if (complete_only && !io::path_exists(join_path(dir, kCompleteFile))) continue;
    out.emplace_back(step, dir);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string resolve_checkpoint_dir(const std::string& dir) {
  FSDP_USER_CHECK(io::path_exists(dir), "checkpoint '", dir, "' does not exist");
  FSDP_USER_CHECK(io::is_directory(dir), "checkpoint '", dir, "' is not a directory");
  if (io::path_exists(join_path(dir, kCompleteFile))) return dir;
  FSDP_USER_CHECK(!io::path_exists(join_path(dir, kIndexFile)) &&
                 !io::path_exists(join_path(dir, rank_file_name(0))),
             "'", dir, "' is an incomplete checkpoint: it has no COMPLETE marker (its save did "
             "not finish)");
  const auto complete = list_step_dirs(dir, true);
  if (!complete.empty()) return complete.back().second;
  const auto any = list_step_dirs(dir, false);
  FSDP_USER_CHECK(any.empty(), "'", dir, "' holds no complete checkpoint (", any.size(),
             " incomplete step directories, the newest '", any.empty() ? "" : any.back().second,
             "')");
  FSDP_USER_FAIL("'", dir, "' is not a checkpoint: no COMPLETE marker, index.json or step-* "
            "directories in it");
}

CheckpointIndex open_checkpoint(const std::string& dir) {
  CheckpointIndex c;
  c.dir = dir;
  c.complete = read_complete_marker(dir);
  const std::string path = join_path(dir, kIndexFile);
  auto rec = c.complete.files.find(kIndexFile);
  FSDP_USER_CHECK(rec != c.complete.files.end(), "'", join_path(dir, kCompleteFile),
             "' lists no index.json");
  const std::string text = io::read_whole_file(path);
  FSDP_USER_CHECK(text.size() == rec->second.bytes, "'", path, "' holds ", text.size(),
             " bytes, COMPLETE says ", rec->second.bytes, " (truncated or changed)");
  FSDP_USER_CHECK(io::crc32_of(text.data(), text.size()) == rec->second.crc, "'", path,
             "' is corrupt: checksum mismatch");
  c.index = parse_json(text, path);
  FSDP_USER_CHECK(c.index.is_object() && c.index.value("format", "") == kFormat &&
                 c.index.value("version", 0) == kFormatVersion,
             "'", path, "' is not an fsdp checkpoint index of version ", kFormatVersion);
  FSDP_USER_CHECK(c.index.value("step", int64_t{-1}) == c.complete.step, "'", path,
             "' is for step ", c.index.value("step", int64_t{-1}), ", COMPLETE for step ",
             c.complete.step);
  return c;
}

RowReader::RowReader(const std::string& path, bool require_crcs)
    : file_(std::make_unique<io::SafetensorsFile>(path)) {
  auto it = file_->metadata().find(kChunkCrcKey);
  if (it == file_->metadata().end()) {
    FSDP_USER_CHECK(!require_crcs, "'", path, "' has no chunk checksums (", kChunkCrcKey, ")");
    return;
  }
  nlohmann::json j = parse_json(it->second, path + "' metadata '" + kChunkCrcKey);
  try {
    for (const auto& [name, list] : j.items()) crcs_[name] = list.get<std::vector<uint32_t>>();
  } catch (const nlohmann::json::exception&) {
    FSDP_USER_FAIL("'", path, "' has corrupt chunk checksums");
  }
  for (const io::TensorEntry& t : file_->tensors()) {
    auto c = crcs_.find(t.name);
    FSDP_USER_CHECK(c != crcs_.end(), "'", path, "' has no chunk checksums for tensor '", t.name, "'");
    const uint64_t bytes = t.end - t.begin;
    FSDP_USER_CHECK(c->second.size() == (bytes + kChunkBytes - 1) / kChunkBytes, "'", path,
               "' has the wrong number of chunk checksums for tensor '", t.name, "'");
  }
}

void RowReader::read_rows(const std::string& name, int64_t begin, int64_t end, float* dst) const {
  const io::TensorEntry& t = file_->at(name);
  const std::string& path = file_->path();
  FSDP_USER_CHECK(t.dtype == "F32" || t.dtype == "BF16", "'", path, "': tensor '", name,
             "' has dtype ", t.dtype, "; expected F32 or BF16");
  FSDP_USER_CHECK(begin >= 0 && begin <= end && end <= t.rows(), "'", path, "': tensor '", name,
             "' has ", t.rows(), " rows; rows [", begin, ", ", end, ") were asked for");
  if (begin == end) return;
  const uint64_t rb = t.row_bytes(), lo = begin * rb, hi = end * rb;
  const uint64_t n = (end - begin) * (rb / io::safetensors_dtype_size(t.dtype));
  std::vector<char> buf;
  const char* src = nullptr;
  auto c = crcs_.find(name);
  if (c != crcs_.end()) {
    // Whole chunks, each verified (Note [Checkpoint checksums]).
    const uint64_t c0 = lo / kChunkBytes, c1 = (hi + kChunkBytes - 1) / kChunkBytes;
    const uint64_t first = c0 * kChunkBytes, last = std::min(c1 * kChunkBytes, t.end - t.begin);
    buf.resize(last - first);
    file_->read(t, first, last - first, buf.data());
    for (uint64_t k = c0; k < c1; ++k) {
      const uint64_t at = k * kChunkBytes - first;
      const uint64_t len = std::min(kChunkBytes, last - first - at);
      FSDP_USER_CHECK(io::crc32_of(buf.data() + at, len) == c->second[k], "'", path,
                 "' is corrupt: checksum mismatch in tensor '", name, "' at bytes [",
                 k * kChunkBytes, ", ", k * kChunkBytes + len, ")");
    }
    src = buf.data() + (lo - first);
  } else if (t.dtype == "F32") {
    file_->read(t, lo, hi - lo, dst);
    return;
  } else {
    buf.resize(hi - lo);
    file_->read(t, lo, hi - lo, buf.data());
    src = buf.data();
  }
  if (t.dtype == "F32") {
    std::memcpy(dst, src, n * sizeof(float));
  } else {
    for (uint64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      dst[i] = bf16_to_float(h);
    }
  }
}

}  // namespace fsdp::checkpoint
