// The pool of TransferMemory.h. Blocks are pinned with cudaHostAlloc (portable: every device's
// DMA can use them) and kept after release up to maxTransferBytesKept: a filter that runs again
// gets the block its previous output just released. The pool itself is
// never destroyed: VTK may release an array after CUDA's runtime has shut down at exit, and a
// block then simply stays with the process.
#include "TransferMemory.h"

#include "CudaSupport.h"

#include <map>
#include <mutex>

namespace neighborgrid
{
namespace detail
{
namespace
{

class TransferPool
{
public:
  void* allocate(std::size_t bytes)
  {
    const std::size_t rounded = (std::max<std::size_t>(bytes, 1) + granule - 1) / granule * granule;
    std::lock_guard<std::mutex> lock(mutex_);
    if (rounded > maxTransferBlockBytes || inUse_ + rounded > maxTransferBytesInUse)
    {
      return nullptr;
    }
    // The smallest kept block that fits and wastes at most as much as it holds.
    auto best = blocks_.end();
    for (auto b = blocks_.begin(); b != blocks_.end(); ++b)
    {
      const Block& k = b->second;
      if (!k.inUse && k.bytes >= rounded && k.bytes <= 2 * rounded && (best == blocks_.end() || k.bytes < best->second.bytes))
      {
        best = b;
      }
    }
    if (best == blocks_.end())
    {
      void* memory = nullptr;
      if (cudaHostAlloc(&memory, rounded, cudaHostAllocPortable) != cudaSuccess)
      {
        cudaGetLastError(); // not sticky: the caller allocates pageable memory instead
        return nullptr;
      }
      best = blocks_.emplace(static_cast<char*>(memory), Block{ rounded, false }).first;
    }
    else
    {
      kept_ -= best->second.bytes;
    }
    best->second.inUse = true;
    inUse_ += best->second.bytes;
    return best->first;
  }

  bool release(void* memory)
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto b = blocks_.find(static_cast<char*>(memory));
    if (b == blocks_.end() || !b->second.inUse)
    {
      return false;
    }
    b->second.inUse = false;
    inUse_ -= b->second.bytes;
    kept_ += b->second.bytes;
    trimKept();
    return true;
  }

  bool contains(const void* memory, std::size_t bytes)
  {
    const char* begin = static_cast<const char*>(memory);
    std::lock_guard<std::mutex> lock(mutex_);
    auto b = blocks_.upper_bound(const_cast<char*>(begin));
    if (b == blocks_.begin())
    {
      return false;
    }
    --b;
    return b->second.inUse && begin >= b->first && begin + bytes <= b->first + b->second.bytes;
  }

private:
  struct Block
  {
    std::size_t bytes = 0;
    bool inUse = false;
  };
  static constexpr std::size_t granule = std::size_t(2) << 20;

  /// Unpins the largest kept blocks until the kept bytes are within their limit.
  void trimKept()
  {
    while (kept_ > maxTransferBytesKept)
    {
      auto largest = blocks_.end();
      for (auto b = blocks_.begin(); b != blocks_.end(); ++b)
      {
        if (!b->second.inUse && (largest == blocks_.end() || b->second.bytes > largest->second.bytes))
        {
          largest = b;
        }
      }
      kept_ -= largest->second.bytes;
      cudaFreeHost(largest->first); // at exit the runtime may be gone: nothing else to do
      blocks_.erase(largest);
    }
  }

  std::mutex mutex_;
  std::map<char*, Block> blocks_;
  std::size_t inUse_ = 0;
  std::size_t kept_ = 0;
};

TransferPool& pool()
{
  static TransferPool* const instance = new TransferPool; // never destroyed (see above)
  return *instance;
}

} // namespace

void* allocateTransferMemory(std::size_t bytes)
{
  return pool().allocate(bytes);
}

bool releaseTransferMemory(void* memory)
{
  return memory && pool().release(memory);
}

bool isTransferMemory(const void* memory, std::size_t bytes)
{
  return memory && pool().contains(memory, bytes);
}

} // namespace detail
} // namespace neighborgrid
