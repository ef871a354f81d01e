// Tensors: 2-D views of stream-ordered device memory.
#pragma once

#include <cstdint>
#include <memory>

#include "fsdp/device.h"

namespace fsdp {

// A device allocation shared by the tensors that view it. The last reference frees it on
// `free_stream` (stream-ordered), so it must only be used on that stream, or by streams that
// the free stream has waited on (Note [Stream-ordered memory]).
class Storage {
 public:
  Storage(Device& device, size_t bytes, Stream stream, MemTag tag)
      : device_(&device), bytes_(bytes), stream_(stream),
        ptr_(bytes ? device.alloc(bytes, stream, tag) : nullptr) {}
  ~Storage() {
    if (ptr_) device_->free(ptr_, stream_);
  }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  Stream stream() const { return stream_; }  // where it is allocated and freed

 private:
  Device* device_;
  size_t bytes_;
  Stream stream_;
  void* ptr_;
};

struct Tensor {
  std::shared_ptr<Storage> storage;  // null for a view of memory owned elsewhere
  void* data = nullptr;
  DType dtype = DType::F32;
  int64_t rows = 0, cols = 0;
  // Note [Fused amax]: set only by the kernel that made this tensor, when an fp8 GEMM reads it:
  // a tensorwise scales buffer (fp8_scale_slots(1) floats for the amax, whose first is max
  // |value| over the whole tensor, then as many for the inverse scale). A view of a part of the
  // tensor must not carry it.
  std::shared_ptr<Storage> fp8_amax;

  bool defined() const { return data != nullptr; }
  int64_t numel() const { return rows * cols; }
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  template <typename T>
  T* as() const { return static_cast<T*>(data); }
};

inline Tensor empty_tensor(Device& device, Stream stream, DType dtype, int64_t rows, int64_t cols,
                           MemTag tag) {
  Tensor t;
  t.storage = std::make_shared<Storage>(device, static_cast<size_t>(rows * cols) * dtype_size(dtype),
                                        stream, tag);
  t.data = t.storage->data();
  t.dtype = dtype;
  t.rows = rows;
  t.cols = cols;
  return t;
}

// A tensor viewing memory it does not own (kept alive by `owner`, if given).
inline Tensor view_tensor(void* data, DType dtype, int64_t rows, int64_t cols,
                          std::shared_ptr<Storage> owner = nullptr) {
  Tensor t;
  t.storage = std::move(owner);
  t.data = data;
  t.dtype = dtype;
  t.rows = rows;
  t.cols = cols;
  return t;
}

}  // namespace fsdp
