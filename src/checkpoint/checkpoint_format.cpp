#include "checkpoint/checkpoint_format.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <set>

#include "fsdp/error.h"
#include "io/file_io.h"
#include "io/shared_by_identity.h"

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
  const io::JsonDocument doc =
      io::parse_json(io::read_bounded_file(path, kMaxMarkerBytes, "a checkpoint's COMPLETE marker"), path);
  const io::JsonField j = doc.root();
  const std::optional<io::JsonField> format = j.is_object() ? j.find("format") : std::nullopt;
  FSDP_USER_CHECK(format && format->is_string() && format->raw() == kFormat, "'", path,
                  "' is not an fsdp checkpoint marker");
  const uint32_t crc = static_cast<uint32_t>(j["crc32"].unsigned_integer(0xffffffffu));
  nlohmann::json body = doc.value;
  body.erase("crc32");
  const std::string text = body.dump();
  FSDP_USER_CHECK(io::crc32_of(text.data(), text.size()) == crc, "'", path,
                  "' is corrupt: checksum mismatch");
  CompleteMarker m;
  m.step = j["step"].integer(0, kMaxStep);
  m.world = static_cast<int>(j["world_size"].integer(1, kMaxWorldSize));
  for (const auto& [name, r] : j["files"].members(static_cast<size_t>(m.world) + 1))
    m.files[name] = {r["bytes"].unsigned_integer(kMaxFileBytes),
                     r["crc_bytes"].unsigned_integer(kMaxFileBytes),
                     static_cast<uint32_t>(r["crc32"].unsigned_integer(0xffffffffu))};
  return m;
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

namespace {

// Note [Checkpoint index checks].
IndexTensor index_tensor(const io::JsonField& e, int world) {
  IndexTensor t;
  t.name = e["name"].string(4096);
  const io::JsonField shape = e["shape"];
  t.shape = shape.integers(16, 0, kMaxDimSize);
  t.rows = t.shape.empty() ? 1 : t.shape[0];
  for (size_t d = 1; d < t.shape.size(); ++d) {
    if (t.shape[d] != 0 && t.cols > kMaxDimSize / t.shape[d])
      shape.fail("holds more than 2^48 elements");
    t.cols *= t.shape[d];
  }
  if (t.cols != 0 && t.rows > kMaxDimSize / t.cols) shape.fail("holds more than 2^48 elements");
  t.dtype = e["dtype"].string(64);
  const io::JsonField ranks = e["ranks"];
  const std::vector<io::JsonField> list = ranks.elements(static_cast<size_t>(world));
  if (static_cast<int>(list.size()) != world)
    ranks.fail("lists " + std::to_string(list.size()) + " ranks, the checkpoint has " +
               std::to_string(world));
  for (const io::JsonField& r : list) {
    const std::vector<int64_t> range = r.integers(2, 0, t.rows);
    if (range.size() != 2 || range[0] > range[1])
      r.fail("must be a row range [begin, end) with 0 <= begin <= end <= " + std::to_string(t.rows));
    t.ranks.emplace_back(range[0], range[1]);
  }
  // The ranks' rows, sorted, tile [0, rows) exactly: every row is in one rank file.
  std::vector<std::pair<int64_t, int64_t>> sorted;
  for (const auto& r : t.ranks)
    if (r.first < r.second) sorted.push_back(r);
  std::sort(sorted.begin(), sorted.end());
  int64_t covered = 0;
  for (const auto& [b, end] : sorted) {
    if (b != covered)
      ranks.fail(detail::concat("leave rows of '", io::printable(t.name), "' (shape rows ", t.rows,
                                ") ", b > covered ? "uncovered" : "covered twice", " at row ",
                                std::min(b, covered)));
    covered = end;
  }
  if (covered != t.rows)
    ranks.fail(detail::concat("cover rows [0, ", covered, ") of '", io::printable(t.name),
                              "', whose shape has ", t.rows, " rows"));
  if (std::optional<io::JsonField> steps = e.find("optimizer_step"))
    t.optimizer_step = steps->integer(0, int64_t{1} << 53);
  return t;
}

}  // namespace

CheckpointIndex open_checkpoint(const std::string& dir) {
  CheckpointIndex c;
  c.dir = dir;
  c.complete = read_complete_marker(dir);
  const std::string path = join_path(dir, kIndexFile);
  auto rec = c.complete.files.find(kIndexFile);
  FSDP_USER_CHECK(rec != c.complete.files.end(), "'", join_path(dir, kCompleteFile),
                  "' lists no index.json");
  const std::string text = io::read_bounded_file(path, kMaxIndexBytes, "a checkpoint's index.json");
  FSDP_USER_CHECK(text.size() == rec->second.bytes, "'", path, "' holds ", text.size(),
                  " bytes, COMPLETE says ", rec->second.bytes, " (truncated or changed)");
  FSDP_USER_CHECK(io::crc32_of(text.data(), text.size()) == rec->second.crc, "'", path,
                  "' is corrupt: checksum mismatch");
  c.index = io::parse_json(text, path);
  const io::JsonField j = c.index.root();
  auto field_is = [&](const char* key, const nlohmann::json& want) {
    if (!j.is_object()) return false;
    const std::optional<io::JsonField> f = j.find(key);
    return f && f->raw() == want;
  };
  FSDP_USER_CHECK(field_is("format", kFormat) && field_is("version", kFormatVersion), "'", path,
                  "' is not an fsdp checkpoint index of version ", kFormatVersion);
  const int64_t step = j["step"].integer(0, kMaxStep);
  FSDP_USER_CHECK(step == c.complete.step, "'", path, "' is for step ", step, ", COMPLETE for step ",
                  c.complete.step);
  if (std::optional<io::JsonField> world = j.find("world_size"))
    FSDP_USER_CHECK(world->integer(1, kMaxWorldSize) == c.complete.world, "'", path,
                    "' is for world size ", world->raw().dump(), ", COMPLETE for ", c.complete.world);
  std::set<std::string> names;
  for (const io::JsonField& e : j["tensors"].elements(1 << 20)) {
    c.tensors.push_back(index_tensor(e, c.complete.world));
    if (!names.insert(c.tensors.back().name).second)
      e["name"].fail("'" + io::printable(c.tensors.back().name) + "' names a param twice");
  }
  if (std::optional<io::JsonField> states = j.find("state_names"))
    c.state_names = states->strings(16, 64);
  if (std::optional<io::JsonField> ts = j.find("train_state"))
    if (!ts->is_object()) ts->fail("must be an object");
  return c;
}

std::shared_ptr<const CheckpointIndex> open_checkpoint_shared(const std::string& dir) {
  auto make = [&] { return std::make_shared<const CheckpointIndex>(open_checkpoint(dir)); };
  io::FileIdentity marker, index;
  if (!io::identity_of_path(join_path(dir, kCompleteFile), marker) ||
      !io::identity_of_path(join_path(dir, kIndexFile), index))
    return make();  // its error
  return io::shared_by_identity<CheckpointIndex>(dir, {marker, index}, make);
}

}  // namespace fsdp::checkpoint
