// The KV cache's ops on the CPU backend (Note [KV cache] in fsdp/device.h). They run the
// training ops' own loops (cpu_attention_rows.h): a token rotated at position p, or a query
// row attending to keys [0, p], gives the values rope() and attention_forward() give it in a
// whole sequence, bit for bit.
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_attention_rows.h"
#include "backend/cpu/cpu_device.h"
#include "backend/cpu/cpu_dtype_io.h"
#include "backend/op_checks.h"
#include "fsdp/error.h"

namespace fsdp::cpu {

namespace {

struct KvCacheShape {
  int64_t rows, position, heads, kv_heads, head_dim;
  int64_t ldq, ldk, ldv, ldo;
};

template <typename Io>
void attention_kv_cache_kernel(const KvCacheShape& a, const void* q, const void* k,
                               const void* v, void* k_cache, void* v_cache, void* out) {
  const int64_t hd = a.head_dim, width = a.kv_heads * hd, group = a.heads / a.kv_heads;
  for (int64_t r = 0; r < a.rows; ++r)
    for (int64_t c = 0; c < width; ++c) {
      Io::store(k_cache, (a.position + r) * width + c, Io::load(k, r * a.ldk + c));
      Io::store(v_cache, (a.position + r) * width + c, Io::load(v, r * a.ldv + c));
    }
  const int64_t keys = a.position + a.rows;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> kh, vh, qrow(static_cast<size_t>(hd)), acc, p;
  for (int64_t h = 0; h < a.heads; ++h) {
    const int64_t kvh = h / group;
    if (h % group == 0) {
      gather_head<Io>(k_cache, width, 0, kvh * hd, keys, hd, kh);
      gather_head<Io>(v_cache, width, 0, kvh * hd, keys, hd, vh);
    }
    for (int64_t i = 0; i < a.rows; ++i) {
      for (int64_t c = 0; c < hd; ++c)
        qrow[static_cast<size_t>(c)] = Io::load(q, i * a.ldq + h * hd + c);
      attend_row<Io>(qrow.data(), kh.data(), vh.data(), a.position + i + 1, hd, scale, p, acc, out,
                     i * a.ldo + h * hd);
    }
  }
}

}  // namespace

void CpuDevice::rope_at(Stream s, void* x, int64_t ld, DType t, int64_t rows, int64_t heads,
                        int64_t head_dim, int64_t first_position, const float* inv_freq) {
  const char* op = "rope_at";
  backend::check_activation_dtype(t, op);
  backend::check_ptr(x, "x", op);
  FSDP_CHECK(inv_freq != nullptr, op, ": no inverse frequencies");
  FSDP_CHECK(head_dim >= 2 && head_dim % 2 == 0, op, ": head_dim must be even, got ", head_dim);
  FSDP_CHECK(rows >= 0 && heads >= 1 && first_position >= 0, op, ": rows ", rows, ", heads ",
             heads, ", first_position ", first_position);
  FSDP_CHECK(ld >= heads * head_dim, op, ": row stride ", ld, " is smaller than a row of ",
             heads * head_dim);
  std::vector<float> freqs(inv_freq, inv_freq + head_dim / 2);  // the caller's may go now
  const int64_t seq_len = rows > 0 ? rows : 1;                   // r % seq_len == r
  enqueue(s, OpKind::Kernel, [=, freqs = std::move(freqs)] {
    with_io(t, [&](auto io) {
      rope_kernel<decltype(io)>(x, ld, rows, heads, head_dim, seq_len, first_position, freqs,
                                false);
    });
  });
}

void CpuDevice::attention_kv_cache(Stream s, const void* q, int64_t ldq, const void* k,
                                   int64_t ldk, const void* v, int64_t ldv, DType t, int64_t rows,
                                   int64_t position, int64_t capacity, int64_t heads,
                                   int64_t kv_heads, int64_t head_dim, void* k_cache,
                                   void* v_cache, void* out, int64_t ldo) {
  const char* op = "attention_kv_cache";
  backend::check_activation_dtype(t, op);
  backend::check_kv_cache_attention(rows, position, capacity, heads, kv_heads, head_dim, ldq, ldk,
                                    ldv, ldo, op);
  backend::check_ptr(q, "q", op), backend::check_ptr(k, "k", op), backend::check_ptr(v, "v", op);
  backend::check_ptr(k_cache, "k_cache", op), backend::check_ptr(v_cache, "v_cache", op);
  backend::check_ptr(out, "out", op);
  const KvCacheShape a{rows, position, heads, kv_heads, head_dim, ldq, ldk, ldv, ldo};
  enqueue(s, OpKind::Kernel, [=] {
    with_io(t, [&](auto io) {
      attention_kv_cache_kernel<decltype(io)>(a, q, k, v, k_cache, v_cache, out);
    });
  });
}

}  // namespace fsdp::cpu
