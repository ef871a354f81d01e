#include "io/safetensors.h"

#include <algorithm>
#include <atomic>
#include <cstdint>

#include <nlohmann/json.hpp>

#include "fsdp/error.h"
#include "io/checked_json.h"
#include "io/file_io.h"

namespace fsdp::io {

namespace {

thread_local uint64_t bytes_read = 0;
std::atomic<uint64_t> headers_parsed{0};

constexpr size_t kMaxTensors = 1 << 20;
constexpr size_t kMaxDims = 16;

uint64_t read_le64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void counted_read(const ReadFile& f, void* dst, uint64_t bytes, uint64_t offset) {
  bytes_read += bytes;
  f.read_at(dst, bytes, offset);
}

}  // namespace

uint64_t thread_bytes_read() { return bytes_read; }
uint64_t safetensors_headers_parsed() { return headers_parsed.load(); }

size_t safetensors_dtype_size(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  return 0;
}

int64_t TensorEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t TensorEntry::cols() const {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

uint64_t TensorEntry::row_bytes() const {
  const int64_t r = rows();
  return r == 0 ? 0 : (end - begin) / static_cast<uint64_t>(r);
}

SafetensorsFile::SafetensorsFile(const std::string& path) : file_(path) {
  file_bytes_ = file_.bytes();
  FSDP_USER_CHECK(file_bytes_ >= 8, "'", path, "' is not a safetensors file: ", file_bytes_,
                  " bytes, shorter than the 8-byte header size");
  unsigned char prefix[8];
  counted_read(file_, prefix, 8, 0);
  const uint64_t n = read_le64(prefix);
  FSDP_USER_CHECK(n <= file_bytes_ - 8, "'", path,
                  "' is not a valid safetensors file: its header size ", n,
                  " does not fit in the file's ", file_bytes_, " bytes (truncated or not safetensors)");
  FSDP_USER_CHECK(n <= kMaxHeaderBytes, "'", path, "' has a safetensors header of ", size_text(n),
                  ", more than the ", size_text(kMaxHeaderBytes), " this reader takes");
  std::string header(n, '\0');
  counted_read(file_, header.data(), n, 8);
  headers_parsed++;
  data_start_ = 8 + n;
  header_crc_ = crc32_of(header.data(), header.size(), crc32_of(prefix, 8));
  const uint64_t data_bytes = file_bytes_ - data_start_;

  const JsonDocument doc = parse_json(header, path);
  const JsonField root = doc.root();
  if (!root.is_object()) root.fail("of the safetensors header must be an object");
  for (const auto& [name, v] : root.members(kMaxTensors)) {
    if (name == "__metadata__") {
      for (const auto& [key, value] : v.members(kMaxTensors)) metadata_[key] = value.string(kMaxHeaderBytes);
      continue;
    }
    TensorEntry t;
    t.name = name;
    t.dtype = v["dtype"].string(64);
    const size_t esize = safetensors_dtype_size(t.dtype);
    if (esize == 0) v["dtype"].fail("is '" + printable(t.dtype) + "', an unknown dtype");
    // Every product below 2^62 bytes, so that no size computed from the shape overflows.
    const uint64_t limit = (uint64_t{1} << 62) / esize;
    uint64_t numel = 1;
    for (const JsonField& d : v["shape"].elements(kMaxDims)) {
      const uint64_t dim = d.unsigned_integer(limit);
      if (dim != 0 && numel > limit / dim) v["shape"].fail("is absurdly large");
      numel *= dim;
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    const std::vector<JsonField> off = v["data_offsets"].elements(2);
    if (off.size() != 2) v["data_offsets"].fail("must be two offsets [begin, end]");
    t.begin = off[0].unsigned_integer(UINT64_MAX);
    t.end = off[1].unsigned_integer(UINT64_MAX);
    FSDP_USER_CHECK(t.begin <= t.end && t.end <= data_bytes, "'", path, "': tensor '",
                    printable(name), "' has data_offsets [", t.begin, ", ", t.end,
                    "] outside the ", data_bytes, " data bytes (truncated?)");
    FSDP_USER_CHECK(t.end - t.begin == numel * esize, "'", path, "': tensor '", printable(name),
                    "' holds ", t.end - t.begin, " bytes but its shape and dtype ", t.dtype,
                    " need ", numel * esize);
    tensors_.push_back(std::move(t));
  }
  std::sort(tensors_.begin(), tensors_.end(),
            [](const TensorEntry& a, const TensorEntry& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  uint64_t expected = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const TensorEntry& t = tensors_[i];
    FSDP_USER_CHECK(t.begin == expected, "'", path, "': tensor '", printable(t.name),
                    "' starts at byte ", t.begin, " of the data but ", expected,
                    " was expected (tensors overlap or leave a hole)");
    expected = t.end;
    by_name_[t.name] = i;
  }
  FSDP_USER_CHECK(expected == data_bytes, "'", path, "' holds ", data_bytes,
                  " data bytes but its tensors cover ", expected, " (trailing bytes)");
}

const TensorEntry* SafetensorsFile::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

const TensorEntry& SafetensorsFile::at(const std::string& name) const {
  const TensorEntry* t = find(name);
  FSDP_USER_CHECK(t, "'", path(), "' has no tensor '", printable(name), "'");
  return *t;
}

void SafetensorsFile::read(const TensorEntry& t, uint64_t offset, uint64_t bytes, void* dst) const {
  FSDP_CHECK(offset <= t.end - t.begin && bytes <= t.end - t.begin - offset, "read of bytes [",
             offset, ", ", offset + bytes, ") past the end of tensor '", t.name, "' in '", path(),
             "'");
  if (bytes) counted_read(file_, dst, bytes, data_start_ + t.begin + offset);
}

std::string safetensors_header(const std::vector<TensorToWrite>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  if (!metadata.empty()) j["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    const size_t esize = safetensors_dtype_size(t.dtype);
    FSDP_CHECK(esize > 0, "unknown safetensors dtype '", t.dtype, "' for tensor '", t.name, "'");
    FSDP_CHECK(t.name != "__metadata__" && !j.contains(t.name), "tensor name '", t.name,
               "' is reserved or used twice");
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      FSDP_CHECK(d >= 0, "tensor '", t.name, "' has a negative dimension");
      numel *= static_cast<uint64_t>(d);
    }
    j[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + numel * esize}}};
    offset += numel * esize;
  }
  std::string body = j.dump();
  body.append((8 - body.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((body.size() >> (8 * i)) & 0xff);
  return out + body;
}

WrittenFile write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  const std::string header = safetensors_header(tensors, metadata);
  AtomicFile f(path);
  f.write(header.data(), header.size());
  WrittenFile out;
  out.header_crc = f.crc();
  out.header_bytes = header.size();
  for (const TensorToWrite& t : tensors) {
    uint64_t bytes = safetensors_dtype_size(t.dtype);
    for (int64_t d : t.shape) bytes *= static_cast<uint64_t>(d);
    if (bytes) f.write(t.data, bytes);
  }
  f.commit();
  out.bytes = f.size();
  out.file_crc = f.crc();
  return out;
}

}  // namespace fsdp::io
