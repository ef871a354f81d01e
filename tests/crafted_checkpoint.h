// Checkpoints and safetensors files changed on purpose, with every checksum made valid again:
// what someone who knows the format (CRC-32 is no secret) can hand the loader. For the
// hostile-file tests and the fuzz test.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_format.h"
#include "io/file_io.h"

namespace fsdp::testing {

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void spill(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A safetensors file as its parts: the header's JSON (as written, in order) and the data.
struct RawSafetensors {
  nlohmann::ordered_json header;
  std::string data;

  static RawSafetensors read(const std::string& path) {
    const std::string bytes = slurp(path);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
    RawSafetensors f;
    f.header = nlohmann::ordered_json::parse(bytes.substr(8, n));
    f.data = bytes.substr(8 + n);
    return f;
  }
  // The bytes of tensor `name` as the header places them.
  std::string tensor_bytes(const std::string& name) const {
    const auto& off = header.at(name).at("data_offsets");
    const uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
    return data.substr(b, e - b);
  }
  // The file: the header as it is (or `raw_header` instead), after its 8-byte size (or
  // `size_prefix`), then the data.
  std::string bytes(const std::string* raw_header = nullptr,
                    const uint64_t* size_prefix = nullptr) const {
    const std::string h = raw_header ? *raw_header : header.dump();
    const uint64_t n = size_prefix ? *size_prefix : h.size();
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    return out + h + data;
  }
  void write(const std::string& path) const { spill(path, bytes()); }
};

// Rebuilds a file from tensors (name -> dtype, shape, bytes) in the given order, offsets laid
// end to end, with valid chunk checksums for each (the metadata of `like` kept otherwise).
struct CraftedTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};
inline RawSafetensors craft_safetensors(const std::vector<CraftedTensor>& tensors,
                                        nlohmann::ordered_json metadata, bool with_crcs = true) {
  RawSafetensors f;
  nlohmann::json crcs = nlohmann::json::object();
  uint64_t at = 0;
  for (const CraftedTensor& t : tensors) {
    f.header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {at, at + t.bytes.size()}}};
    f.data += t.bytes;
    at += t.bytes.size();
    crcs[t.name] = checkpoint::chunk_crcs(t.bytes.data(), t.bytes.size());
  }
  if (with_crcs) metadata[checkpoint::kChunkCrcKey] = crcs.dump();
  if (!metadata.empty()) {
    nlohmann::ordered_json h;
    h["__metadata__"] = metadata;
    for (auto& [k, v] : f.header.items()) h[k] = v;
    f.header = h;
  }
  return f;
}

// The tensors of a file, in data order, for craft_safetensors.
inline std::vector<CraftedTensor> tensors_of(const RawSafetensors& f) {
  std::vector<std::pair<uint64_t, CraftedTensor>> out;
  for (auto& [name, v] : f.header.items()) {
    if (name == "__metadata__") continue;
    out.push_back({v["data_offsets"][0].get<uint64_t>(),
                   {name, v["dtype"].get<std::string>(), v["shape"].get<std::vector<int64_t>>(),
                    f.tensor_bytes(name)}});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<CraftedTensor> t;
  for (auto& [at, c] : out) t.push_back(std::move(c));
  return t;
}

// The chunk checksums in a file's metadata, recomputed from its data as the header places it.
inline void recompute_chunk_crcs(RawSafetensors& f) {
  nlohmann::json crcs = nlohmann::json::object();
  for (auto& [name, v] : f.header.items()) {
    if (name == "__metadata__") continue;
    crcs[name] = checkpoint::chunk_crcs(f.tensor_bytes(name).data(), f.tensor_bytes(name).size());
  }
  f.header["__metadata__"][checkpoint::kChunkCrcKey] = crcs.dump();
}

// COMPLETE's text for `body` (its crc32 computed as the reader checks it).
inline std::string sealed_marker(nlohmann::json body) {
  body.erase("crc32");
  const std::string text = body.dump();
  body["crc32"] = io::crc32_of(text.data(), text.size());
  return body.dump(1) + "\n";
}

// Rewrites DIR/COMPLETE so that it matches the files now in DIR: index.json's size and CRC,
// each rank file's size and header CRC.
inline void reseal(const std::string& dir) {
  const std::string marker = dir + "/" + checkpoint::kCompleteFile;
  nlohmann::json body = nlohmann::json::parse(slurp(marker));
  const std::string index = slurp(dir + "/" + checkpoint::kIndexFile);
  nlohmann::json files = nlohmann::json::object();
  files[checkpoint::kIndexFile] = {{"bytes", index.size()},
                                   {"crc_bytes", index.size()},
                                   {"crc32", io::crc32_of(index.data(), index.size())}};
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("rank-", 0) != 0 || e.path().extension() != ".safetensors") continue;
    const std::string bytes = slurp(e.path().string());
    uint64_t n = 0;
    for (int i = 7; i >= 0 && bytes.size() >= 8; --i)
      n = (n << 8) | static_cast<unsigned char>(bytes[i]);
    const uint64_t header =
        std::min<uint64_t>(bytes.size(), n > bytes.size() ? bytes.size() : 8 + n);
    files[name] = {{"bytes", bytes.size()},
                   {"crc_bytes", header},
                   {"crc32", io::crc32_of(bytes.data(), header)}};
  }
  body["files"] = files;
  spill(marker, sealed_marker(body));
}

}  // namespace fsdp::testing
