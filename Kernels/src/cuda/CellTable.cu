// Grouping points by cell on the GPU: RadixCells and SlotCells (CellTable.h).
#include "CellTable.h"

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_run_length_encode.cuh>
#include <cub/device/device_scan.cuh>
#include <cuda/std/tuple>
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
      c[a] = cellCoordinate(x[a], size);
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
    inputCell(points, s, size, c);
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

/// Cell k of the sorted unique keys into the lookup table (slots claimed by their cell field, or
/// stored where the key is its own slot: lookup.identity);
/// kept[k] = its key when the caller keeps them. Slot: BitsSlot (Bits keys) or WideSlot.
template <class KeyT, class Slot, class KeptT>
__global__ void insertUniqueKeys(const KeyT* __restrict__ unique, int cells, CellLookup lookup, Slot* slots,
  KeptT* __restrict__ kept)
{
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= cells)
  {
    return;
  }
  const auto key = asSlotKey(unique[k]);
  bool stored = false;
  if constexpr (std::is_same<Slot, BitsSlot>::value)
  {
    // The key is its own slot and the keys are unique: one store, no claim (the 4M row's 1.6M
    // cells: 34 -> 17 us under the profiler).
    if (lookup.identity)
    {
      slots[lookup.home(key)] = BitsSlot{ key, k, -1 };
      stored = true;
    }
  }
  for (std::uint64_t s = lookup.home(key); !stored; s = (s + 1) & lookup.mask)
  {
    if (atomicCAS(&slots[s].cell, -1, k) == -1)
    {
      slots[s].key = key;
      stored = true;
    }
  }
  if (kept)
  {
    kept[k] = key;
  }
}

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

/// Slots for at most `cells` cells.
std::int64_t lookupBytes(KeyMode mode, int bits, std::int64_t cells)
{
  int log2Slots = 1;
  bool identity = false;
  sizeLookup(mode, bits, std::max<std::int64_t>(1, cells), log2Slots, identity);
  return (std::int64_t(1) << log2Slots) * (mode == KeyMode::Wide ? sizeof(WideSlot) : sizeof(BitsSlot));
}

template <class KeyT, class Decomposer>
struct RadixBuild
{
  /// Sorts keys/values (DoubleBuffers in place), run-length encodes the sorted keys into
  /// `unique` and `counts`, and returns the number of cells.
  static int sortAndEncode(CudaRun& run, cub::DoubleBuffer<KeyT>& keys, cub::DoubleBuffer<std::int32_t>& values,
    int bits, int xBinBits, std::int32_t* counts, int* runCount, int* runCountHost,
    DeviceBuffer<unsigned char>& scratch, std::int32_t* orderToInput, KeyT*& unique)
  {
    bits += xBinBits;
    const int n = static_cast<int>(run.count);
    std::size_t sortBytes = 0, encodeBytes = 0;
    if constexpr (std::is_same<KeyT, WideKey>::value)
    {
      NG_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sortBytes, keys, values, n, Decomposer{}, run.stream),
        "sizing the radix sort of cell keys");
    }
    else
    {
      NG_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sortBytes, keys, values, n, 0, std::max(1, bits), run.stream),
        "sizing the radix sort of cell keys");
    }
    NG_CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(nullptr, encodeBytes, keys.Current(), keys.Alternate(), counts,
                    runCount, n, run.stream),
      "sizing the run-length encoding of cell keys");
    void* temp = scratch.ensure(std::max(sortBytes, encodeBytes), "radix sort scratch");
    if constexpr (std::is_same<KeyT, WideKey>::value)
    {
      NG_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, sortBytes, keys, values, n, Decomposer{}, run.stream),
        "radix-sorting cell keys");
    }
    else
    {
      NG_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, sortBytes, keys, values, n, 0, std::max(1, bits), run.stream),
        "radix-sorting cell keys");
    }
    // The order may have ended in either value buffer: it lives in orderToInput from here on, and
    // the other one (values A) takes the counts of the cells.
    if (values.Current() != orderToInput)
    {
      NG_CUDA_CHECK(cudaMemcpyAsync(orderToInput, values.Current(), sizeof(std::int32_t) * std::size_t(n),
                      cudaMemcpyDeviceToDevice, run.stream),
        "moving the sorted order");
    }
    // The keys' other buffer takes the unique keys: the cells' keys, without the x bins.
    unique = keys.Alternate();
    if constexpr (!std::is_same<KeyT, WideKey>::value)
    {
      if (xBinBits > 0)
      {
        return encode(run, thrust::make_transform_iterator(keys.Current(), CellOfBinnedKey<KeyT>{ xBinBits }), unique,
          counts, runCount, runCountHost, scratch);
      }
    }
    return encode(run, keys.Current(), unique, counts, runCount, runCountHost, scratch);
  }

  /// Run-length encodes grouped keys (every key's items adjacent) into `unique` and `counts`, and
  /// returns the number of cells.
  template <class Keys>
  static int encode(CudaRun& run, Keys keys, KeyT* unique, std::int32_t* counts, int* runCount, int* runCountHost,
    DeviceBuffer<unsigned char>& scratch)
  {
    const int n = static_cast<int>(run.count);
    std::size_t encodeBytes = 0;
    NG_CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(nullptr, encodeBytes, keys, unique, counts, runCount, n, run.stream),
      "sizing the run-length encoding of cell keys");
    void* temp = scratch.ensure(std::max(scratch.bytes(), encodeBytes), "run-length encoding scratch");
    NG_CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(temp, encodeBytes, keys, unique, counts, runCount, n, run.stream),
      "finding the cells (run-length encoding)");
    NG_CUDA_CHECK(cudaMemcpyAsync(runCountHost, runCount, sizeof(int), cudaMemcpyDeviceToHost, run.stream),
      "reading the number of cells");
    NG_CUDA_CHECK(cudaStreamSynchronize(run.stream), "finding the cells");
    return *runCountHost;
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
  : region_(pool), orderToInput_(pool), start_(pool), bitsSlots_(pool), wideSlots_(pool), wideKeys_(pool),
    bitsKeys_(pool), scratch_(pool), runCount_(pool)
{
}

std::int64_t RadixCells::plannedBytes(std::int64_t n, const KeyLayout& layout, bool keepKeys)
{
  const KeyMode mode = layout.mode;
  const std::int64_t k = keySize(mode);
  const std::int64_t cells = cellCapacity(n, layout);
  const std::int64_t region = std::max<std::int64_t>(16 * n, 2 * alignUp(k * n) + 4 * n) + 512;
  std::int64_t bytes = region + 4 * n + 4 * (cells + 1) + lookupBytes(mode, layout.bits, cells);
  if (keepKeys)
  {
    bytes += (mode == KeyMode::Wide ? k : 8) * cells;
  }
  // CUB's radix sort with double buffers needs about a tenth of a key per item, the encoding less.
  return bytes + n / 4 + (std::int64_t(32) << 20);
}

std::int64_t RadixCells::heldBytes() const
{
  return std::int64_t(region_.bytes() + orderToInput_.bytes() + start_.bytes() + bitsSlots_.bytes() +
    wideSlots_.bytes() + wideKeys_.bytes() + bitsKeys_.bytes() + scratch_.bytes() + runCount_.bytes());
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

void RadixCells::build(CudaRun& run, const KeyLayout& layout, double cellSize, bool keepKeys, int xBinBits)
{
  const std::int64_t n = run.count;
  const Region r = ensureRegion(n, layout.mode);
  std::int32_t* orderToInput = orderToInput_.get();
  xBinBits_ = xBinBitsFor(layout, xBinBits);
  int cells = 0;
  void* uniqueKeys = nullptr;
  withKeyType(layout.mode, [&](auto keyTag) {
    using KeyT = decltype(keyTag);
    // The inverse as particlesInOrder takes it, so that the bins come from the same frame coordinates.
    computeKeys<KeyT><<<blocksFor(n), 256, 0, run.stream>>>(run.input, static_cast<int>(n), cellSize, 1.0 / cellSize,
      xBinBits_, layout, static_cast<KeyT*>(r.keysA), r.valuesA);
    NG_CUDA_CHECK_LAUNCH("computeKeys");
    cub::DoubleBuffer<KeyT> keys(static_cast<KeyT*>(r.keysA), static_cast<KeyT*>(r.keysB));
    cub::DoubleBuffer<std::int32_t> values(r.valuesA, orderToInput);
    KeyT* unique = nullptr;
    cells = RadixBuild<KeyT, WideKeyDecomposer>::sortAndEncode(run, keys, values, layout.bits, xBinBits_, r.valuesA,
      runCount_.get(), runCountHost_.get(), scratch_, orderToInput, unique);
    uniqueKeys = unique;
  });
  finishTable(run, layout, cellSize, keepKeys, cells, uniqueKeys, r.valuesA);
}

void RadixCells::buildGrouped(CudaRun& run, const KeyLayout& layout, double cellSize, const std::int32_t* grouped,
  const InputPoints& inGroupedOrder)
{
  const std::int64_t n = run.count;
  // The region as build() uses it: keys in A, the unique keys in B, the counts in values A.
  const Region r = ensureRegion(n, layout.mode);
  NG_CUDA_CHECK(cudaMemcpyAsync(orderToInput_.get(), grouped, sizeof(std::int32_t) * std::size_t(n),
                  cudaMemcpyDeviceToDevice, run.stream),
    "taking the grouped order");
  xBinBits_ = 0;
  int cells = 0;
  withKeyType(layout.mode, [&](auto keyTag) {
    using KeyT = decltype(keyTag);
    computeKeysOf<KeyT><<<blocksFor(n), 256, 0, run.stream>>>(
      inGroupedOrder, static_cast<int>(n), cellSize, layout, static_cast<KeyT*>(r.keysA));
    NG_CUDA_CHECK_LAUNCH("computeKeysOf");
    cells = RadixBuild<KeyT, WideKeyDecomposer>::encode(run, static_cast<const KeyT*>(r.keysA),
      static_cast<KeyT*>(r.keysB), r.valuesA, runCount_.get(), runCountHost_.get(), scratch_);
  });
  finishTable(run, layout, cellSize, false, cells, r.keysB, r.valuesA);
}

void RadixCells::finishTable(CudaRun& run, const KeyLayout& layout, double cellSize, bool keepKeys, int cells,
  const void* uniqueKeys, const std::int32_t* counts)
{
  // Cell starts: an inclusive sum of the counts after a zero.
  std::int32_t* start = start_.ensure(std::size_t(cells) + 1, "cell starts");
  NG_CUDA_CHECK(cudaMemsetAsync(start, 0, sizeof(std::int32_t), run.stream), "cell starts");
  std::size_t scanBytes = 0;
  NG_CUDA_CHECK(cub::DeviceScan::InclusiveSum(nullptr, scanBytes, counts, start + 1, cells, run.stream),
    "sizing the cell scan");
  void* temp = scratch_.ensure(std::max<std::size_t>(scanBytes, 1), "scan scratch");
  NG_CUDA_CHECK(cub::DeviceScan::InclusiveSum(temp, scanBytes, counts, start + 1, cells, run.stream),
    "scanning cell counts");

  // The lookup table.
  table_ = CellTable{};
  table_.layout = layout;
  table_.cellSize = cellSize;
  table_.inverseCellSize = 1.0 / cellSize;
  table_.start = start;
  table_.cells = cells;
  CellLookup& lookup = table_.lookup;
  lookup.mode = layout.mode;
  sizeLookup(layout.mode, layout.bits, cells, lookup.log2Slots, lookup.identity);
  const std::size_t slots = std::size_t(1) << lookup.log2Slots;
  lookup.mask = slots - 1;
  if (layout.mode == KeyMode::Wide)
  {
    WideSlot* wide = wideSlots_.ensure(slots, "cell lookup table");
    NG_CUDA_CHECK(cudaMemsetAsync(wide, 0xff, slots * sizeof(WideSlot), run.stream), "clearing the cell lookup");
    lookup.wideSlots = wide;
    WideKey* kept = keepKeys ? wideKeys_.ensure(std::size_t(cells), "cell keys") : nullptr;
    insertUniqueKeys<<<blocksFor(cells), 256, 0, run.stream>>>(
      static_cast<const WideKey*>(uniqueKeys), cells, lookup, wide, kept);
    NG_CUDA_CHECK_LAUNCH("insertUniqueKeys");
    table_.wideKeys = kept;
  }
  else
  {
    BitsSlot* bits = bitsSlots_.ensure(slots, "cell lookup table");
    NG_CUDA_CHECK(cudaMemsetAsync(bits, 0xff, slots * sizeof(BitsSlot), run.stream), "clearing the cell lookup");
    lookup.bitsSlots = bits;
    std::uint64_t* kept = keepKeys ? bitsKeys_.ensure(std::size_t(cells), "cell keys") : nullptr;
    if (layout.mode == KeyMode::Bits32)
    {
      insertUniqueKeys<<<blocksFor(cells), 256, 0, run.stream>>>(
        static_cast<const std::uint32_t*>(uniqueKeys), cells, lookup, bits, kept);
    }
    else
    {
      insertUniqueKeys<<<blocksFor(cells), 256, 0, run.stream>>>(
        static_cast<const std::uint64_t*>(uniqueKeys), cells, lookup, bits, kept);
    }
    NG_CUDA_CHECK_LAUNCH("insertUniqueKeys");
    table_.bitsKeys = kept;
  }
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
