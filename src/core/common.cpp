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

const char* dtype_name(DType t) { return t == DType::F32 ? "fp32" : "bf16"; }

DType parse_dtype(const std::string& name) {
  if (name == "fp32" || name == "f32" || name == "float32") return DType::F32;
  if (name == "bf16" || name == "bfloat16") return DType::BF16;
  FSDP_FAIL("unknown dtype '", name, "' (expected fp32 or bf16)");
}

const char* mem_tag_name(MemTag tag) {
  static const char* names[] = {"other",     "sharded_state", "all_gather", "unsharded",
                                "grad",      "grad_accum",    "rs_input",   "rs_output",
                                "activation"};
  static_assert(sizeof(names) / sizeof(names[0]) == kMemTagCount);
  return names[static_cast<int>(tag)];
}

const char* collective_name(CollectiveKind kind) {
  static const char* names[] = {"all_gather", "reduce_scatter", "all_reduce", "broadcast"};
  return names[static_cast<int>(kind)];
}

void Comm::all_gather(const void* send, void* recv, int64_t count, DType t, Stream s) {
  FSDP_CHECK(count >= 0, "all_gather count ", count);
  ++issued_[static_cast<int>(CollectiveKind::AllGather)];
  do_all_gather(send, recv, count, t, s);
}
void Comm::reduce_scatter(const void* send, void* recv, int64_t count, DType t, ReduceOp op,
                          Stream s) {
  FSDP_CHECK(count >= 0, "reduce_scatter count ", count);
  ++issued_[static_cast<int>(CollectiveKind::ReduceScatter)];
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
std::unique_ptr<Comm> Comm::split(int color, int key, const std::string& name) {
  return do_split(color, key, name);
}

}  // namespace fsdp
