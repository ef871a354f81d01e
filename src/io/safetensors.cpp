#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

#include "fsdp/error.h"
#include "io/file_io.h"

namespace fsdp::io {

namespace {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // as the reference implementation
thread_local uint64_t bytes_read = 0;

uint64_t read_le64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void pread_all(int fd, const std::string& path, void* dst, uint64_t bytes, uint64_t offset) {
  bytes_read += bytes;
  char* out = static_cast<char*>(dst);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd, out, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    FSDP_USER_CHECK(n > 0, "cannot read '", path, "' at byte ", offset, ": ",
               n < 0 ? std::strerror(errno) : "the file ends early (truncated?)");
    out += n;
    bytes -= static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
  }
}

}  // namespace

uint64_t thread_bytes_read() { return bytes_read; }

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

uint64_t TensorEntry::row_bytes() const {
  const int64_t r = rows();
  return r == 0 ? 0 : (end - begin) / static_cast<uint64_t>(r);
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  FSDP_USER_CHECK(fd_ >= 0, "cannot open '", path, "': ", std::strerror(errno));
  struct stat st;
  FSDP_USER_CHECK(::fstat(fd_, &st) == 0 && S_ISREG(st.st_mode), "'", path, "' is not a regular file");
  file_bytes_ = static_cast<uint64_t>(st.st_size);
  FSDP_USER_CHECK(file_bytes_ >= 8, "'", path, "' is not a safetensors file: ", file_bytes_,
             " bytes, shorter than the 8-byte header size");
  unsigned char prefix[8];
  pread_all(fd_, path, prefix, 8, 0);
  const uint64_t n = read_le64(prefix);
  FSDP_USER_CHECK(n <= kMaxHeaderBytes && n <= file_bytes_ - 8, "'", path,
             "' is not a valid safetensors file: its header size ", n,
             " does not fit in the file's ", file_bytes_, " bytes (truncated or not safetensors)");
  std::string header(n, '\0');
  pread_all(fd_, path, header.data(), n, 8);
  data_start_ = 8 + n;
  header_crc_ = crc32_of(header.data(), header.size(), crc32_of(prefix, 8));
  const uint64_t data_bytes = file_bytes_ - data_start_;

  nlohmann::json j;
  try {
    j = nlohmann::json::parse(header);
  } catch (const nlohmann::json::exception&) {
    FSDP_USER_FAIL("'", path, "' has a corrupt safetensors header: not valid JSON");
  }
  FSDP_USER_CHECK(j.is_object(), "'", path, "' has a corrupt safetensors header: not a JSON object");
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      FSDP_USER_CHECK(v.is_object(), "'", path, "': __metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        FSDP_USER_CHECK(m.value().is_string(), "'", path, "': __metadata__ value '", m.key(),
                   "' is not a string");
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    FSDP_USER_CHECK(v.is_object() && v.contains("dtype") && v["dtype"].is_string() &&
                   v.contains("shape") && v["shape"].is_array() && v.contains("data_offsets") &&
                   v["data_offsets"].is_array() && v["data_offsets"].size() == 2,
               "'", path, "': tensor '", name, "' needs dtype, shape and two data_offsets");
    TensorEntry t;
    t.name = name;
    t.dtype = v["dtype"].get<std::string>();
    const size_t esize = safetensors_dtype_size(t.dtype);
    FSDP_USER_CHECK(esize > 0, "'", path, "': tensor '", name, "' has unknown dtype '", t.dtype, "'");
    uint64_t numel = 1;
    for (const auto& d : v["shape"]) {
      FSDP_USER_CHECK(d.is_number_unsigned(), "'", path, "': tensor '", name,
                 "' has a shape entry that is not a non-negative integer");
      const uint64_t dim = d.get<uint64_t>();
      FSDP_USER_CHECK(dim == 0 || numel <= (uint64_t{1} << 62) / dim, "'", path, "': tensor '", name,
                 "' has an absurdly large shape");
      numel *= dim;
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    const auto& off = v["data_offsets"];
    FSDP_USER_CHECK(off[0].is_number_unsigned() && off[1].is_number_unsigned(), "'", path,
               "': tensor '", name, "' has data_offsets that are not non-negative integers");
    t.begin = off[0].get<uint64_t>();
    t.end = off[1].get<uint64_t>();
    FSDP_USER_CHECK(t.begin <= t.end && t.end <= data_bytes, "'", path, "': tensor '", name,
               "' has data_offsets [", t.begin, ", ", t.end, "] outside the ", data_bytes,
               " data bytes (truncated?)");
    FSDP_USER_CHECK(t.end - t.begin == numel * esize, "'", path, "': tensor '", name, "' holds ",
               t.end - t.begin, " bytes but its shape and dtype ", t.dtype, " need ",
               numel * esize);
    tensors_.push_back(std::move(t));
  }
  std::sort(tensors_.begin(), tensors_.end(),
            [](const TensorEntry& a, const TensorEntry& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  uint64_t expected = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const TensorEntry& t = tensors_[i];
    FSDP_USER_CHECK(t.begin == expected, "'", path, "': tensor '", t.name, "' starts at byte ",
               t.begin, " of the data but ", expected,
               " was expected (tensors overlap or leave a hole)");
    expected = t.end;
    by_name_[t.name] = i;
  }
  FSDP_USER_CHECK(expected == data_bytes, "'", path, "' holds ", data_bytes,
             " data bytes but its tensors cover ", expected, " (trailing bytes)");
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

const TensorEntry* SafetensorsFile::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

const TensorEntry& SafetensorsFile::at(const std::string& name) const {
  const TensorEntry* t = find(name);
  FSDP_USER_CHECK(t, "'", path_, "' has no tensor '", name, "'");
  return *t;
}

void SafetensorsFile::read(const TensorEntry& t, uint64_t offset, uint64_t bytes, void* dst) const {
  FSDP_CHECK(offset <= t.end - t.begin && bytes <= t.end - t.begin - offset, "read of bytes [",
             offset, ", ", offset + bytes, ") past the end of tensor '", t.name, "' in '", path_,
             "'");
  if (bytes) pread_all(fd_, path_, dst, bytes, data_start_ + t.begin + offset);
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
