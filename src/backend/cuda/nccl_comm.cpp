// NcclComm: the Comm interface on an NCCL communicator, collectives enqueued on the streams
// of a CudaDevice (Note [Collective semantics] in include/fsdp/comm.h: NCCL itself runs the
// collectives of one communicator one at a time, in issue order, whatever their streams).
//
// Communicators are blocking (ncclConfig_t.blocking = 1): init, split and collectives return
// once enqueued, with no ncclInProgress polling. Each is watched (Note [NCCL watchdog]): a
// collective that does not complete within the timeout, or an NCCL error, aborts them all.
// NCCL_* environment variables are left to the user; nothing here turns NVLS (NVLink SHARP)
// or any other feature on.
#include <cstring>
#include <numeric>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/nccl_watchdog.h"

namespace fsdp::cuda {

namespace {

static_assert(sizeof(ncclUniqueId) == sizeof(UniqueId::bytes), "NCCL unique id size changed");

ncclDataType_t nccl_type(DType t) {
  return t == DType::F32 ? ncclFloat32 : t == DType::I32 ? ncclInt32 : ncclBfloat16;
}
ncclRedOp_t nccl_op(ReduceOp op) {
  return op == ReduceOp::Avg ? ncclAvg : op == ReduceOp::Max ? ncclMax : ncclSum;
}

// `name` must outlive the NCCL call that takes the config (NCCL copies it for its logs).
ncclConfig_t blocking_config(const char* name) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 1;
  config.commName = name;
  return config;
}

// The CudaDevice must outlive its communicators (the engine destroys comms first).
class NcclComm final : public Comm {
 public:
  NcclComm(CudaDevice& device, ncclComm_t comm, int rank, std::vector<int> world_ranks,
           std::string name)
      : Comm(rank, std::move(world_ranks), std::move(name)),
        device_(device),
        comm_(std::make_unique<WatchedComm>(comm, device.ordinal(), this->world_ranks()[rank],
                                            this->name())) {}

  // The WatchedComm finalizes the communicator (queued collectives on it complete first), or
  // aborts it after an NCCL error or a watchdog abort, when the peers may be gone. A CUDA
  // graph that captured collectives of this communicator must be destroyed before it: the
  // graph's NCCL kernels refer to the communicator's resources.
  ~NcclComm() override = default;

 protected:
  void do_all_gather(const void* send, void* recv, int64_t count, DType t, Stream s) override {
    CudaDevice::OpScope op(device_, s, OpKind::Collective);
    comm_->collective(op.stream(), "all_gather", count * dtype_size(t), [&](ncclComm_t c) {
      FSDP_NCCL_CHECK(
          ncclAllGather(send, recv, static_cast<size_t>(count), nccl_type(t), c, op.stream()));
    });
  }

  void do_reduce_scatter(const void* send, void* recv, int64_t count, DType t, ReduceOp reduce,
                         Stream s) override {
    CudaDevice::OpScope op(device_, s, OpKind::Collective);
    comm_->collective(op.stream(), "reduce_scatter", size() * count * dtype_size(t),
                      [&](ncclComm_t c) {
                        FSDP_NCCL_CHECK(ncclReduceScatter(send, recv, static_cast<size_t>(count),
                                                          nccl_type(t), nccl_op(reduce), c,
                                                          op.stream()));
                      });
  }

  void do_all_reduce(const void* send, void* recv, int64_t count, DType t, ReduceOp reduce,
                     Stream s) override {
    FSDP_CHECK(count >= 0, "all_reduce count ", count);
    CudaDevice::OpScope op(device_, s, OpKind::Collective);
    comm_->collective(op.stream(), "all_reduce", count * dtype_size(t), [&](ncclComm_t c) {
      FSDP_NCCL_CHECK(ncclAllReduce(send, recv, static_cast<size_t>(count), nccl_type(t),
                                    nccl_op(reduce), c, op.stream()));
    });
  }

  void do_broadcast(void* buf, int64_t count, DType t, int root, Stream s) override {
    FSDP_CHECK(count >= 0, "broadcast count ", count);
    CudaDevice::OpScope op(device_, s, OpKind::Collective);
    comm_->collective(op.stream(), "broadcast", count * dtype_size(t), [&](ncclComm_t c) {
      FSDP_NCCL_CHECK(ncclBroadcast(buf, buf, static_cast<size_t>(count), nccl_type(t), root, c,
                                    op.stream()));
    });
  }

  // NCCL's ncclAlltoAll takes one count for every peer; uneven counts go through grouped
  // point-to-point calls, which NCCL runs as one operation.
  void do_all_to_all(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                     const std::vector<int64_t>& recv_counts, DType t, Stream s) override {
    CudaDevice::OpScope op(device_, s, OpKind::Collective);
    const size_t elem = dtype_size(t);
    int64_t sent = 0;
    for (int64_t n : send_counts) sent += n;
    comm_->collective(op.stream(), "all_to_all", sent * static_cast<int64_t>(elem),
                      [&](ncclComm_t c) {
      FSDP_NCCL_CHECK(ncclGroupStart());
      size_t send_offset = 0, recv_offset = 0;
      for (int peer = 0; peer < size(); ++peer) {
        const size_t n_send = static_cast<size_t>(send_counts[peer]);
        const size_t n_recv = static_cast<size_t>(recv_counts[peer]);
        if (n_send)
          FSDP_NCCL_CHECK(ncclSend(static_cast<const char*>(send) + send_offset * elem, n_send,
                                   nccl_type(t), peer, c, op.stream()));
        if (n_recv)
          FSDP_NCCL_CHECK(ncclRecv(static_cast<char*>(recv) + recv_offset * elem, n_recv,
                                   nccl_type(t), peer, c, op.stream()));
        send_offset += n_send;
        recv_offset += n_recv;
      }
      FSDP_NCCL_CHECK(ncclGroupEnd());
    });
  }

  std::unique_ptr<Comm> do_split(int color, int key, const std::string& name) override {
    device_.make_current();
    ncclConfig_t config = blocking_config(name.c_str());
    ncclComm_t child = nullptr;
    comm_->call([&](ncclComm_t c) {
      FSDP_NCCL_CHECK(
          ncclCommSplit(c, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child, &config));
    });
    if (child == nullptr) return nullptr;  // this rank took no part
    try {
      int child_rank = 0, child_size = 0;
      FSDP_NCCL_CHECK(ncclCommUserRank(child, &child_rank));
      FSDP_NCCL_CHECK(ncclCommCount(child, &child_size));
      std::vector<int> members = gather_global_ranks(child, child_size);
      return std::make_unique<NcclComm>(device_, child, child_rank, std::move(members), name);
    } catch (...) {
      (void)ncclCommAbort(child);
      throw;
    }
  }

 private:
  // The launch-global rank of every member of `child`, in child rank order: an all-gather of
  // one int over the new communicator. Split is rare and collective anyway, so this waits
  // (polling, so that a watchdog abort ends the wait).
  std::vector<int> gather_global_ranks(ncclComm_t child, int child_size) {
    const int32_t my_global_rank = world_ranks()[rank()];
    std::vector<int32_t> members(child_size, -1);
    cudaStream_t stream = nullptr;
    int32_t* buffer = nullptr;
    FSDP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    try {
      const size_t bytes = sizeof(int32_t) * static_cast<size_t>(child_size);
      FSDP_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&buffer), bytes, stream));
      FSDP_CUDA_CHECK(cudaMemcpyAsync(buffer, &my_global_rank, sizeof(int32_t),
                                      cudaMemcpyHostToDevice, stream));
      FSDP_NCCL_CHECK(ncclAllGather(buffer, buffer, 1, ncclInt32, child, stream));
      FSDP_CUDA_CHECK(
          cudaMemcpyAsync(members.data(), buffer, bytes, cudaMemcpyDeviceToHost, stream));
      FSDP_CUDA_CHECK(cudaFreeAsync(buffer, stream));
      buffer = nullptr;
      FSDP_CUDA_CHECK(poll_until_ready([&] { return cudaStreamQuery(stream); }));
    } catch (...) {
      if (buffer) (void)cudaFreeAsync(buffer, stream);
      if (!watchdog_aborted()) (void)cudaStreamSynchronize(stream);
      (void)cudaStreamDestroy(stream);
      throw;
    }
    FSDP_CUDA_CHECK(cudaStreamDestroy(stream));
    return std::vector<int>(members.begin(), members.end());
  }

  CudaDevice& device_;
  std::unique_ptr<WatchedComm> comm_;
};

}  // namespace

UniqueId make_unique_id() {
  // ncclGetUniqueId only opens the bootstrap socket; it does not initialize CUDA, so a
  // launcher may call it before fork().
  ncclUniqueId nccl_id;
  FSDP_NCCL_CHECK(ncclGetUniqueId(&nccl_id));
  UniqueId id;
  std::memcpy(id.bytes.data(), &nccl_id, sizeof(nccl_id));
  return id;
}

std::unique_ptr<Comm> make_world_comm(Device& device, const UniqueId& id, int rank, int world) {
  FSDP_CHECK(world >= 1 && rank >= 0 && rank < world, "rank ", rank, " of world ", world);
  CudaDevice& cuda_device = as_cuda_device(device);
  cuda_device.make_current();  // NCCL binds the communicator to the current device
  ncclUniqueId nccl_id;
  std::memcpy(&nccl_id, id.bytes.data(), sizeof(nccl_id));
  static const char kWorldName[] = "world";
  ncclConfig_t config = blocking_config(kWorldName);
  ncclComm_t comm = nullptr;
  FSDP_NCCL_CHECK(ncclCommInitRankConfig(&comm, world, nccl_id, rank, &config));
  std::vector<int> world_ranks(world);
  std::iota(world_ranks.begin(), world_ranks.end(), 0);
  return std::make_unique<NcclComm>(cuda_device, comm, rank, std::move(world_ranks), kWorldName);
}

}  // namespace fsdp::cuda
