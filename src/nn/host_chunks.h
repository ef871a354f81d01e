// Work on the host split over its cores, for loops whose iterations are independent.
#pragma once

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace fsdp::nn {

// Calls body(begin, end) over [0, n) in contiguous chunks of at least `min_chunk`, one per
// core, on threads of its own (the calling thread takes the first). `body` must not throw and
// must write only its own range.
//
// Note [Initial values in parallel]: every initial value is a pure function of (seed, index)
// (fsdp/synthetic.h), so threads that make disjoint ranges make the same bytes one thread
// does. On one core, an 8B-parameter model's values took minutes before its first step.
template <class Body>
void for_each_host_chunk(int64_t n, int64_t min_chunk, const Body& body) {
  const int64_t cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t chunks = std::clamp<int64_t>(n / std::max<int64_t>(min_chunk, 1), 1, cores);
  const int64_t size = (n + chunks - 1) / chunks;
  std::vector<std::jthread> threads;
  for (int64_t c = 1; c < chunks; ++c) {
    const int64_t begin = c * size, end = std::min(n, begin + size);
    if (begin < end) threads.emplace_back([&body, begin, end] { body(begin, end); });
  }
  body(0, std::min(n, size));
}

}  // namespace fsdp::nn
