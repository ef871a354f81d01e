// Note [Checkpoint checksums], one check at a time: each test damages exactly what one check
// guards (a chunk of a tensor, a rank file's header, a size or checksum in COMPLETE, the index)
// and nothing else, so a check that stops covering its bytes fails its own test. The readers
// are the checkpoint's own: RowReader, open_checkpoint, and a resume through train_rank.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <functional>

#include "checkpoint/checkpoint_format.h"
#include "checkpoint/full_weights.h"
#include "checkpoint/row_reader.h"
#include "fsdp/error.h"
#include "io/file_io.h"
#include "io/safetensors.h"
#include "test_checkpoint_util.h"

namespace fsdp::testing {
namespace {

using checkpoint::kChunkBytes;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_ERROR_HAS(call, text)                                              \
  do {                                                                            \
    const std::string error_ = error_of([&] { call; });                           \
    EXPECT_NE(error_.find(text), std::string::npos) << "error: '" << error_ << "'"; \
  } while (0)

void xor_byte(const std::string& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  const char c = static_cast<char>(f.get() ^ 0x10);
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(c);
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// ---- chunk checksums of a file of full weights (what export writes and --init-from reads)

constexpr int64_t kCols = 1024;  // 4 KiB rows: 256 rows a chunk

struct WeightsFile {
  std::string path;
  uint64_t big_at = 0, small_at = 0;  // file offsets of the tensors' data
};

// "big": 640 rows (2.5 chunks: the last one half full), "small": one chunk of 3 rows.
WeightsFile weights_file(const std::string& name) {
  std::vector<float> big(640 * kCols), small(3 * kCols);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i % 977);
  for (size_t i = 0; i < small.size(); ++i) small[i] = -static_cast<float>(i);
  WeightsFile f;
  f.path = fresh_dir("integrity_" + name) + "/weights.safetensors";
  checkpoint::write_full_weights(f.path, {{"big", {640, kCols}, big.data()}, {"small", {3, kCols}, small.data()}},
                                 DType::F32);
  const io::SafetensorsFile file(f.path);
  f.big_at = file.header_bytes() + file.at("big").begin;
  f.small_at = file.header_bytes() + file.at("small").begin;
  return f;
}

std::vector<float> rows(const checkpoint::RowReader& r, const std::string& name, int64_t b, int64_t e) {
  std::vector<float> out(static_cast<size_t>((e - b) * kCols));
  r.read_rows(name, r.file().at(name).rows(), kCols, b, e, out);
  return out;
}

TEST(CheckpointIntegrity, ACorruptLastChunkFailsTheReadsThatCoverItAndNoOther) {
  const WeightsFile f = weights_file("last_chunk");
  xor_byte(f.path, f.big_at + 2 * kChunkBytes + 12345);  // inside the last (short) chunk
  const checkpoint::RowReader r(f.path);
  EXPECT_NO_THROW(rows(r, "big", 0, 512));  // chunks 0 and 1 only
  EXPECT_NO_THROW(rows(r, "small", 0, 3));
  EXPECT_ERROR_HAS(rows(r, "big", 600, 640),
                   "is corrupt: checksum mismatch in tensor 'big' at bytes [2097152, 2621440)");
  EXPECT_ERROR_HAS(rows(r, "big", 500, 520), "at bytes [2097152, 2621440)");  // spans chunks 1, 2
}

TEST(CheckpointIntegrity, ACorruptFirstOrMiddleChunkFailsTheReadsThatCoverIt) {
  for (uint64_t chunk : {0u, 1u}) {
    const WeightsFile f = weights_file("chunk_" + std::to_string(chunk));
    xor_byte(f.path, f.big_at + chunk * kChunkBytes + 7);
    const checkpoint::RowReader r(f.path);
    const int64_t row = static_cast<int64_t>(chunk) * 256;
    EXPECT_NO_THROW(rows(r, "big", chunk ? 0 : 256, chunk ? 256 : 512));
    EXPECT_ERROR_HAS(rows(r, "big", row, row + 1),
                     "at bytes [" + std::to_string(chunk * kChunkBytes) + ", " +
                         std::to_string((chunk + 1) * kChunkBytes) + ")");
  }
}

TEST(CheckpointIntegrity, ACorruptOneChunkTensorFailsItsReads) {
  const WeightsFile f = weights_file("one_chunk");
  xor_byte(f.path, f.small_at + 3 * kCols * 4 - 1);  // its last byte
  const checkpoint::RowReader r(f.path);
  EXPECT_NO_THROW(rows(r, "big", 0, 640));
  EXPECT_ERROR_HAS(rows(r, "small", 0, 1), "checksum mismatch in tensor 'small' at bytes [0, 12288)");
}

// A file whose metadata holds `crcs` (JSON text) under the chunk-checksum key, or none.
std::string file_with_crcs(const std::string& name, const std::string* crcs) {
  static const std::vector<float> a(10, 1.0f), b(4, 2.0f);
  const std::string path = fresh_dir("integrity_meta_" + name) + "/f.safetensors";
  std::map<std::string, std::string> meta{{"format", "pt"}};
  if (crcs) meta[checkpoint::kChunkCrcKey] = *crcs;
  io::write_safetensors(path, {{"a", "F32", {10}, a.data()}, {"b", "F32", {4}, b.data()}}, meta);
  return path;
}

std::string crc_list(const std::vector<uint32_t>& v) { return nlohmann::json(v).dump(); }

TEST(CheckpointIntegrity, AFileWithoutChunkChecksumsReadsAsAFileFromElsewhere) {
  const std::string path = file_with_crcs("none", nullptr);
  const checkpoint::RowReader r(path);
  EXPECT_FALSE(r.has_crcs());
  std::vector<float> a(10);
  r.read_rows("a", 10, 1, 0, 10, a);
  EXPECT_EQ(a, std::vector<float>(10, 1.0f));
}

TEST(CheckpointIntegrity, ATensorWithoutItsChunkChecksumsIsRefused) {
  const std::vector<float> a(10, 1.0f);
  const std::string only_a = "{\"a\":" + crc_list(checkpoint::chunk_crcs(a.data(), 40)) + "}";
  EXPECT_ERROR_HAS(checkpoint::RowReader(file_with_crcs("missing", &only_a)),
                   "has no chunk checksums for tensor 'b'");
}

TEST(CheckpointIntegrity, AWrongNumberOfChunkChecksumsIsRefused) {
  const std::vector<float> a(10, 1.0f), b(4, 2.0f);
  const std::string two = "{\"a\":" + crc_list(checkpoint::chunk_crcs(a.data(), 40)) + ",\"b\":" +
                          crc_list({checkpoint::chunk_crcs(b.data(), 16)[0], 0u}) + "}";
  EXPECT_ERROR_HAS(checkpoint::RowReader(file_with_crcs("count", &two)),
                   "b holds 2 chunk checksums, the tensor's 16 bytes need 1");
}

TEST(CheckpointIntegrity, UnreadableChunkChecksumsAreRefused) {
  const std::string not_json = "[1, 2", wrong_type = "{\"a\":\"x\",\"b\":[1]}";
  EXPECT_ERROR_HAS(checkpoint::RowReader(file_with_crcs("not_json", &not_json)),
                   "is corrupt: not valid JSON");
  EXPECT_ERROR_HAS(checkpoint::RowReader(file_with_crcs("wrong_type", &wrong_type)),
                   "a must be an array, not a string");
}

// ---- a sharded checkpoint: COMPLETE, index.json and the rank files' headers

// A 2-rank mlp checkpoint of step 2, made once per process (ctest runs tests in processes of
// their own, side by side); each test works on its own copy.
const std::string& saved() {
  static const std::string dir = [] {
    const std::string d = fresh_dir("integrity_saved_" + std::to_string(::getpid()));
    runtime::TrainConfig c = small_config("mlp");
    c.steps = 2;
    c.checkpoint.save_dir = d;
    run_fsdp(2, c);
    return d + "/step-000002";
  }();
  return dir;
}

std::string copy_of_saved(const std::string& name) {
  const std::string dir = fresh_dir("integrity_ckpt_" + name) + "/step-000002";
  std::filesystem::copy(saved(), dir, std::filesystem::copy_options::recursive);
  return dir;
}

runtime::TrainConfig resume_from(const std::string& dir) {
  runtime::TrainConfig c = small_config("mlp");
  c.steps = 3;
  c.checkpoint.resume = dir;
  return c;
}

// Rewrites COMPLETE after `edit`, with a valid checksum of its own.
void edit_marker(const std::string& dir, const std::function<void(checkpoint::CompleteMarker&)>& edit) {
  checkpoint::CompleteMarker m = checkpoint::read_complete_marker(dir);
  edit(m);
  write_text(dir + "/COMPLETE", checkpoint::complete_marker_text(m));
}

// Rewrites index.json after `edit`, and COMPLETE's record of it to match: only the index's own
// checks can object.
void edit_index(const std::string& dir, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json index = nlohmann::json::parse(read_file(dir + "/index.json"));
  edit(index);
  const std::string text = index.dump(1);
  write_text(dir + "/index.json", text);
  edit_marker(dir, [&](checkpoint::CompleteMarker& m) {
    m.files["index.json"] = {text.size(), text.size(), io::crc32_of(text.data(), text.size())};
  });
}

TEST(CheckpointIntegrity, TheUntouchedCopyLoads) {
  const std::string dir = copy_of_saved("untouched");
  EXPECT_NO_THROW(checkpoint::open_checkpoint(dir));
  EXPECT_NO_THROW(run_fsdp(2, resume_from(dir)));
  // The edits below rewrite files through these helpers; unedited, they change nothing a
  // load checks.
  edit_index(dir, [](nlohmann::json&) {});
  EXPECT_NO_THROW(run_fsdp(2, resume_from(dir)));
}

TEST(CheckpointIntegrity, AChangedMarkerFailsItsOwnChecksum) {
  const std::string dir = copy_of_saved("marker_crc");
  // A field no load reads: only the marker's checksum covers it.
  std::string text = read_file(dir + "/COMPLETE");
  text.insert(text.find('{') + 1, "\"note\": 1,");
  write_text(dir + "/COMPLETE", text);
  EXPECT_ERROR_HAS(checkpoint::open_checkpoint(dir), "COMPLETE' is corrupt: checksum mismatch");
}

TEST(CheckpointIntegrity, AMarkerOfAnotherFormatIsRefused) {
  const std::string dir = copy_of_saved("marker_format");
  std::string text = read_file(dir + "/COMPLETE");
  text.replace(text.find("fsdp-sharded-checkpoint"), 4, "fsdq");
  write_text(dir + "/COMPLETE", text);
  EXPECT_ERROR_HAS(checkpoint::open_checkpoint(dir), "COMPLETE' is not an fsdp checkpoint marker");
}

TEST(CheckpointIntegrity, AnIndexOfAnotherSizeIsRefused) {
  const std::string dir = copy_of_saved("index_size");
  const std::string text = read_file(dir + "/index.json");
  write_text(dir + "/index.json", text + " ");  // the same JSON, one byte longer
  EXPECT_ERROR_HAS(checkpoint::open_checkpoint(dir),
                   "index.json' holds " + std::to_string(text.size() + 1) + " bytes, COMPLETE says " +
                       std::to_string(text.size()));
}

TEST(CheckpointIntegrity, AnIndexChangedInPlaceFailsItsChecksum) {
  const std::string dir = copy_of_saved("index_crc");
  std::string text = read_file(dir + "/index.json");
  const size_t space = text.find(' ');
  ASSERT_NE(space, std::string::npos);
  text[space] = '\n';  // the same JSON, the same size: only the checksum sees it
  write_text(dir + "/index.json", text);
  EXPECT_ERROR_HAS(checkpoint::open_checkpoint(dir), "index.json' is corrupt: checksum mismatch");
}

TEST(CheckpointIntegrity, AnIndexOfAnotherVersionOrStepIsRefused) {
  const std::string version = copy_of_saved("index_version");
  edit_index(version, [](nlohmann::json& j) { j["version"] = 2; });
  EXPECT_ERROR_HAS(checkpoint::open_checkpoint(version),
                   "index.json' is not an fsdp checkpoint index of version 1");
  const std::string step = copy_of_saved("index_step");
  edit_index(step, [](nlohmann::json& j) { j["step"] = 3; });
  EXPECT_ERROR_HAS(checkpoint::open_checkpoint(step), "index.json' is for step 3, COMPLETE for step 2");
}

TEST(CheckpointIntegrity, ARankFileHeaderChangedInPlaceFailsTheHeaderChecksum) {
  const std::string dir = copy_of_saved("header_crc");
  // The same length and a valid header, the data and its chunk checksums untouched: only the
  // header's checksum in COMPLETE covers these bytes.
  std::string text = read_file(dir + "/rank-00001.safetensors");
  const size_t at = text.find("\"format\":\"pt\"");
  ASSERT_NE(at, std::string::npos);
  ASSERT_LT(at, 8 + 4096u) << "in the header";
  text.replace(at, 13, "\"format\":\"px\"");
  write_text(dir + "/rank-00001.safetensors", text);
  EXPECT_NO_THROW(checkpoint::open_checkpoint(dir));
  EXPECT_ERROR_HAS(run_fsdp(2, resume_from(dir)), "rank-00001.safetensors' is corrupt: header checksum mismatch");
}

TEST(CheckpointIntegrity, ARankFileHeaderOfAnotherLengthThanCompleteSaysIsRefused) {
  const std::string dir = copy_of_saved("header_bytes");
  edit_marker(dir, [](checkpoint::CompleteMarker& m) { m.files["rank-00000.safetensors"].crc_bytes -= 8; });
  EXPECT_ERROR_HAS(run_fsdp(2, resume_from(dir)), "rank-00000.safetensors' is corrupt: header checksum mismatch");
}

TEST(CheckpointIntegrity, ARankFileOfAnotherSizeThanCompleteSaysIsRefused) {
  const std::string dir = copy_of_saved("rank_bytes");
  uint64_t bytes = 0;
  edit_marker(dir, [&](checkpoint::CompleteMarker& m) { bytes = m.files["rank-00001.safetensors"].bytes++; });
  EXPECT_ERROR_HAS(run_fsdp(2, resume_from(dir)),
                   "rank-00001.safetensors' holds " + std::to_string(bytes) + " bytes, COMPLETE says " +
                       std::to_string(bytes + 1));
}

// A checkpoint's rank files must carry chunk checksums: one rewritten without them (the same
// tensors, COMPLETE's record of it made to match) is refused by the resume.
TEST(CheckpointIntegrity, ARankFileWithoutChunkChecksumsIsRefusedByTheResume) {
  const std::string dir = copy_of_saved("no_crcs");
  const std::string path = dir + "/rank-00000.safetensors";
  std::vector<std::vector<char>> data;
  std::vector<io::TensorToWrite> tensors;
  {
    const io::SafetensorsFile f(path);
    for (const io::TensorEntry& t : f.tensors()) {
      data.emplace_back(t.end - t.begin);
      f.read(t, 0, t.end - t.begin, data.back().data());
    }
    for (size_t i = 0; i < f.tensors().size(); ++i) {
      const io::TensorEntry& t = f.tensors()[i];
      tensors.push_back({t.name, t.dtype, t.shape, data[i].data()});
    }
    std::filesystem::remove(path);
    const io::WrittenFile w = io::write_safetensors(path, tensors, {{"format", "pt"}});
    edit_marker(dir, [&](checkpoint::CompleteMarker& m) {
      m.files["rank-00000.safetensors"] = {w.bytes, w.header_bytes, w.header_crc};
    });
  }
  EXPECT_ERROR_HAS(run_fsdp(2, resume_from(dir)),
                   "rank-00000.safetensors' has no chunk checksums (fsdp.chunk_crc32)");
}

TEST(CheckpointIntegrity, ACorruptRankFileChunkFailsTheResume) {
  const std::string dir = copy_of_saved("rank_chunk");
  const io::SafetensorsFile f(dir + "/rank-00000.safetensors");
  const io::TensorEntry& last = f.tensors().back();
  xor_byte(dir + "/rank-00000.safetensors", f.header_bytes() + last.end - 1);  // its last byte
  EXPECT_ERROR_HAS(run_fsdp(2, resume_from(dir)), "checksum mismatch in tensor '" + last.name + "'");
}

}  // namespace
}  // namespace fsdp::testing
