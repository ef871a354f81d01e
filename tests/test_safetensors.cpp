// The safetensors reader and writer (Note [Safetensors validation]) and atomic files
// (Note [Atomic files]): round trips, byte-range reads, and every malformed header refused
// with an error that names the file.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "fsdp/error.h"
#include "io/file_io.h"
#include "io/safetensors.h"

namespace fsdp::io {
namespace {

std::string temp_path(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "safetensors_test/";
  std::filesystem::create_directories(dir);
  return dir + name;
}

std::string le64(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

// A file with the given JSON header and `data_bytes` zero data bytes.
std::string write_raw(const std::string& name, const std::string& header, size_t data_bytes) {
  const std::string path = temp_path(name);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << le64(header.size()) << header << std::string(data_bytes, '\0');
  return path;
}

std::string error_of(const std::string& path) {
  try {
    SafetensorsFile f(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Safetensors, RoundTripWithByteRangeReads) {
  std::vector<float> a(3 * 5);
  for (size_t i = 0; i < a.size(); ++i) a[i] = 0.25f * static_cast<float>(i) - 1.0f;
  std::vector<uint16_t> b{0x3f80, 0x4000, 0xbf80, 0x0000};
  std::vector<int32_t> c{7, -3};
  const std::string path = temp_path("round_trip.safetensors");
  const WrittenFile w = write_safetensors(
      path,
      {{"a", "F32", {3, 5}, a.data()}, {"b", "BF16", {2, 2}, b.data()},
       {"empty", "F32", {0, 5}, nullptr}, {"c", "I32", {2}, c.data()}},
      {{"format", "pt"}});
  ASSERT_EQ(w.header_bytes % 8, 0u) << "the header is padded to 8 bytes";
  SafetensorsFile f(path);
  EXPECT_EQ(f.file_bytes(), w.bytes);
  EXPECT_EQ(f.header_crc(), w.header_crc);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  ASSERT_EQ(f.tensors().size(), 4u);
  const TensorEntry& ta = f.at("a");
  EXPECT_EQ(ta.shape, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(ta.row_bytes(), 20u);
  std::vector<float> row1(5);
  f.read(ta, ta.row_bytes(), ta.row_bytes(), row1.data());  // row 1 only
  EXPECT_EQ(row1, std::vector<float>(a.begin() + 5, a.begin() + 10));
  std::vector<uint16_t> bb(4);
  f.read(f.at("b"), 0, 8, bb.data());
  EXPECT_EQ(bb, b);
  std::vector<int32_t> cc(2);
  f.read(f.at("c"), 0, 8, cc.data());
  EXPECT_EQ(cc, c);
  EXPECT_EQ(f.at("empty").numel(), 0);
  EXPECT_THROW(f.read(ta, 40, 40, row1.data()), Error);  // past the tensor's end
  EXPECT_THROW(f.at("missing"), Error);
}

TEST(Safetensors, EveryMalformedHeaderIsRefusedNamingTheFile) {
  const std::string ok = R"({"t":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
  ASSERT_EQ(error_of(write_raw("ok.safetensors", ok, 16)), "");
  struct Case {
    std::string name, header;
    size_t data;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"not_json", "{not json", 0, "not valid JSON"},
      {"not_object", "[1,2]", 0, "not a JSON object"},
      {"unknown_dtype", R"({"t":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})", 1,
       "unknown dtype"},
      {"negative_shape", R"({"t":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4,
       "not a non-negative integer"},
      {"size_mismatch", R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8,
       "shape and dtype F32 need 12"},
      {"out_of_range", R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8,
       "outside the 8 data bytes"},
      {"overlap", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                  R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12, "overlap"},
      {"hole", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
               R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})", 12, "hole"},
      {"trailing", ok, 20, "trailing bytes"},
      {"truncated", ok, 12, "outside the 12 data bytes"},
      {"missing_fields", R"({"t":{"dtype":"F32","shape":[1]}})", 0, "needs dtype, shape"},
      {"bad_metadata", R"({"__metadata__":{"k":1}})", 0, "is not a string"},
  };
  for (const Case& c : cases) {
    const std::string path = write_raw(c.name + ".safetensors", c.header, c.data);
    const std::string err = error_of(path);
    EXPECT_NE(err.find(path), std::string::npos) << c.name << ": " << err;
    EXPECT_NE(err.find(c.expect), std::string::npos) << c.name << ": " << err;
    EXPECT_EQ(err.find('\n'), std::string::npos) << c.name << ": one line";
  }
  // A header size beyond the file, and a file shorter than the size prefix.
  const std::string big = temp_path("big_header.safetensors");
  std::ofstream(big, std::ios::binary) << le64(1000) << "{}";
  EXPECT_NE(error_of(big).find("does not fit in the file"), std::string::npos) << error_of(big);
  const std::string tiny = temp_path("tiny.safetensors");
  std::ofstream(tiny, std::ios::binary) << "abc";
  EXPECT_NE(error_of(tiny).find("shorter than the 8-byte header size"), std::string::npos);
  EXPECT_NE(error_of(temp_path("absent.safetensors")).find("cannot open"), std::string::npos);
}

TEST(AtomicFile, AFailedWriteLeavesTheOldFileAndNoTempFile) {
  const std::string path = temp_path("atomic.txt");
  write_file_atomic(path, "old");
  set_write_budget_for_testing(4);  // a disk with 4 bytes free
  EXPECT_THROW(write_file_atomic(path, "new content"), Error);
  set_write_budget_for_testing(-1);
  EXPECT_EQ(read_whole_file(path), "old");
  for (const auto& e : std::filesystem::directory_iterator(temp_path("")))
    EXPECT_EQ(e.path().filename().string().find("atomic.txt.tmp"), std::string::npos)
        << e.path();
  {
    AtomicFile f(path);
    f.write("abandoned", 9);
  }  // never committed
  EXPECT_EQ(read_whole_file(path), "old");
  write_file_atomic(path, "new");
  EXPECT_EQ(read_whole_file(path), "new");
}

TEST(AtomicFile, CrcIsZlibCrc32) {
  EXPECT_EQ(crc32_of("123456789", 9), 0xCBF43926u);  // the standard check value
  EXPECT_EQ(crc32_of("56789", 5, crc32_of("1234", 4)), 0xCBF43926u);
}

}  // namespace
}  // namespace fsdp::io
