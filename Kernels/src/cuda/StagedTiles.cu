// Staged Tiles: the two-step shared-memory search of FENNS and CLAWS (Groß, Köster, Krüger 2019,
// 2020), rebuilt around what limits it on a Hopper GPU: the number of candidates each point tests.
//
// Kept from the papers:
//  - step one in global memory: the points are sorted into a grid of cells (here with the radix
//    sort of RadixCells, keyed by cell coordinates, occupied cells only: CellGrid.h);
//  - step two in shared memory: one thread block per tile of cells stages the points of its tile
//    and of the tile's border region (the neighbors within R) into shared memory, and every
//    neighbor test and kernel evaluation of the tile's points reads them there;
//  - the fine-grained work inside the block, one thread per point of the tile, each pair test in
//    float with the exact double decision inside a narrow band (PairTest.h); density and
//    smoothing skip the decision, since their terms vanish at R (termsVanishAtRadius).
// Changed, and why (measured on an H100, Testing/Benchmarks/RESULTS.md):
//  - Cells of R / 2 instead of R where the data are dense (reachFor). A point's neighbors lie
//    within two cells on each axis, and the 5 x 5 x 5 cells around its own hold 125 / 8 = 15.6
//    R^3 of candidates instead of 27 R^3. On top of that each point skips the rows of cells that
//    lie beyond R from it and trims each row to the quarters of its end cells that its sphere
//    reaches (each cell's points lie in the order of their quarter along x: two more bits of the
//    sort's key, RadixCells), so it tests about 2.0 candidates per neighbor instead of 6.6 (2.5
//    with whole cells; a Poisson cloud's estimate). With fewer than about 10 points per cell of R,
//    cells of R (reach 1): a tile of 4^3 of them then stages 6^3 cells instead of 8^3 cells of
//    R / 2 that hold a point or less each. Below about 1.6 points per cell of R no tile holds
//    enough points to pay for staging, and each point looks up its 27 cells of R instead.
//  - FENNS's coarse cells are sized to fill a block with one cell's points and stage a border of
//    R around them; here a tile is 4 x 4 x 4 cells (2 or 1 when the data are dense), or one cell
//    deeper along z (4 x 4 x 5) where that fills more of a block's 256 threads and still lets as
//    many blocks share an SM (chooseDepthAndCapacity: on the 4M rows a cube holds 155 points, a
//    deeper tile 190), and the staged region is the tile grown by `reach` cells, 8 x 8 x 8 (or 8
//    x 8 x 9) cells of R / 2 or 6 x 6 x 6 of R: every point is staged by about eight (7.2) or
//    3.4 blocks.
//  - Inside the block the staged points keep the global order (row-major by fine cell), so a
//    row of five cells is one contiguous range of shared memory: 25 loops per point, no per-cell
//    lookups. Threads of a warp take neighboring points and so read the same rows (broadcasts).
//    Each point lists its rows in shared memory, 25 entries a thread (in 16 bits instead of 32
//    for smoothing of two or three staged components, where that lets one more block share an
//    SM: RowFormat). What bounds the loop is shared
//    memory: on the 4M rows the L1's shared-memory pipe ran at 84-93% of its peak, half of its
//    wavefronts bank conflicts between the lanes' different candidates (RESULTS.md, issue 22).
//  - Smoothing stages the (weighted) values it smooths beside the points, so that no pair reads
//    global memory (stagedComponents; not where pairs are decided in double).
//  - Two inner loops over a staged tile. Count, density and smoothing of staged components: one
//    thread per point over its own rows (searchPointRows). Smoothing of two or more components
//    read from global memory: cluster pairs as in GROMACS's NxM
//    scheme (Páll and Hess 2013; searchClusterPairs): a warp tests four
//    points against the staged points within R of their box, each candidate read once for four
//    pair tests, every lane busy on every step. With about 80 neighbors a box of four points
//    lets through more candidates than a point's own sphere, and finding them takes a pass of
//    its own: on the 4M density row cluster pairs issued 1.4x the instructions of the loop per
//    point, so they pay only where each pair's terms cost more than its test (RESULTS.md, issue 22).
//  - Symmetric evaluation (CLAWS: each pair tested once and added to both points) only where its
//    shared-memory atomics are integer adds: Neighbor Count, and density where every point has
//    one mass, in 32-bit fixed point (countHalfShells, densityHalfShells), on uniform clouds in
//    cells of R / 2, periodic images included. On the 4M rows on the H200 their searches took
//    1.25 -> 0.93 ms (count) and 1.25 -> 1.00 (density). The other sums stay compensated (Kahan)
//    in registers over every neighbor: a float atomic add to shared memory is a compare-and-swap
//    loop on sm_90 (on the H100 a first half shell took density 2.23 -> 3.55 ms; RESULTS.md,
//    issue 22).
//  - Tiles are found from the occupied cells (the first occupied cell of each tile leads it), so
//    a far outlier adds one tile and no empty ones; a huge axis (CellGrid.h) is its own tile.
//  - A tile whose staged region does not fit in shared memory (a dense cluster) reads its
//    candidates from global memory instead: slower, never wrong. Its own points are spread over
//    blocks of 256 (work items of a tile and a chunk of its points), so a cluster of 40,000
//    points in a few cells keeps the GPU busy instead of one block per tile.
#include "GridSearch.cuh"
#include "ExclusiveSum.cuh"

#include <cub/block/block_scan.cuh>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>

#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <limits>
#include <map>
#include <string>
#include <utility>

namespace neighborgrid
{
namespace detail
{
namespace
{

/// A testing or benchmarking knob of Staged Tiles (NEIGHBORGRID_TILES_*): its value, or empty
/// where it is unset. A value not among `allowed` is refused, so that a misspelled knob never
/// measures or tests another path without saying so.
std::string tilesKnob(const char* name, std::initializer_list<const char*> allowed)
{
  const char* knob = std::getenv(name);
  if (!knob)
  {
    return "";
  }
  const std::string value = knob;
  std::string takes;
  std::size_t k = 0;
  for (const char* a : allowed)
  {
    if (value == a)
    {
      return value;
    }
    takes += (k == 0 ? "" : k + 1 == allowed.size() ? " or " : ", ") + ("'" + std::string(a) + "'");
    ++k;
  }
  throw Error("NeighborGrid: " + std::string(name) + " is '" + value + "'; it takes " + takes);
}

constexpr int tileThreads = 256;
constexpr int maxReach = 2;                                // neighbors lie within one or two cells
constexpr int maxTileSide = 4;                             // cells per tile along x and y
constexpr int maxTileDepth = maxTileSide + 1;              // cells per tile along z (chooseDepthAndCapacity)
constexpr int maxHalfShellDepth = maxTileSide + 2;         // along z over the half shell (chooseHalfShellTiles)
constexpr int maxStagedSide = maxTileSide + 2 * maxReach;  // 8
constexpr int maxStagedDepth = maxTileDepth + 2 * maxReach; // 9
constexpr int maxStagedCells = maxStagedSide * maxStagedSide * maxStagedDepth; // 576
constexpr int maxOwnCells = maxTileSide * maxTileSide * maxHalfShellDepth;     // 96
// The half shell stages no cells below its tiles (StagedRegion::below).
static_assert(maxStagedSide * maxStagedSide * (maxHalfShellDepth + maxReach) <= maxStagedCells,
  "the half shell's deepest region fits the block's tables");
constexpr int maxXBins = 1 << RadixCells::maxXBinBits;                         // 4
constexpr int stagedCellsPerThread = (maxStagedCells + tileThreads - 1) / tileThreads; // the block scan's
constexpr int ownCellsPerLane = (maxOwnCells + 31) / 32;                              // placeOwnCells'

/// A work item of the search: a tile, by its leader (its first occupied cell, and for Bits keys
/// that cell's key, so that a block finds its tile without waiting for a read of the key), and a
/// chunk of the tile's own points. Tiles listed on their grid (TileGrid) have no leader (-1): the
/// key of one of their cells finds them. With the key in the item, on the 4M rows on the H200:
/// count's search 1.273 -> 1.269 ms, density's 1.337 -> 1.332, 64M 21.68 -> 21.61 (RESULTS.md,
/// issue 22).
struct TileItem
{
  std::uint64_t leaderKey;
  int leader;
  // The chunk of the tile's own points (chunkBits low bits), and the layers of the tile's own
  // cells along z that the item takes (from firstLayer to endLayer, 0 for the tile's depth: 4 bits
  // each): a deep tile over a block's threads splits at a layer (splitLayerOf).
  std::uint32_t chunkAndLayers;
  static constexpr int chunkBits = 24;
  __host__ __device__ static TileItem of(std::uint64_t key, int leader, int chunk, int firstLayer = 0, int endLayer = 0)
  {
    return TileItem{ key, leader,
      std::uint32_t(chunk) | (std::uint32_t(firstLayer) << chunkBits) | (std::uint32_t(endLayer) << (chunkBits + 4)) };
  }
  __host__ __device__ int chunk() const { return int(chunkAndLayers & ((1u << chunkBits) - 1)); }
  __host__ __device__ int firstLayer() const { return int((chunkAndLayers >> chunkBits) & 15u); }
  __host__ __device__ int endLayer(int depth) const
  {
    const int end = int(chunkAndLayers >> (chunkBits + 4));
    return end > 0 ? end : depth;
  }
};

/// A tile's cells along axis a: side along x and y, depth along z.
__host__ __device__ __forceinline__ int tileExtent(int a, int side, int depth)
{
  return a == 2 ? depth : side;
}

/// The tile of fine cell c, tiles of side x side x depth cells: its lowest cell (anchor) and c's
/// place in it. A huge axis (CellGrid.h) has no neighbors, so its tile is the cell itself.
__device__ __forceinline__ void tileOf(const double c[3], int side, int depth, double anchor[3], int place[3])
{
  for (int a = 0; a < 3; ++a)
  {
    if (isHugeCell(c[a]))
    {
      anchor[a] = c[a];
      place[a] = 0;
    }
    else
    {
      // c is an integer: its remainder is exact, and so is c less it.
      const double extent = tileExtent(a, side, depth);
      double below = fmod(c[a], extent);
      below = below < 0.0 ? below + extent : below;
      anchor[a] = c[a] - below;
      place[a] = static_cast<int>(below);
    }
  }
}

/// A tile's lowest cell (its anchor), and cell k's place in the tile. Bits keys (no huge cell:
/// makeKeyLayout) keep the anchor as integer offsets from the layout's lowest cells, so that the
/// cells around it are found without floating point (cellNearAnchor); Wide keys keep its
/// coordinates (tileOf). Both make the tiles of tileOf.
struct TileAnchor
{
  double cell[3];         // Wide keys: the anchor's cell coordinates
  std::int64_t offset[3]; // Bits keys: the anchor's offsets from the lowest cells
  int place[3];           // cell k's place in its tile
};

/// The tile of cell k of `fine`, tiles of side x side x depth cells (side 1, 2 or 4; depth side or
/// side + 1); Bits keys take k's key.
__device__ TileAnchor tileAnchorOf(const CellTable& fine, int k, std::uint64_t bitsKey, int side, int depth)
{
  TileAnchor t;
  if (fine.layout.mode != KeyMode::Wide)
  {
    fine.layout.offsetsOfBitsKey(bitsKey, t.offset);
    for (int a = 0; a < 3; ++a)
    {
      // The cell coordinate modulo the tile's extent, rounded towards minus infinity as tileOf's
      // (the lowest cell is an integer below 2^53): for a power of two the low bits of its two's
      // complement.
      const int extent = tileExtent(a, side, depth);
      const std::int64_t c = static_cast<std::int64_t>(fine.layout.lowest[a]) + t.offset[a];
      int below = 0;
      if ((extent & (extent - 1)) == 0)
      {
        below = int(c & (extent - 1));
      }
      else
      {
        below = int(c % extent);
        below = below < 0 ? below + extent : below;
      }
      t.place[a] = below;
      t.offset[a] -= below;
    }
  }
  else
  {
    double c[3];
    fine.coordinates(k, c);
    tileOf(c, side, depth, t.cell, t.place);
  }
  return t;
}

/// The cell at (dx, dy, dz) cells from a tile's anchor, or -1 where no point lies (or where the
/// step leaves a huge axis: offsetCell).
__device__ __forceinline__ int cellNearAnchor(const CellTable& fine, const TileAnchor& t, int dx, int dy, int dz)
{
  if (fine.layout.mode != KeyMode::Wide)
  {
    const std::int64_t offset[3] = { t.offset[0] + dx, t.offset[1] + dy, t.offset[2] + dz };
    return fine.findAtOffsets(offset);
  }
  double cell[3];
  return offsetCell(t.cell, dx, dy, dz, cell) ? fine.find(cell) : -1;
}

/// Cell m's place (x, y, z) in a row-major box of S x S x D cells, for m < 1024 and S <= 8, given
/// inverseS = 1.0f / S: a float multiply divides exactly there ((m + 0.5) / S lies at least
/// 1 / (2 S) from an integer, the product within 1.2e-4 of it), where an integer division by a
/// runtime S takes about twenty instructions.
__device__ __forceinline__ void placeInBox(int m, int S, float inverseS, int& x, int& y, int& z)
{
  static_assert(maxStagedSide <= 8 && maxStagedCells <= 1024, "placeInBox divides exactly up to 1024 cells of S <= 8");
  const int row = int((m + 0.5f) * inverseS);
  z = int((row + 0.5f) * inverseS);
  y = row - z * S;
  x = m - row * S;
}

/// The occupied fine cells with their keys (Bits keys): from the kept keys, or from the slots of
/// an identity table where the keys are not kept (a slot is its key and holds its cell, or -1).
struct OccupiedCells
{
  CellTable fine;
  bool bySlot = false;

  __host__ __device__ std::int64_t count() const { return bySlot ? std::int64_t(fine.lookup.mask) + 1 : fine.cells; }
  /// The cell of entry i < count(), or -1 where it holds none.
  __device__ int cellAt(std::int64_t i) const
  {
    return bySlot ? fine.lookup.identityCells[i] : static_cast<int>(i);
  }
  /// The key of cell k at entry i (Bits keys; 0 for Wide keys).
  __device__ std::uint64_t keyAt(std::int64_t i, int k) const
  {
    if (bySlot)
    {
      return static_cast<std::uint64_t>(i);
    }
    return fine.layout.mode != KeyMode::Wide ? fine.bitsKeyOf(k) : 0;
  }
};

/// The leader of occupied fine cell k (its key: Bits keys) in its tile: the tile's first occupied
/// cell in row-major order, k itself where none comes before it. Where the data are dense the
/// tile's first cell is occupied, and this takes one lookup.
__device__ int tileLeaderOf(const CellTable& fine, int k, std::uint64_t key, int side, int depth)
{
  const TileAnchor tile = tileAnchorOf(fine, k, key, side, depth);
  const int mine = tile.place[0] + side * (tile.place[1] + side * tile.place[2]);
  const float inverseSide = 1.0f / side;
  for (int m = 0; m < mine; ++m)
  {
    int x, y, z;
    placeInBox(m, side, inverseSide, x, y, z);
    const int found = cellNearAnchor(fine, tile, x, y, z);
    if (found >= 0)
    {
      return found;
    }
  }
  return k;
}

/// ownPoints[leader of k's tile] += the points of each occupied fine cell k, over a cleared
/// ownPoints: each tile's own points then sit at its leader, and every other cell holds zero.
__global__ void addToTileLeaders(OccupiedCells occupied, int side, int depth, std::int32_t* __restrict__ ownPoints)
{
  const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int k = i < occupied.count() ? occupied.cellAt(i) : -1;
  if (k >= 0)
  {
    const CellTable& fine = occupied.fine;
    const int leader = tileLeaderOf(fine, k, occupied.keyAt(i, k), side, depth);
    atomicAdd(&ownPoints[leader], fine.start[k + 1] - fine.start[k]);
  }
}

/// The tiles of a Bits layout as a grid: tiles of side x side x depth cells anchored at multiples
/// of their extent (tileOf), numbered x fastest from the tile of the lowest cells. Where the grid
/// holds no more tiles than there are occupied cells (dense data), each tile's own points are
/// counted by its number instead of at its leader cell: no lookup a cell, and the scan and the
/// listing of the items run over the tiles, not the cells.
struct TileGrid
{
  std::int64_t lowest[3] = { 0, 0, 0 }; // the layout's lowest cells
  std::int64_t first[3] = { 0, 0, 0 };  // the tile of the lowest cells along each axis
  int extent[3] = { 1, 1, 1 };
  std::int64_t count[3] = { 1, 1, 1 }; // tiles along each axis

  static __host__ __device__ std::int64_t floorDivide(std::int64_t c, int extent)
  {
    const std::int64_t q = c / extent;
    return q * extent > c ? q - 1 : q;
  }
  /// Bits layouts only (their cells are integers below 2^53, none huge).
  static TileGrid of(const KeyLayout& layout, int side, int depth)
  {
    TileGrid g;
    for (int a = 0; a < 3; ++a)
    {
      g.extent[a] = tileExtent(a, side, depth);
      g.lowest[a] = static_cast<std::int64_t>(layout.lowest[a]);
      g.first[a] = floorDivide(g.lowest[a], g.extent[a]);
      const std::int64_t last = g.lowest[a] + static_cast<std::int64_t>(layout.span[a]) - 1;
      g.count[a] = floorDivide(last, g.extent[a]) - g.first[a] + 1;
    }
    return g;
  }
  __host__ __device__ double tiles() const { return double(count[0]) * double(count[1]) * double(count[2]); }
  /// The offsets of tile t's lowest cell from the layout's lowest cells (negative where the tile
  /// begins below them).
  __device__ void anchorOfTile(int t, std::int64_t o[3]) const
  {
    std::int64_t rest = t;
    for (int a = 0; a < 3; ++a)
    {
      o[a] = (first[a] + rest % count[a]) * extent[a] - lowest[a];
      rest /= count[a];
    }
  }
  /// The offsets of a cell of tile t that lies in the layout: its lowest cell, moved up to the
  /// layout's lowest cells where the tile begins below them. Its tile is t (tileAnchorOf).
  __device__ void cellOfTile(int t, std::int64_t o[3]) const
  {
    anchorOfTile(t, o);
    for (int a = 0; a < 3; ++a)
    {
      o[a] = max(std::int64_t(0), o[a]);
    }
  }
};

/// What the search kernel reads besides the operation.
struct TileSearch
{
  CellTable fine;                        // cells of R / 2 (with their keys: coordinates())
  const Particle* particles = nullptr;   // fine-cell order, frame coordinates of their own cell
  const std::int32_t* orderToInput = nullptr;
  bool hasImages = false;                // periodic images made on the device (Problem::images)
  int firstImage = 0;                    // the input index of the first one
  const TileItem* items = nullptr;       // work items: a tile (by its leader cell) and a chunk of its own points
  const int* itemCount = nullptr;        // how many (device memory)
  // A block a grid tile instead of listed items (StagedTiles::takesTilesDirectly): the blocks
  // take a tile of directGrid each, its first directChunks chunks of own points, and set
  // *restFlag (the host's mapped memory) where a tile holds more. 0 where the search reads items.
  int directTiles = 0;
  TileGrid directGrid;
  int* restFlag = nullptr;
  static constexpr int directChunks = 2;
  int side = maxTileSide;                // fine cells per tile along x and y: 1, 2 or 4
  int depth = maxTileSide;               // along z: side or side + 1 (chooseDepthAndCapacity)
  int reach = maxReach;                  // cells of R / reach: neighbors lie within `reach` cells
  int capacity = 0;                      // staged points that fit the block's shared memory
  float cullLimit = 0.0f;                // squared distance (fine-cell units) beyond which a row is skipped
  int xBinBits = 0;                      // each fine cell's points in 2^xBinBits bins along x (RadixCells)
  bool clusterPairs = false;             // staged tiles: cluster pairs, or one thread per point
  // Pairs decided in double so far in the run from which on a block lists its points' pairs
  // within rounding of R (BandPairs, searchPointRows).
  unsigned long long listBandFrom = ~0ull;
  PairTest test;
  // Neighbor Count over the half shell (takesHalfShell): the counts in input order, cleared
  // before the search; null for the loops over every neighbor.
  std::int32_t* halfShellCounts = nullptr;
  // Density over the half shell (takesHalfShell): the densities in input order, cleared before
  // the search, and what a sum of kernel shapes is multiplied by (the one mass times the
  // kernel's normalization).
  float* halfShellDensities = nullptr;
  float halfShellDensityScale = 0.0f;
};

/// Own points of a tile per block: all of a tile that can stage its region, in blocks of 1024; a
/// tile whose region would not fit at its own points' density reads candidates from global
/// memory and gets a block per 256 points. Any split is correct; this one only sets the speed.
/// The staged estimate ownTotal (staged cells / own cells) is compared with the capacity in
/// integers: with a division in double, the scan of the 64M row's 24M cells (TileChunks) took 159
/// us on the H200 instead of 76.
__host__ __device__ __forceinline__ int chunkPointsFor(int ownTotal, int side, int depth, int reach, int capacity)
{
  if (depth > side + 1)
  {
    // The half shell's deepest tiles (chooseHalfShellTiles) hold about a block's threads: a tile
    // a little over them takes a second block rather than a second round of its first (a grid
    // tile splits at a layer where it can: splitLayerOf).
    return tileThreads;
  }
  const int S = side + 2 * reach, D = depth + 2 * reach;
  const bool fits = std::int64_t(ownTotal) * (S * S * D) <= std::int64_t(capacity) * (side * side * depth);
  return fits ? 4 * tileThreads : tileThreads;
}

/// The work items of a tile of `own` points (chunkPointsFor): of(own) for a grid tile
/// (countGridTileItems), or at leader cell k (addToTileLeaders' ownPoints); none where no tile's
/// points are counted there.
struct TileChunks
{
  const std::int32_t* ownPoints = nullptr; // addToTileLeaders'
  int side = 1, depth = 1, reach = 1, capacity = 0;
  // countGridTileItems' entries: the work items, and the layer at which the tile splits from
  // splitShift on (ItemsOfTile).
  static constexpr int splitShift = 24;

  __host__ __device__ int operator()(int k) const { return of(ownPoints[k]); }
  /// Whether a grid tile of `own` points may split at a layer (splitLayerOf): the half shell's
  /// deepest tiles (chooseHalfShellTiles) a little over a block's threads.
  __host__ __device__ bool splitsAtLayers(int own) const
  {
    return depth > side + 1 && own > tileThreads && own <= 2 * tileThreads;
  }
  /// The work items of a tile of `own` points.
  __host__ __device__ int of(int own) const
  {
    if (own == 0)
    {
      return 0;
    }
    const int per = chunkPointsFor(own, side, depth, reach, capacity);
    return (own + per - 1) / per;
  }
};

/// The layer of own cells along z at which a tile of `own` points splits into two work items of
/// at most a block's threads each (pointsBelow(layer): the own points in the layers below), the
/// highest such; 0 where none does. The items take the layers below it and those from it up, and
/// each stages only its layers' region: the half shell's rows lie at or above a point's. A second
/// chunk of the tile's points staged the whole region for the few points beyond a block's
/// threads: on the 4M rows on the H200 the count search took 0.905 -> 0.898-0.899 ms, density's
/// 0.985-0.986 -> 0.979-0.980 (RESULTS.md, issue 22).
template <class PointsBelow>
__device__ int splitLayerOf(int own, int depth, PointsBelow&& pointsBelow)
{
  for (int layer = depth - 1; layer > 0; --layer)
  {
    const int below = pointsBelow(layer);
    if (below <= tileThreads)
    {
      return own - below <= tileThreads ? layer : 0;
    }
  }
  return 0;
}

/// countGridTileItems' entry: the tile's work items.
struct ItemsOfTile
{
  __host__ __device__ int operator()(int entry) const { return entry & ((1 << TileChunks::splitShift) - 1); }
};

/// itemsOfTile[t] = the work items of grid tile t (chunks.of its own points, from chunk
/// firstChunk on: StagedTiles::searchRest), a warp a tile: a lookup a cell of the tile, no
/// atomics. A lane's lookups are all issued before their cells' starts are read, so that the
/// warp waits on two reads in a row, not six (the 4M rows on the H200: 17.7-18.0 -> 16.0-16.3
/// us). The items, not the points, so that their scan reads a plain array: scanning TileChunks of
/// the points took 13.1 us there, and the sort stage took 0.352-0.353 -> 0.347 ms with this
/// (RESULTS.md, issue 22).
__global__ void countGridTileItems(
  CellTable fine, TileGrid grid, int tiles, TileChunks chunks, int firstChunk, std::int32_t* __restrict__ itemsOfTile)
{
  const std::int64_t t = (std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (t >= tiles) // whole warps: blocks of whole warps
  {
    return;
  }
  std::int64_t anchor[3];
  grid.anchorOfTile(static_cast<int>(t), anchor);
  const int side = grid.extent[0], cellsOfTile = side * side * grid.extent[2];
  const float inverseSide = 1.0f / side;
  int k[ownCellsPerLane];
  for (int e = 0; e < ownCellsPerLane; ++e)
  {
    const int m = threadIdx.x % 32 + 32 * e;
    int x, y, z;
    placeInBox(m, side, inverseSide, x, y, z);
    const std::int64_t offset[3] = { anchor[0] + x, anchor[1] + y, anchor[2] + z };
    k[e] = m < cellsOfTile ? fine.findAtOffsets(offset) : -1;
  }
  int counts[ownCellsPerLane];
  int own = 0;
  for (int e = 0; e < ownCellsPerLane; ++e)
  {
    counts[e] = k[e] >= 0 ? fine.start[k[e] + 1] - fine.start[k[e]] : 0;
    own += counts[e];
  }
  own = __reduce_add_sync(0xffffffffu, own);
  int items = max(0, chunks.of(own) - firstChunk);
  int split = 0;
  if (firstChunk == 0 && chunks.splitsAtLayers(own)) // the same for the whole warp
  {
    split = splitLayerOf(own, grid.extent[2], [&](int layer) {
      int below = 0;
      for (int e = 0; e < ownCellsPerLane; ++e)
      {
        const int m = threadIdx.x % 32 + 32 * e; // the lane's e-th own cell, in layers of side^2
        below += m < layer * side * side ? counts[e] : 0;
      }
      return __reduce_add_sync(0xffffffffu, below);
    });
    items = split > 0 ? 2 : items;
  }
  if (threadIdx.x % 32 == 0)
  {
    itemsOfTile[t] = items | (split << TileChunks::splitShift);
    if (t == 0)
    {
      itemsOfTile[tiles] = 0; // the scan's entry after the last tile
    }
  }
}

/// The work items of the tile that each occupied cell k leads, from position[k] on (an exclusive
/// sum of TileChunks): in the cells' key order, so that the blocks resident together stage
/// neighboring regions and the L2 serves a staged point to the blocks that share it.
__global__ void writeTileItems(OccupiedCells occupied, const std::int32_t* __restrict__ position,
  TileItem* __restrict__ items)
{
  const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int k = i < occupied.count() ? occupied.cellAt(i) : -1;
  if (k >= 0)
  {
    const int first = position[k], count = position[k + 1] - first;
    const std::uint64_t key = count > 0 ? occupied.keyAt(i, k) : 0;
    for (int c = 0; c < count; ++c)
    {
      items[first + c] = TileItem::of(key, k, c);
    }
  }
}

/// The work items of grid tile t from position[t] on (an exclusive sum of TileChunks over the
/// grid's tiles; its chunks from firstChunk on), in the tiles' order: the leader cell order of
/// dense data. The item's key is that of a cell of the tile (TileGrid::cellOfTile), from which
/// the search finds the tile as from its leader's (tileAnchorOf); Bits keys need no leader.
__global__ void writeGridTileItems(CellTable fine, TileGrid grid, int tiles, int firstChunk,
  const std::int32_t* __restrict__ itemsOfTile, const std::int32_t* __restrict__ position, TileItem* __restrict__ items)
{
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t < tiles)
  {
    const int first = position[t], count = position[t + 1] - first;
    if (count > 0)
    {
      std::int64_t offset[3];
      grid.cellOfTile(t, offset);
      std::uint64_t key = 0;
      fine.layout.bitsKeyOfOffsets(offset, key);
      const int split = itemsOfTile[t] >> TileChunks::splitShift;
      if (split > 0)
      {
        items[first] = TileItem::of(key, -1, 0, 0, split);
        items[first + 1] = TileItem::of(key, -1, 0, split, 0);
        return;
      }
      for (int c = 0; c < count; ++c)
      {
        items[first + c] = TileItem::of(key, -1, firstChunk + c);
      }
    }
  }
}

/// Count and density: pair() reads nothing but its arguments, so it can run for every candidate.
template <class Op>
constexpr bool pairReadsNoMemory()
{
  return std::is_same<Op, CountOperation>::value || std::is_same<Op, DensityOperation>::value;
}

/// Operations whose every term is continuous in r and zero at R (density and smoothing: each of
/// DESIGN.md's kernels vanishes at its cutoff). A pair within rounding of R adds at most w(q)
/// with its cutoff factor - q below 1.1e-5 (PairTest.h's band lies within 5e-6 of R, relative,
/// for cells of R or R / 2; plus the float rounding of q): under 3e-16 of the point's own w(0)
/// for the cubic spline, under 1e-21 for the other kernels, far below a float sum's rounding.
/// Deciding such a pair in double cannot change the result, so the loops add its float terms
/// (band-free, below). Neighbor Count's term is 1 up to R and 0 beyond: its pairs near R are
/// decided in double.
template <class Op>
constexpr bool termsVanishAtRadius()
{
  return !std::is_same<Op, CountOperation>::value;
}

template <class Op>
struct SmoothedComponents
{
  static constexpr int value = 0;
};
template <int Components>
struct SmoothedComponents<SmoothingOperation<Components>>
{
  static constexpr int value = Components;
};

/// The components of the values that band-free smoothing stages beside its points (0: none). A
/// pair's terms then read nothing but shared memory, as density's do, and the block stages no
/// indices. The staging multiplies each value by the point's weight; the first component rides
/// in the staged weight (one component: 16 bytes a point instead of 20, four blocks an SM instead
/// of three on the 4M row), the others in an array of their own, read as one vector a candidate.
/// With the band, the double decision adds op.pair()'s terms from the input's arrays, so nothing
/// is staged there.
template <class Op, bool Banded>
constexpr int stagedComponents()
{
  return Banded ? 0 : SmoothedComponents<Op>::value;
}

/// Floats a staged point takes in the array of the components after the first: a vector's width
/// (1, 2 or 4), so that one load reads them.
constexpr int stagedValueStride(int components)
{
  return components <= 1 ? 0 : components == 2 ? 1 : components == 3 ? 2 : 4;
}

/// Staged point q's components after the first, into v[1..components-1].
template <int Components>
__device__ __forceinline__ void loadStagedValues(const float* values, int q, float (&v)[Components])
{
  constexpr int stride = stagedValueStride(Components);
  if constexpr (stride == 1)
  {
    v[1] = values[q];
  }
  else if constexpr (stride == 2)
  {
    const float2 two = reinterpret_cast<const float2*>(values)[q];
    v[1] = two.x;
    v[2] = two.y;
  }
  else if constexpr (stride == 4)
  {
    const float4 four = reinterpret_cast<const float4*>(values)[q];
    v[1] = four.x;
    v[2] = four.y;
    v[3] = four.z;
  }
}

/// The last k in [0, count) with start[k] <= value (start ascending, start[0] <= value); start is
/// an array or a function of k.
__device__ __forceinline__ int at(const int* start, int k)
{
  return start[k];
}
template <class F>
__device__ __forceinline__ int at(const F& start, int k)
{
  return start(k);
}

template <class Starts>
__device__ __forceinline__ int lastAtMost(const Starts& start, int count, int value)
{
  int lo = 0, hi = count - 1;
  while (lo < hi)
  {
    const int mid = (lo + hi + 1) >> 1;
    if (at(start, mid) <= value)
    {
      lo = mid;
    }
    else
    {
      hi = mid - 1;
    }
  }
  return lo;
}

/// A particle in the block's frame: its own fine cell's frame moved by that cell's place (x, y, z)
/// in the staged region; one rounding per axis (PairTest.h, frame span = staged side).
__device__ __forceinline__ Particle staged(const Particle& p, int x, int y, int z)
{
  return Particle{ __fadd_rn(p.x, float(x)), __fadd_rn(p.y, float(y)), __fadd_rn(p.z, float(z)), p.w };
}

/// Distance from coordinate v to the cells `row` (a cell index along the axis) when row lies
/// `d` cells away from v's own cell: 0 for the own cell. NaN stays NaN (no culling).
__device__ __forceinline__ float gapTo(float v, int row, int d)
{
  return d > 0 ? __fsub_rn(float(row), v) : (d < 0 ? __fsub_rn(v, float(row + 1)) : 0.0f);
}

/// The float squared distance of a staged pair with fused multiply-adds: three roundings instead
/// of five, so PairTest.h's bound holds, in two instructions fewer per candidate. Both passes of
/// a loop use it, so they agree on which pairs lie in the band.
__device__ __forceinline__ float fusedSquaredDistance(const Particle& a, const Particle& b)
{
  const float dx = __fsub_rn(a.x, b.x), dy = __fsub_rn(a.y, b.y), dz = __fsub_rn(a.z, b.z);
  return __fmaf_rn(dz, dz, __fmaf_rn(dy, dy, __fmul_rn(dx, dx)));
}

/// Own cell m of a tile (side 1, 2 or 4 cells along x and y, any depth along z) in row-major
/// order, x fastest: the 32 own points of a warp then lie mostly in the same rows of cells along
/// x, whose points list the same rows of staged cells (each trimmed to its point's x bins).
/// Against the Morton order before it, on the 4M rows on the H200: the searches of count 0.922 ->
/// 0.906 ms (with about as many instructions: 697.3M against 699.1M), density 0.999 -> 0.989,
/// Shepard-1 1.349 -> 1.335, Shepard-3 1.876 -> 1.849 (RESULTS.md, issue 22).
__device__ __forceinline__ void ownCellPlace(int m, int side, int& x, int& y, int& z)
{
  const int sideBits = 31 - __clz(side);
  x = m & (side - 1);
  y = (m >> sideBits) & (side - 1);
  z = m >> (2 * sideBits);
}

/// The block's staged region in shared memory: each staged cell's points in global order
/// (cellFirst) and in staged order (cellStart), the tile's own points by own cell (ownStart).
struct StagedRegion
{
  int side = 1;
  int reach = 1;
  int S = 1; // staged cells along x and y (and along z, depth + reach + below)
  // Staged layers of cells below the tile along z: reach, or none for Neighbor Count over the
  // half shell, whose rows lie at or above a point's (countHalfShells: 448 cells instead of 576).
  int below = 1;
  int stagedCells = 1;
  int ownCells = 1;
  const int* cellFirst = nullptr;
  const int* cellStart = nullptr;          // until the search (it shares the search's scratch)
  const std::uint16_t* binStart = nullptr; // each staged cell's x bins in staged order (fits only)
  int xBinBits = 0;
  const int* ownStart = nullptr;
  const Particle* points = nullptr;     // staged order, the block's frame; [capacity] is the sentinel
  const std::int32_t* index = nullptr;  // global index per staged point, or null (found from the cell)
  const float* values = nullptr;        // stagedComponents() >= 2: the weighted components after the first
  int sentinel = 0;                     // the staged position of a point at infinity

  /// Own point t: its staged cell, place in that cell, and the cell's (x, y, z) in the region.
  __device__ __forceinline__ int ownCell(int t, int& x, int& y, int& z, int& offset) const
  {
    const int m = lastAtMost(ownStart, ownCells, t);
    ownCellPlace(m, side, x, y, z);
    x += reach;
    y += reach;
    z += below;
    offset = t - ownStart[m];
    return x + S * (y + S * z);
  }
  /// Where staged cell k's points start in the staged order, during the search of a region that
  /// fits (the first of its bins).
  __device__ __forceinline__ int stagedStart(int k) const { return binStart[k << xBinBits]; }
  /// The global index of staged point q.
  __device__ __forceinline__ int globalOf(int q) const
  {
    if (index)
    {
      return index[q];
    }
    const int k = lastAtMost([this](int c) { return stagedStart(c); }, stagedCells, q);
    return cellFirst[k] + (q - stagedStart(k));
  }
  /// globalOf(q) for staged point q at pq, without its search where the coordinates say: staged()
  /// adds the cell's place to a frame coordinate in [0, 1], so each axis's place is the
  /// coordinate's floor, or one less where the frame coordinate rounded up to 1 (the coordinate an
  /// integer: a point on a cell's upper edge, as every other plane of a lattice lies). Each guess
  /// stands where q lies in that cell's staged range. The pairs decided in double on a crystal
  /// with R on its first shell took 237M warp instructions with the search alone (4M points,
  /// Nsight Compute; RESULTS.md, issue 22).
  __device__ __forceinline__ int globalOfAt(int q, const Particle& pq) const
  {
    if (index)
    {
      return index[q];
    }
    const float v[3] = { pq.x, pq.y, pq.z };
    int k = 0, kBelow = 0;
    for (int a = 2; a >= 0; --a)
    {
      // The region's last place along the axis: a guess beyond it would read another cell's range.
      const int last = a == 2 ? stagedCells / (S * S) - 1 : S - 1;
      const int place = min(max(__float2int_rd(v[a]), 0), last); // NaN: 0, and the search decides
      k = k * S + place;
      kBelow = kBelow * S + (place > 0 && v[a] == float(place) ? place - 1 : place);
    }
    for (const int guess : { k, kBelow })
    {
      const int begin = stagedStart(guess);
      if (q >= begin && q < stagedStart(guess + 1))
      {
        return cellFirst[guess] + (q - begin);
      }
    }
    return globalOf(q);
  }
};

/// One candidate of a loop's float pass: a neighbor's terms added to partial (count and density
/// evaluate them without branching: their terms read no memory). Banded: true when the pair lies
/// within rounding of R and is left to isNeighborInDouble. Band-free (termsVanishAtRadius, and no
/// NaN frame coordinate in the region): every pair below the band's top adds its float terms,
/// and nothing is left to decide.
template <bool Banded, class Op>
__device__ __forceinline__ bool addFloatPair(const TileSearch& g, const Op& op, const StagedRegion& r, const Particle& pi,
  int q, typename Op::Value (&partial)[Op::Terms])
{
  const Particle pj = r.points[q];
  const float r2 = fusedSquaredDistance(pi, pj);
  const bool neighbor = r2 < (Banded ? g.test.accept : g.test.reject);
  typename Op::Value terms[Op::Terms];
  if constexpr (pairReadsNoMemory<Op>())
  {
    // Band-free density needs no test at all: beyond R the kernel is exactly zero (q beyond the
    // cutoff factor, or infinite for the sentinel), and no frame coordinate is NaN.
    op.pair(terms, 0, pj, r2);
    for (int a = 0; a < Op::Terms; ++a)
    {
      if (neighbor || !Banded)
      {
        partial[a] += terms[a];
      }
    }
  }
  else if constexpr (stagedComponents<Op, Banded>() > 0)
  {
    // SmoothingOperation::pair with the weight times the value staged (stagePoints): bit for bit
    // the same terms where the weight is one (Shepard), and added without a test as band-free
    // density's are (the sentinel's staged values are zero).
    constexpr int components = stagedComponents<Op, Banded>();
    // Three components: the two after the first are read only below the band's top, where w may
    // be nonzero, so a lane beyond it loads nothing. The loop is bound by shared-memory
    // wavefronts (4M Shepard-3, H200: 397M -> 350M, 2.69 -> 2.57 ms). Where one float is read
    // (two components), or four in cluster pairs, the predicate's instructions cost more than
    // the loads it saves (+1-2%), and every candidate reads them.
    constexpr bool readsBelowBandOnly = stagedValueStride(components) == 2;
    const float w = kernelShapeFromSquared(op.kernel, r2);
    float v[components] = {};
    v[0] = pj.w;
    if (neighbor || !readsBelowBandOnly)
    {
      loadStagedValues(r.values, q, v);
    }
    for (int c = 0; c < components; ++c)
    {
      partial[c] += w * v[c];
    }
    partial[components] += w;
  }
  else if (neighbor)
  {
    op.pair(terms, r.index[q], pj, r2);
    for (int a = 0; a < Op::Terms; ++a)
    {
      partial[a] += terms[a];
    }
  }
  return Banded && !neighbor && !(r2 > g.test.reject);
}

/// A pair of own point si (pi) and staged point q that the float pass left in the band, decided in
/// double from the input coordinates (PairTest.h); a neighbor's terms go to `terms`.
template <class Op>
__device__ __forceinline__ bool isNeighborInDouble(const TileSearch& g, const Op& op, const StagedRegion& r,
  const Particle& pi, int si, int q, unsigned& decidedHere, typename Op::Value (&terms)[Op::Terms])
{
  const Particle pj = r.points[q];
  float r2 = fusedSquaredDistance(pi, pj);
  bool neighbor = false;
  if (!(r2 < g.test.accept) && !(r2 > g.test.reject))
  {
    ++decidedHere;
    const int sj = r.globalOfAt(q, pj);
    if (g.test.exact(g.orderToInput[si], g.orderToInput[sj], r2))
    {
      op.pair(terms, sj, pj, r2);
      neighbor = true;
    }
  }
  return neighbor;
}

/// Whether own point si is a periodic image made on the device: a neighbor of the particles only,
/// since the engine returns the particles' results and an image's density is its particle's
/// (CudaBackend.cu, divideWeightsByDensity). The loops over every neighbor skip its sums: where a
/// warp holds particles too its image lanes only idle, but a warp of images alone (a tile's rows
/// beyond a face along y or z) costs nothing. The half shell searches an image as any point: a
/// pair of an image and a particle may fall to the image, and it adds to both, so each particle
/// gets the terms of every point within R of it, images included, as over every neighbor. What
/// goes to an image stays in its entry of the results, which the engine never returns
/// (Problem::returnedCount). On the H200, 4M points in a periodic box (`--periodic`, Auto): the
/// density search took 1.44 -> 1.15 ms (RESULTS.md, issue 22).
__device__ __forceinline__ bool isImage(const TileSearch& g, int si)
{
  // Without images the test reads nothing: the open box's loops stay as they were.
  return g.hasImages && g.orderToInput[si] >= g.firstImage;
}

// --- A tile that does not fit shared memory: one thread per point, candidates from global -------

/// The cells of the rows (5 along x) that reach within R of point pi of cell (x, y, z), each as
/// visitCell(cx, dy, dz, begin, end) with its points' global positions [begin, end): rows beyond R
/// skipped, the others trimmed to the cells the sphere spans; cullLimit carries a margin for the
/// rounding of the gaps (NaN coordinates, a huge cell: nothing skipped). HalfShell: only the rows
/// above the point's (dz > 0, or dz = 0 and dy >= 0; countHalfShellsFromGlobal).
template <bool HalfShell, class VisitCell>
__device__ __forceinline__ void forEachRowCellFromGlobal(
  const TileSearch& g, const StagedRegion& r, const Particle& pi, int x, int y, int z, VisitCell&& visitCell)
{
  for (int dz = HalfShell ? 0 : -r.reach; dz <= r.reach; ++dz)
  {
    const float gz = gapTo(pi.z, z + dz, dz);
    for (int dy = HalfShell && dz == 0 ? 0 : -r.reach; dy <= r.reach; ++dy)
    {
      const float gy = gapTo(pi.y, y + dy, dy);
      const float rest = g.cullLimit - (gy * gy + gz * gz);
      if (rest < 0.0f)
      {
        continue;
      }
      int first = x - r.reach, last = x + r.reach;
      if (rest == rest && pi.x == pi.x)
      {
        const float half = approximateSqrt(rest) + 1e-4f;
        first = max(first, __float2int_rd(pi.x - half));
        last = min(last, __float2int_rd(pi.x + half));
      }
      const int row = r.S * ((y + dy) + r.S * (z + dz));
      for (int cx = first; cx <= last; ++cx)
      {
        const int kj = row + cx;
        const int begin = r.cellFirst[kj];
        visitCell(cx, dy, dz, begin, begin + (r.cellStart[kj + 1] - r.cellStart[kj]));
      }
    }
  }
}

template <class Op>
__device__ void searchFromGlobal(
  const TileSearch& g, const Op& op, const StagedRegion& r, int chunkBegin, int chunkEnd, unsigned long long* decided)
{
  for (int t = chunkBegin + threadIdx.x; t < chunkEnd; t += tileThreads)
  {
    int x, y, z, offset;
    const int k = r.ownCell(t, x, y, z, offset);
    const int si = r.cellFirst[k] + offset;
    if (isImage(g, si))
    {
      continue;
    }
    const Particle pi = staged(g.particles[si], x, y, z);
    RegisterSums<Op> acc;
    unsigned decidedHere = 0;
    forEachRowCellFromGlobal<false>(g, r, pi, x, y, z, [&](int cx, int dy, int dz, int begin, int end) {
      for (int sj = begin; sj < end; ++sj)
      {
        const Particle pj = staged(g.particles[sj], cx, y + dy, z + dz);
        float r2 = squaredDistance(pi, pj);
        if (isNeighbor(g.test, r2, si, sj, g.orderToInput, decidedHere))
        {
          acc.add(op, sj, pj, r2);
        }
      }
    });
    acc.finish(op, si, g.orderToInput[si]);
    addDecided(decided, decidedHere);
  }
}

// --- A staged tile, one thread per point (count, density, one-component smoothing) -------------
// Each point lists the rows of staged cells its sphere reaches and tests every candidate in
// them: about 2.0 candidates per neighbor at 80 neighbors (forEachPointRow).

/// A point's rows in its thread's column of shared memory, an entry a row. Wide entries hold the
/// row's first and one-past-last staged positions in 16 bits each. Narrow entries hold its first
/// position in 11 bits and its length in 5, so a row longer than 31 candidates takes several
/// entries: the lists take half the shared memory, and smoothing of two or three staged
/// components takes them where that lets one more block share an SM (four instead of three:
/// StagedTiles::usesNarrowRows). A point whose pieces would not fit its 25 entries (rows through
/// cells of a dense clump) walks its rows without a list (searchPointRows).
template <bool Narrow>
struct RowFormat
{
  using Entry = std::uint32_t;
  static constexpr bool narrow = false; // a row is one entry: a region stages at most 65,535 points
  __device__ static Entry encode(int first, int length)
  {
    return std::uint32_t(first) | (std::uint32_t(first + length) << 16);
  }
  __device__ static void decode(unsigned entry, int& first, int& end)
  {
    first = int(entry & 0xffffu);
    end = int(entry >> 16);
  }
};

template <>
struct RowFormat<true>
{
  using Entry = std::uint16_t;
  static constexpr bool narrow = true;
  static constexpr int positionBits = 11;
  static constexpr int maxPosition = (1 << positionBits) - 1; // the largest capacity it serves
  static constexpr int maxLength = (1 << (16 - positionBits)) - 1;
  __device__ static Entry encode(int first, int length) { return Entry(first | (length << positionBits)); }
  __device__ static void decode(unsigned entry, int& first, int& end)
  {
    first = int(entry & unsigned(maxPosition));
    end = first + int(entry >> positionBits);
  }
};

/// A point's rows of cells: 25 at reach 2.
constexpr int maxPointRows = (2 * maxReach + 1) * (2 * maxReach + 1);

/// Shared memory for the row lists: maxPointRows entries per thread.
template <bool Narrow>
constexpr int rowListBytes()
{
  return maxPointRows * tileThreads * int(sizeof(typename RowFormat<Narrow>::Entry));
}

/// Neighbor Count tests two candidates of a row per step (the second, past the row's end, is the
/// sentinel at infinity): a row change and a loop step serve two pair tests. On the 4M row on the
/// H100 count took 2.23 ms against 2.31; density 2.87 against 2.70 and one-component smoothing
/// 4.94 against 4.24 (RESULTS.md, issue 22), so they test one a step.
template <class Op>
constexpr int candidatesPerStep()
{
  return std::is_same<Op, CountOperation>::value ? 2 : 1;
}

/// Calls visitRow(first, end) for each row of cells (2 Reach + 1 along x) that reaches within R
/// of point p of staged cell (x, y, z) and holds staged points, trimmed to the x bins of its cells
/// that its sphere spans, as staged positions [first, end). With four bins a cell (RadixCells'
/// x bins) a point tests about 2.0 candidates per neighbor instead of 2.5 with whole cells (a
/// Poisson cloud at reach 2; 3.5 instead of 4.9 at reach 1). Unrolled (Unroll = 2 Reach + 1) for
/// the lists: each gap along y and z is found once, and the rows' places are constants (the
/// loops over a runtime reach took about 40 instructions a row, an eighth of the 4M density
/// search's instructions); not unrolled (1) for the rare points that walk their rows without a
/// list. HalfShell: only the rows above the point's (dz > 0, or dz = 0 and dy > 0) and its own
/// row from staged position `after` + 1 on (countHalfShells).
template <int Reach, int Unroll = 2 * Reach + 1, bool HalfShell = false, class VisitRow>
__device__ __forceinline__ void forEachPointRow(const TileSearch& g, const StagedRegion& r, const Particle& p, int x,
  int y, int z, VisitRow&& visitRow, int after = -1)
{
  // The squared gaps: in registers when unrolled; found again a row when not (an array indexed
  // by a loop counter would live in local memory).
  float gapsY2[2 * Reach + 1], gapsZ2[2 * Reach + 1];
  // In units of x bins (products by a power of two: exact); a row's bins in binStart begin at
  // its first cell's, rowStride entries apart.
  const float bins = float(1 << r.xBinBits);
  const float xInBins = p.x * bins, marginInBins = 1e-4f * bins;
  const int firstBin = (x - Reach) << r.xBinBits, lastBin = ((x + Reach + 1) << r.xBinBits) - 1;
  const int rowStride = r.S << r.xBinBits, planeStride = rowStride * r.S;
  const int center = y * rowStride + z * planeStride;
  if constexpr (Unroll > 1)
  {
#pragma unroll
    for (int d = -Reach; d <= Reach; ++d)
    {
      const float gy = gapTo(p.y, y + d, d), gz = gapTo(p.z, z + d, d);
      gapsY2[d + Reach] = gy * gy;
      gapsZ2[d + Reach] = gz * gz;
    }
  }
  auto squaredGap = [&](const float* gaps2, float at, int cell, int d) {
    if constexpr (Unroll > 1)
    {
      return gaps2[d + Reach];
    }
    const float gap = gapTo(at, cell + d, d);
    return gap * gap;
  };
#pragma unroll Unroll
  for (int dz = -Reach; dz <= Reach; ++dz)
  {
#pragma unroll Unroll
    for (int dy = -Reach; dy <= Reach; ++dy)
    {
      if (HalfShell && (dz < 0 || (dz == 0 && dy < 0)))
      {
        continue;
      }
      // cullLimit's margin (1e-4, relative and absolute) lies far above the rounding of the sum.
      const float rest = g.cullLimit - (squaredGap(gapsY2, p.y, y, dy) + squaredGap(gapsZ2, p.z, z, dz));
      if (rest < 0.0f)
      {
        continue;
      }
      // The row's bins (binStart) from the first to the last that the sphere spans: a bin b of
      // cell c holds staged x in [c + b / bins, c + (b + 1) / bins], closed, as a cell holds
      // [c, c + 1] (one rounding: staged()).
      int first = firstBin, last = lastBin;
      if (rest == rest && p.x == p.x)
      {
        // The margin of 1e-4 cells lies far above the approximate root's error (2^-22 relative).
        const float half = fmaf(approximateSqrt(rest), bins, marginInBins);
        first = max(first, __float2int_rd(xInBins - half));
        last = min(last, __float2int_rd(xInBins + half));
      }
      const int row = center + dy * rowStride + dz * planeStride;
      int begin = r.binStart[row + first];
      const int end = r.binStart[row + last + 1];
      if (HalfShell && dz == 0 && dy == 0)
      {
        begin = max(begin, after + 1);
      }
      if (end > begin)
      {
        visitRow(begin, end);
      }
    }
  }
}

/// Point p's rows (forEachPointRow) written to the thread's column of `rows`, in Format's
/// entries. Returns the steps of the pair loop over them (PerStep candidates a step), or -1 when
/// narrow entries would not fit the column. The listing runs to its end either way: with an
/// early exit from it the 4M density search issued 1.7 times the warp instructions (fewer lanes
/// together in the sweep) and took 3.2 ms instead of 2.1 (RESULTS.md, issue 22).
template <int PerStep, int Reach, class Format, bool HalfShell = false>
__device__ __forceinline__ int listPointRowsOf(const TileSearch& g, const StagedRegion& r, const Particle& p, int x,
  int y, int z, typename Format::Entry* rows, int after = -1)
{
  typename Format::Entry* column = rows + threadIdx.x;
  int rowCount = 0, steps = 0;
  forEachPointRow<Reach, 2 * Reach + 1, HalfShell>(g, r, p, x, y, z, [&](int begin, int end) {
    if constexpr (!Format::narrow)
    {
      column[rowCount * tileThreads] = Format::encode(begin, end - begin);
      ++rowCount;
      steps += (end - begin + PerStep - 1) / PerStep;
    }
    else
    {
      for (int first = begin; first < end; first += Format::maxLength)
      {
        const int length = min(Format::maxLength, end - first);
        if (rowCount < maxPointRows)
        {
          column[rowCount * tileThreads] = Format::encode(first, length);
        }
        ++rowCount;
        steps += (length + PerStep - 1) / PerStep;
      }
    }
  }, after);
  return rowCount <= maxPointRows ? steps : -1;
}

template <int PerStep, class Format, bool HalfShell = false>
__device__ __forceinline__ int listPointRows(const TileSearch& g, const StagedRegion& r, const Particle& p, int x, int y,
  int z, typename Format::Entry* rows, int after = -1)
{
  return r.reach == 2 ? listPointRowsOf<PerStep, 2, Format, HalfShell>(g, r, p, x, y, z, rows, after)
                      : listPointRowsOf<PerStep, 1, Format, HalfShell>(g, r, p, x, y, z, rows, after);
}

/// Candidates a point's plain float sums take before they join its compensated sums (flush). Each
/// flush ends a chunk of the sweep, whose bookkeeping issues for the whole warp: on the 4M row on
/// the H200, flushes every 16, 32 and 64 candidates took the density search 1.565, 1.522 and
/// 1.498 ms, Shepard-3's 2.074, 2.041 and 2.024 (RESULTS.md, issue 22). A float sum of 64 terms
/// lies within 63 roundings (4e-6 of the terms' magnitudes) of its exact value, inside the
/// engine's accuracy against references in double (1e-5 relative); a point's ~80 neighbors
/// spread over two or three such sums.
constexpr int candidatesPerFlush = 64;

/// The pairs within rounding of R that a point's float pass leaves to the double decision
/// (addFloatPair). Counted: how many and the last one, two instructions a candidate; a point
/// with two or more passes over its candidates again. Listed: up to `slots` of them, so that
/// none passes again. A lattice with R on a neighbor shell puts every point's shell in the band
/// (six pairs on a simple cubic lattice, twelve on a face-centred one): there (4M points) every
/// point passing again took the count 3.40 ms, every point listing 1.85. But listing everywhere
/// took the uniform 4M count row, where about one point in 50 has one such pair, 1.79 -> 1.98 ms
/// (its loop is that tight), so a block lists only where the run has decided many pairs in
/// double before it (searchPointRows): 1.97 on the lattice (1.93 with the pairs decided four at a
/// time, decideListedInDouble), 1.78-1.79 on the uniform row (H200; RESULTS.md, issue 22).
template <bool Listed>
struct BandPairs
{
  int count = 0, last = 0;

  __device__ __forceinline__ void remember(int q)
  {
    ++count;
    last = q;
  }
  /// decide(q) for every pair remembered, or passAgain() where they are not all here.
  template <class Decide, class PassAgain>
  __device__ __forceinline__ void decideAll(Decide&& decide, PassAgain&& passAgain) const
  {
    if (count == 1)
    {
      decide(last);
    }
    else if (count > 1)
    {
      passAgain();
    }
  }
};

template <>
struct BandPairs<true>
{
  static constexpr int slots = 16;
  int count = 0;
  int at[slots]; // local memory (dynamic indices), written only for such pairs

  __device__ __forceinline__ void remember(int q)
  {
    if (count < slots)
    {
      at[count] = q;
    }
    ++count;
  }
  // Decided by decideListedInDouble, or where more than `slots`, by a second pass.
};

/// The pairs that point si listed within rounding of R (BandPairs<true>, at most its slots),
/// decided in double as isNeighborInDouble does, four at a time: the four candidates' global
/// indices, input indices and input coordinates are each read before any is used, and the own
/// point's coordinates once, so that a point waits on two global reads a batch instead of three a
/// pair. The same doubles and the same order of terms as one by one.
template <class Op>
__device__ __forceinline__ void decideListedInDouble(const TileSearch& g, const Op& op, const StagedRegion& r, int si,
  const BandPairs<true>& band, unsigned& decidedHere, typename Op::Value (&partial)[Op::Terms])
{
  constexpr int batch = 4;
  if (band.count == 0)
  {
    return;
  }
  double own[3];
  g.test.points.get(g.orderToInput[si], own[0], own[1], own[2]);
  for (int first = 0; first < band.count; first += batch)
  {
    int q[batch], sj[batch];
    Particle pj[batch];
    double b[batch][3];
#pragma unroll
    for (int k = 0; k < batch; ++k)
    {
      // Past the list's end, and for the sentinel (a NaN coordinate), the own point stands in.
      q[k] = band.at[min(first + k, band.count - 1)];
      pj[k] = r.points[q[k]];
      sj[k] = q[k] == r.sentinel ? si : r.globalOfAt(q[k], pj[k]);
    }
#pragma unroll
    for (int k = 0; k < batch; ++k)
    {
      g.test.points.get(g.orderToInput[sj[k]], b[k][0], b[k][1], b[k][2]);
    }
#pragma unroll
    for (int k = 0; k < batch; ++k)
    {
      if (first + k >= band.count || q[k] == r.sentinel)
      {
        continue;
      }
      ++decidedHere;
      const double r2 = exactSquaredDistance(own[0], own[1], own[2], b[k][0], b[k][1], b[k][2]);
      if (r2 <= g.test.radiusSquared)
      {
        typename Op::Value terms[Op::Terms];
        op.pair(terms, sj[k], pj[k], static_cast<float>(r2 * g.test.frameScale));
        for (int a = 0; a < Op::Terms; ++a)
        {
          partial[a] += terms[a];
        }
      }
    }
  }
}

/// Point si (pi): its sums and its result over the candidates that sweep(visit, flush) hands to
/// visit one by one, calling flush every candidatesPerFlush candidates or so; Banded as
/// addFloatPair, ListsBand as BandPairs' Listed.
template <bool Banded, bool ListsBand, class Op, class Sweep>
__device__ __forceinline__ void sumPointPairs(const TileSearch& g, const Op& op, const StagedRegion& r,
  const Particle& pi, int si, unsigned long long* decided, Sweep&& sweep)
{
  using Value = typename Op::Value;
  RegisterSums<Op> acc;
  unsigned decidedHere = 0;
  // Terms go to a plain float sum that joins the compensated one at every flush.
  Value partial[Op::Terms];
  for (int a = 0; a < Op::Terms; ++a)
  {
    partial[a] = 0;
  }
  auto flush = [&]() {
    acc.addTerms(partial);
    for (int a = 0; a < Op::Terms; ++a)
    {
      partial[a] = 0;
    }
  };
  // First pass: the pairs the float test decides (addFloatPair). The pairs within rounding of R
  // (about one point in 50 at 80 neighbors has one) are remembered (BandPairs).
  BandPairs<Banded && ListsBand> band;
  sweep(
    [&](int q) {
      if (addFloatPair<Banded>(g, op, r, pi, q, partial))
      {
        band.remember(q);
      }
    },
    flush);
  if constexpr (Banded)
  {
    // The pairs within rounding of R, decided in double from the input coordinates (PairTest.h).
    // The sentinel lies in the band only for a point with a NaN coordinate, and is no one's neighbor.
    auto decideInDouble = [&](int q) {
      Value terms[Op::Terms];
      if (q != r.sentinel && isNeighborInDouble(g, op, r, pi, si, q, decidedHere, terms))
      {
        for (int a = 0; a < Op::Terms; ++a)
        {
          partial[a] += terms[a];
        }
      }
    };
    if constexpr (ListsBand)
    {
      if (band.count <= BandPairs<true>::slots)
      {
        decideListedInDouble(g, op, r, si, band, decidedHere, partial);
      }
      else
      {
        sweep(decideInDouble, flush);
      }
    }
    else
    {
      band.decideAll(decideInDouble, [&]() { sweep(decideInDouble, flush); });
    }
  }
  flush();
  acc.finish(op, si, g.orderToInput[si]);
  if constexpr (Banded)
  {
    // Band-free: nothing was decided in double, and the warp's vote would cost density 0.4-1.0%
    // (4M row, H200).
    addDecided(decided, decidedHere);
  }
}

/// The candidates of a thread's column of rows (`steps` steps of PerStep candidates; past a row's
/// end the second of a step is the sentinel at infinity): visit(q) for each, flush() after every
/// StepsPerFlush steps and at the end. The rows as one sequence: every thread of a warp tests one
/// step's candidates until its own run out, so threads with short rows do not wait for threads
/// with long ones. Every instruction of the row change issues for every step (predicated off
/// where the row goes on), so it is kept to four or five.
template <class Format, int PerStep, int StepsPerFlush, class Visit, class Flush>
__device__ __forceinline__ void sweepColumn(
  const StagedRegion& r, const typename Format::Entry* column, int steps, Visit&& visit, Flush&& flush)
{
  // Wide entries: each row's entry is read one row ahead, so that a row change decodes a value
  // already in a register instead of waiting on a shared-memory load (the last read lands in
  // the staged points after the lists: searchTile). On the 4M row on the H200: density's search
  // 1.48 -> 1.42-1.43 ms, Shepard-1's 1.52 -> 1.50-1.51, count's unchanged; read ahead, the
  // narrow entries of Shepard-2 took 1.93 -> 1.98 ms, so they are read when needed (RESULTS.md,
  // issue 22).
  constexpr bool readsAhead = !Format::narrow;
  const typename Format::Entry* nextRow = column + (readsAhead ? tileThreads : 0);
  [[maybe_unused]] typename Format::Entry pending = readsAhead ? column[0] : 0;
  int q = 0, end = 0;
  for (int chunk = 0; chunk < steps; chunk += StepsPerFlush)
  {
    const int chunkSteps = min(StepsPerFlush, steps - chunk);
    for (int step = 0; step < chunkSteps; ++step)
    {
      if (q >= end)
      {
        if constexpr (readsAhead)
        {
          Format::decode(pending, q, end);
          pending = *nextRow;
        }
        else
        {
          Format::decode(*nextRow, q, end);
        }
        nextRow += tileThreads;
      }
      visit(q);
      if constexpr (PerStep == 2)
      {
        visit(q + 1 < end ? q + 1 : r.sentinel);
      }
      q += PerStep;
    }
    flush();
  }
}

/// sweepColumn's wide rows, two candidates a step (the second past a row's end the sentinel), as
/// visit(qa, a, qb, b) with the staged points read: each step's two are read before the step
/// before them is visited, so that their reads wait on no atomic of that step (countHalfShellPoint).
template <class VisitPair>
__device__ __forceinline__ void sweepPairsAhead(const StagedRegion& r, const std::uint32_t* column, int steps, VisitPair&& visit)
{
  using Format = RowFormat<false>;
  const std::uint32_t* nextRow = column + tileThreads;
  std::uint32_t pending = column[0];
  int q = 0, end = 0;
  auto next = [&](int& qa, int& qb) {
    if (q >= end)
    {
      Format::decode(pending, q, end);
      pending = *nextRow;
      nextRow += tileThreads;
    }
    qa = q;
    qb = q + 1 < end ? q + 1 : r.sentinel;
    q += 2;
  };
  if (steps <= 0)
  {
    return;
  }
  int qa, qb;
  next(qa, qb);
  Particle a = r.points[qa], b = r.points[qb];
  for (int step = 1; step < steps; ++step)
  {
    int na, nb;
    next(na, nb);
    const Particle nextA = r.points[na], nextB = r.points[nb];
    visit(qa, a, qb, b);
    qa = na;
    qb = nb;
    a = nextA;
    b = nextB;
  }
  visit(qa, a, qb, b);
}

/// Point si (pi) over the rows of its column (listPointRows, `steps` steps).
template <bool Banded, bool ListsBand, class Format, class Op>
__device__ __forceinline__ void sweepPointRows(const TileSearch& g, const Op& op, const StagedRegion& r,
  const typename Format::Entry* column, int steps, const Particle& pi, int si, unsigned long long* decided)
{
  constexpr int perStep = candidatesPerStep<Op>();
  // Integer sums (Neighbor Count) are exact: one chunk (4M count search 1.454 -> 1.422 ms).
  constexpr int stepsPerFlush = std::is_integral<typename Op::Value>::value ? std::numeric_limits<int>::max()
                                                                             : candidatesPerFlush / perStep;
  sumPointPairs<Banded, ListsBand>(g, op, r, pi, si, decided, [&](auto&& visit, auto&& flush) {
    sweepColumn<Format, perStep, stepsPerFlush>(r, column, steps, visit, flush);
  });
}

/// Point si (pi) over its rows found as it goes (forEachPointRow): a point whose narrow entries
/// would not fit its column. A call, so that the search's own loop keeps its code and registers
/// (inlined, it took the 4M density search from 2.10 to 2.18 ms); its arguments go by value (by
/// reference the kernel's parameters and region lived in local memory for the whole search: 3.5
/// ms).
template <bool Banded, int Reach, class Op>
__device__ __noinline__ void sweepPointRowsUnlisted(const TileSearch g, const Op op, const StagedRegion r,
  const Particle pi, int si, int x, int y, int z, unsigned long long* decided)
{
  sumPointPairs<Banded, false>(g, op, r, pi, si, decided, [&](auto&& visit, auto&& flush) {
    forEachPointRow<Reach, 1>(g, r, pi, x, y, z, [&](int begin, int end) {
      for (int q = begin; q < end; ++q)
      {
        visit(q);
        if ((q - begin) % candidatesPerFlush == candidatesPerFlush - 1)
        {
          flush();
        }
      }
      flush();
    });
  });
}

template <bool Banded, class Format, class Op>
__device__ void searchPointRows(const TileSearch& g, const Op& op, const StagedRegion& r,
  typename Format::Entry* rows, int chunkBegin, int chunkEnd, unsigned long long* decided)
{
  // Whether the block lists its points' pairs within rounding of R (BandPairs): where the blocks
  // before it have decided at least n / 4 pairs in double (listBandFrom). A uniform cloud decides
  // about one pair in 50 points in all; a lattice with R on a shell six a point.
  const bool listsBand = Banded && *static_cast<volatile unsigned long long*>(decided) >= g.listBandFrom;
  for (int t = chunkBegin + threadIdx.x; t < chunkEnd; t += tileThreads)
  {
    int x, y, z, offset;
    const int k = r.ownCell(t, x, y, z, offset);
    const int si = r.cellFirst[k] + offset;
    if (isImage(g, si))
    {
      continue;
    }
    const Particle pi = r.points[r.stagedStart(k) + offset];
    const int steps = listPointRows<candidatesPerStep<Op>(), Format>(g, r, pi, x, y, z, rows);
    if (listsBand && (!Format::narrow || steps >= 0))
    {
      sweepPointRows<Banded, true, Format>(g, op, r, rows + threadIdx.x, steps, pi, si, decided);
    }
    else if (!Format::narrow || steps >= 0)
    {
      sweepPointRows<Banded, false, Format>(g, op, r, rows + threadIdx.x, steps, pi, si, decided);
    }
    else if constexpr (Format::narrow)
    {
      if (r.reach == 2)
      {
        sweepPointRowsUnlisted<Banded, 2>(g, op, r, pi, si, x, y, z, decided);
      }
      else
      {
        sweepPointRowsUnlisted<Banded, 1>(g, op, r, pi, si, x, y, z, decided);
      }
    }
  }
}

// --- Neighbor Count over the half shell: each pair tested once (CLAWS's symmetric idea) --------
// A point tests the rows of cells above it (dz > 0, or dz = 0 and dy > 0) and the points after it
// in its own row: from the other point of a pair the rows lie below, so each pair is tested by
// one of its points only. A neighbor adds one to the point's count (a register) and one to the
// candidate's (a counter a staged point in shared memory: a 32-bit integer add is one
// instruction there on sm_90, where a float or a 64-bit add is a compare-and-swap loop). Each
// block adds its staged counters to the counts in input order, which every block of the search
// may reach. On the 4M count row on the H200 the search stage took 1.249-1.251 -> 1.111 ms
// (Nsight Compute: 923M -> 748M warp instructions), and 0.962 in a kernel of its own that holds
// five blocks an SM instead of four (stagedTilesCountHalfShells). Density with one mass for every
// point takes the same kernel's shape (densityHalfShells, below): 1.251 -> 1.000 ms. A first try
// of density in the count's kernel of four blocks, with fixed-point counters beside the staged
// masses, took 1.268 -> 1.508 (RESULTS.md, issue 22).

/// A point's rows of the half shell: 13 at reach 2 (two planes of 25 along z, two rows along y
/// and its own row), 5 at reach 1.
constexpr int maxHalfShellRows = (2 * maxReach + 1) * maxReach + maxReach + 1;

/// The half shell's row lists: 13 entries a thread instead of 25, so that with its counters in
/// the staged points (countHalfShells) a block takes 12 KiB less shared memory than the loop over
/// every neighbor, and five blocks share an SM instead of four (stagedTilesCountHalfShells).
constexpr int halfShellRowBytes = maxHalfShellRows * tileThreads * int(sizeof(std::uint32_t));

/// A staged point's counter: the float `w` of its staged copy, whose weight Neighbor Count never
/// reads, staged as +0 (all bits clear) and counted as an integer. The pair loop reads a whole
/// staged point in one 16-byte load; while it does, another thread may add to that point's
/// counter, whose value the loop does not use.
__device__ __forceinline__ int* stagedCounter(const Particle* points, int q)
{
  return reinterpret_cast<int*>(const_cast<float*>(&points[q].w));
}

/// The staged places that the flush's table of cells (addStagedCounters, in the row lists'
/// scratch) holds: the half shell's capacity stays within it (StagedTiles::chooseHalfShellTiles).
constexpr int halfShellFlushPlaces = halfShellRowBytes / int(sizeof(std::uint16_t));

/// After the block's loop: add(input index, counter) for each of its staged points whose counter
/// (stagedCounter) is not zero. Every block that stages a point may add to its result, so the
/// results are sums over blocks in global memory. The row lists' scratch, free after the loop,
/// takes the cell of each staged place, so that each thread takes places a block apart and loads
/// their input indices eight at a time before it adds. With one thread a staged cell, each
/// waiting on its cell's loads in turn, the 4M searches took count 0.930 ms against 0.923 and
/// density 1.001-1.003 against 0.994 (H200, in turns; RESULTS.md, issue 22).
template <class Add>
__device__ __forceinline__ void addStagedCounters(const TileSearch& g, const StagedRegion& r, std::uint32_t* rows, Add&& add)
{
  __syncthreads();
  const int total = r.stagedStart(r.stagedCells); // at most the capacity, within halfShellFlushPlaces
  static_assert(maxStagedCells <= 65536, "a staged cell's number fits 16 bits");
  std::uint16_t* cellOf = reinterpret_cast<std::uint16_t*>(rows);
  for (int k = threadIdx.x; k < r.stagedCells; k += tileThreads)
  {
    for (int q = r.stagedStart(k), end = r.stagedStart(k + 1); q < end; ++q)
    {
      cellOf[q] = std::uint16_t(k);
    }
  }
  __syncthreads();
  constexpr int batch = 8;
  for (int first = threadIdx.x; first < total; first += batch * tileThreads)
  {
    int input[batch], count[batch];
#pragma unroll
    for (int j = 0; j < batch; ++j)
    {
      const int q = first + j * tileThreads;
      count[j] = q < total ? *stagedCounter(r.points, q) : 0;
      input[j] = 0;
      if (count[j] != 0)
      {
        const int k = cellOf[q];
        input[j] = g.orderToInput[r.cellFirst[k] + (q - r.stagedStart(k))];
      }
    }
#pragma unroll
    for (int j = 0; j < batch; ++j)
    {
      if (count[j] != 0)
      {
        add(input[j], count[j]);
      }
    }
  }
}

/// Calls visit(x, y, z, si, qi, pi) for each own point of the chunk that this thread takes: its
/// cell's place (x, y, z) in the region, its global position si, its staged position qi and its
/// staged copy pi, in registers. (Given as a reference to shared memory, pi was read again for
/// every pair: the counters' atomics may alias it. That took the 4M count search 0.930 -> 1.040
/// ms and density's 1.000 -> 1.166 on the H200.)
template <class Visit>
__device__ __forceinline__ void forEachOwnStagedPoint(const StagedRegion& r, int chunkBegin, int chunkEnd, Visit&& visit)
{
  for (int t = chunkBegin + threadIdx.x; t < chunkEnd; t += tileThreads)
  {
    int x, y, z, offset;
    const int k = r.ownCell(t, x, y, z, offset);
    const int qi = r.stagedStart(k) + offset;
    const Particle pi = r.points[qi];
    visit(x, y, z, r.cellFirst[k] + offset, qi, pi);
  }
}

/// Own point si (pi, staged at qi) over its half shell (`steps` steps of its column): the pairs
/// the float test decides, then those within rounding of R decided in double (listed as the loop
/// over every neighbor lists them where the run has decided many, else counted and the last kept:
/// BandPairs). Its count goes to its own staged counter.
template <bool ListsBand>
__device__ __forceinline__ void countHalfShellPoint(const TileSearch& g, const CountOperation& op, const StagedRegion& r,
  const std::uint32_t* column, int steps, const Particle& pi, int si, int qi, unsigned long long* decided)
{
  int count = 0;
  BandPairs<ListsBand> band;
  auto sweep = [&](auto&& visit) {
    sweepColumn<RowFormat<false>, 2, std::numeric_limits<int>::max()>(r, column, steps, visit, []() {});
  };
  auto tally = [&](int q, float r2) {
    if (r2 < g.test.accept)
    {
      ++count;
      atomicAdd(stagedCounter(r.points, q), 1);
    }
    else if (!(r2 > g.test.reject))
    {
      band.remember(q);
    }
  };
  // A step's two candidates are read before either adds to a counter, and the next step's before
  // this one's are tallied: the compiler does not move a shared load above a shared atomic that
  // may alias it. On the 4M count row on the H200 the search took 0.962 -> 0.936-0.937 ms with the
  // step's two read together (issue slots busy 68.6% -> 70.4%) and 0.930-0.931 with the next
  // step's read ahead (72.3%; RESULTS.md, issue 22).
  sweepPairsAhead(r, column, steps, [&](int qa, const Particle& a, int qb, const Particle& b) {
    const float ra = fusedSquaredDistance(pi, a), rb = fusedSquaredDistance(pi, b);
    tally(qa, ra);
    tally(qb, rb);
  });
  unsigned decidedHere = 0;
  auto decide = [&](int q) {
    CountOperation::Value terms[1];
    if (q != r.sentinel && isNeighborInDouble(g, op, r, pi, si, q, decidedHere, terms))
    {
      ++count;
      atomicAdd(stagedCounter(r.points, q), 1);
    }
  };
  if constexpr (ListsBand)
  {
    if (band.count <= BandPairs<true>::slots)
    {
      for (int b = 0; b < band.count; ++b)
      {
        decide(band.at[b]);
      }
    }
    else
    {
      sweep(decide);
    }
  }
  else
  {
    band.decideAll(decide, [&]() { sweep(decide); });
  }
  atomicAdd(stagedCounter(r.points, qi), count);
  addDecided(decided, decidedHere);
}

/// The chunk's own points over their half shells, then the block's nonzero staged counters added
/// to the counts in input order.
__device__ void countHalfShells(const TileSearch& g, const CountOperation& op, const StagedRegion& r,
  std::uint32_t* rows, int chunkBegin, int chunkEnd, unsigned long long* decided)
{
  const bool listsBand = *static_cast<volatile unsigned long long*>(decided) >= g.listBandFrom;
  forEachOwnStagedPoint(r, chunkBegin, chunkEnd, [&](int x, int y, int z, int si, int qi, const Particle& pi) {
    // The half shell's rows (at most 13 of the column's 25), its own row from qi + 1 on.
    const int steps = listPointRows<2, RowFormat<false>, true>(g, r, pi, x, y, z, rows, qi);
    if (listsBand)
    {
      countHalfShellPoint<true>(g, op, r, rows + threadIdx.x, steps, pi, si, qi, decided);
    }
    else
    {
      countHalfShellPoint<false>(g, op, r, rows + threadIdx.x, steps, pi, si, qi, decided);
    }
  });
  addStagedCounters(g, r, rows, [&](int input, int c) { atomicAdd(&g.halfShellCounts[input], c); });
}

/// A tile that does not fit shared memory (searchFromGlobal) over the half shell: each neighbor
/// adds one to the counts in global memory.
__device__ void countHalfShellsFromGlobal(
  const TileSearch& g, const StagedRegion& r, int chunkBegin, int chunkEnd, unsigned long long* decided)
{
  for (int t = chunkBegin + threadIdx.x; t < chunkEnd; t += tileThreads)
  {
    int x, y, z, offset;
    const int k = r.ownCell(t, x, y, z, offset);
    const int si = r.cellFirst[k] + offset;
    const Particle pi = staged(g.particles[si], x, y, z);
    int count = 0;
    unsigned decidedHere = 0;
    forEachRowCellFromGlobal<true>(g, r, pi, x, y, z, [&](int cx, int dy, int dz, int begin, int end) {
      // The own row's cells lie in order along x, as their points do in global memory.
      for (int sj = (dz == 0 && dy == 0) ? max(begin, si + 1) : begin; sj < end; ++sj)
      {
        const Particle pj = staged(g.particles[sj], cx, y + dy, z + dz);
        float r2 = squaredDistance(pi, pj);
        if (isNeighbor(g.test, r2, si, sj, g.orderToInput, decidedHere))
        {
          ++count;
          atomicAdd(&g.halfShellCounts[g.orderToInput[sj]], 1);
        }
      }
    });
    atomicAdd(&g.halfShellCounts[g.orderToInput[si]], count);
    addDecided(decided, decidedHere);
  }
}

// --- Density over the half shell, where every point has one mass ---------------------------------
// As the count's: a neighbor's kernel shape w goes to the point's float sum and to the
// candidate's counter in the staged weight, there in 32-bit fixed point (a shared float add is a
// compare-and-swap loop on sm_90). With one mass m for every point, a density is m sigma / h^d
// times its sum of shapes, so the weight need not be staged; each block adds its sums to the
// densities in input order (float atomics: their order, and so the last bit, may vary from run to
// run). On the 4M density row on the H200 the search took 1.251 -> 1.000 ms (Nsight Compute:
// 830M warp instructions at 80.7% of issue slots), on 64M points 20.17 -> 16.22, and on 8M
// points of about 160 neighbors 4.66 -> 4.14 at four blocks an SM (RESULTS.md, issue 22).

/// A chunk's fixed point (HalfShellFixedPoint::forChunk): w + magic, for w in [0, w(0)] (w(0) the
/// kernel's largest shape: 1 for the cubic spline and Wendland C2, 14.4 and 66 for the quartic
/// and quintic splines) and magic a power of two of at least w(0), rounds w to a multiple of
/// magic 2^-23 in its bits, to nearest: two instructions where a conversion would take a multiply
/// and a slow one. A candidate's counter takes a term from each own point of the chunk at most
/// (each pair is tested once), so with magic at least w(0) (points of the chunk) / 256 it stays
/// at or below 2^31 units. A term is then off by at most magic 2^-24 <= 2^-23 w(0), against the
/// point's own term w(0): within 1.2e-7 of a density a term for chunks of up to 256 points.
struct HalfShellFixedPoint
{
  float magic = 1.0f;

  __device__ static HalfShellFixedPoint forChunk(int points, float selfShape)
  {
    const float most = selfShape * fmaxf(1.0f, float(points) / 256.0f);
    HalfShellFixedPoint f;
    while (f.magic < most)
    {
      f.magic *= 2.0f;
    }
    while (0.5f * f.magic >= most)
    {
      f.magic *= 0.5f;
    }
    return f;
  }
  __device__ __forceinline__ unsigned of(float w) const { return __float_as_uint(w + magic) - __float_as_uint(magic); }
  __device__ __forceinline__ float value(unsigned units) const { return float(units) * (magic * 0x1p-23f); }
};

/// Own point si (pi, staged at qi) over its half shell (`steps` steps of its column): the shapes of
/// its neighbors, to its own sum and to their counters. Band-free, as the loop over every
/// neighbor's density (termsVanishAtRadius): beyond R the shape is exactly zero, and within
/// rounding of R it adds nothing a float sum keeps.
__device__ __forceinline__ void densityHalfShellPoint(const TileSearch& g, const DensityOperation& op, const StagedRegion& r,
  const std::uint32_t* column, int steps, const Particle& pi, int si, HalfShellFixedPoint fixed)
{
  constexpr int perStep = candidatesPerStep<DensityOperation>();
  RegisterSums<DensityOperation> acc;
  float partial[1] = { kernelShapeFromSquared(op.kernel, 0.0f) }; // the point itself (j = i)
  sweepColumn<RowFormat<false>, perStep, candidatesPerFlush / perStep>(r, column, steps,
    [&](int q) {
      const float r2 = fusedSquaredDistance(pi, r.points[q]);
      if (r2 < g.test.reject)
      {
        const float w = kernelShapeFromSquared(op.kernel, r2);
        partial[0] += w;
        atomicAdd(reinterpret_cast<unsigned*>(stagedCounter(r.points, q)), fixed.of(w));
      }
    },
    [&]() {
      acc.addTerms(partial);
      partial[0] = 0.0f;
    });
  acc.addTerms(partial);
  atomicAdd(&g.halfShellDensities[g.orderToInput[si]], acc.sum[0] * g.halfShellDensityScale);
}

/// The chunk's own points over their half shells (densityHalfShellPoint), then the block's nonzero
/// staged counters added to the densities in input order.
__device__ void densityHalfShells(const TileSearch& g, const DensityOperation& op, const StagedRegion& r,
  std::uint32_t* rows, int chunkBegin, int chunkEnd)
{
  const HalfShellFixedPoint fixed = HalfShellFixedPoint::forChunk(chunkEnd - chunkBegin, kernelShapeFromSquared(op.kernel, 0.0f));
  forEachOwnStagedPoint(r, chunkBegin, chunkEnd, [&](int x, int y, int z, int si, int qi, const Particle& pi) {
    const int steps = listPointRows<candidatesPerStep<DensityOperation>(), RowFormat<false>, true>(g, r, pi, x, y, z, rows, qi);
    densityHalfShellPoint(g, op, r, rows + threadIdx.x, steps, pi, si, fixed);
  });
  addStagedCounters(g, r, rows, [&](int input, int c) {
    atomicAdd(&g.halfShellDensities[input], fixed.value(unsigned(c)) * g.halfShellDensityScale);
  });
}

/// A tile that does not fit shared memory over the half shell: each neighbor adds its term to the
/// densities in global memory.
__device__ void densityHalfShellsFromGlobal(
  const TileSearch& g, const DensityOperation& op, const StagedRegion& r, int chunkBegin, int chunkEnd)
{
  for (int t = chunkBegin + threadIdx.x; t < chunkEnd; t += tileThreads)
  {
    int x, y, z, offset;
    const int k = r.ownCell(t, x, y, z, offset);
    const int si = r.cellFirst[k] + offset;
    const Particle pi = staged(g.particles[si], x, y, z);
    RegisterSums<DensityOperation> acc;
    const float own[1] = { kernelShapeFromSquared(op.kernel, 0.0f) };
    acc.addTerms(own);
    forEachRowCellFromGlobal<true>(g, r, pi, x, y, z, [&](int cx, int dy, int dz, int begin, int end) {
      // The own row's cells lie in order along x, as their points do in global memory.
      for (int sj = (dz == 0 && dy == 0) ? max(begin, si + 1) : begin; sj < end; ++sj)
      {
        const Particle pj = staged(g.particles[sj], cx, y + dy, z + dz);
        const float r2 = fusedSquaredDistance(pi, pj);
        if (r2 < g.test.reject)
        {
          const float w[1] = { kernelShapeFromSquared(op.kernel, r2) };
          acc.addTerms(w);
          atomicAdd(&g.halfShellDensities[g.orderToInput[sj]], w[0] * g.halfShellDensityScale);
        }
      }
    });
    atomicAdd(&g.halfShellDensities[g.orderToInput[si]], acc.sum[0] * g.halfShellDensityScale);
  }
}

// --- A staged tile: cluster pairs (GROMACS's NxM scheme, Páll and Hess 2013) ------------------
// A warp takes four own points (an i-cluster, consecutive in the tile's own order) and the
// staged points within R of their box; lane (i, j) = (lane % 4, lane / 4) tests point i against
// every eighth candidate from j on. Each candidate is read from shared memory once for four
// pair tests, and every lane of the warp has work on every step: the loop per point that this
// replaces tested 2.5 candidates per neighbor with about 25 of 32 lanes busy.

constexpr int clusterSize = 4;
constexpr int candidateLanes = 32 / clusterSize; // candidates a warp step
constexpr int tileWarps = tileThreads / 32;
constexpr int survivorCapacity = 384;            // a warp's candidates that passed the box test
constexpr int maxClusterRows = maxStagedSide * maxStagedDepth;
constexpr int clusterRowsPerLane = (maxClusterRows + 31) / 32; // a lane's rows of the cluster's window

/// A warp's lists in shared memory.
struct ClusterLists
{
  std::uint16_t survivors[survivorCapacity + candidateLanes]; // + padding to a whole step
  int rowBase[maxClusterRows]; // staged position of candidate c in non-empty row k: rowBase[k] + c
};
constexpr int clusterListBytes = tileWarps * int(sizeof(ClusterLists));

/// The box of a warp's cluster (every lane gets it); culls is false when a coordinate is NaN (a
/// huge cell, CellGrid.h): every staged point is then a candidate, decided in double.
struct ClusterBox
{
  float lo[3];
  float hi[3];
  bool culls;
};

__device__ __forceinline__ ClusterBox clusterBox(const Particle& p, bool valid)
{
  ClusterBox b;
  const float c[3] = { p.x, p.y, p.z };
  bool undefined = false;
  for (int a = 0; a < 3; ++a)
  {
    b.lo[a] = valid ? c[a] : HUGE_VALF;
    b.hi[a] = valid ? c[a] : -HUGE_VALF;
    undefined = undefined || (valid && !(c[a] == c[a]));
  }
  for (int d = 1; d < clusterSize; d *= 2)
  {
    for (int a = 0; a < 3; ++a)
    {
      b.lo[a] = fminf(b.lo[a], __shfl_xor_sync(0xffffffffu, b.lo[a], d));
      b.hi[a] = fmaxf(b.hi[a], __shfl_xor_sync(0xffffffffu, b.hi[a], d));
    }
  }
  b.culls = !__any_sync(0xffffffffu, undefined);
  return b;
}

/// Distance from cell index c (the cell [c, c + 1)) to [lo, hi] along one axis.
__device__ __forceinline__ float gapToCell(int c, float lo, float hi)
{
  return fmaxf(fmaxf(__fsub_rn(float(c), hi), __fsub_rn(lo, float(c + 1))), 0.0f);
}

/// Whether p may lie within R of the box (NaN: yes).
__device__ __forceinline__ bool reachesBox(const Particle& p, const ClusterBox& b, float limit)
{
  const float gx = fmaxf(fmaxf(__fsub_rn(b.lo[0], p.x), __fsub_rn(p.x, b.hi[0])), 0.0f);
  const float gy = fmaxf(fmaxf(__fsub_rn(b.lo[1], p.y), __fsub_rn(p.y, b.hi[1])), 0.0f);
  const float gz = fmaxf(fmaxf(__fsub_rn(b.lo[2], p.z), __fsub_rn(p.z, b.hi[2])), 0.0f);
  return !(gx * gx + gy * gy + gz * gz > limit);
}

/// The exclusive warp prefix sum of value; total gets the warp's sum.
__device__ __forceinline__ int warpExclusiveSum(int value, int lane, int& total)
{
  int inclusive = value;
  for (int d = 1; d < 32; d *= 2)
  {
    const int other = __shfl_up_sync(0xffffffffu, inclusive, d);
    inclusive += lane >= d ? other : 0;
  }
  total = __shfl_sync(0xffffffffu, inclusive, 31);
  return inclusive - value;
}

/// The rows of staged cells (y, z) that reach within R of the box, each trimmed along x to the
/// cells the box's swept sphere spans, as one sequence of candidates. A lane holds rows lane and
/// lane + 32 e of the window; start[e] is where its row e begins in the sequence (empty rows are
/// marked by start -1); rowBase lists the non-empty rows in order.
struct ClusterRows
{
  int start[clusterRowsPerLane];
  int total;
};

__device__ ClusterRows listClusterRows(const TileSearch& g, const StagedRegion& r, const ClusterBox& b, int* rowBase, int lane)
{
  const int last = r.S - 1, lastZ = r.stagedCells / (r.S * r.S) - 1;
  int y0 = 0, y1 = last, z0 = 0, z1 = lastZ;
  if (b.culls)
  {
    const float reachLimit = sqrtf(g.cullLimit);
    y0 = max(0, __float2int_rd(b.lo[1] - reachLimit));
    y1 = min(last, __float2int_rd(b.hi[1] + reachLimit));
    z0 = max(0, __float2int_rd(b.lo[2] - reachLimit));
    z1 = min(lastZ, __float2int_rd(b.hi[2] + reachLimit));
  }
  const int wide = y1 - y0 + 1, rows = wide * (z1 - z0 + 1);
  int begin[clusterRowsPerLane], length[clusterRowsPerLane];
  for (int e = 0; e < clusterRowsPerLane; ++e)
  {
    const int k = lane + 32 * e;
    begin[e] = 0;
    length[e] = 0;
    if (k < rows)
    {
      const int cy = y0 + k % wide, cz = z0 + k / wide;
      int x0 = 0, x1 = last;
      bool reaches = true;
      if (b.culls)
      {
        const float gy = gapToCell(cy, b.lo[1], b.hi[1]), gz = gapToCell(cz, b.lo[2], b.hi[2]);
        const float rest = g.cullLimit - (gy * gy + gz * gz);
        reaches = rest >= 0.0f;
        const float half = approximateSqrt(fmaxf(rest, 0.0f)) + 1e-4f;
        x0 = max(0, __float2int_rd(b.lo[0] - half));
        x1 = min(last, __float2int_rd(b.hi[0] + half));
      }
      if (reaches)
      {
        const int row = r.S * (cy + r.S * cz);
        begin[e] = r.stagedStart(row + x0);
        length[e] = r.stagedStart(row + x1 + 1) - begin[e];
      }
    }
  }
  // Lane l's e-th row is the window's row l + 32 e: the rows in order are every lane's first,
  // then every lane's second, and so on.
  const unsigned below = (1u << lane) - 1u;
  ClusterRows out;
  int before = 0, ranked = 0;
  for (int e = 0; e < clusterRowsPerLane; ++e)
  {
    const unsigned nonEmpty = __ballot_sync(0xffffffffu, length[e] > 0);
    int total = 0;
    out.start[e] = before + warpExclusiveSum(length[e], lane, total);
    before += total;
    if (length[e] > 0)
    {
      rowBase[ranked + __popc(nonEmpty & below)] = begin[e] - out.start[e];
    }
    else
    {
      out.start[e] = -1;
    }
    ranked += __popc(nonEmpty);
  }
  out.total = before;
  __syncwarp();
  return out;
}

/// Sums of a cluster's lane: the pair loop over a list of survivors, with the rare pairs within
/// rounding of R decided in double afterwards (PairTest.h).
template <bool Banded, class Op>
__device__ void addClusterPairs(const TileSearch& g, const Op& op, const StagedRegion& r, const std::uint16_t* survivors,
  int count, const Particle& pi, bool iValid, int si, RegisterSums<Op>& acc, unsigned& decidedHere)
{
  using Value = typename Op::Value;
  const int jLane = (threadIdx.x % 32) / clusterSize;
  // Terms go to a plain sum that joins the compensated one every 16 steps.
  Value partial[Op::Terms];
  for (int a = 0; a < Op::Terms; ++a)
  {
    partial[a] = 0;
  }
  int bandPairs = 0, bandAt = 0; // pairs within rounding of R: how many, and the last one
  for (int chunk = 0; chunk < count; chunk += 16 * candidateLanes)
  {
    const int end = min(count, chunk + 16 * candidateLanes);
    for (int s = chunk + jLane; s < end; s += candidateLanes)
    {
      if (addFloatPair<Banded>(g, op, r, pi, survivors[s], partial))
      {
        ++bandPairs;
        bandAt = s;
      }
    }
    acc.addTerms(partial);
    for (int a = 0; a < Op::Terms; ++a)
    {
      partial[a] = 0;
    }
  }
  if constexpr (Banded)
  {
    // The pairs within rounding of R, decided in double from the input coordinates (PairTest.h):
    // a lane with one decides it alone; only a lane with two or more walks its list again.
    auto decideInDouble = [&](int s) {
      Value terms[Op::Terms];
      if (iValid && survivors[s] != r.sentinel && isNeighborInDouble(g, op, r, pi, si, survivors[s], decidedHere, terms))
      {
        acc.addTerms(terms);
      }
    };
    if (bandPairs == 1)
    {
      decideInDouble(bandAt);
    }
    else if (bandPairs > 1)
    {
      for (int s = jLane; s < count; s += candidateLanes)
      {
        decideInDouble(s);
      }
    }
  }
}

/// The survivors list padded to whole steps with the sentinel (it is never a neighbor), its
/// pairs added, and the list emptied.
template <bool Banded, class Op>
__device__ __forceinline__ void flushSurvivors(const TileSearch& g, const Op& op, const StagedRegion& r, ClusterLists& lists,
  int& count, const Particle& pi, bool iValid, int si, RegisterSums<Op>& acc, unsigned& decidedHere)
{
  const int lane = threadIdx.x % 32;
  const int padded = (count + candidateLanes - 1) / candidateLanes * candidateLanes;
  if (count + lane < padded)
  {
    lists.survivors[count + lane] = std::uint16_t(r.sentinel);
  }
  __syncwarp();
  addClusterPairs<Banded>(g, op, r, lists.survivors, padded, pi, iValid, si, acc, decidedHere);
  __syncwarp();
  count = 0;
}

/// The chunk's own points in clusters of four, a warp per cluster.
template <bool Banded, class Op>
__device__ void searchClusterPairs(const TileSearch& g, const Op& op, const StagedRegion& r, ClusterLists* allLists,
  int chunkBegin, int chunkEnd, unsigned long long* decided)
{
  using Value = typename Op::Value;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const unsigned below = (1u << lane) - 1u, upToLane = below | (1u << lane);
  ClusterLists& lists = allLists[warp];
  unsigned decidedHere = 0;
  for (int first = chunkBegin + clusterSize * warp; first < chunkEnd; first += clusterSize * tileWarps)
  {
    const int t = first + lane % clusterSize;
    const bool iValid = t < chunkEnd;
    Particle pi{ HUGE_VALF, HUGE_VALF, HUGE_VALF, 0.0f };
    int si = 0;
    if (iValid)
    {
      int x, y, z, offset;
      const int k = r.ownCell(t, x, y, z, offset);
      pi = r.points[r.stagedStart(k) + offset];
      si = r.cellFirst[k] + offset;
    }
    const ClusterBox box = clusterBox(pi, iValid);
    const ClusterRows rows = listClusterRows(g, r, box, lists.rowBase, lane);

    // The rows' candidates, 32 at a time: a lane finds its row from the rows that start in the
    // window, keeps its candidate if it reaches within R of the box, and the kept ones are
    // appended to the survivors in order.
    RegisterSums<Op> acc;
    int kept = 0, rowsBefore = 0;
    for (int window = 0; window < rows.total; window += 32)
    {
      unsigned starts = 0;
      for (int e = 0; e < clusterRowsPerLane; ++e)
      {
        const int d = rows.start[e] - window;
        starts |= (rows.start[e] >= 0 && d >= 0 && d < 32) ? 1u << d : 0u;
      }
      starts = __reduce_or_sync(0xffffffffu, starts);
      const int c = window + lane;
      const int row = rowsBefore + __popc(starts & upToLane) - 1;
      rowsBefore += __popc(starts);
      bool keep = false;
      int q = 0;
      if (c < rows.total)
      {
        q = lists.rowBase[row] + c;
        keep = !box.culls || reachesBox(r.points[q], box, g.cullLimit);
      }
      const unsigned keptLanes = __ballot_sync(0xffffffffu, keep);
      if (keep)
      {
        lists.survivors[kept + __popc(keptLanes & below)] = std::uint16_t(q);
      }
      kept += __popc(keptLanes);
      if (kept > survivorCapacity - 32)
      {
        flushSurvivors<Banded>(g, op, r, lists, kept, pi, iValid, si, acc, decidedHere);
      }
    }
    if (kept > 0)
    {
      flushSurvivors<Banded>(g, op, r, lists, kept, pi, iValid, si, acc, decidedHere);
    }

    // Each point's sums from its eight lanes.
    RegisterSums<Op> total;
    for (int a = 0; a < Op::Terms; ++a)
    {
      Value v = acc.sum[a];
      if constexpr (RegisterSums<Op>::compensated)
      {
        v -= acc.carry[a];
      }
      for (int d = clusterSize; d < 32; d *= 2)
      {
        v += __shfl_xor_sync(0xffffffffu, v, d);
      }
      total.sum[a] = v;
    }
    if (iValid && lane < clusterSize)
    {
      total.finish(op, si, g.orderToInput[si]);
    }
  }
  if constexpr (Banded)
  {
    addDecided(decided, decidedHere);
  }
}

using TileScan = cub::BlockScan<int, tileThreads>;

/// Where the loop per point runs, its row lists (and the block's placement before them) come first
/// in dynamic shared memory and the staged points after them: the sweep reads one row entry
/// ahead, past a point's last row (sweepPointRows), and for the lists' last entries that read
/// lands in the staged points instead of beyond the block's memory. Cluster pairs, which read no
/// entry ahead, keep their lists after the staged points. Every part starts a multiple of 16
/// bytes from the shared base (an offset, not a rounded address: the compiler then still knows it
/// for shared memory).
constexpr int scratchAlignment = 16;
constexpr int alignedScratchBytes(int bytes)
{
  return (bytes + scratchAlignment - 1) / scratchAlignment * scratchAlignment;
}
static_assert(rowListBytes<false>() % scratchAlignment == 0 && rowListBytes<true>() % scratchAlignment == 0,
  "the staged points after the row lists start aligned");

/// The block's static shared memory.
struct StagedCells
{
  int cellFirst[maxStagedCells]; // where each staged cell's points start in global order
  int ownStart[maxOwnCells + 1]; // the tile's own points, by own cell (ownCellPlace's order)
  std::uint16_t binStart[maxStagedCells * maxXBins + 1]; // each staged cell's x bins in staged order (fits only)
};

/// What the block uses while it places its points, in the search's scratch (free until the search):
/// where each staged cell's points start in the staged order (int: a search from global memory,
/// which takes no scratch, reads them too; a search of a region that fits reads the bins' starts),
/// and the block scan's storage. In static memory beside the bins' starts they would take a block
/// of density or count off an SM (4M row: five blocks and four).
struct PlacementScratch
{
  int cellStart[maxStagedCells + 1];
  TileScan::TempStorage scan;
};
static_assert(int(sizeof(PlacementScratch)) <= rowListBytes<true>() && int(sizeof(PlacementScratch)) <= clusterListBytes &&
    alignof(PlacementScratch) <= scratchAlignment,
  "the block's placement fits the search's scratch");
static_assert(int(sizeof(PlacementScratch)) <= halfShellRowBytes, "the block's placement fits the half shell's scratch");

/// The thread's staged cells (blocked: stagedCellsPerThread consecutive ones) in `fine`, -1 where
/// no point lies or beyond the region. With an identity table each is one load, and a thread's
/// loads issue before any is used: with three cells a thread instead of two (deeper tiles), one
/// lookup after the other took count's 4M search 1.240 -> 1.250 ms, density's 1.247 -> 1.260,
/// 64M 20.06 -> 20.30 (H200; RESULTS.md, issue 22).
__device__ __forceinline__ void findStagedCells(const CellTable& fine, const StagedRegion& r, const TileAnchor& tile,
  int (&m)[stagedCellsPerThread])
{
  const float inverseS = 1.0f / r.S;
  int place[stagedCellsPerThread][3];
  for (int e = 0; e < stagedCellsPerThread; ++e)
  {
    placeInBox(stagedCellsPerThread * threadIdx.x + e, r.S, inverseS, place[e][0], place[e][1], place[e][2]);
  }
  if (fine.layout.mode != KeyMode::Wide && fine.lookup.identityCells)
  {
    std::uint64_t key[stagedCellsPerThread];
    bool inside[stagedCellsPerThread];
    for (int e = 0; e < stagedCellsPerThread; ++e)
    {
      const std::int64_t offset[3] = { tile.offset[0] + place[e][0] - r.reach, tile.offset[1] + place[e][1] - r.reach,
        tile.offset[2] + place[e][2] - r.below };
      inside[e] = int(stagedCellsPerThread * threadIdx.x) + e < r.stagedCells && fine.layout.bitsKeyOfOffsets(offset, key[e]);
    }
    for (int e = 0; e < stagedCellsPerThread; ++e)
    {
      m[e] = inside[e] ? fine.lookup.identityCells[key[e] & fine.lookup.mask] : -1;
    }
    return;
  }
  for (int e = 0; e < stagedCellsPerThread; ++e)
  {
    m[e] = int(stagedCellsPerThread * threadIdx.x) + e < r.stagedCells
      ? cellNearAnchor(fine, tile, place[e][0] - r.reach, place[e][1] - r.reach, place[e][2] - r.below)
      : -1;
  }
}

/// Each staged cell's range in global memory (hash lookups) and in shared memory (a block scan);
/// returns the staged points' total.
__device__ int placeStagedCells(const TileSearch& g, const StagedRegion& r, const TileAnchor& tile, StagedCells& cells,
  PlacementScratch& placement, std::uint16_t* cellOfPosition = nullptr, int positions = 0)
{
  int* cellStart = placement.cellStart;
  int m[stagedCellsPerThread];
  findStagedCells(g.fine, r, tile, m);
  int counts[stagedCellsPerThread], offsets[stagedCellsPerThread];
  for (int e = 0; e < stagedCellsPerThread; ++e)
  {
    const int k = stagedCellsPerThread * threadIdx.x + e;
    int first = 0, count = 0;
    if (m[e] >= 0)
    {
      first = g.fine.start[m[e]];
      count = g.fine.start[m[e] + 1] - first;
    }
    if (k < r.stagedCells)
    {
      cells.cellFirst[k] = first;
    }
    counts[e] = count;
  }
  int stagedTotal = 0;
  TileScan(placement.scan).ExclusiveSum(counts, offsets, stagedTotal);
  const int bins = 1 << r.xBinBits;
  for (int e = 0; e < stagedCellsPerThread; ++e)
  {
    const int k = stagedCellsPerThread * threadIdx.x + e;
    if (k < r.stagedCells)
    {
      cellStart[k] = offsets[e];
      // Every bin but the first starts at the cell's end until stagePoints finds a point in it or
      // beyond. Positions beyond 16 bits are never read: the region then does not fit.
      cells.binStart[k * bins] = std::uint16_t(offsets[e]);
#pragma unroll
      for (int b = 1; b < maxXBins; ++b)
      {
        if (b < bins)
        {
          cells.binStart[k * bins + b] = std::uint16_t(offsets[e] + counts[e]);
        }
      }
    }
  }
  if (cellOfPosition && stagedTotal <= positions)
  {
    // Each staged position's cell, for stagePointsFlat.
    for (int e = 0; e < stagedCellsPerThread; ++e)
    {
      const int k = stagedCellsPerThread * threadIdx.x + e;
      for (int i = 0; i < counts[e]; ++i)
      {
        cellOfPosition[offsets[e] + i] = std::uint16_t(k);
      }
    }
  }
  if (threadIdx.x == 0)
  {
    cellStart[r.stagedCells] = stagedTotal;
    cells.binStart[r.stagedCells * bins] = std::uint16_t(stagedTotal);
  }
  __syncthreads();
  return stagedTotal;
}

/// The tile's own cells (at most 96) in ownCellPlace's order: one warp scans their counts
/// into ownStart.
__device__ void placeOwnCells(const StagedRegion& r, StagedCells& cells)
{
  if (threadIdx.x >= 32)
  {
    return;
  }
  int own[ownCellsPerLane];
  int lanesOwn = 0;
  for (int e = 0; e < ownCellsPerLane; ++e)
  {
    const int m = ownCellsPerLane * threadIdx.x + e;
    own[e] = 0;
    if (m < r.ownCells)
    {
      int x, y, z;
      ownCellPlace(m, r.side, x, y, z);
      const int k = (x + r.reach) + r.S * ((y + r.reach) + r.S * (z + r.below));
      own[e] = r.cellStart[k + 1] - r.cellStart[k];
    }
    lanesOwn += own[e];
  }
  int total = 0;
  int exclusive = warpExclusiveSum(lanesOwn, threadIdx.x, total);
  for (int e = 0; e < ownCellsPerLane; ++e)
  {
    const int m = ownCellsPerLane * threadIdx.x + e;
    if (m < r.ownCells)
    {
      cells.ownStart[m] = exclusive;
    }
    exclusive += own[e];
  }
  if (threadIdx.x == 0)
  {
    cells.ownStart[r.ownCells] = total;
  }
}

/// A thread's walk over its run of staged positions: the staged cell k that holds the current
/// position, the cell's place (x, y, z) in the region, where it begins and where the next begins,
/// and the offset from a staged position to its point's global position. A cell's bounds are read
/// from shared memory once a cell instead of three times a point (4M row on the H200: count's
/// search 1.385 -> 1.349 ms, density's 1.496 -> 1.481; RESULTS.md, issue 22).
struct StagedWalk
{
  int k = 0, x = 0, y = 0, z = 0;
  int begin = 0, next = 0, toGlobal = 0;

  /// At the cell of staged position q (a binary search).
  __device__ StagedWalk(const StagedRegion& r, int q)
  {
    k = lastAtMost(r.cellStart, r.stagedCells, q);
    placeInBox(k, r.S, 1.0f / r.S, x, y, z);
    begin = r.cellStart[k];
    next = r.cellStart[k + 1];
    toGlobal = r.cellFirst[k] - begin;
  }
  /// On to the cell that holds staged position q (at or beyond the current cell's first).
  __device__ __forceinline__ void moveTo(const StagedRegion& r, int q)
  {
    if (next > q)
    {
      return;
    }
    do
    {
      ++k;
      if (++x == r.S)
      {
        x = 0;
        if (++y == r.S)
        {
          y = 0;
          ++z;
        }
      }
      begin = next;
      next = r.cellStart[k + 1];
    } while (next <= q);
    toGlobal = r.cellFirst[k] - begin;
  }
};

/// The region's points in the block's frame with the staged values of smoothing
/// (stagedComponents; the other operations stage by stagePointsFlat), and the sentinel: a point
/// at infinity that pads the pair loop to whole steps. Each thread stages a run of consecutive
/// positions: the first one's cell by a binary search, then the cells in turn with their place
/// (x, y, z) in the region. A search and three divisions by S
/// per point took an eighth of the 4M count search's instructions. With x bins, a point whose bin
/// lies beyond its predecessor's in the cell starts the bins between (binStart; the sort put a
/// cell's points in the order of their bins).
template <int Components, bool XBins>
__device__ void stagePoints(const TileSearch& g, const StagedRegion& r, int stagedTotal, Particle* stagedPoints,
  const float* values, float* stagedValues, std::uint16_t* binStart)
{
  // One position at a time: its values' loads and registers made a batch of four slower for
  // smoothing (4M Shepard-1 on the H200: 1.53 -> 1.75 ms), and a batch of one kept in arrays took
  // 1.467 ms against 1.454 without them (RESULTS.md, issue 22).
  const int run = (stagedTotal + tileThreads - 1) / tileThreads;
  const int runBegin = min(stagedTotal, int(threadIdx.x) * run), runEnd = min(stagedTotal, runBegin + run);
  if (runBegin < runEnd)
  {
    StagedWalk walk(r, runBegin);
    const int bins = 1 << r.xBinBits;
    int previousBin = 0; // the bin of the point before q in its cell
    if (XBins && runBegin > walk.begin)
    {
      previousBin = xBinOf(g.particles[walk.toGlobal + runBegin - 1].x, r.xBinBits);
    }
    for (int q = runBegin; q < runEnd; ++q)
    {
      walk.moveTo(r, q);
      const int source = walk.toGlobal + q;
      const Particle own = g.particles[source];
      if constexpr (XBins)
      {
        // A cell's first point starts its bins from the cell's first.
        const int bin = xBinOf(own.x, r.xBinBits);
        for (int b = (q == walk.begin ? 0 : previousBin) + 1; b <= bin; ++b)
        {
          binStart[walk.k * bins + b] = std::uint16_t(q);
        }
        previousBin = bin;
      }
      Particle p = staged(own, walk.x, walk.y, walk.z);
      const float* v = values + std::int64_t(source) * Components;
      for (int c = 1; c < Components; ++c)
      {
        stagedValues[q * stagedValueStride(Components) + c - 1] = p.w * v[c];
      }
      p.w *= v[0];
      stagedPoints[q] = p;
    }
  }
  if (threadIdx.x == 0)
  {
    stagedPoints[g.capacity] = Particle{ HUGE_VALF, HUGE_VALF, HUGE_VALF, 0.0f };
    for (int c = 0; c < stagedValueStride(Components); ++c)
    {
      stagedValues[g.capacity * stagedValueStride(Components) + c] = 0.0f;
    }
  }
}

/// stagePoints for the operations that stage no values (count, density, and the banded loops'
/// global indices): each warp stages a run of whole steps of 32 consecutive positions, each
/// position's cell read from placeStagedCells' table (or, where the scratch holds no table, found
/// by a binary search). A warp's loads from global memory and its stores to shared memory are then
/// contiguous, and a point's predecessor in its cell (for the x bins' starts) is the lane before
/// it, or the last lane of the warp's step before. Against runs of five or six positions a thread
/// walked cell by cell (stagePoints), on the 4M rows on the H200: count's search 1.318 -> 1.281 ms,
/// density's 1.397 -> 1.372, 64M density 22.67 -> 22.31 (RESULTS.md, issue 22).
template <bool XBins, bool Counters>
__device__ void stagePointsFlat(const TileSearch& g, const StagedRegion& r, int stagedTotal, Particle* stagedPoints,
  std::int32_t* stagedIndex, std::uint16_t* binStart, const std::uint16_t* cellOfPosition)
{
  constexpr int batch = 4;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int per = (stagedTotal + tileThreads - 1) / tileThreads * 32; // positions a warp, whole steps
  const int begin = min(stagedTotal, warp * per), end = min(stagedTotal, begin + per);
  const int bins = 1 << r.xBinBits;
  const float inverseS = 1.0f / r.S;
  // The bin and cell of the position before the step's first.
  int carryBin = 0, carryCell = -1;
  if (XBins && begin < end && begin > 0)
  {
    carryCell = cellOfPosition ? int(cellOfPosition[begin - 1]) : lastAtMost(r.cellStart, r.stagedCells, begin - 1);
    const int toGlobal = r.cellFirst[carryCell] - r.cellStart[carryCell];
    carryBin = lane == 0 ? xBinOf(g.particles[toGlobal + begin - 1].x, r.xBinBits) : 0;
    carryBin = __shfl_sync(0xffffffffu, carryBin, 0);
  }
  for (int batchBegin = begin; batchBegin < end; batchBegin += batch * 32)
  {
    Particle own[batch];
    int cellOf[batch];
#pragma unroll
    for (int i = 0; i < batch; ++i)
    {
      const int q = batchBegin + 32 * i + lane;
      cellOf[i] = -1;
      if (q < end)
      {
        const int k = cellOfPosition ? int(cellOfPosition[q]) : lastAtMost(r.cellStart, r.stagedCells, q);
        cellOf[i] = k;
        own[i] = g.particles[r.cellFirst[k] - r.cellStart[k] + q];
      }
    }
#pragma unroll
    for (int i = 0; i < batch; ++i)
    {
      const int q = batchBegin + 32 * i + lane;
      if (batchBegin + 32 * i >= end)
      {
        break;
      }
      const int k = cellOf[i];
      if constexpr (XBins)
      {
        const int bin = q < end ? xBinOf(own[i].x, r.xBinBits) : 0;
        int previousBin = __shfl_up_sync(0xffffffffu, bin, 1);
        int previousCell = __shfl_up_sync(0xffffffffu, k, 1);
        if (lane == 0)
        {
          previousBin = carryBin;
          previousCell = carryCell;
        }
        carryBin = __shfl_sync(0xffffffffu, bin, 31);
        carryCell = __shfl_sync(0xffffffffu, k, 31);
        if (q < end)
        {
          for (int b = (previousCell == k ? previousBin : 0) + 1; b <= bin; ++b)
          {
            binStart[k * bins + b] = std::uint16_t(q);
          }
        }
      }
      if (q < end)
      {
        int x, y, z;
        placeInBox(k, r.S, inverseS, x, y, z);
        Particle p = staged(own[i], x, y, z);
        if constexpr (Counters)
        {
          p.w = 0.0f; // stagedCounter
        }
        stagedPoints[q] = p;
        if (stagedIndex)
        {
          stagedIndex[q] = r.cellFirst[k] - r.cellStart[k] + q;
        }
      }
    }
  }
  if (threadIdx.x == 0)
  {
    stagedPoints[g.capacity] = Particle{ HUGE_VALF, HUGE_VALF, HUGE_VALF, 0.0f };
  }
}

/// A block's staged region before its points are placed: the tile's shape and the block's tables
/// (`cells` in static shared memory, the cells' staged starts in the placement's scratch).
__device__ StagedRegion regionOfBlock(
  const TileSearch& g, StagedCells& cells, PlacementScratch& placement, bool halfShell, int layers)
{
  StagedRegion region;
  region.side = g.side;
  region.reach = g.reach;
  region.below = halfShell ? 0 : g.reach;
  region.S = g.side + 2 * g.reach;
  region.stagedCells = region.S * region.S * (layers + g.reach + region.below);
  region.ownCells = g.side * g.side * layers;
  region.cellFirst = cells.cellFirst;
  region.cellStart = placement.cellStart;
  region.binStart = cells.binStart;
  region.xBinBits = g.xBinBits;
  region.ownStart = cells.ownStart;
  region.sentinel = g.capacity;
  return region;
}

/// The placed region's points into shared memory (stagePointsFlat, or stagePoints with the
/// staged values of smoothing: Components); Counters: each staged point's counter cleared
/// (stagedCounter).
template <int Components, bool Counters>
__device__ void stageRegion(const TileSearch& g, const StagedRegion& r, int stagedTotal, Particle* stagedPoints,
  std::int32_t* stagedIndex, const float* values, float* stagedValues, std::uint16_t* binStart,
  const std::uint16_t* cellOfPosition)
{
  if constexpr (Components == 0)
  {
    if (r.xBinBits > 0)
    {
      stagePointsFlat<true, Counters>(g, r, stagedTotal, stagedPoints, stagedIndex, binStart, cellOfPosition);
    }
    else
    {
      stagePointsFlat<false, Counters>(g, r, stagedTotal, stagedPoints, stagedIndex, binStart, cellOfPosition);
    }
  }
  else if (r.xBinBits > 0)
  {
    stagePoints<Components, true>(g, r, stagedTotal, stagedPoints, values, stagedValues, binStart);
  }
  else
  {
    stagePoints<Components, false>(g, r, stagedTotal, stagedPoints, values, stagedValues, binStart);
  }
}

/// One block per work item (a tile and a chunk of its own points), blocks beyond the item count
/// (on the device) returning at once; or where blocks take grid tiles directly
/// (TileSearch::directTiles) a block a tile and its first chunks. Banded as
/// addFloatPair: false only where the operation's terms vanish at R and no point lies in a huge
/// cell (StagedTiles::reachesHugeCells). NarrowRows: the loop per point keeps its rows in
/// RowFormat<true>'s entries. HalfShell: Neighbor Count or density over the half shell
/// (countHalfShells, densityHalfShells), with its shorter row lists.
template <class Op, bool Banded, bool NarrowRows, bool HalfShell = false>
__device__ __forceinline__ void searchTile(const TileSearch& g, const Op& op, unsigned long long* decided)
{
  constexpr bool counts = std::is_same<Op, CountOperation>::value;
  static_assert(!HalfShell || ((counts || std::is_same<Op, DensityOperation>::value) && !NarrowRows),
    "the half shell counts or sums densities");
  extern __shared__ float4 stagedMemory[];
  // The threads' row lists, then the staged points; or the staged points, then the warps' cluster
  // lists (g.clusterPairs).
  constexpr int rowBytes = HalfShell ? halfShellRowBytes : rowListBytes<NarrowRows>();
  const bool clusterPairs = !HalfShell && g.clusterPairs;
  const int listFloat4s = clusterPairs ? 0 : rowBytes / int(sizeof(float4));
  Particle* stagedPoints = reinterpret_cast<Particle*>(stagedMemory + listFloat4s);
  // Count, density and band-free smoothing stage no indices (16 bytes a point, and the staged
  // values: stagedComponents); the rare pairs decided in double find a staged point's index from
  // its cell.
  constexpr int components = stagedComponents<Op, Banded>();
  constexpr bool stagesIndex = !pairReadsNoMemory<Op>() && components == 0;
  const float* values = nullptr;
  if constexpr (components > 0)
  {
    values = op.values;
  }
  std::int32_t* stagedIndex = reinterpret_cast<std::int32_t*>(stagedPoints + g.capacity + 1);
  float* stagedValues = reinterpret_cast<float*>(stagedIndex + (stagesIndex ? g.capacity + 1 : 0));
  const float* stagedEnd = stagedValues + (g.capacity + 1) * stagedValueStride(components);
  const int stagedFloat4s = int(alignedScratchBytes(int(reinterpret_cast<const char*>(stagedEnd) -
                                  reinterpret_cast<const char*>(stagedMemory))) / int(sizeof(float4)));
  void* scratch = clusterPairs ? static_cast<void*>(stagedMemory + stagedFloat4s) : static_cast<void*>(stagedMemory);
  __shared__ StagedCells cells;
  // Blocks take grid tiles directly only over the half shell (StagedTiles::takesTilesDirectly).
  const bool direct = HalfShell && g.directTiles > 0;
  if (!direct && int(blockIdx.x) >= *g.itemCount)
  {
    return;
  }
  TileItem item;
  if (direct)
  {
    // A grid tile's item: the key of one of its cells (TileGrid::cellOfTile).
    std::int64_t offset[3];
    g.directGrid.cellOfTile(blockIdx.x, offset);
    std::uint64_t key = 0;
    g.fine.layout.bitsKeyOfOffsets(offset, key);
    item = TileItem::of(key, -1, 0);
  }
  else
  {
    item = g.items[blockIdx.x];
  }
  // The item's layers of the tile: its region from its first layer up.
  const int firstLayer = item.firstLayer();
  PlacementScratch& placement = *static_cast<PlacementScratch*>(scratch);
  StagedRegion region = regionOfBlock(g, cells, placement, HalfShell, item.endLayer(g.depth) - firstLayer);
  region.points = stagedPoints;
  region.index = stagesIndex ? stagedIndex : nullptr;
  region.values = components >= 2 ? stagedValues : nullptr;

  // stagePointsFlat's table of each staged position's cell, after the placement's scratch, where
  // the row lists' scratch holds one for the tile's capacity.
  const int scratchBytes = clusterPairs ? clusterListBytes : rowBytes;
  std::uint16_t* cellOfPosition = reinterpret_cast<std::uint16_t*>(&placement + 1);
  const int positions = (scratchBytes - int(sizeof(PlacementScratch))) / int(sizeof(std::uint16_t));
  const bool table = components == 0 && !clusterPairs && g.capacity <= positions;
  if (!table)
  {
    cellOfPosition = nullptr;
  }
  TileAnchor anchor = tileAnchorOf(g.fine, item.leader, item.leaderKey, g.side, g.depth);
  anchor.offset[2] += firstLayer; // layers split only grid tiles, whose keys are Bits keys
  const int stagedTotal = placeStagedCells(g, region, anchor, cells, placement, cellOfPosition, g.capacity);
  placeOwnCells(region, cells);
  const bool fits = stagedTotal <= g.capacity;
  if (fits)
  {
    stageRegion<components, HalfShell>(g, region, stagedTotal, stagedPoints, region.index ? stagedIndex : nullptr, values,
      stagedValues, cells.binStart, cellOfPosition);
  }
  __syncthreads();

  const int ownTotal = cells.ownStart[region.ownCells];
  const int per = chunkPointsFor(ownTotal, g.side, g.depth, g.reach, g.capacity);
  // A tile's own block (TileSearch::directTiles) takes its first chunks and flags any more for
  // a listed search after it (StagedTiles::searchRest). Listing them here, with an atomic and
  // a fence, took the 4M count search 0.893 -> 0.953 ms on the H200, though no tile listed any.
  if (direct && threadIdx.x == 0 && ownTotal > TileSearch::directChunks * per)
  {
    *static_cast<volatile int*>(g.restFlag) = 1;
  }
  const int chunkBegin = direct ? 0 : item.chunk() * per;
  const int chunkEnd = min(ownTotal, direct ? TileSearch::directChunks * per : chunkBegin + per);
  if (!fits)
  {
    if constexpr (HalfShell && counts)
    {
      countHalfShellsFromGlobal(g, region, chunkBegin, chunkEnd, decided);
    }
    else if constexpr (HalfShell)
    {
      densityHalfShellsFromGlobal(g, op, region, chunkBegin, chunkEnd);
    }
    else
    {
      searchFromGlobal(g, op, region, chunkBegin, chunkEnd, decided);
    }
  }
  else if (clusterPairs)
  {
    searchClusterPairs<Banded>(g, op, region, static_cast<ClusterLists*>(scratch), chunkBegin, chunkEnd, decided);
  }
  else
  {
    // Wide rows: the staged points at a constant offset from the block's shared memory (the row
    // lists' size) instead of the offset chosen above at run time, so that a candidate's address
    // takes one instruction instead of two. On the 4M rows on the H200: density's search 1.397 ->
    // 1.360 ms, Shepard-1's 1.486 -> 1.465 (RESULTS.md, issue 22).
    StagedRegion rows = region;
    if constexpr (!NarrowRows)
    {
      rows.points = reinterpret_cast<const Particle*>(stagedMemory + rowBytes / int(sizeof(float4)));
    }
    if constexpr (HalfShell && counts)
    {
      countHalfShells(g, op, rows, static_cast<std::uint32_t*>(scratch), chunkBegin, chunkEnd, decided);
    }
    else if constexpr (HalfShell)
    {
      densityHalfShells(g, op, rows, static_cast<std::uint32_t*>(scratch), chunkBegin, chunkEnd);
    }
    else
    {
      using Format = RowFormat<NarrowRows>;
      searchPointRows<Banded, Format>(g, op, rows, static_cast<typename Format::Entry*>(scratch), chunkBegin, chunkEnd, decided);
    }
  }
}

/// The search of every operation but count and density (searchTile).
template <class Op, bool Banded, bool NarrowRows>
__global__ void __launch_bounds__(tileThreads) stagedTilesSearch(TileSearch g, Op op, unsigned long long* decided)
{
  searchTile<Op, Banded, NarrowRows>(g, op, decided);
}

/// Count and density (searchTile) in at most 64 registers, so that the four blocks an SM their
/// shared memory allows fit its registers: with its row entries read ahead (sweepPointRows) the
/// count search took 65-67 and three blocks an SM (4M row on the H200: 1.35 -> 1.47 ms).
template <class Op, bool Banded, bool NarrowRows>
__global__ void __launch_bounds__(tileThreads, 4) stagedTilesSearchInFour(TileSearch g, Op op, unsigned long long* decided)
{
  searchTile<Op, Banded, NarrowRows>(g, op, decided);
}

/// Neighbor Count over the half shell (searchTile, countHalfShells) in at most 48 registers, so
/// that the five blocks an SM its shared memory allows (chooseHalfShellTiles) fit its registers.
/// On the 4M row on the H200 its search took 1.112 ms at four blocks an SM (inside the count's
/// kernel of the loop over every neighbor) and 0.962 at five, with tiles two cells deeper
/// (RESULTS.md, issue 22).
constexpr int halfShellBlocksPerSm = 5;
__global__ void __launch_bounds__(tileThreads, halfShellBlocksPerSm)
  stagedTilesCountHalfShells(TileSearch g, CountOperation op, unsigned long long* decided)
{
  searchTile<CountOperation, true, false, true>(g, op, decided);
}

/// Density over the half shell where every point has one mass (densityHalfShells), as the count's
/// kernel.
__global__ void __launch_bounds__(tileThreads, halfShellBlocksPerSm)
  stagedTilesDensityHalfShells(TileSearch g, DensityOperation op, unsigned long long* decided)
{
  searchTile<DensityOperation, false, false, true>(g, op, decided);
}

/// The search kernel of an operation.
template <class Op, bool Banded, bool NarrowRows>
constexpr auto searchKernel()
{
  if constexpr (pairReadsNoMemory<Op>())
  {
    return stagedTilesSearchInFour<Op, Banded, NarrowRows>;
  }
  else
  {
    return stagedTilesSearch<Op, Banded, NarrowRows>;
  }
}

/// Shared memory per staged point: the particle and, for operations that read arrays, its global index.
constexpr int stagedPointBytes = int(sizeof(Particle) + sizeof(std::int32_t));
template <class Op, bool Banded>
constexpr int stagedPointBytesFor()
{
  constexpr int components = stagedComponents<Op, Banded>();
  return pairReadsNoMemory<Op>() || components > 0
    ? int(sizeof(Particle)) + stagedValueStride(components) * int(sizeof(float))
    : stagedPointBytes;
}

class StagedTiles final : public CudaMethod
{
public:
  explicit StagedTiles(DevicePool& pool)
    : cells_(pool), tileCounts_(pool), position_(pool), scratch_(pool), itemList_(pool)
  {
  }
  Method id() const override { return Method::StagedTiles; }

  /// Whether the cells' keys are read from the slots of an identity table instead of being kept
  /// (OccupiedCells): 8 bytes less for each cell the table has room for (8 a point at 64M). Wide
  /// keys never have one.
  static bool keysInTable(std::int64_t n, const KeyLayout& layout) { return RadixCells::looksUpByIdentity(n, layout); }

  std::int64_t plannedBytes(const CudaRun& run) const override
  {
    const Problem& p = *run.problem;
    const KeyLayout layout = makeKeyLayout(p.lo, p.hi, cellSizeFor(p.radius, reachFor(p)));
    const std::int64_t cells = cellCapacity(run.count, layout);
    // Each tile's own points at its leader and the items' positions: two words per occupied cell;
    // work items: one per tile and one per 256 points.
    return RadixCells::plannedBytes(run.count, layout, !keysInTable(run.count, layout)) + 8 * (cells + 1) +
      std::int64_t(sizeof(TileItem)) * (cells + run.count / tileThreads + 2) + (std::int64_t(8) << 20);
  }

  void sort(CudaRun& run) override
  {
    const Problem& p = *run.problem;
    const int n = static_cast<int>(run.count);
    reach_ = reachFor(p);
    shellKnob_ = shellKnob();
    cellSize_ = cellSizeFor(p.radius, reach_);
    hugeCells_ = reachesHugeCells(p, cellSize_);
    const KeyLayout layout = makeKeyLayout(p.lo, p.hi, cellSize_);
    keysByTable_ = keysInTable(n, layout);
    // The gather of the particles runs while the host waits for the count of cells, and the
    // tiles' listing beside it (listItems).
    cells_.build(run, layout, cellSize_, !keysByTable_, xBinBitsWanted(), [&]() {
      cellsFound_.record(run.stream);
      particlesInOrder<<<blocksFor(n), 256, 0, run.stream>>>(
        run.input, cells_.orderToInput(), n, cellSize_, 1.0 / cellSize_, cells_.particleRegion());
      NG_CUDA_CHECK_LAUNCH("particlesInOrder");
    });
    const CellTable& fine = cells_.table();
    const int cells = fine.cells;
    const double perCell = double(n) / std::max(1, cells);

    // Sparse data: below 1.5 points per occupied cell of R (a uniform cloud of about 0.9 points
    // per cell of R) no tile holds enough points to pay for staging, so each point looks up its
    // 27 cells of R (the search of Counting Sort and Radix Sort). Uniform clouds, density (H200,
    // `--table=sparser`, tiles against by point): 4M points at 0.75 points per cell of R (1.42
    // per occupied cell) 2.11 against 1.82 ms, at 1 (1.58) 1.78 against 1.88, at 1.5 (1.93) 1.45
    // against 1.99; 16M at 1, 6.58 against 7.12; 1M at 1, 0.486 against 0.498.
    items_ = 0;
    const bool sparse = searchesByPoint(perCell); // reads the knob on every run, so a misspelling is refused
    byPoint_ = reach_ == 1 && sparse;
    pointTest_ = makePairTest(p.radius, cellSize_, 3.0, run.input);
    if (byPoint_)
    {
      return;
    }

    // Tiles as large as shared memory allows for the data's points per occupied cell.
    // Survivor lists hold staged positions in 16 bits, the sentinel's (= capacity) included.
    const int maxCapacity = std::min(65535,
      (run.device->sharedMemoryPerBlock - staticSharedBytes - scratchAlignment - std::max(rowListBytes<false>(), clusterListBytes)) / stagedPointBytes - 1);
    side_ = maxTileSide;
    while (side_ > 1 && perCell * std::pow(side_ + 2 * reach_, 3) > 0.5 * maxCapacity)
    {
      side_ /= 2;
    }
    const double lambda = uniformPointsPerCell(n, cells, layout);
    uniform_ = lambda > 0.0;
    // The half shell where its tiles fit a uniform cloud's regions, or where the knob asks for it.
    halfShell_ = takesHalfShell(p) && (chooseHalfShellTiles(*run.device, lambda, maxCapacity) || shellKnob_ == "half");
    if (!halfShell_)
    {
      chooseDepthAndCapacity(*run.device, lambda, perCell, maxCapacity);
    }

    search_ = TileSearch{};
    search_.fine = fine;
    search_.particles = cells_.particleRegion();
    search_.orderToInput = cells_.orderToInput();
    search_.hasImages = p.images > 0;
    search_.firstImage = static_cast<int>(p.count - p.images);
    search_.side = side_;
    search_.depth = depth_;
    search_.reach = reach_;
    search_.capacity = capacity_;
    const double rho = p.radius / cellSize_;
    search_.cullLimit = static_cast<float>(rho * rho * (1.0 + 1e-4) + 1e-4);
    search_.xBinBits = cells_.xBinBits();
    search_.listBandFrom = listBandFrom(n);
    search_.test = makePairTest(p.radius, cellSize_, double(depth_ + 2 * reach_), run.input);
    listItems(run, n, layout);
  }
  double cellSize() const override { return cellSize_; }
  bool sortWeighsOne() const override { return true; }
  /// The half shell adds into its output (launch): wherever takesHalfShell may hold before the
  /// cells are counted (a clearing more than needed costs little: CudaBackend::clearBesideUpload).
  bool addsToOutput(const Problem& p) const override
  {
    const bool sums = p.operation == Operation::NeighborCount || (p.operation == Operation::Density && !p.mass);
    const std::string shell = shellKnob();
    return sums && !p.queries.separate && !p.radiusPass && shell != "full" && (shell == "half" || reachFor(p) == 2);
  }
  Particle* particles() override { return cells_.particleRegion(); }
  const std::int32_t* orderToInput() const override { return cells_.orderToInput(); }
  QuerySource querySource() override { return cellQuerySource(cells_.table(), particles(), orderToInput(), reach_); }
  std::int64_t heldBytes() const override
  {
    return cells_.heldBytes() +
      std::int64_t(tileCounts_.bytes() + position_.bytes() + scratch_.bytes() + itemList_.bytes());
  }

  NEIGHBORGRID_SEARCHES_BY(launch)

private:
  /// The search's work items: every tile in chunks of its own points (chunkPointsFor), listed by
  /// each tile's leader (its first occupied cell) in the cells' order. Their count stays on the
  /// device: the search reads it. This replaced a warp a tile that looked up its 64 cells and
  /// placed its items by an atomic counter, after a pass that flagged the leaders and a gather of
  /// them. On the H200 the listing's kernels took 74 -> 49 us on the 4M density row and 0.98 ->
  /// 0.48 ms on the 64M one, and with the items exactly in the cells' order the searches took
  /// about 1% less (RESULTS.md, issue 22).
  /// The listing reads only the cells and their lookup, so it runs on the run's side stream,
  /// beside the gather of the particles (sort), which it slows by about 9 us: on the 4M rows on
  /// the H200 the sort stage took 0.337-0.342 ms with the listing after the gather and 0.324-0.327
  /// beside it (RESULTS.md, issue 22).
  void listItems(CudaRun& run, int n, const KeyLayout& layout)
  {
    if (takesTilesDirectly(layout))
    {
      return;
    }
    if (!run.side)
    {
      queueItems(run, run.stream, n, layout);
      return;
    }
    cellsFound_.holdBack(run.side, "listing the tiles beside the gather");
    queueItems(run, run.side, n, layout);
    listed_.record(run.side);
    listed_.holdBack(run.stream, "joining the tiles' listing");
  }

  /// Whether the half shell's blocks take the grid's tiles directly (TileSearch::directTiles):
  /// a block a tile, its first two chunks of own points (a uniform cloud's tiles hold one or two);
  /// where a tile holds more, a listed search of the chunks after them (searchRest). No listing
  /// runs beside the gather, which took 98 us beside it against 89 alone, and the search waits
  /// on no other stream: on the 4M rows on the H200, four rounds in turns, the sort stage took
  /// 0.306-0.307 -> 0.296-0.298 ms, count's search 0.893-0.896 -> 0.892-0.895 (count 1.200-1.203
  /// -> 1.188-1.192) and density's 0.971-0.973 -> 0.982-0.984 (a tile over a block's threads in
  /// one block; RESULTS.md, issue 22). Smoothing's loops over every neighbor keep their listed
  /// chunks: a block a tile took Shepard-3's search 1.859 -> 1.903 ms.
  /// Where the grid holds more tiles than there are occupied cells, so would the blocks.
  /// NEIGHBORGRID_TILES_ITEMS=direct|listed (a testing and benchmarking knob) takes a way, the
  /// direct one for every half shell with an identity table.
  bool takesTilesDirectly(const KeyLayout& layout)
  {
    search_.directTiles = 0;
    const std::string knob = tilesKnob("NEIGHBORGRID_TILES_ITEMS", { "direct", "listed" });
    const TileGrid grid = keysByTable_ ? TileGrid::of(layout, side_, depth_) : TileGrid{};
    const bool possible = halfShell_ && keysByTable_ && grid.tiles() <= double(std::numeric_limits<int>::max());
    if (knob == "direct" && !possible)
    {
      throw Error("NeighborGrid: NEIGHBORGRID_TILES_ITEMS is 'direct', but this run's tiles are listed: blocks take "
                  "grid tiles directly only over the half shell with an identity table of cells");
    }
    if (!possible || knob == "listed" || (knob.empty() && grid.tiles() > double(search_.fine.cells)))
    {
      return false;
    }
    int* hostFlag = restFlag_.ensure(1, "the flag of tiles over their blocks");
    NG_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&search_.restFlag), hostFlag, 0),
      "mapping the flag of tiles over their blocks");
    search_.directTiles = static_cast<int>(grid.tiles());
    search_.directGrid = grid;
    items_ = search_.directTiles;
    return true;
  }

  /// listItems' kernels, queued on `stream`.
  /// From chunk firstChunk of each tile on (searchRest: the grid's tiles, whatever their count).
  void queueItems(CudaRun& run, cudaStream_t stream, int n, const KeyLayout& layout, int firstChunk = 0)
  {
    const int cells = search_.fine.cells;
    if (cells == 0)
    {
      return;
    }
    // A tile holds an occupied cell and lies in the grid; its chunks hold 256 points or more but
    // the last.
    const std::size_t bound = std::size_t(tileBound(layout, cells)) + std::size_t(n) / tileThreads + 1;
    if (bound > std::size_t(std::numeric_limits<int>::max()))
    {
      throw Error("NeighborGrid: Staged Tiles would need " + std::to_string(bound) +
        " work items, more than a CUDA grid holds; split the points into slabs");
    }
    // Each tile's own points by its number on the grid of tiles (identity tables, where that grid
    // is no larger than the occupied cells), else at its leader cell. On the H200, with the cell
    // starts' selection filling the table (RadixCells::build) and no kept keys: the 4M sort stage
    // 0.373-0.378 -> 0.355-0.357 ms, the 64M one 5.58-5.59 -> 5.09 (RESULTS.md, issue 22).
    const TileGrid grid = keysByTable_ ? TileGrid::of(layout, side_, depth_) : TileGrid{};
    const bool onGrid = keysByTable_ && (grid.tiles() <= double(cells) || firstChunk > 0);
    const int entries = onGrid ? static_cast<int>(grid.tiles()) : cells;
    // Each grid tile's work items, or each leader cell's tile's own points (TileChunks makes them
    // work items), then scanned into the items' positions.
    std::int32_t* tileCounts = tileCounts_.ensure(std::size_t(entries) + 1, "each tile's points or work items");
    std::int32_t* position = position_.ensure(std::size_t(entries) + 1, "the tiles' work item positions");
    const OccupiedCells occupied{ search_.fine, keysByTable_ };
    const TileChunks chunks{ tileCounts, side_, depth_, reach_, capacity_ };
    if (onGrid)
    {
      // countGridTileItems also clears the scan's entry after the last tile.
      countGridTileItems<<<blocksFor(std::int64_t(entries) * 32), 256, 0, stream>>>(
        search_.fine, grid, entries, chunks, firstChunk, tileCounts);
      NG_CUDA_CHECK_LAUNCH("countGridTileItems");
      exclusiveSum(thrust::make_transform_iterator(tileCounts, ItemsOfTile{}), position, entries + 1, scratch_, stream,
        "scanning the tiles' work items");
    }
    else
    {
      NG_CUDA_CHECK(cudaMemsetAsync(tileCounts, 0, sizeof(std::int32_t) * (std::size_t(entries) + 1), stream),
        "each tile's own points");
      addToTileLeaders<<<blocksFor(occupied.count()), 256, 0, stream>>>(occupied, side_, depth_, tileCounts);
      NG_CUDA_CHECK_LAUNCH("addToTileLeaders");
      const auto chunksOfEntry = thrust::make_transform_iterator(thrust::counting_iterator<int>(0), chunks);
      exclusiveSum(chunksOfEntry, position, entries + 1, scratch_, stream, "scanning the tiles' work items");
    }
    TileItem* items = itemList_.ensure(bound, "tile work items");
    if (onGrid)
    {
      writeGridTileItems<<<blocksFor(entries), 256, 0, stream>>>(search_.fine, grid, entries, firstChunk, tileCounts, position, items);
      NG_CUDA_CHECK_LAUNCH("writeGridTileItems");
    }
    else
    {
      writeTileItems<<<blocksFor(occupied.count()), 256, 0, stream>>>(occupied, position, items);
      NG_CUDA_CHECK_LAUNCH("writeTileItems");
    }
    search_.items = items;
    search_.itemCount = position + entries;
    // The search launches a block per item of the bound; those beyond the count return at once.
    // Without the two host waits for the tile and item counts the 4M sort stage took 20-40 us
    // less on the H200; a grid of resident blocks that took items from a counter instead made
    // every search 60-115 us slower (RESULTS.md, issue 22).
    items_ = static_cast<int>(bound);
  }

  /// At most one tile per occupied cell, and at most the tiles that the grid's span meets on each
  /// axis (a wide layout's span may be infinite: then the cells bound it).
  std::int64_t tileBound(const KeyLayout& layout, int cells) const
  {
    double tiles = 1.0;
    for (int a = 0; a < 3; ++a)
    {
      tiles *= std::floor(layout.span[a] / tileExtent(a, side_, depth_)) + 2.0;
    }
    return tiles < double(cells) ? static_cast<std::int64_t>(tiles) : std::int64_t(cells);
  }

  // StagedCells, rounded up.
  static constexpr int staticSharedBytes = 8192;
  static_assert(sizeof(StagedCells) <= staticSharedBytes, "the search's static shared memory");
  // Points per cell of R over the bounds from which cells of R / 2 pay (reachFor), and points
  // per occupied cell of R below which each point looks up its cells (sort).
  static constexpr double densePointsPerCellOfR = 10.0;
  static constexpr double sparsePointsPerCell = 1.5;

  /// Cells of R / 2 where the data are dense, of R where they are not. With few points per cell
  /// of R / 2 the rows of a point's 5 x 5 cells hold about one point each, and a tile of 4^3
  /// cells stages 512 cells for a few dozen points (8M points at 20 neighbors: Staged Tiles
  /// 6.9 ms, the 27-cell search 4.6); cells of R stage 216 cells for 64 cells' points. The rule
  /// looks at the points per cell of R over the bounds (Auto's estimate; clustered data look
  /// sparser than they are, which costs speed, never a result). NEIGHBORGRID_TILES_REACH=1|2 (a
  /// benchmarking knob) takes one for every run.
  static int reachFor(const Problem& p)
  {
    const std::string reach = tilesKnob("NEIGHBORGRID_TILES_REACH", { "1", "2" });
    if (!reach.empty())
    {
      return reach == "1" ? 1 : 2;
    }
    const double size = cellSizeFor(p.radius, 1);
    const double perCellOfR = double(p.count) * size * size * size / boundsVolume(p, size);
    return perCellOfR >= densePointsPerCellOfR ? 2 : 1;
  }

  /// Bits of x bins a fine cell (RadixCells::build): 2, four bins, where the key word has room.
  /// Each point's rows end at the bins its sphere reaches instead of whole cells (forEachPointRow),
  /// for two more key bits in the sort (the 4M row's sort stays at three passes). On the 4M row on
  /// the H200, against whole cells (HEAD) in one call: count 2.05-2.07 -> 1.97 ms, density 2.10-2.13 ->
  /// 2.06-2.09, Shepard-1 2.27-2.30 -> 2.10-2.12, Shepard-3 2.91 -> 2.66-2.70 (RESULTS.md, issue
  /// 22). NEIGHBORGRID_TILES_BINS=1|2|4 (a testing and benchmarking knob) asks for that many bins.
  static int xBinBitsWanted()
  {
    const std::string bins = tilesKnob("NEIGHBORGRID_TILES_BINS", { "1", "2", "4" });
    if (!bins.empty())
    {
      return bins == "1" ? 0 : bins == "2" ? 1 : 2;
    }
    return RadixCells::maxXBinBits;
  }

  /// Whether a point may lie in a huge cell (CellGrid.h), whose frame coordinates are NaN: every
  /// pair there is decided in double, so the search keeps its band for every operation. Cell
  /// coordinates grow with x, so the bounds' cells tell.
  static bool reachesHugeCells(const Problem& p, double size)
  {
    for (int a = 0; a < 3; ++a)
    {
      if (isHugeCell(cellCoordinate(p.lo[a], size)) || isHugeCell(cellCoordinate(p.hi[a], size)))
      {
        return true;
      }
    }
    return false;
  }

  /// Cluster pairs for smoothing of two or more components where the search reads the values
  /// from global memory (the banded loop); one thread per point for the rest, staged values of
  /// every width among them. On the 4M rows on the H200 the loop per point is the faster for one
  /// to four staged components at about 24, 80 and 190 neighbors; four components took 1.72,
  /// 3.28 and 7.12 ms by point against 2.40, 3.86 and 11.57 in cluster pairs (RESULTS.md, issue
  /// 22). NEIGHBORGRID_TILES_LOOP=points|clusters (a benchmarking knob) takes one for every
  /// operation.
  template <class Op>
  static bool usesClusterPairs(bool stagesValues)
  {
    const std::string loop = tilesKnob("NEIGHBORGRID_TILES_LOOP", { "points", "clusters" });
    if (!loop.empty())
    {
      return loop == "clusters";
    }
    return !stagesValues && Op::Terms >= 3;
  }

  template <class Op>
  void launch(CudaRun& run, const Op& op)
  {
    if (byPoint_)
    {
      launchGridSearch(run, cells_.table(), cells_.particleRegion(), cells_.orderToInput(), pointTest_, op);
      return;
    }
    if (items_ == 0)
    {
      return;
    }
    TileSearch search = search_;
    if constexpr (std::is_same<Op, CountOperation>::value)
    {
      if (halfShell_)
      {
        if (run.clearedOutput != op.output)
        {
          NG_CUDA_CHECK(cudaMemsetAsync(op.output, 0, sizeof(std::int32_t) * std::size_t(run.count), run.stream),
            "clearing the neighbor counts");
        }
        search.halfShellCounts = op.output;
        launchHalfShell(run, stagedTilesCountHalfShells, search, op);
        return;
      }
    }
    if constexpr (std::is_same<Op, DensityOperation>::value)
    {
      // The density of Operation::Density (OperationPlan.h): in input order only, where the
      // caller asked for it.
      if (halfShell_ && !op.orderedOutput)
      {
        if (op.output)
        {
          if (run.clearedOutput != op.output)
          {
            NG_CUDA_CHECK(cudaMemsetAsync(op.output, 0, sizeof(float) * std::size_t(run.count), run.stream),
              "clearing the densities");
          }
          search.halfShellDensities = op.output;
          search.halfShellDensityScale = run.problem->constantMass * op.kernel.normalization;
          launchHalfShell(run, stagedTilesDensityHalfShells, search, op);
        }
        return;
      }
    }
    if (halfShell_ || depth_ > maxTileDepth)
    {
      // sort() planned the half shell's tiles for its operation only.
      throw Error("NeighborGrid: Staged Tiles sorted for a search over the half shell, then searched another operation");
    }
    if constexpr (termsVanishAtRadius<Op>())
    {
      // Staged values of three or four components take more shared memory a point than an index:
      // a capacity that fits the index (sort) may not fit them (a region of thousands of points),
      // and the banded loop stages indices.
      search.clusterPairs = usesClusterPairs<Op>(stagedComponents<Op, false>() > 0);
      if (!hugeCells_ && sharedBytes<Op, false>(search) <= std::size_t(run.device->sharedMemoryPerBlock - staticSharedBytes))
      {
        launchSearch<Op, false>(run, search, op);
        return;
      }
    }
    search.clusterPairs = usesClusterPairs<Op>(false);
    launchSearch<Op, true>(run, search, op);
  }
  template <class Op>
  void launchHalfShell(CudaRun& run, void (*kernel)(TileSearch, Op, unsigned long long*), const TileSearch& search, const Op& op)
  {
    const std::size_t bytes = halfShellSharedBytes();
    allowDynamicSharedMemory(kernel, run.device->id, bytes, "allowing the half shell's shared memory");
    if (search.directTiles > 0)
    {
      *static_cast<volatile int*>(restFlag_.get()) = 0;
      // The tiles' chunks after their blocks' (searchRest): the search over listed items.
      rest_ = [this, kernel, search, op, bytes](CudaRun& restRun) {
        TileSearch rest = search;
        rest.directTiles = 0;
        rest.items = search_.items;
        rest.itemCount = search_.itemCount;
        kernel<<<items_, tileThreads, bytes, restRun.stream>>>(rest, op, restRun.decided);
        NG_CUDA_CHECK_LAUNCH("the tiles' chunks over their blocks");
      };
    }
    kernel<<<items_, tileThreads, bytes, run.stream>>>(search, op, run.decided);
  }

public:
  /// After a search that took grid tiles directly and the stream's synchronization: where a
  /// tile held more than its block's chunks (the flag in the host's memory), lists the chunks
  /// after each tile's first TileSearch::directChunks and queues their search (true). A search
  /// whose tiles all fit their blocks costs nothing here.
  bool searchRest(CudaRun& run) override
  {
    if (!rest_)
    {
      return false;
    }
    const auto rest = std::move(rest_);
    rest_ = nullptr;
    if (*static_cast<volatile int*>(restFlag_.get()) == 0)
    {
      return false;
    }
    *static_cast<volatile int*>(restFlag_.get()) = 0;
    const int directTiles = search_.directTiles;
    queueItems(run, run.stream, static_cast<int>(run.count), search_.fine.layout, TileSearch::directChunks);
    rest(run);
    items_ = directTiles; // for a later search of the same sort
    return true;
  }

private:
  template <class Op, bool Banded, bool NarrowRows = false>
  std::size_t sharedBytes(const TileSearch& search) const
  {
    return std::size_t(capacity_ + 1) * stagedPointBytesFor<Op, Banded>() + scratchAlignment +
      (search.clusterPairs ? clusterListBytes : rowListBytes<NarrowRows>());
  }
  template <class Op, bool Banded>
  void launchSearch(CudaRun& run, TileSearch search, const Op& op)
  {
    if (search.clusterPairs)
    {
      // Cluster pairs read whole cells (listClusterRows): the staging places no bins.
      search.xBinBits = 0;
    }
    if (usesNarrowRows<Op, Banded>(run, search))
    {
      launchSearchKernel<Op, Banded, true>(run, search, op);
    }
    else
    {
      launchSearchKernel<Op, Banded, false>(run, search, op);
    }
  }
  template <class Op, bool Banded, bool NarrowRows>
  void launchSearchKernel(CudaRun& run, const TileSearch& search, const Op& op)
  {
    const std::size_t bytes = sharedBytes<Op, Banded, NarrowRows>(search);
    auto* kernel = searchKernel<Op, Banded, NarrowRows>();
    allowDynamicSharedMemory(kernel, run.device->id, bytes, "allowing the staged tiles' shared memory");
    kernel<<<items_, tileThreads, bytes, run.stream>>>(search, op, run.decided);
  }

  /// The tiles' depth (depth_) and the staged points a block holds (capacity_), for tiles of
  /// side_ cells along x and y.
  /// - The capacity: the mean points per occupied cell overstates a uniform cloud's (empty cells
  ///   are not counted), so 5% and 96 points above the region's mean stage nearly every tile; a
  ///   tile that does not fit reads from global memory. Where what one more count or density
  ///   block an SM would leave still holds a uniform cloud's region at three standard deviations
  ///   above its mean, the capacity is that (Nsight Compute on the 4M row: three blocks of mostly
  ///   5 busy warps left the SM idle a third of its cycles; the 8M row of 160 neighbors took 5.30
  ///   ms at three blocks, 6.13 at two).
  /// - The depth: a block has 256 threads, and a cube of 4^3 cells holds about 155 +- 12 points
  ///   on the 4M row (Poisson estimates here), so about 100 threads idle while the block holds its
  ///   share of the SM's shared memory and registers. A tile one cell deeper along z (side x side
  ///   x (side + 1)) holds about 190 +- 14, and its region stages 9/8 of the cube's cells for 5/4
  ///   of its own points. Taken where a uniform cloud (uniformPointsPerCell: lambda) puts its
  ///   points at four standard deviations above their mean within the block's threads, and its
  ///   region at three within what the cube's blocks an SM leave. On the H200 against the cube
  ///   (RESULTS.md, issue 22): the 4M rows' searches, count 1.279 -> 1.240 ms, density 1.333 ->
  ///   1.247, Shepard-1 1.425 -> 1.354, Shepard-3 1.973 -> 1.857; 64M density 21.62 -> 20.06.
  /// NEIGHBORGRID_TILES_DEPTH=cube|deeper|deepest (a benchmarking knob) takes one of the two
  /// depths, the deeper one with what the cube's blocks leave ("deepest" is "deeper" here).
  void chooseDepthAndCapacity(const CudaDevice& device, double lambda, double perOccupiedCell, int maxCapacity)
  {
    const std::string depth = depthKnob();
    const auto atThreeDeviations = [](double mean) { return mean + 3.0 * std::sqrt(mean); };
    const int S = side_ + 2 * reach_;
    // Count's and density's shared memory a block (sharedBytes, wide rows), with a margin for the
    // compiler's placement of the static part.
    const int fixedBytes = alignedScratchBytes(int(sizeof(StagedCells))) + 64 + scratchAlignment + rowListBytes<false>();
    const auto capacityAt = [&](int blocks) {
      return std::min(maxCapacity,
        (device.sharedMemoryPerSm / blocks - device.reservedSharedMemoryPerBlock - fixedBytes) / int(sizeof(Particle)) - 1);
    };
    const auto blocksAt = [&](int capacity) {
      return device.sharedMemoryPerSm / ((capacity + 1) * int(sizeof(Particle)) + fixedBytes + device.reservedSharedMemoryPerBlock);
    };
    const double expected = perOccupiedCell * S * S * S;
    capacity_ = static_cast<int>(std::min<double>(maxCapacity, std::ceil((1.05 * expected + 96) / 32) * 32));
    if (lambda > 0.0 && atThreeDeviations(lambda * S * S * S) <= capacityAt(blocksAt(capacity_) + 1))
    {
      capacity_ = capacityAt(blocksAt(capacity_) + 1);
    }
    depth_ = side_;
    const int blocks = blocksAt(capacity_);
    if (depth == "cube" || side_ + 1 > maxTileDepth || blocks < 1)
    {
      return;
    }
    const double own = lambda * side_ * side_ * (side_ + 1), staged = lambda * S * S * (S + 1);
    if (depth == "deeper" || depth == "deepest" ||
      (lambda > 0.0 && own + 4.0 * std::sqrt(own) <= tileThreads && atThreeDeviations(staged) <= capacityAt(blocks)))
    {
      depth_ = side_ + 1;
      capacity_ = capacityAt(blocks);
    }
  }

  /// The half shell's tiles (takesHalfShell): depth_ and capacity_, and whether a uniform cloud's
  /// region fits them. Its kernels hold five blocks an SM (stagedTilesCountHalfShells), so the
  /// capacity is what five leave where the region fits it, else what four leave, and so on. Its
  /// regions stage no layers below their tiles, and its blocks wait for their slowest warp before
  /// they add their counters (countHalfShells), so a tile holds as many points as a block's
  /// threads take: two cells deeper than wide where a uniform cloud's own points lie within one
  /// standard deviation below 256 (the 4M row: 229 +- 15; about one tile in 25 takes a second
  /// block: chunkPointsFor), else one deeper or the cube, each where its region fits at three
  /// standard deviations. Where no region fits, nearly every tile would search from global memory
  /// with an atomic a pair (8M points at 160 neighbors: density 5.28 -> 11.96 ms on the H200).
  /// NEIGHBORGRID_TILES_DEPTH=cube|deeper|deepest (a benchmarking knob) takes a depth.
  bool chooseHalfShellTiles(const CudaDevice& device, double lambda, int maxCapacity)
  {
    const std::string depth = depthKnob();
    // An SM gives a block its shared memory in units of 128 bytes, so five blocks fit only within
    // a fifth rounded down to a unit (the first version lost its fifth block to this).
    constexpr int allocationUnit = 128;
    const int fixedBytes = alignedScratchBytes(int(sizeof(StagedCells))) + 64 + scratchAlignment + halfShellRowBytes;
    const auto capacityAt = [&](int blocks) {
      const int blockBytes = (device.sharedMemoryPerSm / blocks - device.reservedSharedMemoryPerBlock) / allocationUnit * allocationUnit;
      return std::min({ maxCapacity, halfShellFlushPlaces, (blockBytes - fixedBytes) / int(sizeof(Particle)) - 1 });
    };
    const int S = side_ + 2 * reach_;
    const auto fits = [&](int d, int capacity) {
      const double own = lambda * side_ * side_ * d, staged = lambda * S * S * (d + reach_);
      return lambda > 0.0 && (d == side_ || own + std::sqrt(own) <= tileThreads) &&
        staged + 3.0 * std::sqrt(staged) <= capacity;
    };
    const int wanted = depth.empty() ? 0 : depth == "cube" ? side_ : depth == "deeper" ? side_ + 1 : side_ + 2;
    for (int blocks = halfShellBlocksPerSm; blocks >= 2; --blocks)
    {
      capacity_ = capacityAt(blocks);
      for (depth_ = side_ + 2; depth_ >= side_; --depth_)
      {
        if ((wanted == 0 || depth_ == wanted) && fits(depth_, capacity_))
        {
          return true;
        }
      }
    }
    capacity_ = capacityAt(halfShellBlocksPerSm);
    depth_ = wanted > 0 ? wanted : side_;
    return false;
  }
  /// NEIGHBORGRID_TILES_DEPTH: "cube", "deeper", "deepest" or empty (unset); a misspelling is
  /// refused.
  static std::string depthKnob()
  {
    return tilesKnob("NEIGHBORGRID_TILES_DEPTH", { "cube", "deeper", "deepest" });
  }
  /// The half shell's shared memory a block (stagedTilesCountHalfShells): its row lists and its
  /// staged points, whose weights hold their counters (stagedCounter).
  std::size_t halfShellSharedBytes() const
  {
    return std::size_t(capacity_ + 1) * sizeof(Particle) + scratchAlignment + halfShellRowBytes;
  }

  /// The mean points per cell where the data look uniform, 0 where they do not. A Poisson cloud of
  /// mean lambda a cell holds lambda / (1 - exp(-lambda)) points per occupied cell; the data look
  /// uniform where their occupied cells hold at most 5% more than that for the mean over their
  /// bounds (clustered data hold far more). The mean is then the larger of that over the bounds
  /// (cells cut by the bounds lower it a little) and the one that the points per occupied cell
  /// give (a lattice of one point a cell gives none).
  static double uniformPointsPerCell(std::int64_t n, int cells, const KeyLayout& layout)
  {
    if (layout.mode == KeyMode::Wide || cells == 0 || n == 0)
    {
      return 0.0;
    }
    const double boundsMean = double(n) / (layout.span[0] * layout.span[1] * layout.span[2]);
    const double perOccupiedCell = double(n) / cells;
    if (perOccupiedCell > 1.05 * boundsMean / -std::expm1(-boundsMean))
    {
      return 0.0;
    }
    // The fixed point converges linearly; it stops once a step moves it by less than 1e-13 of
    // itself: 20 steps at the 4M row's 2.66 points per occupied cell instead of 100 (3.4 us of a
    // build machine's core), the same lambda to 2e-14. The host runs this while the GPU gathers.
    double lambda = perOccupiedCell;
    for (int i = 0; i < 100; ++i)
    {
      const double next = perOccupiedCell * -std::expm1(-lambda);
      const bool settled = std::fabs(next - lambda) <= 1e-13 * next;
      lambda = next;
      if (settled)
      {
        break;
      }
    }
    return std::max(boundsMean, lambda);
  }

  /// Whether each point looks up its cells of R (points per occupied cell below
  /// sparsePointsPerCell). NEIGHBORGRID_TILES_STAGING=tiles|points (a benchmarking knob) takes
  /// one wherever the cells are of R.
  static bool searchesByPoint(double perOccupiedCell)
  {
    const std::string staging = tilesKnob("NEIGHBORGRID_TILES_STAGING", { "tiles", "points" });
    return !staging.empty() ? staging == "points" : perOccupiedCell < sparsePointsPerCell;
  }

  /// The pairs decided in double from which on a block lists its pairs within rounding of R
  /// (BandPairs): a quarter of a pair a point. NEIGHBORGRID_TILES_BAND=counted|listed (a
  /// testing and benchmarking knob) takes one way everywhere.
  static unsigned long long listBandFrom(int n)
  {
    const std::string band = tilesKnob("NEIGHBORGRID_TILES_BAND", { "counted", "listed" });
    if (!band.empty())
    {
      return band == "listed" ? 0ull : ~0ull;
    }
    return std::max(1ull, static_cast<unsigned long long>(n) / 4);
  }

  /// Whether Neighbor Count, or density with one mass for every point, takes the half shell
  /// (countHalfShells, densityHalfShells), decided before the tiles are chosen
  /// (chooseHalfShellTiles, which may still turn it down): on clouds of uniform density, where
  /// nearly every tile fits shared memory (a tile that does not adds each neighbor to the results
  /// in global memory, which in a dense clump would take an atomic a pair), in cells of R / 2,
  /// with or without periodic images (isImage), without separate queries or a
  /// radius layer, with wide row entries and one thread a point. Density's masses from an array
  /// keep the loop over every neighbor: the half shell's counters take the staged weights. In
  /// cells of R the gain is mixed: on the H200 a simple cubic lattice of 4M points with
  /// R on a shell took 1.577 -> 0.957 ms (half its pairs at R to decide in double), but FCC
  /// crystals of a dozen or two neighbors, R on the first shell, past it and at 1.7, took 1.478 ->
  /// 1.608, 0.678 -> 0.722 and 0.526 -> 0.518 (RESULTS.md, issue 22).
  /// NEIGHBORGRID_TILES_SHELL=half|full (a benchmarking knob) takes one where both can run.
  bool takesHalfShell(const Problem& p) const
  {
    // The loop knob is read on every run, so that a misspelling is refused; forced to cluster
    // pairs, count and density keep them.
    const bool clusterPairs = usesClusterPairs<CountOperation>(false);
    const bool counts = p.operation == Operation::NeighborCount && !clusterPairs;
    // Density with one mass for every point (its staged weights hold the counters), band-free.
    const bool sumsDensity = p.operation == Operation::Density && !p.mass && !hugeCells_ && !clusterPairs;
    const bool runs = (counts || sumsDensity) && !p.queries.separate && !p.radiusPass && rowsKnob() != "narrow";
    return runs && (shellKnob_.empty() ? uniform_ && reach_ == 2 : shellKnob_ == "half");
  }
  /// NEIGHBORGRID_TILES_SHELL, read on every run (sort), so that a misspelling is refused.
  static std::string shellKnob()
  {
    return tilesKnob("NEIGHBORGRID_TILES_SHELL", { "half", "full" });
  }
  /// Narrow row entries (RowFormat<true>) for smoothing of two to four staged components, where
  /// they let more blocks share an SM than wide ones and the tile's capacity fits their
  /// positions: on the 4M row on the H200 (whole cells), Shepard smoothing of two and three
  /// components 2.64 -> 2.51 and 2.94-2.96 -> 2.86-2.89 ms (four blocks instead of three); with
  /// x bins, three components 2.71 -> 2.68-2.70. Density took five blocks with them and 2.18 ->
  /// 2.14 ms with whole cells, but with x bins its rows hold fewer candidates and wide entries at
  /// four blocks are faster: 2.05-2.06 ms against 2.09; count, four blocks either way, 2.03 ->
  /// 2.17 with narrow entries. Four components by point (H200, 4M, about 24 neighbors): 1.72 ms
  /// against 1.86 with wide entries (RESULTS.md, issue 22).
  /// NEIGHBORGRID_TILES_ROWS=narrow|wide (a testing and benchmarking knob) takes one wherever the
  /// capacity allows.
  template <class Op, bool Banded>
  bool usesNarrowRows(const CudaRun& run, const TileSearch& search)
  {
    const std::string rows = rowsKnob();
    if (search.clusterPairs || capacity_ > RowFormat<true>::maxPosition)
    {
      return false;
    }
    if (!rows.empty())
    {
      return rows == "narrow";
    }
    return stagedComponents<Op, Banded>() >= 2 &&
      blocksPerSm<Op, Banded, true>(run, search) > blocksPerSm<Op, Banded, false>(run, search);
  }
  /// NEIGHBORGRID_TILES_ROWS: "narrow", "wide" or empty (unset); a misspelling is refused.
  static std::string rowsKnob()
  {
    return tilesKnob("NEIGHBORGRID_TILES_ROWS", { "narrow", "wide" });
  }
  /// The search's resident blocks an SM, asked of the driver once a kernel and size.
  template <class Op, bool Banded, bool NarrowRows>
  int blocksPerSm(const CudaRun& run, const TileSearch& search)
  {
    auto* kernel = searchKernel<Op, Banded, NarrowRows>();
    const std::size_t bytes = sharedBytes<Op, Banded, NarrowRows>(search);
    int& blocks = residentBlocks_[{ reinterpret_cast<const void*>(kernel), bytes }];
    if (blocks == 0)
    {
      allowDynamicSharedMemory(kernel, run.device->id, bytes, "allowing the staged tiles' shared memory");
      NG_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, tileThreads, bytes),
        "the staged tiles' resident blocks");
    }
    return blocks;
  }

  RadixCells cells_;
  DeviceBuffer<std::int32_t> tileCounts_; // listItems: each tile's points or work items
  DeviceBuffer<std::int32_t> position_;
  DeviceBuffer<unsigned char> scratch_;
  DeviceBuffer<TileItem> itemList_;
  PinnedBuffer<int> restFlag_;          // TileSearch::restFlag
  std::function<void(CudaRun&)> rest_;  // the last direct search's launch, for its tiles' other chunks
  StreamMark cellsFound_; // the cells and their lookup are built (sort)
  StreamMark listed_;     // the work items are listed (listItems)
  bool uniform_ = false; // the occupied cells hold what a uniform cloud's would (uniformPointsPerCell)
  bool halfShell_ = false; // count or density over the half shell (takesHalfShell), on its own tiles
  std::string shellKnob_;
  TileSearch search_;
  PairTest pointTest_; // the search by point (sparse data): frames of 3 cells
  double cellSize_ = 1.0;
  int reach_ = maxReach;
  bool byPoint_ = false;
  bool hugeCells_ = false;
  bool keysByTable_ = false; // an identity table without kept keys (OccupiedCells)
  int side_ = maxTileSide;
  int depth_ = maxTileSide;
  int capacity_ = 0;
  int items_ = 0; // the search's blocks: the work items, or a bound on them
  std::map<std::pair<const void*, std::size_t>, int> residentBlocks_;
};

} // namespace

std::unique_ptr<CudaMethod> makeStagedTiles(DevicePool& pool)
{
  return std::make_unique<StagedTiles>(pool);
}

} // namespace detail
} // namespace neighborgrid
