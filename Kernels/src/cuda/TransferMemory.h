// Page-locked host memory for result arrays (Engine::allocateTransferMemory): a run downloads
// into it with one DMA, where a pageable array costs a copy through the transfer ring beside the
// DMA (host memory carries the bytes three times) and a page fault per 4 KiB for a new array.
#pragma once

#include <cstddef>

namespace neighborgrid
{
namespace detail
{

/// `bytes` or more of pinned host memory from the process's pool, or null when the pool would
/// pass its limits (one block at most maxTransferBlockBytes, all blocks in use at most
/// maxTransferBytesInUse) or CUDA cannot pin memory. Thread-safe.
void* allocateTransferMemory(std::size_t bytes);
/// Returns a block of allocateTransferMemory to the pool (true), or false for any other pointer.
bool releaseTransferMemory(void* memory);
/// Whether [memory, memory + bytes) lies inside one block in use.
bool isTransferMemory(const void* memory, std::size_t bytes);

constexpr std::size_t maxTransferBlockBytes = std::size_t(1) << 30;
constexpr std::size_t maxTransferBytesInUse = std::size_t(4) << 30;
/// Released blocks the pool keeps for the next arrays: pinning is slow (cudaHostRegister of 48 MiB
/// took 2.6 ms on the H100 machine, RESULTS.md "Transfers"), and a filter that runs again needs
/// the size its previous output released.
constexpr std::size_t maxTransferBytesKept = std::size_t(512) << 20;

} // namespace detail
} // namespace neighborgrid
