#include "runtime/captured_step.h"

#include "fsdp/error.h"

namespace fsdp::runtime {

namespace {

// dst's buffer takes src's contents; both were made by the same source for the same shape.
void copy_into(Device& d, Stream s, const Tensor& dst, const Tensor& src, const char* what) {
  if (!dst.defined() && !src.defined()) return;
  FSDP_USER_CHECK(dst.defined() && src.defined() && dst.bytes() == src.bytes(),
                  "a captured step: the batch's ", what, " changed shape between steps (",
                  dst.rows, "x", dst.cols, " then ", src.rows, "x", src.cols,
                  "); a captured step reads fixed buffers");
  d.copy(s, dst.data, src.data, src.bytes());
}

}  // namespace

CapturedStep::CapturedStep(Device& device, Stream stream, int micro_batches)
    : device_(device), stream_(stream), batches_(static_cast<size_t>(micro_batches)) {
  step_loss_ = static_cast<float*>(device_.alloc(sizeof(float), stream_, MemTag::Other));
}

CapturedStep::~CapturedStep() {
  synchronize_in_destructor(device_);
  if (graph_ >= 0) {
    try {
      device_.destroy_graph(graph_);
    } catch (...) {  // a failed device: its error surfaces elsewhere
    }
  }
  batches_.clear();
  device_.free(step_loss_, stream_);
}

void CapturedStep::stage(int mb, DeviceBatch fresh) {
  DeviceBatch& fixed = batches_.at(mb);
  if (!fixed.x.defined()) {
    FSDP_CHECK(!captured(), "a captured step's batch buffers are fixed");
    fixed = std::move(fresh);  // allocated outside the graph: these become the fixed buffers
    return;
  }
  device_.set_label("stage batch");
  copy_into(device_, stream_, fixed.x, fresh.x, "input");
  copy_into(device_, stream_, fixed.labels, fresh.labels, "labels");
  fixed.tokens = fresh.tokens;
}

void CapturedStep::capture(const std::function<void()>& step) {
  FSDP_CHECK(!captured(), "the step is captured once");
  device_.begin_capture(stream_);
  try {
    step();
    graph_ = device_.end_capture(stream_);
  } catch (...) {
    device_.abort_capture(stream_);
    throw;
  }
  streams_ = device_.graph_streams(graph_);
}

void CapturedStep::replay() {
  // The label of the one replay op, when the graph does not time its ops.
  device_.set_label("cuda graph step (per-op times are not recorded inside this graph)");
  device_.replay(graph_, stream_);
}

}  // namespace fsdp::runtime
