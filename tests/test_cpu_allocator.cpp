// The CPU backend's checked allocator: a write into freed memory (a stream that writes after
// the free, with no event ordering the write before it) is reported, naming the allocation,
// when the block leaves quarantine or at the next device-wide synchronize. The streams run on
// the virtual clock, so "after the free" is certain, not a matter of thread timing.
#include <gtest/gtest.h>

#include <string>

#include "backend/cpu/cpu_backend.h"
#include "fsdp/error.h"

namespace fsdp::cpu {
namespace {

CpuOptions virtual_time(size_t quarantine_bytes = size_t{256} << 20) {
  CpuOptions o;
  o.virtual_clock = true;
  o.quarantine_bytes = quarantine_bytes;
  return o;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The writer fills the block 100 us into the run; the owner frees it at once. The fix is an
// event recorded after the fill that the owner waits on before its free.
void write_while_freeing(Device& dev, Stream owner, Stream writer, void* block, bool wait) {
  dev.spin(writer, 100);
  dev.fill(writer, block, DType::F32, 64, 1.0f);
  if (wait) {
    Event done = dev.create_event();
    dev.record_event(done, writer);
    dev.wait_event(owner, done);
    dev.destroy_event(done);
  }
  dev.free(block, owner);
}

TEST(CpuAllocator, WriteAfterFreeIsCaughtAtSynchronize) {
  CpuWorld world(1, virtual_time());
  auto dev = world.make_device(0);
  Stream owner = dev->create_stream("owner", StreamPriority::Normal);
  Stream writer = dev->create_stream("writer", StreamPriority::Normal);
  write_while_freeing(*dev, owner, writer, dev->alloc(256, owner, MemTag::Activation), false);
  const std::string error = error_of([&] { dev->synchronize(); });
  EXPECT_NE(error.find("[rank 0 cpu:0] memory was written after it was freed: the activation "
                       "allocation of 256 bytes, changed in bytes 0..255"),
            std::string::npos)
      << error;
}

TEST(CpuAllocator, TheEventWaitMakesTheSameWritesClean) {
  CpuWorld world(1, virtual_time());
  auto dev = world.make_device(0);
  Stream owner = dev->create_stream("owner", StreamPriority::Normal);
  Stream writer = dev->create_stream("writer", StreamPriority::Normal);
  write_while_freeing(*dev, owner, writer, dev->alloc(256, owner, MemTag::Activation), true);
  EXPECT_NO_THROW(dev->synchronize());
}

// With room for one block in quarantine, the second free pushes the first one out, and that
// check finds the write (on the owner's stream: synchronize_stream does not scan the
// quarantine itself).
TEST(CpuAllocator, WriteAfterFreeIsCaughtWhenTheBlockLeavesQuarantine) {
  CpuWorld world(1, virtual_time(/*quarantine_bytes=*/300));
  auto dev = world.make_device(0);
  Stream owner = dev->create_stream("owner", StreamPriority::Normal);
  Stream writer = dev->create_stream("writer", StreamPriority::Normal);
  void* other = dev->alloc(200, owner, MemTag::Other);
  write_while_freeing(*dev, owner, writer, dev->alloc(256, owner, MemTag::Grad), false);
  dev->spin(owner, 200);  // the write lands in quarantine first
  dev->free(other, owner);
  const std::string error = error_of([&] { dev->synchronize_stream(owner); });
  EXPECT_NE(error.find("memory was written after it was freed: the grad allocation of 256 "
                       "bytes, changed in bytes 0..255"),
            std::string::npos)
      << error;
}

// A partial write is located, and the fresh poison of a new allocation is no false alarm.
TEST(CpuAllocator, APartialWriteIsLocated) {
  CpuWorld world(1, virtual_time());
  auto dev = world.make_device(0);
  Stream owner = dev->create_stream("owner", StreamPriority::Normal);
  Stream writer = dev->create_stream("writer", StreamPriority::Normal);
  auto* block = static_cast<float*>(dev->alloc(400, owner, MemTag::RsInput));
  dev->free(dev->alloc(64, owner, MemTag::Other), owner);  // untouched: no report
  dev->spin(writer, 100);
  dev->fill(writer, block + 10, DType::F32, 3, 2.0f);
  dev->free(block, owner);
  const std::string error = error_of([&] { dev->synchronize(); });
  EXPECT_NE(error.find("the rs_input allocation of 400 bytes, changed in bytes 40..51"),
            std::string::npos)
      << error;
}

}  // namespace
}  // namespace fsdp::cpu
