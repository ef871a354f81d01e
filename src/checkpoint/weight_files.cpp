#include "checkpoint/weight_files.h"

#include <set>

#include "fsdp/error.h"
#include "io/file_io.h"
#include "tokenizer/json_object.h"

namespace fsdp::checkpoint {

namespace {

bool plain_file_name(const std::string& name) {
  return !name.empty() && name.size() <= 255 && name != "." && name != ".." &&
         name.find('/') == std::string::npos && name.find('\0') == std::string::npos;
}

}  // namespace

WeightFiles::WeightFiles(const std::string& path) : path_(path) {
  FSDP_USER_CHECK(io::path_exists(path), "cannot open '", path, "': no such file or directory");
  if (!io::is_directory(path)) {
    add_file(path);
    return;
  }
  const std::string index_path = join_path(path, kHfIndexFile);
  if (!io::path_exists(index_path)) {
    const std::string single = join_path(path, kHfWeightsFile);
    FSDP_USER_CHECK(io::path_exists(single), "'", path, "' holds neither ", kHfWeightsFile, " nor ",
                    kHfIndexFile, " (not a Hugging Face model directory)");
    add_file(single);
    return;
  }
  // Note [Weight directories]
  const std::string text = io::read_bounded_file(index_path, kMaxHfIndexBytes, "a safetensors index");
  const nlohmann::json index = tokenizer::json_reading::parse_bounded(text, "'" + index_path + "'");
  FSDP_USER_CHECK(
      index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(), "'",
      index_path, "' has no \"weight_map\" object (not a safetensors index)");
  std::map<std::string, std::vector<std::string>> by_shard;  // shard -> its tensors
  for (const auto& [tensor, shard] : index["weight_map"].items()) {
    FSDP_USER_CHECK(shard.is_string() && plain_file_name(shard.get<std::string>()), "'", index_path,
                    "': tensor '", tensor, "' is mapped to ", shard.dump(),
                    ", not the name of a file in its directory");
    by_shard[shard.get<std::string>()].push_back(tensor);
  }
  FSDP_USER_CHECK(!by_shard.empty(), "'", index_path, "' maps no tensor to a shard");
  FSDP_USER_CHECK(by_shard.size() <= kMaxShards, "'", index_path, "' names ", by_shard.size(),
                  " shards, more than the ", kMaxShards, " this reader opens");
  // Every shard is there before any is opened: a missing one is named, whichever it is.
  for (const auto& [shard, names] : by_shard)
    FSDP_USER_CHECK(io::path_exists(join_path(path, shard)), "shard '", join_path(path, shard),
                    "' named by '", index_path, "' (for tensor '", names.front(),
                    "') does not exist");
  for (const auto& [shard, names] : by_shard) {
    const std::string file = join_path(path, shard);
    add_file(file);
    const std::set<std::string> listed(names.begin(), names.end());
    for (const std::string& name : names)
      FSDP_USER_CHECK(tensors_.count(name) && tensors_[name].file == files_.back().get(), "'",
                      index_path, "' puts tensor '", name, "' in '", file,
                      "', which does not hold it");
    for (const io::TensorEntry& t : files_.back()->file().tensors())
      FSDP_USER_CHECK(listed.count(t.name), "'", file, "' holds tensor '", t.name, "', which '",
                      index_path, "' does not put there");
  }
}

void WeightFiles::add_file(const std::string& file) {
  files_.push_back(RowReader::open(file));  // Note [Shared readers]
  for (const io::TensorEntry& t : files_.back()->file().tensors()) {
    auto [it, inserted] = tensors_.try_emplace(t.name, Where{files_.back().get(), &t});
    FSDP_USER_CHECK(inserted, "tensor '", t.name, "' is in both '", it->second.file->file().path(),
                    "' and '", file, "'");
  }
}

const io::TensorEntry* WeightFiles::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : it->second.entry;
}

const std::string& WeightFiles::file_of(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? path_ : it->second.file->file().path();
}

const io::TensorEntry& WeightFiles::expect(const std::string& name, int64_t rows, int64_t cols) const {
  auto it = tensors_.find(name);
  FSDP_USER_CHECK(it != tensors_.end(), "'", path_, "' has no tensor '", name, "' (another model?)");
  return it->second.file->expect(name, rows, cols);
}

void WeightFiles::read_rows(const std::string& name, int64_t rows, int64_t cols, int64_t begin,
                            int64_t end, std::span<float> dst) const {
  auto it = tensors_.find(name);
  FSDP_USER_CHECK(it != tensors_.end(), "'", path_, "' has no tensor '", name, "'");
  it->second.file->read_rows(name, rows, cols, begin, end, dst);
}

std::vector<std::string> WeightFiles::names() const {
  std::vector<std::string> out;
  for (const auto& [name, where] : tensors_) out.push_back(name);
  return out;
}

}  // namespace fsdp::checkpoint
