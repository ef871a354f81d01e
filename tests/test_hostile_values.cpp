// Values that used to pass, and errors that read like crashes: negative sizes where 0 means the
// default, seeds outside uint64, save settings with nowhere to save, sizes beyond any real
// model (refused by the library's own check, in its terms, before anything is allocated), and
// running out of device memory (Note [Out of memory]): one plain line with the peak so far and
// what to try, and the summary still written.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "command_util.h"
#include "fsdp/out_of_memory.h"
#include "test_checkpoint_util.h"

namespace fsdp::testing {
namespace {

CommandResult run_bounded(const std::string& args) {
  return run_fsdp_command_prefixed("timeout -k 5 60 ", args);
}

void expect_one_line_error(const CommandResult& r, const std::vector<std::string>& expect,
                           int code = 1) {
  EXPECT_EQ(r.code, code) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_EQ(r.output.find(".cpp:"), std::string::npos) << "a source location: " << r.output;
  for (const std::string& e : expect)
    EXPECT_NE(r.output.find(e), std::string::npos) << e << ": " << r.output;
}

const std::string kTrain = "train --backend cpu --world-size 2 --steps 1 --quiet ";

TEST(HostileValues, NegativeSizesWhereZeroMeansTheDefaultAreRefused) {
  for (const auto& [flags, expect] : std::vector<std::pair<std::string, std::string>>{
           {"--model transformer --kv-heads -1", "--kv-heads must be >= 0 (0: as many as the heads), got -1"},
           {"--model transformer --ffn-dim -5", "--ffn-dim must be >= 0"},
           {"--model resmlp --hidden -3", "--hidden must be >= 0"},
           {"--model moe-transformer --expert-ffn-dim -1", "--expert-ffn-dim must be >= 0"}}) {
    SCOPED_TRACE(flags);
    expect_one_line_error(run_bounded(kTrain + flags), {expect});
  }
}

TEST(HostileValues, SeedsOutsideUint64AreRefusedNotWrapped) {
  for (const std::string seed : {"-1", "18446744073709551616", "99999999999999999999999", "1e3", "0x10"}) {
    SCOPED_TRACE(seed);
    expect_one_line_error(run_bounded(kTrain + "--seed " + seed),
                          {"--seed: must be an integer in [0, 18446744073709551615], got '" + seed + "'"},
                          2);
  }
  const CommandResult largest = run_bounded(kTrain + "--seed 18446744073709551615");
  EXPECT_EQ(largest.code, 0) << largest.output;
  const CommandResult prepare = run_bounded("prepare-data --input /nonexistent --out /nonexistent --seed -1");
  expect_one_line_error(prepare, {"--seed: must be an integer"}, 2);
}

TEST(HostileValues, SaveSettingsWithNowhereToSaveAreRefused) {
  expect_one_line_error(run_bounded(kTrain + "--save-every 1"),
                        {"--save-every 1 needs a directory to save to"});
  expect_one_line_error(run_bounded(kTrain + "--keep-last 2"),
                        {"--keep-last 2 needs a directory to save to"});
  expect_one_line_error(run_bounded(kTrain + "--save-every -1 --save-dir /tmp/unused"),
                        {"--save-every must be >= 0"});
}

// A bad value is named as itself, not as another flag it makes look wrong.
TEST(HostileValues, ABadValueIsNamedAsItself) {
  expect_one_line_error(run_bounded("train --backend cpu --quiet --steps 0"), {"--steps must be >= 1, got 0"});
  expect_one_line_error(run_bounded(kTrain + "--model moe-transformer --capacity-factor nan"),
                        {"--capacity-factor must be a finite number, got nan"});
}

// The library refuses the same in its own terms (an OptionError naming the API's option), so a
// program that is not the command line gets the same protection.
std::string option_refused(const runtime::TrainConfig& c) {
  try {
    runtime::check_train_config(c, 2);
  } catch (const OptionError& e) {
    // "option:" and the rest of the message after that name.
    const std::string text = e.spelled([](const std::string& name) { return name; });
    const bool leads = text.compare(0, e.option().size(), e.option()) == 0;
    return e.option() + ":" + (leads ? text.substr(e.option().size()) : text);
  } catch (const UserError& e) {
    return std::string("-:") + e.what();
  }
  return "";
}

TEST(HostileValues, TheLibraryRefusesAbsurdSizesInItsOwnTermsBeforeBuildingAnything) {
  struct Case {
    std::function<void(runtime::TrainConfig&)> set;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {[](auto& c) { c.model.layers = 2147483647; }, "layers: 2147483647 is beyond any real model"},
      {[](auto& c) { c.model.dim = int64_t{1} << 62; }, "dim: 4611686018427387904 is beyond any real model"},
      {[](auto& c) { c.model.kind = "transformer"; c.model.kv_heads = -1; }, "kv_heads: must be >= 0"},
      {[](auto& c) { c.model.kind = "transformer"; c.model.ffn_dim = -5; }, "ffn_dim: must be >= 0"},
      {[](auto& c) { c.model.kind = "transformer"; c.model.vocab = int64_t{1} << 40; }, "vocab: "},
      {[](auto& c) { c.model.experts = 1 << 30; }, "experts: "},
      {[](auto& c) { c.model.capacity_factor = 1e300; }, "capacity_factor: "},
      {[](auto& c) { c.tokens = int64_t{1} << 40; }, "tokens: 1099511627776 is beyond any real run"},
      {[](auto& c) { c.rs_max_input_buffers = 1 << 30; }, "reduce_scatter_max_input_buffers: "},
      // Each size in range, their product not: the model's parameters, then a step's activations.
      {[](auto& c) { c.model.layers = 16384; c.model.dim = 262144; }, "-:the model's sizes come to about"},
      {[](auto& c) {
         c.model.kind = "transformer";
         c.model.dim = 8192;
         c.model.heads = 64;
         c.model.layers = 100;
         c.model.seq_len = 4096;
         c.tokens = int64_t{1} << 32;
       },
       "-:a step of 4294967296 tokens through this model keeps about"},
      {[](auto& c) { c.checkpoint.save_every = 1; }, "save_every: 1 needs a directory to save to"},
      {[](auto& c) { c.checkpoint.keep_last = 2; }, "keep_last: 2 needs a directory to save to"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(i);
    runtime::TrainConfig c = small_config("mlp");
    cases[i].set(c);
    const std::string got = option_refused(c);
    EXPECT_EQ(got.rfind(cases[i].expect, 0), 0u) << got;
  }
  EXPECT_EQ(option_refused(small_config("mlp")), "");
}

TEST(HostileValues, TheCommandMapsTheLibrarysSizeChecksToItsFlags) {
  for (const auto& [flags, expect] : std::vector<std::pair<std::string, std::string>>{
           {"--layers 2147483647", "--layers 2147483647 is beyond any real model: at most 16384"},
           {"--model transformer --vocab 3000000000", "--vocab 3000000000 is beyond any real model"},
           {"--world-size 2147483647", "--world-size 2147483647 is outside 1..1048576"}}) {
    SCOPED_TRACE(flags);
    expect_one_line_error(run_bounded("train --backend cpu --steps 1 " + flags), {expect});
  }
}

// Note [Out of memory], on the CPU backend with a device of limited memory: the allocation
// that does not fit ends the run in one line with what would fit, and the summary is written.
TEST(HostileValues, OutOfDeviceMemoryIsOneLineWithThePeakAndWhatToTry) {
  const std::string json = fresh_dir("values_oom") + "/summary.json";
  const CommandResult r = run_bounded(
      "train --backend cpu --world-size 2 --model transformer --dim 64 --layers 2 --seq-len 64 "
      "--tokens 2048 --steps 2 --quiet --cpu-memory-mib 4 --json " + json);
  expect_one_line_error(r, {"out of memory on cpu:", " for activation did not fit beside the ",
                            " in use of the device's 4.0 MiB; the run's peak so far: ",
                            "; the budget: 4.0 MiB (the device's); what would fit: "
                            "--activation-checkpointing "});
  ASSERT_TRUE(std::filesystem::exists(json)) << r.output;
  const nlohmann::json summary = nlohmann::json::parse(read_file(json));
  EXPECT_NE(summary.value("error", std::string()).find("out of memory on cpu:"), std::string::npos)
      << summary.dump();
  EXPECT_EQ(summary["steps_done"], 0);
  // The same run with room enough trains.
  const CommandResult fits = run_bounded(
      "train --backend cpu --world-size 2 --model transformer --dim 64 --layers 2 --seq-len 64 "
      "--tokens 2048 --steps 2 --quiet --cpu-memory-mib 1024");
  EXPECT_EQ(fits.code, 0) << fits.output;
}

TEST(HostileValues, TheLibraryRaisesOutOfMemoryErrorInItsOwnTerms) {
  runtime::TrainConfig c = small_config("transformer");
  c.model.seq_len = 8;
  c.tokens = 64;
  cpu::CpuOptions options;
  options.memory_capacity_bytes = 64 << 10;
  try {
    run_fsdp(2, c, options);
    FAIL() << "a run larger than its devices trained";
  } catch (const OutOfMemoryError& e) {
    const std::string m = e.what();
    EXPECT_EQ(e.capacity(), 64 << 10);
    EXPECT_LE(e.live(), e.capacity());
    EXPECT_GT(e.live() + static_cast<int64_t>(e.requested()), e.capacity()) << m;
    EXPECT_NE(m.find("of the device's 64.0 KiB; the run's peak so far: "), std::string::npos) << m;
    // What would fit, in the API's names: nothing, on a device this small.
    EXPECT_NE(m.find("; the budget: 64.0 KiB (the device's); no checkpointing, micro-batches, "
                     "reduce_scatter_max_input_buffers or reshard_after_forward fits it (the "
                     "least: "),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("with activation_checkpointing full micro_batches "), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace fsdp::testing
