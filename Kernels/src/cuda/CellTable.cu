// Grouping points by cell on the GPU: RadixCells and SlotCells (CellTable.h).
#include "CellTable.h"

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <cub/device/device_select.cuh>
#include <cuda/std/tuple>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/tabulate_output_iterator.h>
#include <thrust/iterator/transform_iterator.h>

#include <cstdlib>

namespace neighborgrid
{
namespace detail
{
namespace
{

/// CUB's view of a WideKey: three words, the first the most significant.
struct WideKeyDecomposer
{
  __host__ __device__ ::cuda::std::tuple<std::uint64_t&, std::uint64_t&, std::uint64_t&> operator()(WideKey& key) const
  {
    return { key.word[0], key.word[1], key.word[2] };
  }
};

__device__ __forceinline__ void makeKey(const KeyLayout& layout, const double c[3], std::uint32_t& key)
{
  std::uint64_t k = 0;
  layout.bitsKey(c, k);
  key = static_cast<std::uint32_t>(k);
}
__device__ __forceinline__ void makeKey(const KeyLayout& layout, const double c[3], std::uint64_t& key)
{
  layout.bitsKey(c, key);
}
__device__ __forceinline__ void makeKey(const KeyLayout& layout, const double c[3], WideKey& key)
{
  key = layout.wideKey(c);
}

/// keys[i] = the key of input point i's cell, followed by its x bin (xBinBits low bits: xBinOf),
/// and values[i] = i.
template <class KeyT>
__global__ void computeKeys(InputPoints input, int n, double size, double inverse, int xBinBits, KeyLayout layout,
  KeyT* __restrict__ keys, std::int32_t* __restrict__ values)
{
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
  {
    double x[3], c[3];
    input.get(i, x[0], x[1], x[2]);
    for (int a = 0; a < 3; ++a)
    {
      c[a] = cellCoordinate(x[a], size, inverse);
    }
    KeyT key;
    makeKey(layout, c, key);
    if constexpr (!std::is_same<KeyT, WideKey>::value)
    {
      if (xBinBits > 0)
      {
        // The frame coordinate as particlesInOrder writes it (inputParticle), so that the staged
        // points of a cell lie in the order of their bins.
        key = (key << xBinBits) | KeyT(xBinOf(frameCoordinate(x[0], c[0], size, inverse), xBinBits));
      }
    }
    keys[i] = key;
    values[i] = i;
  }
}

/// A sorted key without its x bin: the cell's key.
template <class KeyT>
struct CellOfBinnedKey
{
  int xBinBits = 0;
  __host__ __device__ KeyT operator()(const KeyT& key) const { return key >> xBinBits; }
};

/// keys[s] = the key of the cell of point s of `points`.
template <class KeyT>
__global__ void computeKeysOf(InputPoints points, int n, double size, KeyLayout layout, KeyT* __restrict__ keys)
{
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s < n)
  {
    double c[3];
    inputCell(points, s, size, 1.0 / size, c);
    makeKey(layout, c, keys[s]);
  }
}

__device__ __forceinline__ WideKey asSlotKey(const WideKey& k)
{
  return k;
}
__device__ __forceinline__ std::uint64_t asSlotKey(std::uint32_t k)
{
  return k;
}
__device__ __forceinline__ std::uint64_t asSlotKey(std::uint64_t k)
{
  return k;
}

/// Position i of grouped keys starts a cell: the first position, the end (n, so that the starts
/// end with it), or a key unlike the one before.
template <class Keys>
struct StartsCell
{
  Keys keys;
  int n = 0;
  __host__ __device__ bool operator()(int i) const { return i == 0 || i == n || !(keys[i] == keys[i - 1]); }
};

/// Cell k (its key: keys[start[k]]) into the hashed lookup table (slots claimed by their cell
/// field; identity tables: IdentityCellsAtStarts); kept[k] = its key when the caller keeps them.
/// Slot: BitsSlot (Bits keys) or WideSlot.
template <class Keys, class Slot, class KeptT>
__global__ void insertUniqueKeys(Keys keys, const std::int32_t* __restrict__ start, const int* __restrict__ starts,
  CellLookup lookup, Slot* slots, KeptT* __restrict__ kept)
{
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= *starts - 1) // the cells: one start each, and the end
  {
    return;
  }
  const auto key = asSlotKey(keys[start[k]]);
  for (std::uint64_t s = lookup.home(key);; s = (s + 1) & lookup.mask)
  {
    if (atomicCAS(&slots[s].cell, -1, k) == -1)
    {
      slots[s].key = key;
      break;
    }
  }
  if (kept)
  {
    kept[k] = key;
  }
}

/// The selection of cell starts writing an identity table as it goes (selectStarts' output):
/// cell k starts at position s, so start[k] = s and, but for the end (s = n), the slot of its key
/// holds k (no pass of its own over the cells); kept[k] = the key when the caller keeps them. The
/// end's k + 1, the count of starts, goes to the host's pinned word countOnHost: a copy queued
/// after the selection kept the GPU idle for 11-14 us on the 4M row (H200), its own 1.5-2.2 us and
/// the switches between the copy engine and the kernels around it (RESULTS.md, issue 22).
template <class Keys>
struct IdentityCellsAtStarts
{
  Keys keys;
  std::int32_t* start = nullptr;
  std::int32_t* identityCells = nullptr;
  std::uint64_t* kept = nullptr;
  int* countOnHost = nullptr;
  int n = 0;

  __device__ void operator()(std::ptrdiff_t k, int s) const
  {
    start[k] = s;
    if (s == n)
    {
      *countOnHost = static_cast<int>(k) + 1;
      __threadfence_system();
    }
    else
    {
      const std::uint64_t key = keys[s];
      identityCells[key] = static_cast<std::int32_t>(k);
      if (kept)
      {
        kept[k] = key;
      }
    }
  }
};

/// out[orderToInput[s]] = the cell holding position s (a binary search in the cell starts).
__global__ void cellOfInputKernel(const std::int32_t* __restrict__ start, int cells,
  const std::int32_t* __restrict__ orderToInput, int n, std::int32_t* __restrict__ out)
{
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= n)
  {
    return;
  }
  int lo = 0, hi = cells - 1; // the last k with start[k] <= s
  while (lo < hi)
  {
    const int mid = (lo + hi + 1) / 2;
    if (start[mid] <= s)
    {
      lo = mid;
    }
    else
    {
      hi = mid - 1;
    }
  }
  out[orderToInput[s]] = lo;
}

/// Every point finds or inserts its cell's key; the slot is the cell id.
__global__ void insertPointKeys(SlotInsert insert, int n)
{
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
  {
    insert.insert(i);
  }
}

std::int64_t keySize(KeyMode mode)
{
  return mode == KeyMode::Bits32 ? 4 : (mode == KeyMode::Bits64 ? 8 : std::int64_t(sizeof(WideKey)));
}

std::int64_t alignUp(std::int64_t bytes)
{
  return (bytes + 255) & ~std::int64_t(255);
}

/// The lookup table's bytes for n points, sized as build() sizes it before the cells are counted
/// (an identity table holds a cell a slot; a hashed one is no larger once they are).
std::int64_t lookupBytes(std::int64_t n, const KeyLayout& layout)
{
  int log2Slots = 1;
  bool identity = false;
  RadixCells::sizeLookupBefore(n, layout, log2Slots, identity);
  const std::size_t slotBytes =
    layout.mode == KeyMode::Wide ? sizeof(WideSlot) : identity ? sizeof(std::int32_t) : sizeof(BitsSlot);
  return (std::int64_t(1) << log2Slots) * std::int64_t(slotBytes);
}

template <class KeyT, class Decomposer>
struct RadixBuild
{
  /// Sorts keys/values (DoubleBuffers in place; the order ends in orderToInput) as the graph
  /// captured for the same buffers and sizes, captured now where there is none (SortGraph).
  static void sortPairs(CudaRun& run, cub::DoubleBuffer<KeyT>& keys, cub::DoubleBuffer<std::int32_t>& values, int bits,
    int xBinBits, DeviceBuffer<unsigned char>& scratch, std::int32_t* orderToInput, SortGraph& graph)
  {
    const int n = static_cast<int>(run.count);
    const int endBit = std::is_same<KeyT, WideKey>::value ? 0 : std::max(1, bits + xBinBits);
    auto sort = [&](void* temp, std::size_t& sortBytes, cudaStream_t stream) {
      if constexpr (std::is_same<KeyT, WideKey>::value)
      {
        return cub::DeviceRadixSort::SortPairs(temp, sortBytes, keys, values, n, Decomposer{}, stream);
      }
      else
      {
        return cub::DeviceRadixSort::SortPairs(temp, sortBytes, keys, values, n, 0, endBit, stream);
      }
    };
    std::size_t sortBytes = 0;
    NG_CUDA_CHECK(sort(nullptr, sortBytes, run.stream), "sizing the radix sort of cell keys");
    void* temp = scratch.ensure(sortBytes, "radix sort scratch");
    SortGraph::Launch launch;
    launch.buffers[0] = keys.Current();
    launch.buffers[1] = keys.Alternate();
    launch.buffers[2] = values.Current();
    launch.buffers[3] = values.Alternate();
    launch.temp = temp;
    launch.tempBytes = sortBytes;
    launch.count = n;
    launch.endBit = endBit;
    launch.stream = run.stream;
    const int keysFrom = keys.selector, valuesFrom = values.selector;
    const bool captured = graph.work.launch(launch, run.stream, [&](cudaStream_t stream) {
      NG_CUDA_CHECK(sort(temp, sortBytes, stream), "radix-sorting cell keys");
    }, "radix-sorting cell keys (a graph)");
    // CUB swaps a DoubleBuffer's selector on the host as its passes swap the buffers.
    if (captured)
    {
      graph.keySelector = keys.selector ^ keysFrom;
      graph.valueSelector = values.selector ^ valuesFrom;
    }
    else
    {
      keys.selector = keysFrom ^ graph.keySelector;
      values.selector = valuesFrom ^ graph.valueSelector;
    }
    // The order may have ended in either value buffer (build() starts it where the passes it
    // expects leave it in orderToInput): it lives in orderToInput from here on.
    if (values.Current() != orderToInput)
    {
      NG_CUDA_CHECK(cudaMemcpyAsync(orderToInput, values.Current(), sizeof(std::int32_t) * std::size_t(n),
                      cudaMemcpyDeviceToDevice, run.stream),
        "moving the sorted order");
    }
  }

  /// Queues selectStarts over the cells' keys; where identityCells is given (Bits keys, a cleared
  /// identity table: RadixCells::clearedIdentityTable) the selection fills it, and kept, as it
  /// finds each start (IdentityCellsAtStarts).
  template <class Keys>
  static void selectStartsFilling(CudaRun& run, Keys cellKeys, std::int32_t* starts, int* runCount, int* runCountHost,
    DeviceBuffer<unsigned char>& scratch, std::int32_t* identityCells, std::uint64_t* kept)
  {
    if constexpr (!std::is_same<KeyT, WideKey>::value)
    {
      if (identityCells)
      {
        int* countOnHost = nullptr;
        NG_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&countOnHost), runCountHost, 0),
          "mapping the cell count");
        const IdentityCellsAtStarts<Keys> sink{ cellKeys, starts, identityCells, kept, countOnHost, static_cast<int>(run.count) };
        selectStarts(run, cellKeys, thrust::make_tabulate_output_iterator(sink), runCount, nullptr, scratch);
        return;
      }
    }
    selectStarts(run, cellKeys, starts, runCount, runCountHost, scratch);
  }

  /// The sorted keys without their x bins: the cells' keys.
  static auto cellKeysOf(const KeyT* sorted, int xBinBits)
  {
    if constexpr (std::is_same<KeyT, WideKey>::value)
    {
      return sorted;
    }
    else
    {
      return thrust::make_transform_iterator(sorted, CellOfBinnedKey<KeyT>{ xBinBits });
    }
  }

  /// Queues the search for where each cell of grouped keys (every key's items adjacent) starts,
  /// and n after the last: `starts` (room for the cells and one more), their number at runCount
  /// and, once the stream gets there, at runCountHost where given (else `starts` puts it there:
  /// IdentityCellsAtStarts). One selection of the positions where the key changes: 20 us on the
  /// 4M row and 188 us on the 64M one (H200), where a run-length encoding and a scan of its
  /// counts took 31 and 283.
  template <class Keys, class Starts>
  static void selectStarts(CudaRun& run, Keys keys, Starts starts, int* runCount, int* runCountHost,
    DeviceBuffer<unsigned char>& scratch)
  {
    const int n = static_cast<int>(run.count);
    const thrust::counting_iterator<int> positions(0);
    const StartsCell<Keys> startsCell{ keys, n };
    std::size_t selectBytes = 0;
    NG_CUDA_CHECK(cub::DeviceSelect::If(nullptr, selectBytes, positions, starts, runCount, n + 1, startsCell, run.stream),
      "sizing the search for cell starts");
    void* temp = scratch.ensure(std::max(scratch.bytes(), selectBytes), "cell start scratch");
    NG_CUDA_CHECK(cub::DeviceSelect::If(temp, selectBytes, positions, starts, runCount, n + 1, startsCell, run.stream),
      "finding the cells (where the keys change)");
    if (runCountHost)
    {
      NG_CUDA_CHECK(cudaMemcpyAsync(runCountHost, runCount, sizeof(int), cudaMemcpyDeviceToHost, run.stream),
        "reading the number of cells");
    }
  }
};

/// Calls f with a value of the key type of `mode`.
template <class F>
void withKeyType(KeyMode mode, const F& f)
{
  switch (mode)
  {
    case KeyMode::Bits32:
      f(std::uint32_t{});
      break;
    case KeyMode::Bits64:
      f(std::uint64_t{});
      break;
    case KeyMode::Wide:
      f(WideKey{});
      break;
  }
}

} // namespace

// --- RadixCells ---------------------------------------------------------------------------------
RadixCells::RadixCells(DevicePool& pool)
  : region_(pool), orderToInput_(pool), start_(pool), bitsSlots_(pool), identityCells_(pool), wideSlots_(pool),
    wideKeys_(pool), bitsKeys_(pool), scratch_(pool), runCount_(pool)
{
}

std::int64_t RadixCells::plannedBytes(std::int64_t n, const KeyLayout& layout, bool keepKeys)
{
  const KeyMode mode = layout.mode;
  const std::int64_t k = keySize(mode);
  const std::int64_t cells = cellCapacity(n, layout);
  const std::int64_t region = std::max<std::int64_t>(16 * n, 2 * alignUp(k * n) + 4 * n) + 512;
  std::int64_t bytes = region + 4 * n + 4 * (cells + 1) + lookupBytes(n, layout);
  if (keepKeys)
  {
    bytes += (mode == KeyMode::Wide ? k : 8) * cells;
  }
  // CUB's radix sort with double buffers needs about a tenth of a key per item, the selection less.
  return bytes + n / 4 + (std::int64_t(32) << 20);
}

std::int64_t RadixCells::heldBytes() const
{
  return std::int64_t(region_.bytes() + orderToInput_.bytes() + start_.bytes() + bitsSlots_.bytes() +
    identityCells_.bytes() + wideSlots_.bytes() + wideKeys_.bytes() + bitsKeys_.bytes() + scratch_.bytes() +
    runCount_.bytes());
}

RadixCells::Region RadixCells::ensureRegion(std::int64_t n, KeyMode mode)
{
  // keys A | keys B | values A, later the particles (16 bytes per point).
  const std::int64_t keyBytesAll = alignUp(keySize(mode) * n);
  const std::int64_t regionBytes = std::max<std::int64_t>(16 * n, 2 * keyBytesAll + 4 * n) + 512;
  unsigned char* region = region_.ensure(std::size_t(regionBytes), "cell keys and particles");
  orderToInput_.ensure(std::size_t(n), "cell order to input order");
  runCountHost_.ensure(1, "cell count (pinned host memory)");
  runCount_.ensure(1, "cell count");
  return Region{ region, region + keyBytesAll, reinterpret_cast<std::int32_t*>(region + 2 * keyBytesAll) };
}

int RadixCells::xBinBitsFor(const KeyLayout& layout, int wanted)
{
  const int keyBits = layout.mode == KeyMode::Bits32 ? 32 : layout.mode == KeyMode::Bits64 ? 64 : 0;
  return std::max(0, std::min({ wanted, maxXBinBits, keyBits - layout.bits }));
}

std::int32_t* RadixCells::clearedIdentityTable(CudaRun& run, const KeyLayout& layout, bool keepKeys, std::uint64_t*& kept)
{
  kept = nullptr;
  int log2Slots = 1;
  bool identity = false;
  sizeLookupBefore(run.count, layout, log2Slots, identity);
  if (!identity) // Wide keys never have one (sizeLookup)
  {
    return nullptr;
  }
  const std::size_t slots = std::size_t(1) << log2Slots;
  std::int32_t* identityCells = identityCells_.ensure(slots, "cell lookup table");
  // On the side stream, once what the stream queued before is done (the last run's searches,
  // the keys' computation); joinClearedTable joins it before the selection. On the 4M rows on the
  // H200 the keys' computation then started 4.4-4.7 us after the work before the sort stage,
  // against 8.4 after this clearing's 2.9 us on the stream (RESULTS.md, issue 22).
  clearingBeside_ = run.side != nullptr;
  if (clearingBeside_)
  {
    tableFree_.record(run.stream);
    tableFree_.holdBack(run.side, "clearing the cell lookup beside the keys");
  }
  NG_CUDA_CHECK(cudaMemsetAsync(identityCells, 0xff, slots * sizeof(std::int32_t), clearingBeside_ ? run.side : run.stream),
    "clearing the cell lookup");
  if (clearingBeside_)
  {
    tableCleared_.record(run.side);
  }
  kept = keepKeys ? bitsKeys_.ensure(std::size_t(cellCapacity(run.count, layout)), "cell keys") : nullptr;
  return identityCells;
}

void RadixCells::joinClearedTable(CudaRun& run)
{
  if (clearingBeside_)
  {
    tableCleared_.holdBack(run.stream, "joining the cleared cell lookup");
    clearingBeside_ = false;
  }
}

void RadixCells::build(CudaRun& run, const KeyLayout& layout, double cellSize, bool keepKeys, int xBinBits,
  const std::function<void()>& keysDone)
{
  const std::int64_t n = run.count;
  const Region r = ensureRegion(n, layout.mode);
  std::int32_t* orderToInput = orderToInput_.get();
  xBinBits_ = xBinBitsFor(layout, xBinBits);
  // The sort's passes swap the value buffers: the order starts in the buffer from which the last
  // build's passes (as many for the same points and key bits) left it in orderToInput, so that
  // it need not be copied there (a copy of 256 MB after the four passes of the 64M row).
  std::int32_t* first = valuesStartInOrder_ ? orderToInput : r.valuesA;
  std::int32_t* second = valuesStartInOrder_ ? r.valuesA : orderToInput;
  std::int32_t* start = start_.ensure(std::size_t(cellCapacity(n, layout)) + 1, "cell starts");
  withKeyType(layout.mode, [&](auto keyTag) {
    using KeyT = decltype(keyTag);
    // The inverse as particlesInOrder takes it, so that the bins come from the same frame coordinates.
    computeKeys<KeyT><<<blocksFor(n), 256, 0, run.stream>>>(run.input, static_cast<int>(n), cellSize, 1.0 / cellSize,
      xBinBits_, layout, static_cast<KeyT*>(r.keysA), first);
    NG_CUDA_CHECK_LAUNCH("computeKeys");
    // Queued after the keys, so that the GPU starts on them while the host queues the rest; the
    // clearing runs beside the radix sort.
    std::uint64_t* kept = nullptr;
    std::int32_t* identityCells = clearedIdentityTable(run, layout, keepKeys, kept);
    cub::DoubleBuffer<KeyT> keys(static_cast<KeyT*>(r.keysA), static_cast<KeyT*>(r.keysB));
    cub::DoubleBuffer<std::int32_t> values(first, second);
    using Build = RadixBuild<KeyT, WideKeyDecomposer>;
    Build::sortPairs(run, keys, values, layout.bits, xBinBits_, scratch_, orderToInput, sortGraph_);
    joinClearedTable(run);
    Build::selectStartsFilling(run, Build::cellKeysOf(keys.Current(), xBinBits_), start, runCount_.get(),
      runCountHost_.get(), scratch_, identityCells, kept);
    if (values.Current() != orderToInput)
    {
      valuesStartInOrder_ = !valuesStartInOrder_;
    }
    finishTable(run, layout, cellSize, keepKeys, Build::cellKeysOf(keys.Current(), xBinBits_), keysDone);
  });
}

void RadixCells::buildGrouped(CudaRun& run, const KeyLayout& layout, double cellSize, const std::int32_t* grouped,
  const InputPoints& inGroupedOrder)
{
  const std::int64_t n = run.count;
  // The region as build() uses it: keys in A.
  const Region r = ensureRegion(n, layout.mode);
  NG_CUDA_CHECK(cudaMemcpyAsync(orderToInput_.get(), grouped, sizeof(std::int32_t) * std::size_t(n),
                  cudaMemcpyDeviceToDevice, run.stream),
    "taking the grouped order");
  xBinBits_ = 0;
  std::int32_t* start = start_.ensure(std::size_t(cellCapacity(n, layout)) + 1, "cell starts");
  withKeyType(layout.mode, [&](auto keyTag) {
    using KeyT = decltype(keyTag);
    computeKeysOf<KeyT><<<blocksFor(n), 256, 0, run.stream>>>(
      inGroupedOrder, static_cast<int>(n), cellSize, layout, static_cast<KeyT*>(r.keysA));
    NG_CUDA_CHECK_LAUNCH("computeKeysOf");
    std::uint64_t* kept = nullptr;
    std::int32_t* identityCells = clearedIdentityTable(run, layout, false, kept);
    joinClearedTable(run);
    const KeyT* keys = static_cast<const KeyT*>(r.keysA);
    RadixBuild<KeyT, WideKeyDecomposer>::selectStartsFilling(
      run, keys, start, runCount_.get(), runCountHost_.get(), scratch_, identityCells, kept);
    finishTable(run, layout, cellSize, false, keys, {});
  });
}

template <class Keys>
void RadixCells::finishTable(CudaRun& run, const KeyLayout& layout, double cellSize, bool keepKeys, Keys keys,
  const std::function<void()>& keysDone)
{
  countKnown_.record(run.stream);
  auto waitForCells = [&]() {
    countKnown_.wait("finding the cells");
    return *runCountHost_.get() - 1;
  };
  table_ = CellTable{};
  table_.layout = layout;
  table_.cellSize = cellSize;
  table_.inverseCellSize = 1.0 / cellSize;
  table_.start = start_.get();
  CellLookup& lookup = table_.lookup;
  lookup.mode = layout.mode;
  // An identity table (the key its own slot) has as many slots whatever the count of cells, so it
  // is filled before the host has that count, and the caller's work on the particles (keysDone)
  // is queued behind it: the GPU does not idle while the count comes back (the 4M row's sort
  // stage on the H200: 0.390-0.400 -> 0.368-0.371 ms). Its kernels take the count from the device.
  const std::int64_t bound = cellCapacity(run.count, layout);
  sizeLookupBefore(run.count, layout, lookup.log2Slots, lookup.identity);
  int cells = -1;
  if (!lookup.identity)
  {
    cells = waitForCells();
    sizeLookup(layout.mode, layout.bits, std::max(1, cells), lookup.log2Slots, lookup.identity);
  }
  const std::size_t slots = std::size_t(1) << lookup.log2Slots;
  const std::int64_t most = cells >= 0 ? cells : bound; // cells, or a bound until the count is back
  const int* starts = runCount_.get();
  lookup.mask = slots - 1;
  if constexpr (std::is_same<typename std::iterator_traits<Keys>::value_type, WideKey>::value)
  {
    WideSlot* wide = wideSlots_.ensure(slots, "cell lookup table");
    NG_CUDA_CHECK(cudaMemsetAsync(wide, 0xff, slots * sizeof(WideSlot), run.stream), "clearing the cell lookup");
    lookup.wideSlots = wide;
    WideKey* kept = keepKeys ? wideKeys_.ensure(std::size_t(most), "cell keys") : nullptr;
    insertUniqueKeys<<<blocksFor(most), 256, 0, run.stream>>>(keys, table_.start, starts, lookup, wide, kept);
    NG_CUDA_CHECK_LAUNCH("insertUniqueKeys");
    table_.wideKeys = kept;
  }
  else if (lookup.identity)
  {
    // Filled by the selection of the cell starts (clearedIdentityTable, selectStartsFilling).
    lookup.identityCells = identityCells_.get();
    table_.bitsKeys = keepKeys ? bitsKeys_.get() : nullptr;
  }
  else
  {
    BitsSlot* bits = bitsSlots_.ensure(slots, "cell lookup table");
    NG_CUDA_CHECK(cudaMemsetAsync(bits, 0xff, slots * sizeof(BitsSlot), run.stream), "clearing the cell lookup");
    lookup.bitsSlots = bits;
    std::uint64_t* kept = keepKeys ? bitsKeys_.ensure(std::size_t(most), "cell keys") : nullptr;
    insertUniqueKeys<<<blocksFor(most), 256, 0, run.stream>>>(keys, table_.start, starts, lookup, bits, kept);
    NG_CUDA_CHECK_LAUNCH("insertUniqueKeys");
    table_.bitsKeys = kept;
  }
  // The keys are read: the caller's particles may take their memory.
  if (keysDone)
  {
    keysDone();
  }
  table_.cells = cells >= 0 ? cells : waitForCells();
}

void RadixCells::cellOfInput(CudaRun& run, std::int32_t* out)
{
  cellOfInputKernel<<<blocksFor(run.count), 256, 0, run.stream>>>(
    table_.start, table_.cells, orderToInput_.get(), static_cast<int>(run.count), out);
  NG_CUDA_CHECK_LAUNCH("cellOfInput");
}

// --- SlotCells ----------------------------------------------------------------------------------
SlotCells::SlotCells(DevicePool& pool) : bitsSlots_(pool), slotOf_(pool), ranks_(pool) {}

namespace
{
/// The hashed table's slots for n points on a Bits layout: sizeLookup's, but hashed rather than
/// one slot per key where the key space is larger than maxTableSlots (sizeLookup's Wide mode is
/// its rule without the identity table).
void planSlotTable(std::int64_t n, const KeyLayout& layout, int& log2Slots, bool& identity, int slotsPerCell = 2)
{
  const std::int64_t cells = cellCapacity(n, layout);
  sizeLookup(layout.mode, layout.bits, cells, log2Slots, identity, slotsPerCell);
  if (identity && (std::int64_t(1) << log2Slots) > SlotCells::maxTableSlots)
  {
    sizeLookup(KeyMode::Wide, layout.bits, cells, log2Slots, identity);
  }
}
} // namespace

bool SlotCells::ranksCells(std::int64_t n, const KeyLayout& layout)
{
  if (layout.mode == KeyMode::Wide || std::getenv("NEIGHBORGRID_SLOT_CELLS_RANKED")) // knob: tests
  {
    return true;
  }
  int log2Slots = 1;
  bool identity = false;
  planSlotTable(n, layout, log2Slots, identity);
  return (std::int64_t(1) << log2Slots) > maxTableSlots;
}

std::int64_t SlotCells::plannedBytes(std::int64_t n, const KeyLayout& layout, int slotsPerCell)
{
  if (ranksCells(n, layout))
  {
    return 4 * n + RadixCells::plannedBytes(n, layout, true);
  }
  int log2Slots = 1;
  bool identity = false;
  planSlotTable(n, layout, log2Slots, identity, slotsPerCell);
  return 4 * n + (std::int64_t(1) << log2Slots) * std::int64_t(sizeof(BitsSlot));
}

std::int64_t SlotCells::heldBytes() const
{
  return std::int64_t(bitsSlots_.bytes() + slotOf_.bytes()) + ranks_.heldBytes();
}

void SlotCells::build(CudaRun& run, const KeyLayout& layout, double cellSize, int slotsPerCell)
{
  const std::int64_t n = run.count;
  SlotInsert insert;
  if (!prepare(run, layout, cellSize, slotsPerCell, insert))
  {
    rankCells(run, layout, cellSize);
    return;
  }
  // No count of the occupied cells comes back to the host: nothing reads it, and waiting for it
  // was a host round trip in every sort of Counting Sort, FENNS and CLAWS.
  insertPointKeys<<<blocksFor(n), 256, 0, run.stream>>>(insert, static_cast<int>(n));
  NG_CUDA_CHECK_LAUNCH("insertPointKeys");
}

void SlotCells::rankCells(CudaRun& run, const KeyLayout& layout, double cellSize)
{
  // Rank the cells with the radix sort; the rank is the slot, the radix lookup finds it.
  std::int32_t* slotOf = slotOf_.ensure(std::size_t(run.count), "cell slot of each point");
  ranks_.build(run, layout, cellSize, true);
  ranks_.cellOfInput(run, slotOf);
  table_ = ranks_.table();
  slots_ = table_.cells;
}

bool SlotCells::prepare(CudaRun& run, const KeyLayout& layout, double cellSize, int slotsPerCell, SlotInsert& insert)
{
  const std::int64_t n = run.count;
  table_ = CellTable{};
  if (ranksCells(n, layout))
  {
    return false;
  }
  table_.layout = layout;
  table_.cellSize = cellSize;
  table_.inverseCellSize = 1.0 / cellSize;
  table_.cellsAreSlots = true;
  CellLookup& lookup = table_.lookup;
  lookup.mode = layout.mode;
  planSlotTable(n, layout, lookup.log2Slots, lookup.identity, slotsPerCell);
  const std::size_t slots = std::size_t(1) << lookup.log2Slots;
  lookup.mask = slots - 1;
  BitsSlot* table = bitsSlots_.ensure(slots, "occupied-cell table");
  NG_CUDA_CHECK(cudaMemsetAsync(table, 0xff, slots * sizeof(BitsSlot), run.stream), "clearing the occupied-cell table");
  lookup.bitsSlots = table;
  slots_ = static_cast<std::int32_t>(slots);
  table_.cells = slots_;
  insert.input = run.input;
  insert.cellSize = cellSize;
  insert.inverseCellSize = 1.0 / cellSize;
  insert.layout = layout;
  insert.lookup = lookup;
  insert.table = table;
  insert.slotOf = slotOf_.ensure(std::size_t(n), "cell slot of each point");
  return true;
}

CellTable SlotCells::table(const std::int32_t* start) const
{
  CellTable t = table_;
  t.start = start;
  return t;
}

} // namespace detail
} // namespace neighborgrid
