// The safetensors reader and writer (Note [Safetensors validation]) and atomic files
// (Note [Atomic files]): round trips, byte-range reads, and every malformed header refused
// with an error that names the file.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "fsdp/error.h"
#include "io/file_io.h"
#include "io/safetensors.h"
#include "checkpoint/row_reader.h"
#include "io/checked_json.h"

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
      {"not_object", "[1,2]", 0, "must be an object"},
      {"unknown_dtype", R"({"t":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})", 1,
       "unknown dtype"},
      {"negative_shape", R"({"t":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4,
       "t.shape[0] must be an integer in [0, "},
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
      {"missing_fields", R"({"t":{"dtype":"F32","shape":[1]}})", 0, "t.data_offsets is missing"},
      {"bad_metadata", R"({"__metadata__":{"k":1}})", 0, "__metadata__.k must be a string"},
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
  EXPECT_EQ(read_bounded_file(path, 1024, "a test file"), "old");
  for (const auto& e : std::filesystem::directory_iterator(temp_path("")))
    EXPECT_EQ(e.path().filename().string().find("atomic.txt.tmp"), std::string::npos)
        << e.path();
  {
    AtomicFile f(path);
    f.write("abandoned", 9);
  }  // never committed
  EXPECT_EQ(read_bounded_file(path, 1024, "a test file"), "old");
  write_file_atomic(path, "new");
  EXPECT_EQ(read_bounded_file(path, 1024, "a test file"), "new");
}

TEST(AtomicFile, CrcIsZlibCrc32) {
  EXPECT_EQ(crc32_of("123456789", 9), 0xCBF43926u);  // the standard check value
  EXPECT_EQ(crc32_of("56789", 5, crc32_of("1234", 4)), 0xCBF43926u);
}

// Note [Shared readers]: rank threads that read one file share one parse of its header, for
// as long as any of them holds it; a file changed since is parsed anew.
TEST(Safetensors, ThreadsReadingOneFileShareOneParsedHeader) {
  const std::string path = temp_path("shared.safetensors");
  std::vector<float> a(64, 1.0f);
  write_safetensors(path, {{"a", "F32", {8, 8}, a.data()}}, {{"format", "pt"}});
  const uint64_t before = safetensors_headers_parsed();
  std::vector<std::shared_ptr<const checkpoint::RowReader>> readers(4);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < readers.size(); ++i)
    threads.emplace_back([&, i] { readers[i] = checkpoint::RowReader::open(path); });
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(safetensors_headers_parsed() - before, 1u);
  for (const auto& r : readers) EXPECT_EQ(r.get(), readers[0].get());
  readers.clear();  // no one holds it: the next open parses again
  auto again = checkpoint::RowReader::open(path);
  EXPECT_EQ(safetensors_headers_parsed() - before, 2u);
  std::vector<float> b(32, 2.0f);
  write_safetensors(path, {{"a", "F32", {4, 8}, b.data()}}, {{"format", "pt"}});  // a new file
  auto changed = checkpoint::RowReader::open(path);
  EXPECT_NE(changed.get(), again.get());
  EXPECT_EQ(changed->file().at("a").rows(), 4);
}

// The one reader of rows checks the file's dims against the destination's.
TEST(Safetensors, RowsAreReadOnlyIntoADestinationOfTheirShape) {
  const std::string path = temp_path("rows.safetensors");
  std::vector<float> a(16 * 1024, 0.5f);
  write_safetensors(path, {{"w", "F32", {16, 1024}, a.data()}}, {});
  const checkpoint::RowReader r(path);
  std::vector<float> dst(16 * 32);
  std::string err;
  try {
    r.read_rows("w", 16, 32, 0, 16, dst);
  } catch (const Error& e) {
    err = e.what();
  }
  EXPECT_EQ(err, "'" + path + "': tensor 'w' has shape [16, 1024], expected 16 rows of 32 (another "
                 "model shape, or a damaged or crafted file)");
  EXPECT_THROW(r.read_rows("w", 16, 1024, 8, 17, std::span<float>(a).subspan(0, 9 * 1024)), UserError);
  std::vector<float> row(1024);
  r.read_rows("w", 16, 1024, 3, 4, row);
  EXPECT_EQ(row, std::vector<float>(1024, 0.5f));
}

std::string json_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(CheckedJson, EveryErrorNamesTheFileAndTheKeyInPlainWords) {
  const JsonDocument doc = parse_json(R"({"a": {"b": [1, -2, "x"]}, "s": 5, "k\nl": 1})", "f.json");
  const JsonField root = doc.root();
  EXPECT_EQ(json_error([&] { root["missing"]; }), "'f.json': missing is missing");
  EXPECT_EQ(json_error([&] { root["a"]["b"].integers(8, 0, 10); }),
            "'f.json': a.b[1] must be an integer in [0, 10], not the integer -2");
  EXPECT_EQ(json_error([&] { root["s"].string(); }), "'f.json': s must be a string, not the integer 5");
  EXPECT_EQ(json_error([&] { root["a"]["b"].elements(2); }),
            "'f.json': a.b has 3 elements, more than the 2 it may have");
  EXPECT_EQ(json_error([&] { root["s"]["t"]; }), "'f.json': s must be an object, not the integer 5");
  EXPECT_EQ(json_error([&] { root["k\nl"].string(); }), "'f.json': k\\x0al must be a string, not the integer 1");
  EXPECT_EQ(json_error([&] { root["a"]["b"].elements(3)[2].unsigned_integer(9); }),
            "'f.json': a.b[2] must be an integer in [0, 9], not a string");
  EXPECT_EQ(root["a"]["b"].elements(3)[0].integer(0, 1), 1);
  // Text: invalid, too deep for a recursive reader, numbers past a double.
  EXPECT_NE(json_error([] { parse_json("{\"a\": ", "g.json"); }).find("'g.json' is corrupt: not valid JSON (at byte "), std::string::npos);
  EXPECT_EQ(json_error([] { parse_json(std::string(40, '[') + std::string(40, ']'), "g.json"); }),
            "'g.json' is corrupt: its JSON nests deeper than 32 levels");
  EXPECT_EQ(json_error([] { parse_json("\"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\"", "g.json"); }), "");
  EXPECT_NE(json_error([] { parse_json("[1e999]", "g.json"); }).find("'g.json' is corrupt: not valid JSON"),
            std::string::npos);
}

}  // namespace
}  // namespace fsdp::io
