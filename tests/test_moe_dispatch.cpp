// The MoE layer's plumbing: the CPU all-to-all with uneven counts, the expert dispatch and
// combine against a gather-everything reference, and the host routing (top-k, capacity, the
// auxiliary loss).
#include <gtest/gtest.h>

#include <cmath>

#include "fsdp/error.h"
#include "fsdp/nn/moe.h"
#include "test_util.h"

namespace fsdp::testing {
namespace {

// Member i sends (i + 1) * (j + 1) % 3 elements to member j (zeros included), value
// 1000 * i + 100 * j + element.
int64_t count_from_to(int i, int j) { return (i + 1) * (j + 1) % 3; }

TEST(MoeAllToAll, UnevenCountsDeliverEveryPeersChunkInRankOrder) {
  const int world = 4;
  runtime::run_cpu_ranks(world, {}, [&](int rank, Device& device, std::shared_ptr<Comm> comm) {
    const Stream s = device.create_stream("s", StreamPriority::Normal);
    std::vector<int64_t> send_counts(world), recv_counts(world);
    std::vector<float> send;
    for (int j = 0; j < world; ++j) {
      send_counts[j] = count_from_to(rank, j);
      recv_counts[j] = count_from_to(j, rank);
      for (int64_t e = 0; e < send_counts[j]; ++e) send.push_back(1000.0f * rank + 100.0f * j + e);
    }
    std::vector<float> expected;
    for (int i = 0; i < world; ++i)
      for (int64_t e = 0; e < recv_counts[i]; ++e) expected.push_back(1000.0f * i + 100.0f * rank + e);
    float* d_send = static_cast<float*>(device.alloc(send.size() * 4 + 4, s, MemTag::Other));
    float* d_recv = static_cast<float*>(device.alloc(expected.size() * 4 + 4, s, MemTag::Other));
    device.copy_from_host(s, d_send, send.data(), send.size() * 4);
    comm->all_to_all(d_send, send_counts, d_recv, recv_counts, DType::F32, s);
    std::vector<float> got(expected.size());
    device.copy_to_host(s, got.data(), d_recv, got.size() * 4);
    device.synchronize_stream(s);
    EXPECT_EQ(got, expected) << "rank " << rank;
    EXPECT_EQ(comm->issued(CollectiveKind::AllToAll), 1);
    device.free(d_send, s);
    device.free(d_recv, s);
    device.synchronize();
  });
}

TEST(MoeAllToAll, CountsThatDisagreeAreAOneLineError) {
  try {
    runtime::run_cpu_ranks(2, {}, [](int rank, Device& device, std::shared_ptr<Comm> comm) {
      const Stream s = device.create_stream("s", StreamPriority::Normal);
      float* buf = static_cast<float*>(device.alloc(64, s, MemTag::Other));
      // rank 0 sends 2 to rank 1, which expects 3
      const std::vector<int64_t> send = rank == 0 ? std::vector<int64_t>{1, 2} : std::vector<int64_t>{3, 1};
      const std::vector<int64_t> recv = rank == 0 ? std::vector<int64_t>{1, 3} : std::vector<int64_t>{3, 1};
      comm->all_to_all(buf, send, buf + 8, recv, DType::F32, s);
      device.synchronize();
    });
    FAIL() << "accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("sends 2 elements to member 1 (rank 1), which expects 3"), std::string::npos)
        << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

// Dispatch: rank r's token t has features (r, t, c); its assignment a = t * K + k goes to
// expert expert_of(r, a). On the expert's rank the rows must arrive expert-major, then by
// source rank, then in assignment order: what a gather of every rank's rows would give.
// Combine: the experts scale their rows by (global expert + 1); each rank must get back, in
// its send order, (expert + 1) * its own row.
int32_t expert_of(int rank, int64_t a) {
  if (a % 5 == 4) return -1;                       // dropped: never sent
  const int32_t e = static_cast<int32_t>((a * 7 + rank * 3) % 5);  // experts 0..4; 5 gets none
  return rank == 1 && e == 2 ? 4 : e;              // uneven: rank 1 sends nothing to expert 2
}

class MoeDispatch : public ::testing::TestWithParam<int> {};

TEST_P(MoeDispatch, MatchesTheGatherEverythingReferenceBothWays) {
  const int world = GetParam(), experts = 6, local = experts / world, tokens = 9, K = 2, dim = 3;
  auto feature = [](int rank, int64_t token, int64_t c) {
    return static_cast<float>(rank * 100 + token + 0.125 * c);
  };
  runtime::run_cpu_ranks(world, {}, [&](int rank, Device& device, std::shared_ptr<Comm> comm) {
    const Stream s = device.create_stream("s", StreamPriority::Normal);
    RunContext ctx{&device, s, DType::F32};
    std::vector<int32_t> assignment(static_cast<size_t>(tokens * K));
    for (int64_t a = 0; a < tokens * K; ++a) assignment[a] = expert_of(rank, a);
    nn::ExpertDispatcher dispatcher;
    dispatcher.plan(ctx, comm.get(), experts, assignment);
    std::vector<float> send;
    for (int32_t a : dispatcher.send_assignments())
      for (int c = 0; c < dim; ++c) send.push_back(feature(rank, a / K, c));
    Tensor send_rows = empty_tensor(device, s, DType::F32, dispatcher.sent_rows(), dim, MemTag::Activation);
    if (!send.empty()) device.copy_from_host(s, send_rows.data, send.data(), send.size() * 4);
    Tensor got = dispatcher.to_experts(ctx, send_rows, dim);

    std::vector<float> expected;  // gather everything, keep ours
    std::vector<int64_t> expected_counts(local, 0);
    for (int l = 0; l < local; ++l)
      for (int src = 0; src < world; ++src)
        for (int64_t a = 0; a < tokens * K; ++a)
          if (expert_of(src, a) == rank * local + l) {
            ++expected_counts[l];
            for (int c = 0; c < dim; ++c) expected.push_back(feature(src, a / K, c));
          }
    EXPECT_EQ(dispatcher.local_counts(), expected_counts) << "rank " << rank;
    std::vector<float> host(expected.size());
    if (!host.empty()) device.copy_to_host(s, host.data(), got.data, host.size() * 4);
    device.synchronize_stream(s);
    EXPECT_EQ(host, expected) << "rank " << rank;

    // The experts' "work", then the way back.
    int64_t row = 0;
    for (int l = 0; l < local; ++l)
      for (int64_t i = 0; i < expected_counts[l]; ++i, ++row)
        for (int c = 0; c < dim; ++c) host[row * dim + c] *= static_cast<float>(rank * local + l + 1);
    Tensor worked = empty_tensor(device, s, DType::F32, row, dim, MemTag::Activation);
    if (!host.empty()) device.copy_from_host(s, worked.data, host.data(), host.size() * 4);
    Tensor back = dispatcher.from_experts(ctx, worked, dim);
    std::vector<float> returned(send.size());
    if (!returned.empty()) device.copy_to_host(s, returned.data(), back.data, returned.size() * 4);
    device.synchronize_stream(s);
    for (size_t i = 0; i < dispatcher.send_assignments().size(); ++i) {
      const int32_t a = dispatcher.send_assignments()[i];
      for (int c = 0; c < dim; ++c)
        EXPECT_EQ(returned[i * dim + c], feature(rank, a / K, c) * (assignment[a] + 1))
            << "rank " << rank << " row " << i;
    }
    got = back = worked = send_rows = Tensor{};
    dispatcher = nn::ExpertDispatcher{};
    device.synchronize();
  });
}

INSTANTIATE_TEST_SUITE_P(EpSizes, MoeDispatch, ::testing::Values(1, 2, 3),
                         [](const auto& info) { return "ep" + std::to_string(info.param); });

// ---- routing on the host

nn::MoeConfig routing_config(int experts, int top_k) {
  nn::MoeConfig c;
  c.experts = experts;
  c.top_k = top_k;
  c.expert_ffn_dim = 4;
  return c;
}

TEST(MoeRouting, TopKRenormalizesAndBreaksTiesToTheLowerExpert) {
  const nn::MoeConfig c = routing_config(4, 2);
  const std::vector<float> probs = {0.1f, 0.4f, 0.2f, 0.3f,     // top-2: 1, 3
                                    0.25f, 0.25f, 0.25f, 0.25f};  // ties: 0, 1
  const nn::RoutePlan p = nn::route_tokens(probs, 2, c);
  EXPECT_EQ(p.expert, (std::vector<int32_t>{1, 3, 0, 1}));
  EXPECT_FLOAT_EQ(p.weight[0], 0.4f / 0.7f);
  EXPECT_FLOAT_EQ(p.weight[1], 0.3f / 0.7f);
  EXPECT_FLOAT_EQ(p.weight[2], 0.5f);
  EXPECT_FLOAT_EQ(p.max_load, 0.5f);  // expert 1: 2 of 4 assignments
}

TEST(MoeRouting, AuxLossIsTheWeightAtUniformRoutingAndCapacityDropsTheOverflow) {
  nn::MoeConfig c = routing_config(2, 1);
  c.aux_loss_weight = 0.01f;
  // Uniform probabilities, tokens split evenly: E * sum f P = 2 * (0.5 * 0.5 * 2) = 1.
  const nn::RoutePlan uniform = nn::route_tokens({0.6f, 0.4f, 0.4f, 0.6f}, 2, c);
  EXPECT_NEAR(uniform.aux_loss, 0.01f * 2 * (0.5 * 0.5 + 0.5 * 0.5), 1e-7);
  // Everything to expert 0, capacity ceil(1.0 * 4 * 1 / 2) = 2: the last two are dropped.
  c.capacity_factor = 1.0;
  const std::vector<float> skewed = {0.9f, 0.1f, 0.8f, 0.2f, 0.7f, 0.3f, 0.6f, 0.4f};
  const nn::RoutePlan p = nn::route_tokens(skewed, 4, c);
  EXPECT_EQ(p.capacity, 2);
  EXPECT_EQ(p.expert, (std::vector<int32_t>{0, 0, -1, -1}));
  EXPECT_EQ(p.chosen, (std::vector<int32_t>{0, 0, 0, 0}));
  EXPECT_FLOAT_EQ(p.max_load, 1.0f);
  // f = (1, 0), P_0 = mean(0.9, 0.8, 0.7, 0.6) = 0.75: aux = 0.01 * 2 * 0.75.
  EXPECT_NEAR(p.aux_loss, 0.01 * 2 * 0.75, 1e-7);
  EXPECT_NEAR(p.aux_grad[0], 0.01 * 2 * 1.0 / 4, 1e-9);
  EXPECT_EQ(p.aux_grad[1], 0.0f);
}

TEST(MoeRouting, BadSettingsAreOneLineErrors) {
  nn::MoeConfig c = routing_config(6, 2);
  c.ep = 4;
  try {
    c.validate();
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("experts (6) must be divisible by ep (4)"),
              std::string::npos) << e.what();
  }
  c.ep = 1;
  c.top_k = 7;
  EXPECT_THROW(c.validate(), Error);
}

}  // namespace
}  // namespace fsdp::testing
