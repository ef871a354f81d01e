// The root's reshard_after_forward and unshard() before the first forward, against FSDP2's
// rules and counts (fully_shard in PyTorch 2.11).
#include <gtest/gtest.h>

#include <optional>

#include "fsdp/error.h"
#include "test_fsdp_loop.h"
#include "test_util.h"

namespace fsdp::testing {
namespace {

// FSDP2's test_gradient_accumulation model: nn.Sequential(Linear, MLP x 3) with fully_shard
// on each MLP, then on the root, which so holds the first Linear. Here a block is Linear+ReLU.
class RootLinearChain : public LoopModel {
 public:
  RootLinearChain(int blocks, int64_t dim) : LoopModel("RootLinearChain"), dim_(dim) {
    first_ = &add_child("0", std::make_unique<nn::Linear>(dim, dim, false, 400));
    for (int i = 0; i < blocks; ++i) {
      auto block = std::make_unique<nn::Sequential>();
      block->append(std::make_unique<nn::Linear>(dim, dim, false, 401 + i));
      block->append(std::make_unique<nn::Act>(Activation::ReLU));
      blocks_.push_back(&add_child(std::to_string(i + 1), std::move(block)));
    }
  }
  std::vector<Module*> units() override { return blocks_; }
  int64_t dim() const override { return dim_; }

 protected:
  Tensor forward_impl(RunContext& ctx, const Tensor& x) override {
    Tensor h = first_->forward(ctx, x);
    for (Module* b : blocks_) h = b->forward(ctx, h);
    return h;
  }
  Tensor backward_impl(RunContext& ctx, const Tensor& dy, bool input_grad) override {
    Tensor g = dy;
    for (size_t i = blocks_.size(); i-- > 0;) g = blocks_[i]->backward(ctx, g, true);
    return first_->backward(ctx, g, input_grad);
  }

 private:
  int64_t dim_;
  Module* first_;
  std::vector<Module*> blocks_;
};

ModelFactory root_linear_chain(int blocks) {
  return [blocks] { return std::make_unique<RootLinearChain>(blocks, 8); };
}

int64_t issued(const LoopResult& r, int rank, CollectiveKind k) {
  return r.issued[rank][static_cast<int>(k)];
}

std::string name_of(std::optional<bool> root) {
  return root ? (*root ? "root true" : "root false") : "root unset";
}

// FSDP2's rule (fully_shard's reshard_after_forward docs, FSDPState._lazy_init): left unset,
// the root does not reshard after forward, since backward would gather it again at once; set
// on the root (fully_shard's option, or set_reshard_after_forward), it is honoured. FSDP2's
// test passes reshard_after_forward=True to every fully_shard call, the root's included, and
// (since PyTorch 2.8) expects the root's backward all-gather with it. Per micro-batch, blocks
// resharding: forward gathers the 3 blocks and the root (4); backward the 3 blocks again
// (3), plus the root when it resharded (4). Each micro-batch's backward reshards every unit
// (reshard_after_backward), so each micro-batch gathers anew: 21 or 24 a step. Gradient sync
// runs on the last micro-batch only: one reduce-scatter per unit a step.
TEST(RootReshard, GradientAccumulationWithAParamOnTheRootCountsAsFsdp2) {
  const int blocks = 3, micro_batches = 3, steps = 2;
  const ModelFactory make = root_linear_chain(blocks);
  LoopOptions o;
  o.steps = steps;
  o.micro_batches = micro_batches;
  o.reshard_after_forward = true;
  const LoopResult ref = run_reference_loop(make, o);
  struct Case {
    std::optional<bool> root;
    int64_t all_gathers_per_step;
  };
  for (const Case& c : {Case{std::nullopt, 3 * (4 + 3)}, Case{false, 3 * (4 + 3)},
                        Case{true, 3 * (4 + 4)}}) {
    o.root_reshard_after_forward = c.root;
    const LoopResult got = run_sharded_loop(make, o);
    for (int rank = 0; rank < o.world; ++rank) {
      EXPECT_EQ(issued(got, rank, CollectiveKind::AllGather), steps * c.all_gathers_per_step)
          << name_of(c.root) << ", rank " << rank;
      EXPECT_EQ(issued(got, rank, CollectiveKind::ReduceScatter), steps * (blocks + 1))
          << name_of(c.root);
    }
    expect_matches_reference(got, ref, 1e-5, name_of(c.root));
  }
}

// The same rule through set_reshard_after_forward on the root after fully_shard: an explicit
// true reshards the root; not recursive, so the blocks keep their own setting (false here).
TEST(RootReshard, SetReshardAfterForwardOnTheRootIsExplicit) {
  LoopOptions o;
  o.steps = 1;
  o.micro_batches = 2;
  o.reshard_after_forward = false;
  o.customize = [](LoopModel&, FsdpModule& root) {
    root.set_reshard_after_forward(true, /*recurse=*/false);
  };
  const LoopResult got = run_sharded_loop(root_linear_chain(3), o);
  // Per micro-batch: forward 4; backward only the root (1).
  EXPECT_EQ(issued(got, 0, CollectiveKind::AllGather), 2 * (4 + 1));
}

// All-gathers of each whole step (every micro-batch) on each rank, through the trainer, as
// `fsdp train` shards: blocks with --reshard-after-forward, the root with FSDP2's default.
std::vector<std::vector<int64_t>> all_gathers_by_step(runtime::TrainConfig c, int world) {
  std::vector<std::vector<int64_t>> by_rank(world);
  c.after_step = [&by_rank](runtime::TrainState& s) {
    const Mesh& mesh = s.root.state().mesh;
    const int64_t total = mesh.comm().issued(CollectiveKind::AllGather);
    std::vector<int64_t>& mine = by_rank[mesh.rank()];
    int64_t before = 0;
    for (int64_t n : mine) before += n;
    mine.push_back(total - before);
  };
  run_fsdp(world, c);
  return by_rank;
}

// The transformer's root holds the embedding, the final norm and the head (2 x vocab x dim
// params: 1 GiB in bf16 at a 128k vocab and width 4096). FSDP2 keeps it gathered from its
// forward to its backward: per micro-batch L + 1 all-gathers in forward and L in backward,
// so 2L + 1 (33 for Llama-3.2-1B's 16 layers); each micro-batch's backward reshards it, so
// N micro-batches gather N (2L + 1).
TEST(RootReshard, TransformerGathersItsRootOncePerMicroBatch) {
  struct Case {
    int layers, micro_batches;
  };
  for (const Case& k : {Case{2, 1}, Case{2, 4}, Case{16, 1}}) {
    runtime::TrainConfig c = tiny_transformer_config(/*steps=*/2);
    c.model.layers = k.layers;
    c.model.dim = 16;
    c.model.heads = 2;
    c.model.kv_heads = 1;
    c.model.ffn_dim = 16;
    c.model.seq_len = 4;
    c.tokens = 4;  // per micro-batch: one sequence
    c.micro_batches = k.micro_batches;
    c.collect_params = false;
    const int64_t expected = k.micro_batches * (2 * k.layers + 1);
    for (const std::vector<int64_t>& steps : all_gathers_by_step(c, 2))
      EXPECT_EQ(steps, std::vector<int64_t>(2, expected))
          << k.layers << " layers, " << k.micro_batches << " micro-batches";
  }
}

// ---- Note [Unshard before forward]

// FSDP2's test_1f1b_microbatching: reshard_after_forward=False everywhere, and every module's
// unshard(async_op=True) before the first forward, which initializes FSDP there. Those
// all-gathers are the first forward's own: the counts and the training are unchanged.
TEST(UnshardBeforeForward, AsyncUnshardOfEveryModuleTrainsAsWithout) {
  const ModelFactory make = root_linear_chain(3);
  LoopOptions o;
  o.steps = 2;
  o.micro_batches = 3;
  o.reshard_after_forward = false;
  o.root_reshard_after_forward = false;
  const LoopResult ref = run_reference_loop(make, o);
  const LoopResult plain = run_sharded_loop(make, o);
  o.before_forward = [](LoopModel& m, FsdpModule& root, int step, int mb) {
    if (step != 0 || mb != 0) return;
    for (Module* u : m.units()) fsdp_module_of(*u)->unshard(/*async_op=*/true);
    root.unshard(/*async_op=*/true);
    EXPECT_TRUE(root.is_root());
  };
  const LoopResult got = run_sharded_loop(make, o);
  expect_matches_reference(got, ref, 1e-5, "unshard before forward");
  EXPECT_EQ(got.params, plain.params);
  for (int rank = 0; rank < o.world; ++rank)
    EXPECT_EQ(issued(got, rank, CollectiveKind::AllGather),
              issued(plain, rank, CollectiveKind::AllGather));
}

// A synchronous unshard() of a block before any forward: its params hold their full values
// (those of an unsharded copy of the model) at once, on any stream; reshard() drops them, and
// training then runs as usual.
TEST(UnshardBeforeForward, SyncUnshardGathersTheFullParams) {
  runtime::run_cpu_ranks(2, {}, [](int rank, Device& d, std::shared_ptr<Comm> comm) {
    const Stream s = d.create_stream("compute", StreamPriority::Normal);
    RunContext ctx{&d, s, DType::F32};
    Mesh mesh("dp", d, comm);
    RootLinearChain model(3, 5);  // 5 rows over 2 ranks: padded shards
    RootLinearChain fresh(3, 5);  // never sharded: its init values are the full params
    for (Module* u : model.units()) fully_shard(*u, mesh);
    FsdpModule& root = fully_shard(model, mesh);
    Module& block = *model.units()[1];
    fsdp_module_of(block)->unshard();
    EXPECT_TRUE(root.is_root());
    Param& w = *block.all_params()[0];
    ASSERT_NE(w.value.data, nullptr);
    EXPECT_EQ(host_copy(d, s, w.value.data, w.numel()),
              fresh.units()[1]->all_params()[0]->init_values());
    fsdp_module_of(block)->reshard();
    EXPECT_EQ(w.value.data, nullptr);
    Tensor x = empty_tensor(d, s, DType::F32, 3, 5, MemTag::Activation);
    d.synthetic_batch(s, x.data, DType::F32, 3, 5, 1, 0, rank * 3, 1.0f);
    Tensor y = model.forward(ctx, x);
    model.backward(ctx, y, /*input_grad=*/false);
    d.synchronize();
  });
}

// A block unsharded before its root was fully_shard'ed becomes a root of its own; the real
// root's first forward then refuses in one plain line that names the block.
TEST(UnshardBeforeForward, ABlockInitializedBeforeItsRootIsRefusedByName) {
  runtime::run_cpu_ranks(2, {}, [](int rank, Device& d, std::shared_ptr<Comm> comm) {
    const Stream s = d.create_stream("compute", StreamPriority::Normal);
    RunContext ctx{&d, s, DType::F32};
    Mesh mesh("dp", d, comm);
    RootLinearChain model(2, 4);
    for (Module* u : model.units()) fully_shard(*u, mesh);
    fsdp_module_of(*model.units()[0])->unshard();
    fully_shard(model, mesh);
    Tensor x = empty_tensor(d, s, DType::F32, 2, 4, MemTag::Activation);
    d.synthetic_batch(s, x.data, DType::F32, 2, 4, 1, 0, rank * 2, 1.0f);
    try {
      model.forward(ctx, x);
      ADD_FAILURE() << "the root's forward ran";
    } catch (const UserError& e) {
      EXPECT_EQ(std::string(e.what()),
                "module '1' was initialized on its own (by its forward or unshard()) before "
                "the root module that holds it: fully_shard every module, then run the root's "
                "forward (or unshard) first");
    }
    d.synchronize();
  });
}

}  // namespace
}  // namespace fsdp::testing
