// Property tests (rapidcheck) of the shard layout and the fused copies, for random shapes
// and world sizes: every element lands where Note [Shard layout] says, padding is zero, and
// sharding, gathering and copying out gives back the full params.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/shard_layout.h"

namespace fsdp::core {
namespace {

struct Case {
  int world;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<std::vector<float>> values;
};

rc::Gen<std::vector<int64_t>> shape() {  // 1 to 3 dims of 1 to 19
  return rc::gen::mapcat(rc::gen::inRange<size_t>(1, 4), [](size_t dims) {
    return rc::gen::container<std::vector<int64_t>>(dims, rc::gen::inRange<int64_t>(1, 20));
  });
}

rc::Gen<Case> cases() {  // 1 to 8 ranks, 1 to 4 params
  return rc::gen::mapcat(rc::gen::inRange(1, 9), [](int world) {
    auto shapes = rc::gen::mapcat(rc::gen::inRange<size_t>(1, 5), [](size_t n) {
      return rc::gen::container<std::vector<std::vector<int64_t>>>(n, shape());
    });
    return rc::gen::map(shapes, [world](std::vector<std::vector<int64_t>> shapes) {
      Case c{world, shapes, {}};
      float next = 1.0f;  // distinct, non-zero values: a misplaced element shows
      for (const auto& s : shapes) {
        int64_t n = 1;
        for (int64_t d : s) n *= d;
        std::vector<float> v(static_cast<size_t>(n));
        for (float& x : v) x = next++;
        c.values.push_back(std::move(v));
      }
      return c;
    });
  });
}

std::vector<const std::vector<float>*> pointers(const Case& c) {
  std::vector<const std::vector<float>*> out;
  for (const auto& v : c.values) out.push_back(&v);
  return out;
}

RC_GTEST_PROP(ShardLayout, ShardThenGatherGivesBackEveryParam, ()) {
  const Case c = *cases();
  const GroupLayout layout = make_group_layout(c.shapes, c.world);
  std::vector<float> gathered;
  for (int r = 0; r < c.world; ++r) {
    const std::vector<float> shard = shard_of(layout, r, pointers(c));
    RC_ASSERT(static_cast<int64_t>(shard.size()) == layout.shard_numel);
    gathered.insert(gathered.end(), shard.begin(), shard.end());
  }
  for (size_t p = 0; p < c.values.size(); ++p)
    RC_ASSERT(unshard_param(layout, static_cast<int>(p), gathered) == c.values[p]);
  // Padding holds zeros, and nothing else does (the values are all non-zero).
  int64_t zeros = 0, padding = 0;
  for (float x : gathered) zeros += x == 0.0f;
  for (const ShardSlice& s : layout.slices) padding += (s.rows_per_rank * c.world - s.rows) * s.cols;
  RC_ASSERT(zeros == padding);
}

RC_GTEST_PROP(ShardLayout, CpuCopyInAndCopyOutFollowTheLayout, ()) {
  const Case c = *cases();
  const GroupLayout layout = make_group_layout(c.shapes, c.world);
  cpu::CpuWorld world(1, {});
  auto device = world.make_device(0);
  Device& d = *device;
  const Stream s = d.create_stream("compute", StreamPriority::Normal);
  const int64_t flat_numel = layout.shard_numel * c.world;
  void* flat = d.alloc(static_cast<size_t>(flat_numel) * 4, s, MemTag::Other);
  std::vector<void*> params;
  std::vector<const void*> srcs;
  std::vector<DType> types;
  for (const auto& v : c.values) {
    params.push_back(d.alloc(v.size() * 4, s, MemTag::Other));
    d.copy_from_host(s, params.back(), v.data(), v.size() * 4);
    srcs.push_back(params.back());
    types.push_back(DType::F32);
  }
  // Copy-in (the RS input) must equal the concatenated shards; copy-out must invert it.
  d.reduce_scatter_copy_in(s, flat, DType::F32, layout.shard_numel, c.world, layout.slices.data(),
                           srcs.data(), types.data(), static_cast<int>(srcs.size()));
  std::vector<float> got(static_cast<size_t>(flat_numel));
  d.copy_to_host(s, got.data(), flat, got.size() * 4);
  for (void* p : params) d.fill(s, p, DType::F32, 0, 0.0f);
  std::vector<void*> dsts;
  for (const auto& v : c.values) dsts.push_back(d.alloc(v.size() * 4, s, MemTag::Other));
  d.all_gather_copy_out(s, flat, DType::F32, layout.shard_numel, c.world, layout.slices.data(),
                        dsts.data(), static_cast<int>(dsts.size()));
  std::vector<std::vector<float>> back;
  for (size_t p = 0; p < c.values.size(); ++p) {
    back.emplace_back(c.values[p].size());
    d.copy_to_host(s, back.back().data(), dsts[p], back.back().size() * 4);
  }
  d.synchronize();
  std::vector<float> want;
  for (int r = 0; r < c.world; ++r) {
    const std::vector<float> shard = shard_of(layout, r, pointers(c));
    want.insert(want.end(), shard.begin(), shard.end());
  }
  RC_ASSERT(got == want);
  RC_ASSERT(back == c.values);
  for (void* p : params) d.free(p, s);
  for (void* p : dsts) d.free(p, s);
  d.free(flat, s);
  d.synchronize();
}

}  // namespace
}  // namespace fsdp::core
