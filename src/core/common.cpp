// Small shared definitions: errors, dtype and tag names, the Comm front half.
#include <atomic>

#include "fsdp/comm.h"
#include "fsdp/device.h"
#include "fsdp/error.h"

namespace fsdp {

ThreadIdentity& this_thread_identity() {
  thread_local ThreadIdentity identity;
  return identity;
}

namespace detail {
void raise(const char* file, int line, const std::string& message) {
  const ThreadIdentity& id = this_thread_identity();
  std::string where = id.rank >= 0 ? concat("[rank ", id.rank, " ", id.device, "] ")
                                   : concat("[", id.device, "] ");
  std::string short_file = file;
  if (auto pos = short_file.rfind("/src/"); pos != std::string::npos)
    short_file = short_file.substr(pos + 1);
  throw Error(concat(where, message, " (", short_file, ":", line, ")"));
}
}  // namespace detail

const char* dtype_name(DType t) {
  return t == DType::F32 ? "fp32" : t == DType::BF16 ? "bf16" : "int32";
}

DType parse_dtype(const std::string& name) {
  if (name == "fp32" || name == "f32" || name == "float32") return DType::F32;
  if (name == "bf16" || name == "bfloat16") return DType::BF16;
  FSDP_FAIL("unknown dtype '", name, "' (expected fp32 or bf16)");
}

const char* mem_tag_name(MemTag tag) {
  static const char* names[] = {"other",     "sharded_state", "all_gather", "unsharded",
                                "grad",      "grad_accum",    "rs_input",   "rs_output",
                                "activation", "post_forward"};
  static_assert(sizeof(names) / sizeof(names[0]) == kMemTagCount);
  return names[static_cast<int>(tag)];
}

const char* reduce_op_name(ReduceOp op) {
  return op == ReduceOp::Sum ? "sum" : op == ReduceOp::Avg ? "avg" : "max";
}

const char* collective_name(CollectiveKind kind) {
  static const char* names[] = {"all_gather", "reduce_scatter", "all_reduce", "broadcast",
                                "all_to_all"};
  static_assert(sizeof(names) / sizeof(names[0]) == kCollectiveKindCount);
  return names[static_cast<int>(kind)];
}

// Note [One-rank collectives]
// Over one rank, an in-place all-gather or reduce-scatter (average or sum) is the identity:
// it counts as issued, and nothing is launched (a backend's own one-rank collective may still
// run a kernel over the buffer, which at world size 1 competes with the step's GEMMs).
void Comm::all_gather(const void* send, void* recv, int64_t count, DType t, Stream s) {
  FSDP_CHECK(count >= 0, "all_gather count ", count);
  ++issued_[static_cast<int>(CollectiveKind::AllGather)];
  if (size() == 1 && send == recv) return;
  do_all_gather(send, recv, count, t, s);
}
void Comm::reduce_scatter(const void* send, void* recv, int64_t count, DType t, ReduceOp op,
                          Stream s) {
  FSDP_CHECK(count >= 0, "reduce_scatter count ", count);
  ++issued_[static_cast<int>(CollectiveKind::ReduceScatter)];
  if (size() == 1 && send == recv) return;
  do_reduce_scatter(send, recv, count, t, op, s);
}
void Comm::all_reduce(const void* send, void* recv, int64_t count, DType t, ReduceOp op,
                      Stream s) {
  ++issued_[static_cast<int>(CollectiveKind::AllReduce)];
  do_all_reduce(send, recv, count, t, op, s);
}
void Comm::broadcast(void* buf, int64_t count, DType t, int root, Stream s) {
  FSDP_CHECK(root >= 0 && root < size(), "broadcast root ", root, " outside [0, ", size(), ")");
  ++issued_[static_cast<int>(CollectiveKind::Broadcast)];
  do_broadcast(buf, count, t, root, s);
}
void Comm::all_to_all(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                      const std::vector<int64_t>& recv_counts, DType t, Stream s) {
  FSDP_CHECK(static_cast<int>(send_counts.size()) == size() &&
                 static_cast<int>(recv_counts.size()) == size(),
             "all_to_all on communicator '", name(), "' of ", size(), " members needs ", size(),
             " send and recv counts, got ", send_counts.size(), " and ", recv_counts.size());
  for (int j = 0; j < size(); ++j)
    FSDP_CHECK(send_counts[j] >= 0 && recv_counts[j] >= 0, "all_to_all on communicator '",
               name(), "': negative count for member ", j);
  ++issued_[static_cast<int>(CollectiveKind::AllToAll)];
  do_all_to_all(send, send_counts, recv, recv_counts, t, s);
}
// Note [Grouped GEMM] in include/fsdp/device.h: the default, one gemm per group.
void Device::grouped_gemm(Stream s, bool trans_a, bool trans_b, const GemmGroup* groups, int count,
                          DType ab_t, DType c_t) {
  for (int i = 0; i < count; ++i) {
    const GemmGroup& g = groups[i];
    FSDP_CHECK(g.m >= 0 && g.n >= 0 && g.k >= 0, "grouped_gemm group ", i, " shape ", g.m, "x",
               g.n, "x", g.k);
    if (g.m == 0 || g.n == 0) continue;
    if (g.k == 0)
      fill(s, g.c, c_t, g.m * g.n, 0.0f);
    else
      gemm(s, trans_a, trans_b, g.m, g.n, g.k, 1.0f, g.a, g.b, ab_t, 0.0f, g.c, c_t);
  }
}

// Note [Transformer ops]
// The transformer's ops (include/fsdp/device.h) have these defaults so a backend can add them
// one at a time; both backends override every one of them, and the tests compare the two.
namespace {
[[noreturn]] void not_on_backend(const Device& d, const char* op) {
  FSDP_FAIL(op, " is not implemented on device ", d.name());
}
}  // namespace
void Device::embedding_forward(Stream, const void*, DType, const int32_t*, int64_t, int64_t, void*) {
  not_on_backend(*this, "embedding_forward");
}
void Device::embedding_backward(Stream, const void*, DType, const int32_t*, int64_t, int64_t,
                                int64_t, void*) {
  not_on_backend(*this, "embedding_backward");
}
void Device::rms_norm_forward(Stream, const void*, const void*, DType, int64_t, int64_t, float,
                              void*, float*, float*) {
  not_on_backend(*this, "rms_norm_forward");
}
void Device::rms_norm_backward(Stream, const void*, const void*, const float*, const void*, DType,
                               int64_t, int64_t, void*, void*, float*) {
  not_on_backend(*this, "rms_norm_backward");
}
void Device::add_rms_norm_forward(Stream, const void*, const void*, const void*, DType, int64_t,
                                  int64_t, float, void*, void*, float*, float*) {
  not_on_backend(*this, "add_rms_norm_forward");
}
void Device::rms_norm_backward_add(Stream, const void*, const void*, const float*, const void*,
                                   const void*, DType, int64_t, int64_t, void*, void*, float*) {
  not_on_backend(*this, "rms_norm_backward_add");
}
void Device::rope(Stream, void*, int64_t, DType, int64_t, int64_t, int64_t, int64_t, const float*,
                  bool) {
  not_on_backend(*this, "rope");
}
void Device::attention_forward(Stream, const void*, int64_t, const void*, int64_t, const void*,
                               int64_t, DType, int64_t, int64_t, int64_t, int64_t, int64_t, void*,
                               int64_t, float*) {
  not_on_backend(*this, "attention_forward");
}
void Device::attention_backward(Stream, const void*, int64_t, const void*, int64_t, const void*,
                                int64_t, const void*, int64_t, const void*, int64_t, const float*,
                                DType, int64_t, int64_t, int64_t, int64_t, int64_t, void*, void*,
                                void*) {
  not_on_backend(*this, "attention_backward");
}
void Device::rope_at(Stream, void*, int64_t, DType, int64_t, int64_t, int64_t, int64_t,
                     const float*) {
  not_on_backend(*this, "rope_at");
}
void Device::attention_kv_cache(Stream, const void*, int64_t, const void*, int64_t, const void*,
                                int64_t, DType, int64_t, int64_t, int64_t, int64_t, int64_t,
                                int64_t, void*, void*, void*, int64_t) {
  not_on_backend(*this, "attention_kv_cache");
}
void Device::swiglu_forward(Stream, const void*, DType, int64_t, int64_t, void*, float*) {
  not_on_backend(*this, "swiglu_forward");
}
void Device::swiglu_backward(Stream, const void*, const void*, DType, int64_t, int64_t, void*,
                             float*) {
  not_on_backend(*this, "swiglu_backward");
}
void Device::fp8_amax(Stream, const void*, DType, int64_t, int64_t, Fp8Axis, float*) {
  not_on_backend(*this, "fp8_amax");
}
void Device::fp8_cast(Stream, const void*, DType, DType, int64_t, int64_t, Fp8Axis, const float*,
                      Fp8Format, uint8_t*, uint8_t*, float*) {
  not_on_backend(*this, "fp8_cast");
}
void Device::fp8_gemm(Stream, bool, bool, int64_t, int64_t, int64_t, Fp8Operand, Fp8Operand, bool,
                      void*, DType) {
  not_on_backend(*this, "fp8_gemm");
}
void Device::check_fp8_gemm(int64_t m, int64_t n, int64_t k, const Fp8Operand& a,
                            const Fp8Operand& b, const void* c) {
  const char* op = "fp8_gemm";
  FSDP_CHECK(m >= 0 && n >= 0 && k >= 0, op, ": negative dims ", m, "x", n, "x", k);
  FSDP_CHECK(!(a.format == Fp8Format::E5M2 && b.format == Fp8Format::E5M2), op,
             ": A and B cannot both be e5m2");
  FSDP_CHECK(a.scale_inv && b.scale_inv, op, ": a null inverse scale");
  FSDP_CHECK(reinterpret_cast<uintptr_t>(a.scale_inv) % 16 == 0 &&
                 reinterpret_cast<uintptr_t>(b.scale_inv) % 16 == 0,
             op, ": inverse scales must start at a multiple of 16 bytes (Note [Fp8 scales "
             "16-byte aligned]), got ", static_cast<const void*>(a.scale_inv), " and ",
             static_cast<const void*>(b.scale_inv));
  FSDP_CHECK(m * k == 0 || a.data, op, ": A is null");
  FSDP_CHECK(k * n == 0 || b.data, op, ": B is null");
  FSDP_CHECK(m * n == 0 || c, op, ": C is null");
}
void Device::moe_route(Stream, const MoeRouting&) { not_on_backend(*this, "moe_route"); }
void Device::wait_until_drained() noexcept {
  // A backend whose synchronize() waits for the work itself, whatever aborts meanwhile.
  try {
    synchronize();
  } catch (...) {
  }
}
void Device::copy_from_host_async(Stream, void*, const void*, size_t) {
  not_on_backend(*this, "copy_from_host_async");
}
void Device::run_host_task(Stream, int64_t, std::function<void()>) {
  not_on_backend(*this, "run_host_task");
}
void Device::moe_route_backward(Stream, const MoeRouting&, const float*, float*) {
  not_on_backend(*this, "moe_route_backward");
}

std::unique_ptr<Comm> Comm::split(int color, int key, const std::string& name) {
  return do_split(color, key, name);
}

std::unique_ptr<Comm> Comm::split_groups(int group_size, int stride, const std::string& name) {
  FSDP_CHECK(group_size >= 1 && stride >= 1 &&
                 static_cast<int64_t>(group_size) * stride <= size() &&
                 size() % (group_size * stride) == 0,
             "split of communicator '", this->name(), "' (", size(), " members) into groups of ",
             group_size, " members ", stride, " apart: the groups do not tile it");
  const int block = group_size * stride;
  const int color = rank() / block * stride + rank() % stride;
  return do_split_groups(group_size, stride, color, name);
}

}  // namespace fsdp

namespace fsdp {

namespace {
[[noreturn]] void no_graphs(const Device& d) {
  FSDP_USER_FAIL("device ", d.name(), " cannot capture CUDA graphs (a captured step needs the "
                 "CUDA backend)");
}
}  // namespace

void Device::begin_capture(Stream) { no_graphs(*this); }
int Device::end_capture(Stream) { no_graphs(*this); }
void Device::abort_capture(Stream) noexcept {}
void Device::replay(int, Stream) { no_graphs(*this); }
void Device::destroy_graph(int) { no_graphs(*this); }
std::vector<std::string> Device::graph_streams(int) const { no_graphs(*this); }

}  // namespace fsdp
