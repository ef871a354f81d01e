// Resume continues bitwise on the same world size; on another world size it reshards by rows
// and matches the uninterrupted run within fp32 rounding; each rank reads only its rows.
#include <gtest/gtest.h>

#include <functional>

#include "checkpoint/checkpoint_format.h"
#include "checkpoint/checkpoint_loader.h"
#include "fsdp/data.h"
#include "fsdp/error.h"
#include "io/safetensors.h"
#include "runtime/token_file_source.h"
#include "test_checkpoint_util.h"

namespace fsdp::testing {
namespace {

// The models resume is tested on: adding a model is one line here.
const std::vector<std::string> kResumeModels = {"mlp", "moe", "resmlp", "transformer"};

// Where the optimizer steps: after backward, in backward (the command's default schedule
// without clipping, with next-step prefetch), or in the next forward (Note [Optimizer in
// forward], with next-step prefetch: a save must run the pending updates first).
enum class StepAt { AfterBackward, InBackward, InForward };
struct ResumeCase {
  std::string kind;
  StepAt step_at;
};
const char* name_of(StepAt s) {
  return s == StepAt::AfterBackward ? "StepAfterBackward"
         : s == StepAt::InBackward  ? "OptimizerInBackward"
                                    : "OptimizerInForward";
}
void PrintTo(const ResumeCase& c, std::ostream* os) { *os << c.kind << " " << name_of(c.step_at); }

class Resume : public ::testing::TestWithParam<ResumeCase> {};

TEST_P(Resume, ContinuesBitwiseIdenticallyOnTheSameWorldSize) {
  const ResumeCase p = GetParam();
  runtime::TrainConfig c = small_config(p.kind);
  c.optimizer_in_backward = p.step_at == StepAt::InBackward;
  c.optimizer_in_forward = p.step_at == StepAt::InForward;
  c.prefetch_next_step = p.step_at != StepAt::AfterBackward;
  const int world = 3;
  const auto plain = run_fsdp(world, c);  // no checkpoints at all

  const std::string dir = fresh_dir("resume_" + p.kind + "_" + name_of(p.step_at));
  runtime::TrainConfig saving = c;
  saving.checkpoint.save_dir = dir;
  saving.checkpoint.save_every = 4;  // mid-run: step 4 of 6 (and the last step)
  const auto full = run_fsdp(world, saving);
  EXPECT_EQ(full[0].losses, plain[0].losses) << "saving changed the training";
  EXPECT_EQ(full[0].params, plain[0].params);

  runtime::TrainConfig resumed = c;
  resumed.checkpoint.resume = dir + "/step-000004";
  const auto rest = run_fsdp(world, resumed);
  ASSERT_EQ(rest[0].losses.size(), 2u);
  EXPECT_EQ(rest[0].losses[0], full[0].losses[4]);
  EXPECT_EQ(rest[0].losses[1], full[0].losses[5]);
  EXPECT_EQ(rest[0].params, full[0].params) << "resume must be bitwise identical";
}

std::vector<ResumeCase> resume_cases() {
  std::vector<ResumeCase> out;
  for (const std::string& kind : kResumeModels)
    for (StepAt at : {StepAt::AfterBackward, StepAt::InBackward, StepAt::InForward})
      out.push_back({kind, at});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Models, Resume, ::testing::ValuesIn(resume_cases()),
                         [](const auto& info) {
                           return info.param.kind + "_" + name_of(info.param.step_at);
                         });

struct ReshardCase {
  int save_world, load_world;
};
void PrintTo(const ReshardCase& c, std::ostream* os) {
  *os << c.save_world << " -> " << c.load_world;
}

class Reshard : public ::testing::TestWithParam<ReshardCase> {};

TEST_P(Reshard, MatchesTheUninterruptedRunWithinFp32Rounding) {
  const ReshardCase p = GetParam();
  const int global_tokens = 24;  // the same global batch on every world size
  runtime::TrainConfig c = small_config("moe");
  c.tokens = global_tokens / p.save_world;
  const std::string dir = fresh_dir("reshard_" + std::to_string(p.save_world) + "_to_" +
                                    std::to_string(p.load_world));
  c.checkpoint.save_dir = dir;
  c.checkpoint.save_every = 3;
  const auto full = run_fsdp(p.save_world, c);

  runtime::TrainConfig resumed = small_config("moe");
  resumed.tokens = global_tokens / p.load_world;
  resumed.checkpoint.resume = dir + "/step-000003";  // mid-run (the save dir's latest is 6)
  const auto rest = run_fsdp(p.load_world, resumed);
  EXPECT_LE(relative_error(rest[0].params, full[0].params), 1e-6);
  ASSERT_EQ(rest[0].losses.size(), 3u);
  for (int s = 0; s < 3; ++s)
    EXPECT_NEAR(rest[0].losses[s], full[0].losses[3 + s], 1e-6 * std::abs(full[0].losses[3 + s]));
}

INSTANTIATE_TEST_SUITE_P(Worlds, Reshard,
                         ::testing::Values(ReshardCase{4, 2}, ReshardCase{4, 3},
                                           ReshardCase{4, 8}, ReshardCase{2, 8}),
                         [](const auto& info) {
                           return "from" + std::to_string(info.param.save_world) + "to" +
                                  std::to_string(info.param.load_world);
                         });

TEST(ReshardReads, EachRankReadsOnlyTheChunksThatHoldItsRows) {
  // 1024 x 1024 weights: 1 MiB per tensor per saved rank of 4, half of that per loading rank
  // of 8, which reads the one 1 MiB chunk that holds its half (to verify its CRC).
  runtime::TrainConfig c;
  c.model.kind = "mlp";
  c.model.layers = 2;
  c.model.dim = 1024;
  c.tokens = 2;
  c.steps = 2;
  const std::string dir = fresh_dir("reshard_reads");
  c.checkpoint.save_dir = dir;
  c.checkpoint.save_every = 1;
  run_fsdp(4, c);
  uint64_t checkpoint_bytes = 0;
  for (int r = 0; r < 4; ++r)
    checkpoint_bytes += std::filesystem::file_size(dir + "/step-000001/" + checkpoint::rank_file_name(r));

  runtime::TrainConfig resumed = c;
  resumed.tokens = 1;
  resumed.checkpoint = {};
  resumed.checkpoint.resume = dir + "/step-000001";
  std::vector<uint64_t> read(8);
  runtime::run_cpu_ranks(8, {}, [&](int rank, Device& device, std::shared_ptr<Comm> comm) {
    const uint64_t before = io::thread_bytes_read();
    runtime::train_rank(device, comm, resumed);
    read[rank] = io::thread_bytes_read() - before;
  });
  const uint64_t needed = 2 * 3 * 128 * 1024 * 4;  // 2 layers x (param + 2 states) x its rows
  for (int r = 0; r < 8; ++r) {
    EXPECT_GE(read[r], needed) << "rank " << r;
    // The chunk around its rows (twice what it needs here) and the headers it checks.
    EXPECT_LE(read[r], 2 * needed + 64 * 1024) << "rank " << r;
    EXPECT_LT(read[r], checkpoint_bytes / 3) << "rank " << r << " read most of the checkpoint";
  }
}

// Saves after `save_at` of c.steps steps on `world` ranks, resumes there, and checks that the
// rest is bitwise the uninterrupted run: losses, lrs and params.
void expect_bitwise_resume(const runtime::TrainConfig& c, int world, int save_at,
                           const std::string& name) {
  const auto plain = run_fsdp(world, c);
  const std::string dir = fresh_dir(name);
  runtime::TrainConfig saving = c;
  saving.checkpoint.save_dir = dir;
  saving.checkpoint.save_every = save_at;
  const auto full = run_fsdp(world, saving);
  EXPECT_EQ(full[0].losses, plain[0].losses) << "saving changed the training";
  runtime::TrainConfig resumed = c;
  char step_dir[32];
  std::snprintf(step_dir, sizeof(step_dir), "/step-%06d", save_at);
  resumed.checkpoint.resume = dir + step_dir;
  const auto rest = run_fsdp(world, resumed);
  const size_t left = static_cast<size_t>(c.steps - save_at);
  ASSERT_EQ(rest[0].losses.size(), left);
  EXPECT_EQ(rest[0].losses, std::vector<float>(full[0].losses.begin() + save_at, full[0].losses.end()));
  EXPECT_EQ(rest[0].lrs, std::vector<float>(full[0].lrs.begin() + save_at, full[0].lrs.end()));
  EXPECT_EQ(rest[0].params, full[0].params) << "resume must be bitwise identical";
}

TEST(ResumeSchedule, TransformerContinuesBitwiseMidCosineSchedule) {
  runtime::TrainConfig c = small_config("transformer");
  c.steps = 8;
  c.optimizer.adamw.lr = 1e-2f;
  c.schedule = {"cosine", /*warmup_steps=*/3, /*min_lr=*/1e-3f, /*total_steps=*/8};
  const float lr5 = c.schedule.at(5, c.optimizer.base_lr());
  ASSERT_LT(lr5, c.optimizer.base_lr());  // past the warm-up, inside the decay
  ASSERT_GT(lr5, c.schedule.min_lr);
  expect_bitwise_resume(c, 2, 5, "resume_cosine");
}

TEST(ResumeData, TransformerContinuesBitwiseInsideTheSecondEpochOfTokenFiles) {
  // The first 200 tokens of the repo's corpus: 49 windows of 4 + 1 tokens; 3 ranks of 2
  // sequences take 6 a step, so an epoch is 8 steps and step 10 is inside the second.
  const data::TokenFile corpus(std::string(FSDP_SOURCE_DIR) + "/data/pydocs-4k/train.bin", 65536);
  const std::string dir = fresh_dir("resume_data_corpus");
  const std::string path = dir + "/train.bin";
  std::vector<uint32_t> first(200);
  corpus.read(0, 200, first.data());
  data::write_token_file(path, first, data::TokenDtype::kUint16);
  runtime::TrainConfig c = small_config("transformer");
  c.model.vocab = 4096;
  c.model.seq_len = 4;
  c.tokens = 8;
  c.steps = 13;
  c.batch_source = runtime::token_file_batches(path, c.model, c.seed);
  c.data_name = path;
  const data::BatchSampler sampler(std::make_shared<const data::TokenFile>(path, c.model.vocab),
                                   {2, 4, 3}, c.seed);
  ASSERT_EQ(sampler.steps_per_epoch(), 8);
  expect_bitwise_resume(c, 3, 10, "resume_data");
}

TEST(ResumeSchedule, AnotherScheduleOrDataIsStatedOnResume) {
  runtime::TrainConfig c = small_config("mlp");
  c.steps = 2;
  c.schedule = {"cosine", 0, 0.0f, 2};
  const std::string dir = fresh_dir("resume_stated");
  c.checkpoint.save_dir = dir;
  run_fsdp(2, c);
  checkpoint::RunDescription run{c.model, c.param_dtype, c.reduce_dtype, c.optimizer.kind, 2,
                                 c.tokens, c.seed, c.micro_batches, c.schedule,
                                 c.optimizer.base_lr(), c.data_name};
  const checkpoint::CheckpointIndex saved = checkpoint::open_checkpoint(dir + "/step-000002");
  EXPECT_TRUE(checkpoint::check_compatible(saved, checkpoint::run_config_json(run)).empty());
  run.schedule.total_steps = 10;  // a longer run: the cosine ends later
  run.data = "other/train.bin";
  const auto changes = checkpoint::check_compatible(saved, checkpoint::run_config_json(run));
  ASSERT_EQ(changes.size(), 2u);
  EXPECT_NE(changes[0].find("another lr_schedule"), std::string::npos) << changes[0];
  EXPECT_NE(changes[0].find("\"total_steps\":10"), std::string::npos) << changes[0];
  EXPECT_NE(changes[1].find("another data"), std::string::npos) << changes[1];
}

TEST(ResumeShape, TransformerHeadsAndSeqLenThatKeepEveryParamShapeAreRefused) {
  // 3 heads of 6 and 1 head of 18 give wqkv the same [54, 18]; so does any seq_len. Only the
  // run config tells them apart.
  runtime::TrainConfig c = small_config("transformer");
  c.model.kv_heads = 3;
  c.steps = 2;
  const std::string dir = fresh_dir("resume_heads");
  c.checkpoint.save_dir = dir;
  run_fsdp(2, c);
  for (const auto& [field, change] :
       std::vector<std::pair<std::string, std::function<void(nn::ModelConfig&)>>>{
           {"heads", [](nn::ModelConfig& m) { m.heads = m.kv_heads = 1; }},
           {"seq_len", [](nn::ModelConfig& m) { m.seq_len = 6; }}}) {
    runtime::TrainConfig resumed = c;
    resumed.checkpoint = {};
    resumed.checkpoint.resume = dir;
    resumed.steps = 3;
    change(resumed.model);
    try {
      run_fsdp(2, resumed);
      ADD_FAILURE() << field << ": the resume was not refused";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("another model shape: its " + field), std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace fsdp::testing
