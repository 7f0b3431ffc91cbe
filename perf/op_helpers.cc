// Building blocks shared by the op files: deterministic data, buffer sizes, bandwidth and wire-byte
// formulas, bit-exact host references of the plain collectives, and the NCCL baseline calls.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "host/base/params.h"
#include "host/dtype.h"
#include "host/quant_format.h"
#include "host/quant_ref.h"
#include "host/topology.h"
#include "perf/common.h"
#include "src/cuda/cuda_backend.h"

namespace zp {
namespace perf {

namespace {
thread_local int reportRank = -1;

void printPrefix() {
  if (reportRank >= 0)
    std::fprintf(stderr, "zpccl perf: rank %d: ", reportRank);
  else
    std::fprintf(stderr, "zpccl perf: ");
}
}  // namespace

void setReportRank(int rank) { reportRank = rank; }

void reportCudaError(cudaError_t err, const char* call, const char* file, int line) {
  printPrefix();
  std::fprintf(stderr, "%s failed: %s (%s) at %s:%d\n", call, cudaGetErrorName(err), cudaGetErrorString(err), file,
               line);
  (void)cudaGetLastError();  // clear a sticky-free error so it does not resurface in the next check
}

void reportNcclError(ncclResult_t res, ncclComm_t comm, const char* call, const char* file, int line) {
  printPrefix();
  const char* last = ncclGetLastError(comm);
  std::fprintf(stderr, "%s failed: %s%s%s at %s:%d\n", call, ncclGetErrorString(res), last && *last ? ": " : "",
               last ? last : "", file, line);
}

void reportZpError(zpResult_t res, zpComm_t comm, const char* call, const char* file, int line) {
  printPrefix();
  const char* last = zpGetLastError(comm);
  std::fprintf(stderr, "%s failed: %s%s%s at %s:%d\n", call, zpGetErrorString(res), last && *last ? ": " : "",
               last ? last : "", file, line);
}

// ---- host-side parallelism ---------------------------------------------------------------------------------

namespace {
std::atomic<int> gHostThreads{0};
}  // namespace

void setHostThreads(int threads) { gHostThreads = std::max(0, threads); }

int hostThreads() {
  const int set = gHostThreads.load();
  if (set > 0) return set;
  return std::max(1, int(std::thread::hardware_concurrency()));
}

void parallelFor(size_t n, size_t grain, const std::function<void(size_t, size_t)>& fn) {
  grain = std::max<size_t>(grain, 1);
  const size_t pieces = std::min<size_t>(size_t(hostThreads()), (n + grain - 1) / grain);
  if (pieces <= 1) {
    if (n > 0) fn(0, n);
    return;
  }
  const size_t step = (n + pieces - 1) / pieces;
  std::vector<std::thread> threads;
  for (size_t begin = step; begin < n; begin += step)
    threads.emplace_back([&fn, begin, step, n] { fn(begin, std::min(n, begin + step)); });
  fn(0, std::min(n, step));
  for (auto& t : threads) t.join();
}

void quantizeRefParallel(const void* input, zpDataType_t type, size_t count, int bits, int blockSize, void* payload) {
  const size_t blocks = quantBlockCount(count, blockSize), ts = typeSize(type);
  float* scales = static_cast<float*>(payload);
  unsigned char* codes = static_cast<unsigned char*>(payload) + quantScaleBytes(count, blockSize);
  std::memset(payload, 0, quantPayloadBytes(count, bits, blockSize));
  parallelFor(blocks, (size_t(1) << 20) / size_t(blockSize), [&](size_t b0, size_t b1) {
    const size_t e0 = b0 * size_t(blockSize), n = std::min(count, b1 * size_t(blockSize)) - e0;
    std::vector<unsigned char> piece(quantPayloadBytes(n, bits, blockSize));
    quantizeRef(static_cast<const char*>(input) + e0 * ts, type, n, bits, blockSize, piece.data());
    std::memcpy(scales + b0, piece.data(), (b1 - b0) * sizeof(float));
    // e0 is a multiple of the block size (>= 32), so its codes start on a byte.
    std::memcpy(codes + e0 * size_t(bits) / 8, piece.data() + quantScaleBytes(n, blockSize), (n * bits + 7) / 8);
  });
}

void dequantizeRefParallel(const void* payload, zpDataType_t type, size_t count, int bits, int blockSize,
                           void* output) {
  const size_t blocks = quantBlockCount(count, blockSize), ts = typeSize(type);
  const float* scales = static_cast<const float*>(payload);
  const unsigned char* codes = static_cast<const unsigned char*>(payload) + quantScaleBytes(count, blockSize);
  parallelFor(blocks, (size_t(1) << 20) / size_t(blockSize), [&](size_t b0, size_t b1) {
    const size_t e0 = b0 * size_t(blockSize), n = std::min(count, b1 * size_t(blockSize)) - e0;
    std::vector<unsigned char> piece(quantPayloadBytes(n, bits, blockSize), 0);
    std::memcpy(piece.data(), scales + b0, (b1 - b0) * sizeof(float));
    std::memcpy(piece.data() + quantScaleBytes(n, blockSize), codes + e0 * size_t(bits) / 8, (n * bits + 7) / 8);
    dequantizeRef(piece.data(), type, n, bits, blockSize, static_cast<char*>(output) + e0 * ts);
  });
}

// ---- deterministic data ------------------------------------------------------------------------------------

uint64_t mix64(uint64_t x) {
  // splitmix64's finalizer: every input bit affects every output bit.
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

namespace {
inline uint64_t keyOf(int rank, uint64_t index) {
  return mix64(index * 0x9e3779b97f4a7c15ull + (uint64_t(uint32_t(rank)) + 1) * 0xd1b54a32d192ed03ull);
}
}  // namespace

float spreadValue(int rank, uint64_t index) {
  uint64_t h = keyOf(rank, index);
  // 24 random bits: exact in fp32, uniform in [-1, 1).
  float u = float(int32_t((h >> 40) & 0xffffff) - (1 << 23)) * (1.0f / float(1 << 23));
  // Magnitudes vary per element (2 bits) and per region of 2048 elements (2 bits), so that quantization
  // blocks see different absolute maxima and small values inside a block.
  int shift = int((h >> 8) & 3) + int(mix64(keyOf(rank, index >> 11)) & 3);
  return u * (1.0f / float(1 << shift));
}

float exactValue(int rank, uint64_t index) {
  uint64_t h = keyOf(rank, index);
  return float(int((h >> 40) & 15) - 8) * 0.125f;
}

bool isSupportedType(int type) {
  switch (type) {
    case zpInt8:
    case zpUint8:
    case zpInt32:
    case zpUint32:
    case zpInt64:
    case zpUint64:
    case zpFloat16:
    case zpFloat32:
    case zpFloat64:
    case zpBfloat16:
      return true;
    default:
      return false;
  }
}

uint16_t floatToHalf(float value) {
  uint32_t x;
  std::memcpy(&x, &value, 4);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000);
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) return uint16_t(sign | (x > 0x7f800000u ? 0x7e00 : 0x7c00));  // NaN, Inf
  if (x >= 0x477ff000u) return uint16_t(sign | 0x7c00);                               // >= 65520 rounds to Inf
  if (x < 0x38800000u) {               // below 2^-14: a half subnormal or zero
    if (x < 0x33000000u) return sign;  // <= 2^-25 rounds to zero (2^-25 ties to even)
    const uint32_t e = x >> 23;
    const uint32_t m = (x & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // value / 2^-24 = m * 2^(e - 126)
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (r & 1))) ++r;
    return uint16_t(sign | r);
  }
  const uint32_t rounded = x + 0xfffu + ((x >> 13) & 1);  // round to nearest even at bit 13
  return uint16_t(sign | ((rounded - 0x38000000u) >> 13));
}

float halfToFloat(uint16_t bits) {
  const uint32_t sign = uint32_t(bits & 0x8000) << 16;
  uint32_t e = (bits >> 10) & 0x1f, m = bits & 0x3ff, x;
  if (e == 0x1f) {
    x = sign | 0x7f800000u | (m << 13);
  } else if (e != 0) {
    x = sign | ((e + 112) << 23) | (m << 13);
  } else if (m == 0) {
    x = sign;
  } else {  // subnormal: m * 2^-24, exact in fp32
    float f = float(m) * (1.0f / 16777216.0f);
    std::memcpy(&x, &f, 4);
    x |= sign;
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

uint16_t floatToBf16(float value) {
  uint32_t x;
  std::memcpy(&x, &value, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t(((x >> 16) & 0x8000) | 0x7fc0);  // quiet NaN
  return uint16_t((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

float bf16ToFloat(uint16_t bits) {
  uint32_t x = uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

double loadAsDouble(zpDataType_t type, const void* base, size_t i) {
  switch (type) {
    case zpInt8:
      return static_cast<const int8_t*>(base)[i];
    case zpUint8:
      return static_cast<const uint8_t*>(base)[i];
    case zpInt32:
      return static_cast<const int32_t*>(base)[i];
    case zpUint32:
      return static_cast<const uint32_t*>(base)[i];
    case zpInt64:
      return double(static_cast<const int64_t*>(base)[i]);
    case zpUint64:
      return double(static_cast<const uint64_t*>(base)[i]);
    case zpFloat16:
      return halfToFloat(static_cast<const uint16_t*>(base)[i]);
    case zpFloat32:
      return static_cast<const float*>(base)[i];
    case zpFloat64:
      return static_cast<const double*>(base)[i];
    case zpBfloat16:
      return bf16ToFloat(static_cast<const uint16_t*>(base)[i]);
    default:
      return 0;
  }
}

void storeFromDouble(zpDataType_t type, double v, void* base, size_t i) {
  // Integers wrap modulo 2^bits, as NCCL's integer sums do.
  switch (type) {
    case zpInt8:
      static_cast<int8_t*>(base)[i] = int8_t(uint8_t(int64_t(v)));
      break;
    case zpUint8:
      static_cast<uint8_t*>(base)[i] = uint8_t(int64_t(v));
      break;
    case zpInt32:
      static_cast<int32_t*>(base)[i] = int32_t(uint32_t(int64_t(v)));
      break;
    case zpUint32:
      static_cast<uint32_t*>(base)[i] = uint32_t(int64_t(v));
      break;
    case zpInt64:
      static_cast<int64_t*>(base)[i] = int64_t(v);
      break;
    case zpUint64:
      static_cast<uint64_t*>(base)[i] = uint64_t(int64_t(v));
      break;
    case zpFloat16:
      static_cast<uint16_t*>(base)[i] = floatToHalf(float(v));
      break;
    case zpFloat32:
      static_cast<float*>(base)[i] = float(v);
      break;
    case zpFloat64:
      static_cast<double*>(base)[i] = v;
      break;
    case zpBfloat16:
      static_cast<uint16_t*>(base)[i] = floatToBf16(float(v));
      break;
    default:
      break;
  }
}

namespace {
void fillSerial(zpDataType_t type, Fill fill, int rank, uint64_t first, size_t count, void* dst);
}  // namespace

bool fillData(zpDataType_t type, Fill fill, int rank, uint64_t first, size_t count, void* dst) {
  if (!isSupportedType(type)) return false;
  const size_t ts = typeSize(type);
  parallelFor(count, size_t(1) << 20, [&](size_t begin, size_t end) {
    fillSerial(type, fill, rank, first + begin, end - begin, static_cast<char*>(dst) + begin * ts);
  });
  return true;
}

namespace {
void fillSerial(zpDataType_t type, Fill fill, int rank, uint64_t first, size_t count, void* dst) {
  const bool integer = !(type == zpFloat16 || type == zpFloat32 || type == zpFloat64 || type == zpBfloat16);
  for (size_t i = 0; i < count; ++i) {
    const uint64_t index = first + i;
    if (integer) {
      // Small integers in [-8, 8) ([0, 16) unsigned): sums stay exact (or wrap identically) in any order.
      const bool isUnsigned = type == zpUint8 || type == zpUint32 || type == zpUint64;
      storeFromDouble(type, double(exactValue(rank, index)) * 8.0 + (isUnsigned ? 8.0 : 0.0), dst, i);
      continue;
    }
    const float v = fill == Fill::kExact ? exactValue(rank, index) : spreadValue(rank, index);
    switch (type) {
      case zpFloat16:
        static_cast<uint16_t*>(dst)[i] = floatToHalf(v);
        break;
      case zpBfloat16:
        static_cast<uint16_t*>(dst)[i] = floatToBf16(v);
        break;
      case zpFloat32:
        static_cast<float*>(dst)[i] = v;
        break;
      default:
        static_cast<double*>(dst)[i] = v;
        break;
    }
  }
}
}  // namespace

// ---- sizes -------------------------------------------------------------------------------------------------

void countsAllGather(const SizeArgs& s, OpCounts* c) {
  const size_t ts = typeSize(s.type), n = size_t(s.nranks);
  const size_t per = s.bytes / (ts * n);
  *c = OpCounts();
  c->bytes = per * n * ts;
  c->count = per * n;
  c->paramCount = per;
  c->sendBytes = per * ts;
  c->recvBytes = per * n * ts;
  c->ipSendOffset = size_t(s.rank) * per * ts;
  c->ipRecvOffset = 0;
}

void countsReduceScatter(const SizeArgs& s, OpCounts* c) {
  const size_t ts = typeSize(s.type), n = size_t(s.nranks);
  const size_t per = s.bytes / (ts * n);
  *c = OpCounts();
  c->bytes = per * n * ts;
  c->count = per * n;
  c->paramCount = per;
  c->sendBytes = per * n * ts;
  c->recvBytes = per * ts;
  c->ipSendOffset = 0;
  c->ipRecvOffset = size_t(s.rank) * per * ts;
}

void countsAllToAll(const SizeArgs& s, OpCounts* c) {
  const size_t ts = typeSize(s.type), n = size_t(s.nranks);
  const size_t per = s.bytes / (ts * n);
  *c = OpCounts();
  c->bytes = per * n * ts;
  c->count = per * n;
  c->paramCount = per;
  c->sendBytes = per * n * ts;
  c->recvBytes = per * n * ts;
}

// ---- inputs and references ---------------------------------------------------------------------------------

void initStandard(const SizeArgs& s, const OpCounts& c, void* hostSend) {
  fillData(s.type, s.op->fill, s.rank, 0, c.sendBytes / typeSize(s.type), hostSend);
}

void expectedAllGather(const SizeArgs& s, const OpCounts& c, const void*, void* hostExpected) {
  const size_t ts = typeSize(s.type);
  for (int r = 0; r < s.nranks; ++r)
    fillData(s.type, s.op->fill, r, 0, c.paramCount, static_cast<char*>(hostExpected) + size_t(r) * c.paramCount * ts);
}

void expectedReduceScatter(const SizeArgs& s, const OpCounts& c, const void*, void* hostExpected) {
  // In pieces, so that the fp64 accumulator stays small whatever the size. Summing in fp64 is exact for
  // Fill::kExact data, so it matches any reduction order of NCCL's.
  const size_t ts = typeSize(s.type), chunk = size_t(1) << 18;
  const bool integer = !(s.type == zpFloat16 || s.type == zpFloat32 || s.type == zpFloat64 || s.type == zpBfloat16);
  parallelFor(c.paramCount, chunk, [&](size_t pieceBegin, size_t pieceEnd) {
    std::vector<double> acc;
    std::vector<char> slice(chunk * ts);
    for (size_t begin = pieceBegin; begin < pieceEnd; begin += chunk) {
      const size_t len = std::min(chunk, pieceEnd - begin);
      acc.assign(len, 0.0);
      for (int r = 0; r < s.nranks; ++r) {
        fillSerial(s.type, s.op->fill, r, uint64_t(s.rank) * c.paramCount + begin, len, slice.data());
        for (size_t i = 0; i < len; ++i) acc[i] += loadAsDouble(s.type, slice.data(), i);
      }
      for (size_t i = 0; i < len; ++i) {
        double v = acc[i];
        if (s.redOp == zpAvg) v = integer ? double(int64_t(v) / int64_t(s.nranks)) : v / s.nranks;
        storeFromDouble(s.type, v, hostExpected, begin + i);
      }
    }
  });
}

void expectedAllToAll(const SizeArgs& s, const OpCounts& c, const void*, void* hostExpected) {
  // Block p of this rank's output is block `rank` of peer p's input.
  const size_t ts = typeSize(s.type);
  for (int p = 0; p < s.nranks; ++p)
    fillData(s.type, s.op->fill, p, uint64_t(s.rank) * c.paramCount, c.paramCount,
             static_cast<char*>(hostExpected) + size_t(p) * c.paramCount * ts);
}

uint64_t compareBitwise(const SizeArgs& s, const OpCounts& c, const void* got, const void* expected) {
  const size_t ts = typeSize(s.type), bytes = c.recvBytes - c.recvBytes % ts;
  const char* a = static_cast<const char*>(got);
  const char* b = static_cast<const char*>(expected);
  uint64_t wrong = 0;
  // Whole pages first; per element only where a page differs.
  const size_t page = 4096 - 4096 % ts;
  for (size_t off = 0; off < bytes; off += page) {
    const size_t len = std::min(page, bytes - off);
    if (std::memcmp(a + off, b + off, len) == 0) continue;
    for (size_t e = 0; e < len; e += ts)
      if (std::memcmp(a + off + e, b + off + e, ts) != 0) ++wrong;
  }
  return wrong;
}

uint64_t comparePayload(const SizeArgs& s, const OpCounts& c, const void* got, const void* expected) {
  const size_t count = c.count;
  if (count == 0) return 0;
  const unsigned char* a = static_cast<const unsigned char*>(got);
  const unsigned char* b = static_cast<const unsigned char*>(expected);
  uint64_t wrong = 0;
  const size_t blocks = quantBlockCount(count, s.blockSize);
  for (size_t i = 0; i < blocks; ++i) wrong += std::memcmp(a + 4 * i, b + 4 * i, 4) != 0;
  const size_t codes = quantScaleBytes(count, s.blockSize);
  a += codes;
  b += codes;
  if (s.bits == 8) {
    for (size_t i = 0; i < count; ++i) wrong += a[i] != b[i];
  } else {
    for (size_t i = 0; i < count; ++i) {
      const int shift = (i & 1) ? 4 : 0;
      wrong += ((a[i / 2] >> shift) & 0xf) != ((b[i / 2] >> shift) & 0xf);
    }
  }
  return wrong;
}

// ---- bandwidth and wire bytes ------------------------------------------------------------------------------

double busFactorCollective(int nranks) { return nranks > 0 ? double(nranks - 1) / double(nranks) : 0.0; }

void bwCollective(const SizeArgs& s, const OpCounts& c, double seconds, double* algbw, double* busbw) {
  *algbw = seconds > 0 ? double(c.bytes) / 1e9 / seconds : 0.0;
  *busbw = *algbw * busFactorCollective(s.nranks);
}

void bwLocal(const SizeArgs&, const OpCounts& c, double seconds, double* algbw, double* busbw) {
  *algbw = seconds > 0 ? double(c.sendBytes + c.recvBytes) / 1e9 / seconds : 0.0;
  *busbw = *algbw;
}

WireBytes ringWire(double bytes, int nranks, int nodes) {
  WireBytes w;
  if (nranks <= 1) return w;
  const double n = nranks, perRank = (n - 1) / n * bytes;
  w.inter = nodes > 1 ? perRank * double(nodes) / n : 0.0;
  w.intra = perRank - w.inter;
  return w;
}

WireBytes directWire(double bytesPerPeer, int nranks, int nodes) {
  WireBytes w;
  if (nranks <= 1 || nodes < 1) return w;
  const int local = nranks / nodes;
  w.intra = bytesPerPeer * double(local - 1);
  w.inter = bytesPerPeer * double(nranks - local);
  return w;
}

bool zpTwoHops(const SizeArgs& s) {
  const std::vector<uint64_t> nodeKeys(s.nodeOf, s.nodeOf + s.nranks);
  Topology t;
  return buildTopology(nodeKeys, s.rank, 0, "zpTwoHops", &t) == zpSuccess && t.hierarchical();
}

WireBytes ringWireCollective(const SizeArgs& s, const OpCounts& c) {
  return ringWire(double(c.bytes), s.nranks, s.nodes);
}

// ---- NCCL baselines ----------------------------------------------------------------------------------------

NcclChannels zpNcclChannelsFor(const ZpNcclFacts& f) {
  NcclChannels c;
  c.netChannelsPerPeer = static_cast<int>(std::max<int64_t>(f.netChannelsPerPeer, 0));
  const int shm = shmChannelsFor({f.nodes, f.nranks, f.shmMinCtas, f.ncclMinCtas, f.p2pDisable, f.shmDisable, false});
  const int minCtas = f.ncclMinCtas > 0 ? static_cast<int>(f.ncclMinCtas) : shm;
  if (minCtas > 0) {
    c.minCtas = minCtas;
    c.maxCtas = std::max(minCtas, 32);
  }
  return c;
}

NcclChannels zpNcclChannels(int nodes, int nranks) {
  ZpNcclFacts f;
  f.nodes = nodes;
  f.nranks = nranks;
  f.netChannelsPerPeer = paramNetChannelsPerPeer();
  f.ncclMinCtas = paramNcclMinCtas();
  f.shmMinCtas = paramShmMinCtas();
  f.p2pDisable = std::getenv("NCCL_P2P_DISABLE");
  f.shmDisable = std::getenv("NCCL_SHM_DISABLE");
  return zpNcclChannelsFor(f);
}

ncclResult_t splitWithChannels(ncclComm_t comm, int rank, const NcclChannels& channels, ncclComm_t* out) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  if (channels.minCtas > 0) config.minCTAs = channels.minCtas;
  if (channels.maxCtas > 0) config.maxCTAs = channels.maxCtas;
  if (channels.netChannelsPerPeer > 0) config.nChannelsPerNetPeer = channels.netChannelsPerPeer;
  return ncclCommSplit(comm, 0, rank, out, &config);
}

bool runNcclAllGather(const RunArgs& a) {
  PERF_NCCL(a.nccl, ncclAllGather(a.send, a.recv, a.counts->paramCount, static_cast<ncclDataType_t>(a.size->type),
                                  a.nccl, a.stream));
  return true;
}

bool runNcclReduceScatter(const RunArgs& a) {
  PERF_NCCL(a.nccl, ncclReduceScatter(a.send, a.recv, a.counts->paramCount, static_cast<ncclDataType_t>(a.size->type),
                                      static_cast<ncclRedOp_t>(a.size->redOp), a.nccl, a.stream));
  return true;
}

bool runNcclAllToAll(const RunArgs& a) {
  const size_t chunk = a.counts->paramCount * typeSize(a.size->type);
  const ncclDataType_t type = static_cast<ncclDataType_t>(a.size->type);
  PERF_NCCL(a.nccl, ncclGroupStart());
  for (int p = 0; p < a.size->nranks; ++p) {
    PERF_NCCL(a.nccl, ncclSend(static_cast<const char*>(a.send) + size_t(p) * chunk, a.counts->paramCount, type, p,
                               a.nccl, a.stream));
    PERF_NCCL(a.nccl, ncclRecv(static_cast<char*>(a.recv) + size_t(p) * chunk, a.counts->paramCount, type, p, a.nccl,
                               a.stream));
  }
  PERF_NCCL(a.nccl, ncclGroupEnd());
  return true;
}

namespace {
// What every collective op shares: initStandard inputs, collective bandwidths, and who runs it.
PerfOp collectiveOp(const char* name, unsigned uses, CountsFn counts, RunFn run) {
  PerfOp op;
  op.name = name;
  op.uses = uses;
  op.counts = counts;
  op.init = initStandard;
  op.bw = bwCollective;
  op.run = run;
  return op;
}
}  // namespace

PerfOp ncclCollectiveOp(const char* name, CountsFn counts, ExpectedFn expected, RunFn run) {
  PerfOp op = collectiveOp(name, kUsesNccl, counts, run);
  op.runLabel = "nccl";
  op.expected = expected;
  return op;
}

PerfOp zpCollectiveOp(const char* name, CountsFn counts, RunFn run, RunFn baseline) {
  PerfOp op = collectiveOp(name, kUsesZp, counts, run);
  op.expectedFromHostBackend = true;
  op.baselineName = "nccl";
  op.baseline = baseline;
  op.baselineUses = kUsesNccl;
  op.ringWire = ringWireCollective;
  return op;
}

}  // namespace perf
}  // namespace zp
