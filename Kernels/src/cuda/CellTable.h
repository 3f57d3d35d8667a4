// Grouping points by cell on the GPU (CellGrid.h): the two ways the methods build their cells.
//  - RadixCells (Green's radix sort): keys sorted with CUB, runs of equal keys are the cells, in
//    key order, and a lookup table maps a key to its cell. Any key mode.
//  - SlotCells (Hoetzlein's and FENNS's counting sorts): each point inserts its cell's key into a
//    hash table of occupied cells, whose slot is the cell id; the method counts and scatters by
//    slot. Bits keys (an atomic compare-and-swap per key); keys wider than 64 bits are ranked by
//    RadixCells first and the rank is the slot.
// Included only by .cu files.
#pragma once

#include "CudaRun.h"

#include <algorithm>
#include <functional>

namespace neighborgrid
{
namespace detail
{

/// A grid of cells as the search kernels see it.
struct CellTable
{
  KeyLayout layout;
  double cellSize = 1.0;
  double inverseCellSize = 1.0;
  CellLookup lookup;                       // key -> cell id
  const std::int32_t* start = nullptr;     // cells + 1 entries: the points of cell k are [start[k], start[k + 1])
  std::int32_t cells = 0;
  const WideKey* wideKeys = nullptr;       // cell id -> key (Wide keys)
  const std::uint64_t* bitsKeys = nullptr; // cell id -> key (Bits keys, cells in key order)
  bool cellsAreSlots = false;              // Bits slot tables: cell id = slot, its key in the slot

  NG_HD int find(const double c[3]) const { return lookup.find(layout, c); }
  /// Bits keys: the cell at integer offsets from the lowest cells (KeyLayout::bitsKeyOfOffsets),
  /// or -1 where no point lies.
  NG_HD int findAtOffsets(const std::int64_t offset[3]) const
  {
    std::uint64_t key;
    return layout.bitsKeyOfOffsets(offset, key) ? lookup.findBits(key) : -1;
  }
  /// Bits keys: cell id -> key.
  NG_HD std::uint64_t bitsKeyOf(int cell) const { return cellsAreSlots ? lookup.bitsSlots[cell].key : bitsKeys[cell]; }
  NG_HD void coordinates(int cell, double c[3]) const
  {
    if (layout.mode == KeyMode::Wide)
    {
      layout.cellOfWideKey(wideKeys[cell], c);
    }
    else
    {
      layout.cellOfBitsKey(bitsKeyOf(cell), c);
    }
  }
};

/// A method's particles as separate queries (Problem::queries) search them, after its sort: its
/// cells with their points' ranges, `reach` cells each way around a query's own cell (cell size
/// at least R / reach), or every particle (Brute Force).
struct QuerySource
{
  CellTable table;                           // lookup, cell size and each cell's first point
  const std::int32_t* secondStart = nullptr; // CLAWS: a cell's border section, a second range
  const Particle* particles = nullptr;
  const std::int32_t* orderToInput = nullptr; // null: the particles are in input order
  int reach = 1;
  bool bruteForce = false;
};

/// The query source of a method whose particles lie, by cell, in `table`.
inline QuerySource cellQuerySource(const CellTable& table, const Particle* particles,
  const std::int32_t* orderToInput, int reach)
{
  QuerySource q;
  q.table = table;
  q.particles = particles;
  q.orderToInput = orderToInput;
  q.reach = reach;
  return q;
}

/// The lookup size for n points on this layout when the cells are not counted yet: at most one
/// cell per point, and no more than the key space.
inline std::int64_t cellCapacity(std::int64_t n, const KeyLayout& layout)
{
  if (layout.mode != KeyMode::Wide && layout.bits < 62)
  {
    return std::min<std::int64_t>(n, std::int64_t(1) << layout.bits);
  }
  return n;
}

/// The bin of frame coordinate x (a point's place in its cell, [0, 1]) among 2^xBinBits equal
/// bins along the cell's x axis: bin b holds [b, b + 1) / 2^xBinBits (the last also 1). The
/// product is exact (a power of two), so the sort (RadixCells::build) and a search that stages
/// the points find the same bin from the same float.
__device__ __forceinline__ int xBinOf(float x, int xBinBits)
{
  const int bins = 1 << xBinBits;
  const float scaled = x * float(bins);
  return scaled > 0.0f ? min(bins - 1, int(scaled)) : 0; // NaN (a huge cell): bin 0
}

/// CUB's radix sort of RadixCells::build as a CUDA graph (CapturedWork), for the buffers and
/// sizes it was captured for, and where that sort leaves its keys and values.
struct SortGraph
{
  struct Launch
  {
    const void* buffers[4] = { nullptr, nullptr, nullptr, nullptr }; // keys' and values' pairs
    const void* temp = nullptr;
    std::size_t tempBytes = 0;
    int count = 0, endBit = 0;
    cudaStream_t stream = nullptr;
    bool operator==(const Launch& o) const
    {
      return std::equal(buffers, buffers + 4, o.buffers) && temp == o.temp && tempBytes == o.tempBytes &&
        count == o.count && endBit == o.endBit && stream == o.stream;
    }
  };
  CapturedWork<Launch> work;
  int keySelector = 0, valueSelector = 0;
};

class RadixCells
{
public:
  explicit RadixCells(DevicePool& pool);
  /// Device bytes build() holds for n points (cells <= n), the particles' 16 bytes per point
  /// included: they reuse the memory of the keys.
  static std::int64_t plannedBytes(std::int64_t n, const KeyLayout& layout, bool keepKeys);
  /// Groups the run's points by cells of `cellSize`, keys by `layout`: orderToInput(), the cells
  /// in key order, a lookup table; particleRegion() (16 bytes per point) is then free for the
  /// caller. keepKeys: the table can give each cell's coordinates. xBinBits: up to that many bits
  /// (xBinBitsFor) order each cell's points by their x bin (xBinOf), at no cost in memory; the
  /// sort then takes those bits more. keysDone, when given, queues work that may write
  /// particleRegion() (the gather of the particles): it is called once the keys are read, and
  /// where it can be, before the host waits for the number of cells.
  void build(CudaRun& run, const KeyLayout& layout, double cellSize, bool keepKeys, int xBinBits = 0,
    const std::function<void()>& keysDone = {});
  /// The x bin bits build() takes for `wanted`: those the layout's key word leaves free (none for
  /// Wide keys), at most maxXBinBits.
  static int xBinBitsFor(const KeyLayout& layout, int wanted);
  static constexpr int maxXBinBits = 2;
  /// The lookup table of n points on this layout sized before their cells are counted (at most
  /// cellCapacity cells), and whether it is an identity table: the key its own slot, so that no
  /// lookup hashes and the table is filled before the count of cells is back (build()).
  static void sizeLookupBefore(std::int64_t n, const KeyLayout& layout, int& log2Slots, bool& identity)
  {
    sizeLookup(layout.mode, layout.bits, std::max<std::int64_t>(1, cellCapacity(n, layout)), log2Slots, identity);
  }
  /// Whether build() looks the cells of n points on this layout up in an identity table.
  static bool looksUpByIdentity(std::int64_t n, const KeyLayout& layout)
  {
    int log2Slots = 0;
    bool identity = false;
    sizeLookupBefore(n, layout, log2Slots, identity);
    return identity;
  }
  /// The x bin bits of the last build (0: a cell's points in input order).
  int xBinBits() const { return xBinBits_; }
  /// The same without the sort, for points already grouped by these cells: `grouped` (run.count
  /// input indices) puts every cell's points next to each other (a Morton order of finer cells
  /// aligned to these), and inGroupedOrder holds their coordinates in that order (read as a
  /// stream). The cells are in that order, not in key order; no keys are kept.
  void buildGrouped(CudaRun& run, const KeyLayout& layout, double cellSize, const std::int32_t* grouped,
    const InputPoints& inGroupedOrder);
  const CellTable& table() const { return table_; }
  std::int32_t* orderToInput() const { return orderToInput_.get(); }
  Particle* particleRegion() const { return reinterpret_cast<Particle*>(region_.get()); }
  /// out[i] = the cell of input point i, for n points.
  void cellOfInput(CudaRun& run, std::int32_t* out);
  std::int64_t heldBytes() const;

private:
  struct Region
  {
    void* keysA;
    void* keysB;
    std::int32_t* valuesA;
  };
  /// The key buffers for n points (the particles reuse them later), and the small buffers.
  Region ensureRegion(std::int64_t n, KeyMode mode);
  /// The table of the cells whose starts selectStarts queued (start_, runCount_): the lookup
  /// table of their keys (cell k's: keys[start[k]]), and the number of cells from the host.
  /// An identity table is filled by the selection of the cell starts (selectStartsFilling).
  template <class Keys>
  void finishTable(CudaRun& run, const KeyLayout& layout, double cellSize, bool keepKeys, Keys keys,
    const std::function<void()>& keysDone);
  /// The identity table of n = run.count points on this layout, cleared, and the array for the
  /// kept keys (keepKeys) in kept; null where the cells are not looked up by identity. It is
  /// sized before the cells are counted, so the selection of their starts fills it as it goes.
  /// The clearing runs on the run's side stream where it has one, until joinClearedTable.
  std::int32_t* clearedIdentityTable(CudaRun& run, const KeyLayout& layout, bool keepKeys, std::uint64_t*& kept);
  /// The stream's work from here on waits for the clearing of clearedIdentityTable.
  void joinClearedTable(CudaRun& run);
  DeviceBuffer<unsigned char> region_;
  DeviceBuffer<std::int32_t> orderToInput_;
  DeviceBuffer<std::int32_t> start_;
  DeviceBuffer<BitsSlot> bitsSlots_;
  DeviceBuffer<std::int32_t> identityCells_;
  DeviceBuffer<WideSlot> wideSlots_;
  DeviceBuffer<WideKey> wideKeys_;
  DeviceBuffer<std::uint64_t> bitsKeys_;
  DeviceBuffer<unsigned char> scratch_;
  SortGraph sortGraph_;
  DeviceBuffer<int> runCount_;
  PinnedBuffer<int> runCountHost_;
  StreamMark countKnown_;   // runCountHost_ holds the count of cell starts
  StreamMark tableFree_;    // the stream's work before the identity table's clearing
  StreamMark tableCleared_; // the identity table is cleared (on the side stream)
  bool clearingBeside_ = false;
  CellTable table_;
  int xBinBits_ = 0;
  bool valuesStartInOrder_ = false; // build(): the sort's values start in orderToInput (not values A)
};

/// One point's insertion into SlotCells' hashed table of occupied cells (SlotCells::prepare):
/// the point's cell key by compare-and-swap into the first free or matching slot from its home.
struct SlotInsert
{
  InputPoints input;
  double cellSize = 1.0;
  double inverseCellSize = 1.0; // 1.0 / cellSize
  KeyLayout layout;
  CellLookup lookup;
  BitsSlot* table = nullptr;
  std::int32_t* slotOf = nullptr; // written: the slot of each point, input order

  /// Inserts point i's cell and returns its slot (also written to slotOf[i]).
  __device__ std::int32_t insert(std::int64_t i) const
  {
    double c[3];
    inputCell(input, i, cellSize, inverseCellSize, c);
    std::uint64_t key = 0;
    layout.bitsKey(c, key);
    unsigned long long* keys = reinterpret_cast<unsigned long long*>(&table[0].key);
    constexpr int stride = sizeof(BitsSlot) / sizeof(unsigned long long);
    for (std::uint64_t s = lookup.home(key);; s = (s + 1) & lookup.mask)
    {
      unsigned long long seen = keys[s * stride];
      if (seen == emptyKey)
      {
        seen = atomicCAS(keys + s * stride, emptyKey, key);
        if (seen == emptyKey)
        {
          table[s].cell = static_cast<std::int32_t>(s);
          seen = key;
        }
      }
      if (seen == key)
      {
        slotOf[i] = static_cast<std::int32_t>(s);
        return static_cast<std::int32_t>(s);
      }
    }
  }
};

/// The slots SlotCells::build wrote (ranked cells, or a method's second pass): insert() reads them.
struct SlotsGiven
{
  const std::int32_t* slotOf = nullptr;
  __device__ std::int32_t insert(std::int64_t i) const { return slotOf[i]; }
};

class SlotCells
{
public:
  explicit SlotCells(DevicePool& pool);
  /// The most slots of the hashed table: slot indices, and the starts of CLAWS's two sections a
  /// slot (2 slots + 1 of them), stay in 32-bit ints.
  static constexpr std::int64_t maxTableSlots = std::int64_t(1) << 29;
  /// Whether build() ranks the cells with the radix sort (slots are then the occupied cells, at
  /// most one a point) instead of hashing them: keys wider than 64 bits, or a table that would
  /// need more than maxTableSlots slots (an upper bound of one cell a point: sparse clouds of
  /// more than 2^28 points, or a far outlier beside them).
  static bool ranksCells(std::int64_t n, const KeyLayout& layout);
  /// Device bytes build() holds for n points.
  static std::int64_t plannedBytes(std::int64_t n, const KeyLayout& layout, int slotsPerCell = 2);
  /// Slot of every point's cell (slotOf(), input order) in a table of occupied cells, with at
  /// least slotsPerCell slots a cell (a table at most half full by default).
  void build(CudaRun& run, const KeyLayout& layout, double cellSize, int slotsPerCell = 2);
  /// build() in two halves, for a caller whose own kernel inserts every point (SlotInsert) beside
  /// its own work on the point, one launch and one read of the slots fewer: prepare() plans and
  /// clears the table and fills `insert`; once the caller's kernel has run, slots(), slotOf() and
  /// table() are as after build(). False where build() ranks the cells (ranksCells): call it then.
  bool prepare(CudaRun& run, const KeyLayout& layout, double cellSize, int slotsPerCell, SlotInsert& insert);
  /// The table for a caller whose kernel takes every point's slot as it counts: count(insert)
  /// after prepare(), or count(SlotsGiven) after build() where the cells are ranked.
  template <class Count>
  void buildWhile(CudaRun& run, const KeyLayout& layout, double cellSize, int slotsPerCell, Count&& count)
  {
    SlotInsert insert;
    if (prepare(run, layout, cellSize, slotsPerCell, insert))
    {
      count(insert);
      return;
    }
    rankCells(run, layout, cellSize); // prepare() found that build() would rank them
    count(SlotsGiven{ slotOf() });
  }
  std::int32_t slots() const { return slots_; }
  const std::int32_t* slotOf() const { return slotOf_.get(); }
  /// The table, with the caller's start array over slots (slots() + 1 entries).
  CellTable table(const std::int32_t* start) const;
  std::int64_t heldBytes() const;

private:
  /// build() where the cells are ranked (ranksCells).
  void rankCells(CudaRun& run, const KeyLayout& layout, double cellSize);
  DeviceBuffer<BitsSlot> bitsSlots_;
  DeviceBuffer<std::int32_t> slotOf_;
  RadixCells ranks_; // ranksCells()
  CellTable table_;
  std::int32_t slots_ = 0;
};

} // namespace detail
} // namespace neighborgrid
