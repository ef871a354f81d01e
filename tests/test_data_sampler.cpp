// The batch sampler (Note [Batch sampler]): determinism from (seed, step), epochs that visit
// every window once, per-rank slices whose union is the global batch, resumable state, fixed
// validation batches.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "fsdp/data.h"
#include "fsdp/error.h"

namespace {

using fsdp::data::BatchSampler;
using fsdp::data::BatchShape;
using fsdp::data::TokenFile;

// A file whose token i is i % 50000: a window's start is readable from its first token.
std::shared_ptr<const TokenFile> make_file(const std::string& name, int64_t n) {
  std::vector<uint16_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = static_cast<uint16_t>(i % 50000);
  const std::string path = ::testing::TempDir() + "sampler_" + name;
  fsdp::data::write_token_file(path, t);
  return std::make_shared<const TokenFile>(path, 50000);
}

// The same tokens, i % 50000 + offset, in a uint32 file: with offset 0 it must sample exactly
// like make_file's uint16 file; with a large one, ids past uint16 come through.
std::shared_ptr<const TokenFile> make_wide_file(const std::string& name, int64_t n,
                                                uint32_t offset) {
  std::vector<uint32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    t[static_cast<size_t>(i)] = static_cast<uint32_t>(i % 50000) + offset;
  const std::string path = ::testing::TempDir() + "sampler_" + name;
  fsdp::data::write_token_file(path, t, fsdp::data::TokenDtype::kUint32);
  return std::make_shared<const TokenFile>(path, 50000 + offset);
}

struct RankBatch {
  std::vector<int32_t> inputs, labels;
};

RankBatch fill(const BatchSampler& s, int64_t step, int rank) {
  const size_t n = static_cast<size_t>(s.shape().batch * s.shape().seq_len);
  RankBatch b{std::vector<int32_t>(n), std::vector<int32_t>(n)};
  s.fill(step, rank, b.inputs, b.labels);
  return b;
}

TEST(DataSampler, SplitMix64MatchesItsPublishedSequence) {
  uint64_t state = 0;
  EXPECT_EQ(fsdp::data::splitmix64_next(state), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(fsdp::data::splitmix64_next(state), 0x6E789E6AA1B965F4ull);
  EXPECT_EQ(fsdp::data::splitmix64_next(state), 0x06C45D188009454Full);
}

TEST(DataSampler, SameSeedAndStepGiveTheSameBatchOtherSeedsDoNot) {
  auto file = make_file("determinism.bin", 20000);
  const BatchShape shape{4, 16, 2};
  BatchSampler a(file, shape, 1234), b(file, shape, 1234), c(file, shape, 1235);
  for (int64_t step : {0, 1, 7, 500, 3}) {  // any order: a batch depends on (seed, step) only
    EXPECT_EQ(a.global_windows(step), b.global_windows(step)) << step;
    EXPECT_EQ(fill(a, step, 1).inputs, fill(b, step, 1).inputs) << step;
  }
  EXPECT_NE(a.global_windows(0), c.global_windows(0));
  EXPECT_NE(a.global_windows(0), a.global_windows(1));
}

TEST(DataSampler, Uint32FilesSampleLikeUint16FilesAndKeepWideIds) {
  auto narrow = make_file("narrow.bin", 20000);
  auto wide = make_wide_file("wide.bin", 20000, 0);
  auto wider = make_wide_file("wider.bin", 20000, 128256 - 50000);  // ids up to 128255
  const BatchShape shape{3, 16, 2};
  BatchSampler a(narrow, shape, 9), b(wide, shape, 9), c(wider, shape, 9);
  for (int64_t step : {0, 5, 400})
    for (int rank : {0, 1}) {
      const RankBatch x = fill(a, step, rank), y = fill(b, step, rank), z = fill(c, step, rank);
      EXPECT_EQ(x.inputs, y.inputs) << step;
      EXPECT_EQ(x.labels, y.labels) << step;
      for (size_t i = 0; i < x.inputs.size(); ++i) {
        EXPECT_EQ(z.inputs[i], x.inputs[i] + (128256 - 50000)) << i;
        EXPECT_EQ(z.labels[i], x.labels[i] + (128256 - 50000)) << i;
      }
    }
  fsdp::data::ValidationBatches v(wider, shape, 2);
  std::vector<int32_t> in(48), lab(48);
  v.fill(1, 1, in, lab);
  EXPECT_EQ(in[0], (6 + 3) * 16 + (128256 - 50000));  // batch 1, rank 1: window 9
}

TEST(DataSampler, InputsAreWindowsAndLabelsAreShiftedByOne) {
  auto file = make_file("windows.bin", 5000);
  BatchSampler s(file, {3, 32, 1}, 7);
  const std::vector<int64_t> windows = s.global_windows(5);
  RankBatch b = fill(s, 5, 0);
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t t = 0; t < 32; ++t) {
      EXPECT_EQ(b.inputs[i * 32 + t], windows[i] * 32 + t);
      EXPECT_EQ(b.labels[i * 32 + t], windows[i] * 32 + t + 1);
    }
}

TEST(DataSampler, EachEpochVisitsEveryWindowOnceThenReshuffles) {
  auto file = make_file("epochs.bin", 32 * 10 + 1 + 20);  // 10 windows of 32; 20 tokens spare
  BatchSampler s(file, {1, 32, 3}, 99);                 // G = 3: 3 steps per epoch, 1 dropped
  EXPECT_EQ(s.windows(), 10);
  EXPECT_EQ(s.steps_per_epoch(), 3);
  for (int64_t epoch = 0; epoch < 4; ++epoch) {
    std::vector<int64_t> seen;
    for (int64_t step = epoch * 3; step < epoch * 3 + 3; ++step)
      for (int64_t w : s.global_windows(step)) seen.push_back(w);
    std::vector<uint32_t> perm = fsdp::data::epoch_permutation(99, epoch, 10);
    EXPECT_EQ(seen, std::vector<int64_t>(perm.begin(), perm.begin() + 9)) << epoch;
    std::sort(perm.begin(), perm.end());
    for (uint32_t i = 0; i < 10; ++i) EXPECT_EQ(perm[i], i);
  }
  EXPECT_NE(fsdp::data::epoch_permutation(99, 0, 10), fsdp::data::epoch_permutation(99, 1, 10));
}

TEST(DataSampler, RankSlicesTileTheGlobalBatchForWorldSizes124) {
  auto file = make_file("slices.bin", 40000);
  const int64_t global = 8, seq = 16;
  BatchSampler reference(file, {global, seq, 1}, 5);
  for (int world : {1, 2, 4}) {
    BatchSampler s(file, {global / world, seq, world}, 5);
    for (int64_t step : {0, 3, 400}) {
      ASSERT_EQ(s.global_windows(step), reference.global_windows(step)) << world;
      RankBatch whole = fill(reference, step, 0);
      std::vector<int32_t> joined_inputs, joined_labels;
      for (int r = 0; r < world; ++r) {
        RankBatch part = fill(s, step, r);
        joined_inputs.insert(joined_inputs.end(), part.inputs.begin(), part.inputs.end());
        joined_labels.insert(joined_labels.end(), part.labels.begin(), part.labels.end());
      }
      EXPECT_EQ(joined_inputs, whole.inputs) << "world " << world << " step " << step;
      EXPECT_EQ(joined_labels, whole.labels) << "world " << world << " step " << step;
    }
  }
}

// Rank threads sharing one sampler, each in another epoch at times, read what a private
// sampler reads.
TEST(DataSampler, RankThreadsCanShareOneSampler) {
  auto file = make_file("threads.bin", 16 * 40 + 1);  // 40 windows; G = 4: 10 steps per epoch
  const BatchShape shape{1, 16, 4};
  BatchSampler shared(file, shape, 11);
  std::vector<std::vector<int32_t>> got(4), want(4);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 4; ++r)
    ranks.emplace_back([&, r] {
      for (int64_t i = 0; i < 60; ++i) {
        const int64_t step = (r % 2 == 0) ? i : 59 - i;  // half the ranks walk backwards
        RankBatch b = fill(shared, step, r);
        got[r].insert(got[r].end(), b.inputs.begin(), b.inputs.end());
      }
    });
  for (std::thread& t : ranks) t.join();
  for (int r = 0; r < 4; ++r) {
    BatchSampler own(file, shape, 11);
    for (int64_t i = 0; i < 60; ++i) {
      RankBatch b = fill(own, (r % 2 == 0) ? i : 59 - i, r);
      want[r].insert(want[r].end(), b.inputs.begin(), b.inputs.end());
    }
    EXPECT_EQ(got[r], want[r]) << "rank " << r;
  }
}

TEST(DataSampler, NextAdvancesAndRestoreResumes) {
  auto file = make_file("resume.bin", 3000);
  BatchSampler s(file, {2, 8, 2}, 3);
  const int64_t per_epoch = s.steps_per_epoch();
  std::vector<int32_t> in(16), lab(16);
  for (int64_t i = 0; i < per_epoch + 2; ++i) s.next(1, in, lab);
  const fsdp::data::SamplerState st = s.state();
  EXPECT_EQ(st.step, per_epoch + 2);
  EXPECT_EQ(st.epoch, 1);

  BatchSampler resumed(file, {2, 8, 2}, 3);
  resumed.restore(st);
  std::vector<int32_t> in2(16), lab2(16);
  s.next(1, in, lab);
  resumed.next(1, in2, lab2);
  EXPECT_EQ(in, in2);
  EXPECT_EQ(lab, lab2);

  // The same state against another batch shape names the mismatch in one line.
  BatchSampler other(file, {4, 8, 2}, 3);
  try {
    other.restore(st);
    FAIL() << "restore accepted a state from another batch shape";
  } catch (const fsdp::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("does not match"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

TEST(DataSampler, FewerTokensThanOneGlobalBatchFailsInOneLine) {
  auto file = make_file("too_short.bin", 64);  // 3 windows of 16 + 1
  EXPECT_NO_THROW(BatchSampler(file, {3, 16, 1}, 0));
  try {
    BatchSampler(file, {2, 16, 2}, 0);
    FAIL() << "a batch larger than the file was accepted";
  } catch (const fsdp::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(file->path() + ": 64 tokens, fewer than the 65 that one global batch "
                                      "(2 ranks x 2 sequences x 16 tokens, + 1) needs"),
              std::string::npos) << msg;
  }
}

TEST(DataSampler, ValidationBatchesAreTheFirstWindowsInOrder) {
  auto file = make_file("val.bin", 16 * 20 + 1);  // 20 windows
  fsdp::data::ValidationBatches v(file, {2, 16, 2}, 100);
  EXPECT_EQ(v.count(), 5);  // 20 windows / G = 4, capped by what exists
  std::vector<int32_t> in(32), lab(32);
  for (int64_t k = 0; k < v.count(); ++k)
    for (int r = 0; r < 2; ++r) {
      v.fill(k, r, in, lab);
      for (int64_t b = 0; b < 2; ++b) {
        const int64_t window = k * 4 + r * 2 + b;
        EXPECT_EQ(in[b * 16], window * 16);
        EXPECT_EQ(lab[b * 16 + 15], window * 16 + 16);
      }
    }
  EXPECT_EQ(fsdp::data::ValidationBatches(file, {2, 16, 2}, 3).count(), 3);
}

std::string run_command(const std::string& cmd, int* status) {
  FILE* pipe = popen((cmd + " 2>&1").c_str(), "r");
  std::string out;
  if (pipe == nullptr) return out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), pipe)) out.append(buf.data(), n);
  *status = pclose(pipe);
  return out;
}

// bench/llm_data.py (the sampler bench/torch_llama.py uses) gives the same windows as this
// one, over several epochs, for two seeds and a split over ranks, from files of both layouts
// (one Python process for all of them: its start is most of the cost).
TEST(DataSampler, PythonSamplerOfTheBenchGivesTheSameWindows) {
  if (std::system("python3 -c 'pass' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "python3 is not installed: bench/llm_data.py is not checked";
  const auto narrow = make_file("python.bin", 16 * 50 + 5);  // 50 windows of 16
  const auto wide = make_wide_file("python_u32.bin", 16 * 50 + 5, 100000);
  const std::string script = ::testing::TempDir() + "sampler_windows.py";
  std::ofstream(script)
      << "import json, sys\n"
         "sys.path.insert(0, '" FSDP_SOURCE_DIR
         "/bench')\n"
         "import llm_data\n"
         "out = []\n"
         "for path, vocab, seed in json.loads(sys.argv[1]):\n"
         "    t = llm_data.read_token_file(path, vocab)\n"
         "    s = llm_data.BatchSampler(len(t), 3, 16, 2, seed, path)\n"
         "    out.append({'token_dtype': llm_data.token_dtype(t), 'windows': s.windows,\n"
         "                'steps_per_epoch': s.steps_per_epoch,\n"
         "                'global_windows': [s.global_windows(k) for k in range(30)]})\n"
         "print(json.dumps(out))\n";
  const std::vector<uint64_t> seeds = {0ull, 0xFEDCBA9876543210ull};
  nlohmann::json runs = nlohmann::json::array();
  for (const auto& file : {narrow, wide})
    for (uint64_t seed : seeds) runs.push_back({file->path(), file->vocab(), seed});
  int status = -1;
  const std::string out = run_command("python3 " + script + " '" + runs.dump() + "'", &status);
  ASSERT_EQ(status, 0) << out;
  const nlohmann::json j = nlohmann::json::parse(out);
  ASSERT_EQ(j.size(), 4u);
  size_t k = 0;
  for (const auto& [file, dtype] : {std::pair{narrow, "uint16"}, std::pair{wide, "uint32"}})
    for (uint64_t seed : seeds) {
      const BatchSampler s(file, {3, 16, 2}, seed);  // G = 6: 8 steps per epoch
      const nlohmann::json& r = j[k++];
      EXPECT_EQ(r["token_dtype"], dtype);
      EXPECT_EQ(r["windows"], s.windows());
      EXPECT_EQ(r["steps_per_epoch"], s.steps_per_epoch());
      for (int64_t step = 0; step < 30; ++step)
        EXPECT_EQ(r["global_windows"][step].get<std::vector<int64_t>>(), s.global_windows(step))
            << dtype << " seed " << seed << " step " << step;
    }
}

// The Python reader refuses what TokenFile refuses, with the same one line.
TEST(DataSampler, PythonReaderRefusesAHeaderOfNeitherLayoutInOneLine) {
  if (std::system("python3 -c 'pass' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "python3 is not installed: bench/llm_data.py is not checked";
  const std::string path = ::testing::TempDir() + "sampler_bad_magic.bin";
  std::vector<int32_t> header(256, 0);
  header[0] = 20240521;
  header[1] = 1;
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(header.data()), 1024);
  int status = -1;
  const std::string out =
      run_command("python3 " FSDP_SOURCE_DIR "/bench/llm_data.py check " + path, &status);
  EXPECT_NE(status, 0);
  EXPECT_EQ(out, "llm_data: error: " + path +
                     ": not a token file: magic 20240521, expected "
                     "20240520 (llm.c's uint16 layout) or 20240801 (its uint32 layout)\n");
}

}  // namespace
