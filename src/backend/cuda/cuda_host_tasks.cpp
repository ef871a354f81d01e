// Note [Host-side stream work] on CUDA: a host task is a cudaLaunchHostFunc on the stream, so
// the stream's later work (an upload of what the task wrote) follows it with no host wait;
// the upload is a cudaMemcpyAsync from page-locked memory, which reads the host bytes when
// the copy runs.
#include <cuda_runtime.h>

#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_device.h"
#include "fsdp/error.h"

namespace fsdp::cuda {

// Shared with the tasks in flight, so a task that runs after an error still has somewhere to
// write (and the device's destructor synchronizes before it goes).
struct HostTaskErrors {
  std::mutex mutex;
  std::string first;  // empty: none
};

namespace {

struct HostTask {
  std::function<void()> run;
  std::shared_ptr<HostTaskErrors> errors;
};

// On CUDA's host-function thread: no CUDA call may be made here, and nothing may escape.
void CUDART_CB run_host_task_once(void* data) {
  std::unique_ptr<HostTask> task(static_cast<HostTask*>(data));
  std::string error;
  try {
    task->run();
  } catch (const std::exception& e) {
    error = e.what();
  } catch (...) {
    error = "a host task failed";
  }
  if (error.empty()) return;
  std::lock_guard<std::mutex> lock(task->errors->mutex);
  if (task->errors->first.empty()) task->errors->first = std::move(error);
}

}  // namespace

void CudaDevice::rethrow_host_task_error() const {
  if (!host_task_errors_) return;
  std::lock_guard<std::mutex> lock(host_task_errors_->mutex);
  if (!host_task_errors_->first.empty()) throw Error(host_task_errors_->first);
}

void CudaDevice::copy_from_host_async(Stream s, void* dst, const void* host_src, size_t bytes) {
  FSDP_CHECK(bytes == 0 || (dst && host_src), "copy_from_host_async of ", bytes,
             " bytes with a null pointer");
  fail_if_capturing("copy_from_host_async");
  OpScope op(*this, s, OpKind::Copy);
  if (bytes == 0) return;
  FSDP_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, op.stream()));
}

void CudaDevice::run_host_task(Stream s, int64_t bytes, std::function<void()> task) {
  FSDP_CHECK(bytes >= 0 && task, "run_host_task: no task, or a negative byte count ", bytes);
  fail_if_capturing("run_host_task");
  if (!host_task_errors_) host_task_errors_ = std::make_shared<HostTaskErrors>();
  OpScope op(*this, s, OpKind::Optimizer);
  auto owned = std::make_unique<HostTask>(HostTask{std::move(task), host_task_errors_});
  FSDP_CUDA_CHECK(cudaLaunchHostFunc(op.stream(), run_host_task_once, owned.get()));
  (void)owned.release();  // the host function owns it now
}

}  // namespace fsdp::cuda
