// Elementwise, copy, optimizer and loss kernels of the CPU backend (gemm: cpu_gemm.cpp).
#include "backend/cpu/cpu_kernels.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_dtype_io.h"
#include "fsdp/error.h"

namespace fsdp::cpu::kernels {

namespace {
char* byte_ptr(void* p) {
  return static_cast<char*>(p);
}
const char* byte_ptr(const void* p) {
  return static_cast<const char*>(p);
}

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;
}  // namespace

// ---- copies and casts

void fill(void* dst, DType t, int64_t n, float value) {
  with_io(t, [&](auto out) {
    for (int64_t i = 0; i < n; ++i) out.store(dst, i, value);
  });
}

void cast(void* dst, DType dst_t, const void* src, DType src_t, int64_t n) {
  if (dst_t == src_t) {
    if (n > 0) std::memmove(dst, src, static_cast<size_t>(n) * dtype_size(dst_t));
    return;
  }
  with_io(src_t, [&](auto in) {
    with_io(dst_t, [&](auto out) {
      for (int64_t i = 0; i < n; ++i) out.store(dst, i, in.load(src, i));
    });
  });
}

void all_gather_copy_out(const void* gathered, DType t, int64_t shard_numel, int world,
                         const ShardSlice* slices, void* const* dsts, int count) {
  const auto esize = static_cast<int64_t>(dtype_size(t));
  for (int p = 0; p < count; ++p) {
    const ShardSlice& sl = slices[p];
    // Rank r's rows are contiguous both in its chunk of `gathered` and in the unsharded
    // param, so each (param, rank) pair is one memcpy.
    for (int r = 0; r < world; ++r) {
      const int64_t first = r * sl.rows_per_rank;
      const int64_t last = std::min(first + sl.rows_per_rank, sl.rows);
      if (first >= last) continue;
      std::memcpy(byte_ptr(dsts[p]) + first * sl.cols * esize,
                  byte_ptr(gathered) + (r * shard_numel + sl.offset) * esize,
                  static_cast<size_t>((last - first) * sl.cols * esize));
    }
  }
}

void reduce_scatter_copy_in(void* rs_in, DType rs_t, int64_t shard_numel, int world,
                            const ShardSlice* slices, const void* const* srcs,
                            const DType* src_types, int count) {
  // Parts of a shard that no param covers (alignment gaps) must reduce to zero, not to
  // whatever the buffer held.
  int64_t covered = 0;
  for (int p = 0; p < count; ++p) covered += slices[p].rows_per_rank * slices[p].cols;
  if (covered < shard_numel)
    std::memset(rs_in, 0, static_cast<size_t>(world * shard_numel) * dtype_size(rs_t));
  for (int p = 0; p < count; ++p) {
    const ShardSlice& sl = slices[p];
    const void* src = srcs[p];
    with_io(src_types[p], [&](auto in) {
      with_io(rs_t, [&](auto out) {
        for (int r = 0; r < world; ++r) {
          for (int64_t j = 0; j < sl.rows_per_rank; ++j) {
            const int64_t row = r * sl.rows_per_rank + j;
            const int64_t dst_base = r * shard_numel + sl.offset + j * sl.cols;
            if (row < sl.rows) {
              const int64_t src_base = row * sl.cols;
              for (int64_t c = 0; c < sl.cols; ++c)
                out.store(rs_in, dst_base + c, in.load(src, src_base + c));
            } else {  // padding rows: their grad is zero, so padding stays zero
              for (int64_t c = 0; c < sl.cols; ++c) out.store(rs_in, dst_base + c, 0.0f);
            }
          }
        }
      });
    });
  }
}

void accumulate(float* dst, const void* src, DType src_t, int64_t n, float scale) {
  with_io(src_t, [&](auto in) {
    for (int64_t i = 0; i < n; ++i) dst[i] += scale * in.load(src, i);
  });
}

// ---- optimizers

namespace {

// PyTorch's AdamW (foreach=False) order of operations: decoupled decay first, then the
// moments, then the bias-corrected update. grad_scale is the clipping coefficient.
// The updated param into the tensor's param_copy, if it has one, rounded as cast() rounds.
void write_param_copy(const OptimTensor& o) {
  if (o.param_copy) cast(o.param_copy, o.param_copy_dtype, o.param, DType::F32, o.numel);
}

void adamw_apply(const OptimTensor* tensors, int count, const AdamWConfig& c, float lr,
                 float step_size, float bias2_sqrt, float grad_scale) {
  const float decay = 1.0f - lr * c.weight_decay;
  for (int t = 0; t < count; ++t) {
    const OptimTensor& o = tensors[t];
    with_io(o.grad_dtype, [&](auto grad) {
      for (int64_t i = 0; i < o.numel; ++i) {
        const float g = grad.load(o.grad, i) * grad_scale;
        float p = o.param[i] * decay;
        const float m = c.beta1 * o.state0[i] + (1.0f - c.beta1) * g;
        const float v = c.beta2 * o.state1[i] + (1.0f - c.beta2) * g * g;
        p -= step_size * m / (std::sqrt(v) / bias2_sqrt + c.eps);
        o.param[i] = p;
        o.state0[i] = m;
        o.state1[i] = v;
      }
    });
    write_param_copy(o);
  }
}

// PyTorch's SGD with dampening 0. Its first step sets buf = g; with the buffer starting at
// zero (the engine zero-fills optimizer state), buf = momentum * 0 + g is the same thing, so
// no first-step flag is needed.
void sgd_apply(const OptimTensor* tensors, int count, float lr, float momentum,
               float weight_decay, float grad_scale) {
  for (int t = 0; t < count; ++t) {
    const OptimTensor& o = tensors[t];
    with_io(o.grad_dtype, [&](auto grad) {
      for (int64_t i = 0; i < o.numel; ++i) {
        float g = grad.load(o.grad, i) * grad_scale + weight_decay * o.param[i];
        if (momentum != 0.0f) {
          g = momentum * o.state0[i] + g;
          o.state0[i] = g;
        }
        o.param[i] -= lr * g;
      }
    });
    write_param_copy(o);
  }
}

}  // namespace

float clip_coefficient(const StepScalars& s, GradSquares grad_sq) {
  if (s.max_grad_norm <= 0.0f) return 1.0f;
  float total = 0.0f;
  for (int i = 0; i < grad_sq.count; ++i) total += grad_sq.sums[i];
  const float coef = s.max_grad_norm / (std::sqrt(total) + 1e-6f);
  // A non-finite norm gives a NaN coefficient on purpose: the step is poisoned, and the
  // trainer, which reads the norm, stops the run naming that step.
  return coef < 1.0f || coef != coef ? coef : 1.0f;
}

void adamw_step(const OptimTensor* tensors, int count, const AdamWConfig& c, int64_t step) {
  FSDP_CHECK(step >= 1, "adamw_step needs a 1-based step count, got ", step);
  const double bias1 = 1.0 - std::pow(static_cast<double>(c.beta1), static_cast<double>(step));
  const double bias2 = 1.0 - std::pow(static_cast<double>(c.beta2), static_cast<double>(step));
  adamw_apply(tensors, count, c, c.lr, static_cast<float>(c.lr / bias1),
              static_cast<float>(std::sqrt(bias2)), 1.0f);
}

void adamw_step_scalars(const OptimTensor* tensors, int count, const AdamWConfig& c,
                        const StepScalars& s, GradSquares grad_sq) {
  adamw_apply(tensors, count, c, s.lr, s.lr / s.bias_correction1, s.bias_correction2_sqrt,
              clip_coefficient(s, grad_sq));
}

void sgd_step(const OptimTensor* tensors, int count, float lr, float momentum, float weight_decay) {
  sgd_apply(tensors, count, lr, momentum, weight_decay, 1.0f);
}

void sgd_step_scalars(const OptimTensor* tensors, int count, float momentum, float weight_decay,
                      const StepScalars& s, GradSquares grad_sq) {
  sgd_apply(tensors, count, s.lr, momentum, weight_decay, clip_coefficient(s, grad_sq));
}

void sum_squares(const float* const* tensors, const int64_t* numels, int count, float* out) {
  for (int t = 0; t < count; ++t) {
    double sum = 0;  // in double, in order: the same bits on every run
    for (int64_t i = 0; i < numels[t]; ++i) sum += static_cast<double>(tensors[t][i]) * tensors[t][i];
    out[t] = static_cast<float>(sum);
  }
}

// ---- elementwise

float gelu(float x) {
  const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
  return 0.5f * x * (1.0f + std::tanh(u));
}

float gelu_grad(float x) {
  const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
  const float th = std::tanh(u);
  const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
  return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
}

void activation_forward(Activation f, const void* x, void* y, DType t, int64_t n) {
  with_io(t, [&](auto io) {
    if (f == Activation::ReLU) {
      // `x < 0 ? 0 : x` rather than max(x, 0): a NaN input stays NaN, so poisoned reads
      // are not laundered into zeros.
      for (int64_t i = 0; i < n; ++i) {
        const float v = io.load(x, i);
        io.store(y, i, v < 0.0f ? 0.0f : v);
      }
    } else {
      for (int64_t i = 0; i < n; ++i) io.store(y, i, gelu(io.load(x, i)));
    }
  });
}

void activation_backward(Activation f, const void* x, const void* dy, void* dx, DType t,
                         int64_t n) {
  with_io(t, [&](auto io) {
    for (int64_t i = 0; i < n; ++i) {
      const float v = io.load(x, i);
      const float g = io.load(dy, i);
      float d;
      if (f == Activation::ReLU)
        d = v > 0.0f ? g : (std::isnan(v) ? v : 0.0f);  // NaN in x stays visible
      else
        d = g * gelu_grad(v);
      io.store(dx, i, d);
    }
  });
}

void add(void* out, const void* a, const void* b, DType t, int64_t n) {
  with_io(t, [&](auto io) {
    for (int64_t i = 0; i < n; ++i) io.store(out, i, io.load(a, i) + io.load(b, i));
  });
}

// ---- router helpers

void softmax_rows(const void* x, DType t, float* probs, int64_t rows, int64_t cols) {
  with_io(t, [&](auto io) {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t base = r * cols;
      float max_v = -INFINITY;
      for (int64_t c = 0; c < cols; ++c) max_v = std::max(max_v, io.load(x, base + c));
      float sum = 0.0f;
      for (int64_t c = 0; c < cols; ++c) {
        const float e = std::exp(io.load(x, base + c) - max_v);
        probs[base + c] = e;
        sum += e;
      }
      const float inv = 1.0f / sum;
      for (int64_t c = 0; c < cols; ++c) probs[base + c] *= inv;
    }
  });
}

void softmax_rows_backward(const float* probs, const float* dprobs, void* dx, DType t, int64_t rows,
                           int64_t cols) {
  with_io(t, [&](auto io) {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t base = r * cols;
      float dot = 0.0f;
      for (int64_t c = 0; c < cols; ++c) dot += probs[base + c] * dprobs[base + c];
      for (int64_t c = 0; c < cols; ++c)
        io.store(dx, base + c, probs[base + c] * (dprobs[base + c] - dot));
    }
  });
}

void scale_rows(void* out, const void* in, DType t, const float* w, int64_t w_stride, int64_t rows,
                int64_t cols, bool accumulate) {
  with_io(t, [&](auto io) {
    for (int64_t r = 0; r < rows; ++r) {
      const float wr = w[r * w_stride];
      const int64_t base = r * cols;
      for (int64_t c = 0; c < cols; ++c) {
        float v = wr * io.load(in, base + c);
        if (accumulate) v += io.load(out, base + c);
        io.store(out, base + c, v);
      }
    }
  });
}

void row_dot(const void* a, const void* b, DType t, float* out, int64_t out_stride, int64_t rows,
             int64_t cols) {
  with_io(t, [&](auto io) {
    for (int64_t r = 0; r < rows; ++r) {
      float sum = 0.0f;
      for (int64_t c = 0; c < cols; ++c) sum += io.load(a, r * cols + c) * io.load(b, r * cols + c);
      out[r * out_stride] = sum;
    }
  });
}

// ---- losses

void mean_square_loss(const void* y, DType t, int64_t n, float* loss, void* dy) {
  FSDP_CHECK(n > 0, "mean_square_loss over ", n, " elements");
  with_io(t, [&](auto io) {
    double sum = 0.0;  // the scalar is compared across backends and runs: sum it accurately
    const float grad_scale = 2.0f / static_cast<float>(n);
    for (int64_t i = 0; i < n; ++i) {
      const float v = io.load(y, i);
      sum += static_cast<double>(v) * v;
      if (dy) io.store(dy, i, grad_scale * v);
    }
    if (loss) *loss = static_cast<float>(sum / static_cast<double>(n));
  });
}

void cross_entropy_loss(const void* logits, DType t, const int32_t* labels, int64_t rows,
                        int64_t classes, float* loss, void* dlogits) {
  FSDP_CHECK(rows > 0 && classes > 0, "cross_entropy_loss over ", rows, "x", classes, " logits");
  with_io(t, [&](auto io) {
    double total = 0.0;
    const float inv_rows = 1.0f / static_cast<float>(rows);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t base = r * classes;
      const int32_t label = labels[r];
      FSDP_CHECK(label >= 0 && label < classes, "cross_entropy_loss: label ", label, " of row ", r,
                 " outside [0, ", classes, ")");
      float max_v = -INFINITY;
      for (int64_t c = 0; c < classes; ++c) max_v = std::max(max_v, io.load(logits, base + c));
      float sum = 0.0f;
      for (int64_t c = 0; c < classes; ++c) sum += std::exp(io.load(logits, base + c) - max_v);
      const float log_sum = std::log(sum);
      total += static_cast<double>(max_v + log_sum - io.load(logits, base + label));
      if (!dlogits) continue;
      for (int64_t c = 0; c < classes; ++c) {
        const float p = std::exp(io.load(logits, base + c) - max_v - log_sum);
        io.store(dlogits, base + c, (p - (c == label ? 1.0f : 0.0f)) * inv_rows);
      }
    }
    if (loss) *loss = static_cast<float>(total / static_cast<double>(rows));
  });
}

void spin(double microseconds) {
  // The stream is occupied for a known time. Its thread sleeps rather than burns a core:
  // ranks are threads on few cores, and a burning rank would delay the others' streams and
  // so the very timings the forced-duration tests compute by hand.
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::duration<double, std::micro>(microseconds);
  std::this_thread::sleep_until(until);
}

}  // namespace fsdp::cpu::kernels
