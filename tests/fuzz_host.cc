// libFuzzer target over the host backend's argument checks and its planners (Meson's -Dfuzz=true builds it, with
// clang; tools/run-sanitizers.sh runs it under AddressSanitizer and UndefinedBehaviorSanitizer).
//
// The input is decoded into a sequence of operations:
//   - an ABI call with buffers (zpQuantize, zpDequantize, qwZ, hpZ, qgZ and their Ex forms, hpZ's quantized
//     mode included) on one of three
//     live 1-rank host communicators (different default bits and block sizes), with random types, ops, bits,
//     block sizes, options, stream, counts (small, around 2^31 and 2^32, around the overflow limit, raw 64-bit)
//     and buffers (NULL, or anywhere in two heap arenas: misaligned, overlapping, in place). An oracle written
//     here from the documented rules (include/zpccl.h, DESIGN.md) says whether the call is valid: a valid
//     call must succeed, an invalid one must fail with a message naming the call, and zpGetLastError(comm)
//     must be "" after a success. Buffers are real only where the call cannot reach past them: a count that
//     does not fit the arena from the pointer's offset gets a NULL pointer, unless the count overflows the
//     size limit (count > SIZE_MAX / 16), which the checks must refuse before touching memory;
//   - the calls without buffers (queries, zpCommReserve, zpCommGetAsyncError, zpHierSecondaryShard,
//     zpQuantPayloadSize against a 128-bit formula), and every comm-taking call with a NULL, destroyed, garbage
//     or forged handle, which must fail with zpInvalidArgument;
//   - zpCommInitRankConfig with random nranks, rank and config fields (only combinations that cannot wait for
//     absent peers), against an oracle of the config rules;
//   - the tunables' parser (host/base/params.h, readParamText) on random texts and ranges, against strtoll: text that
//   is
//     no integer is refused as such, an integer outside the range (beyond int64 too) as outside it, with the
//     default; an integer in range is taken, without a warning;
//   - the pure planners: buildTopology (host/topology.h) on random node-key vectors of 1..64 ranks and random
//     hpZ requests, for every rank, checking that every rank is in exactly one node, nodes are numbered by their
//     lowest rank, local ranks, hpZ groups (a partition into consecutive local ranks) and inter-node groups are
//     consistent; makeQgzPlan (host/qgz_plan.h), checking by simulating the two hops that every destination
//     receives its own slice from every source exactly once; makeChunkPlan (host/chunk_plan.h), checking that
//     chunks are whole blocks, cover [0, count) in order, and respect maxChunks.
// A violated invariant prints what and traps.
#include <stdint.h>
#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "host/base/params.h"
#include "host/chunk_plan.h"
#include "host/dtype.h"
#include "host/qgz_plan.h"
#include "host/quant_format.h"
#include "host/topology.h"
#include "include/zpccl.h"
#include "src/comm.h"

namespace {

#define FUZZ_CHECK(cond, ...)                                                                          \
  do {                                                                                                 \
    if (!(cond)) {                                                                                     \
      std::fprintf(stderr, "fuzz_host invariant violated (%s:%d): %s\n  ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                                               \
      std::fprintf(stderr, "\n");                                                                      \
      __builtin_trap();                                                                                \
    }                                                                                                  \
  } while (0)

// ---- input decoding ----------------------------------------------------------------------------------------

class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : p_(data), n_(size) {}
  bool empty() const { return n_ == 0; }
  uint8_t byte() {
    if (n_ == 0) return 0;
    --n_;
    return *p_++;
  }
  uint64_t u64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = (v << 8) | byte();
    return v;
  }
  uint32_t u32() { return static_cast<uint32_t>(u64() >> 32); }
  template <class T, size_t N>
  T pick(const T (&values)[N]) {
    return values[byte() % N];
  }

 private:
  const uint8_t* p_;
  size_t n_;
};

constexpr size_t kOverflowLimit = SIZE_MAX / 16;  // the largest count any call accepts

size_t readCount(Reader& in) {
  static const size_t kEdges[] = {0,
                                  1,
                                  2,
                                  (size_t{1} << 31) - 1,
                                  size_t{1} << 31,
                                  (size_t{1} << 31) + 1,
                                  (size_t{1} << 32) - 1,
                                  size_t{1} << 32,
                                  (size_t{1} << 32) + 1,
                                  (size_t{1} << 33) + 1,
                                  kOverflowLimit,
                                  kOverflowLimit + 1,
                                  SIZE_MAX / 8 + 1,
                                  SIZE_MAX / 4 + 1,
                                  SIZE_MAX / 2,
                                  SIZE_MAX / 2 + 1,
                                  SIZE_MAX - 1,
                                  SIZE_MAX};
  switch (in.byte() % 8) {
    case 0:
      return in.pick(kEdges);
    case 1:
      return in.u64();
    case 2:
      return 1 + in.byte();
    default:
      return (static_cast<size_t>(in.byte()) << 8 | in.byte()) % 4097;
  }
}

int readInt(Reader& in) {
  static const int kValues[] = {-1, 0,  1,  2,  3,   4,    5,    6,    7,     8,  9,       10,      11,          12, 16,
                                31, 32, 48, 64, 256, 4096, 8192, 8193, 16384, 99, INT_MAX, INT_MIN, INT_MIN + 1, -32};
  switch (in.byte() % 4) {
    case 0:
      return static_cast<int>(in.u32());
    case 1:
      return static_cast<int>(in.byte()) - 4;
    default:
      return in.pick(kValues);
  }
}

// ---- the live communicators --------------------------------------------------------------------------------

struct CommInfo {
  zpComm_t comm;
  int weightBits, gradBits, blockSize;
};

zpComm_t makeComm(int weightBits, int gradBits, int blockSize) {
  zpUniqueId id;
  FUZZ_CHECK(zpGetUniqueId(&id) == zpSuccess, "%s", zpGetLastError(nullptr));
  zpConfig_t config = ZP_CONFIG_INITIALIZER;
  config.backend = zpBackendHost;
  config.weightBits = weightBits;
  config.gradBits = gradBits;
  config.blockSize = blockSize;
  zpComm_t comm = nullptr;
  FUZZ_CHECK(zpCommInitRankConfig(&comm, 1, id, 0, &config) == zpSuccess, "%s", zpGetLastError(nullptr));
  return comm;
}

std::vector<CommInfo>& comms() {
  static std::vector<CommInfo> all = [] {
    std::vector<CommInfo> v;
    v.push_back({makeComm(8, 4, 256), 8, 4, 256});
    v.push_back({makeComm(4, 8, 32), 4, 8, 32});
    v.push_back({makeComm(8, 8, 8192), 8, 8, 8192});
    return v;
  }();
  return all;
}

// Two heap arenas: buffers are carved from them (ASan sees any access past their ends).
constexpr size_t kArenaBytes = 64 * 1024;
unsigned char* arena(int which) {
  static unsigned char* arenas[2] = {static_cast<unsigned char*>(malloc(kArenaBytes)),
                                     static_cast<unsigned char*>(malloc(kArenaBytes))};
  return arenas[which];
}

bool mentions(const char* message, const char* what) { return message && std::strstr(message, what) != nullptr; }

// ---- calls with buffers ------------------------------------------------------------------------------------

enum Kind { kQuantize, kDequantize, kQwz, kQwzEx, kHpz, kHpzEx, kQgz, kQgzEx, kNumKinds };
const char* const kNames[] = {
    "zpQuantize",      "zpDequantize",    "zpQuantAllGather",        "zpQuantAllGather",
    "zpHierAllGather", "zpHierAllGather", "zpQuantReduceScatterA2A", "zpQuantReduceScatterA2A"};

struct BufferCall {
  Kind kind;
  const CommInfo* ci;
  const void* send;
  void* recv;
  size_t count;
  int type, op, bits, blockSize;
  bool withOptions;
  zpQuantOptions_t options;
  bool stream;
};

zpResult_t invoke(const BufferCall& c, zpComm_t comm) {
  // Enums cast in the call: an enum variable holding an out-of-range value would be undefined behaviour here.
#define ZP_TYPE static_cast<zpDataType_t>(c.type)
#define ZP_OP static_cast<zpRedOp_t>(c.op)
  const zpQuantOptions_t* options = c.withOptions ? &c.options : nullptr;
  cudaStream_t stream = c.stream ? reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(0x40)) : nullptr;
  switch (c.kind) {
    case kQuantize:
      return zpQuantize(c.send, c.recv, c.count, ZP_TYPE, c.bits, c.blockSize, comm, stream);
    case kDequantize:
      return zpDequantize(c.send, c.recv, c.count, ZP_TYPE, c.bits, c.blockSize, comm, stream);
    case kQwz:
      return zpQuantAllGather(c.send, c.recv, c.count, ZP_TYPE, comm, stream);
    case kQwzEx:
      return zpQuantAllGatherEx(c.send, c.recv, c.count, ZP_TYPE, options, comm, stream);
    case kHpz:
      return zpHierAllGather(c.send, c.recv, c.count, ZP_TYPE, comm, stream);
    case kHpzEx:
      return zpHierAllGatherEx(c.send, c.recv, c.count, ZP_TYPE, options, comm, stream);
    case kQgz:
      return zpQuantReduceScatterA2A(c.send, c.recv, c.count, ZP_TYPE, ZP_OP, comm, stream);
    default:
      return zpQuantReduceScatterA2AEx(c.send, c.recv, c.count, ZP_TYPE, ZP_OP, options, comm, stream);
  }
#undef ZP_TYPE
#undef ZP_OP
}

bool validBits(int bits) { return bits == ZP_BITS_INT4 || bits == ZP_BITS_INT8; }
bool validBlock(int block) {
  return block >= ZP_MIN_BLOCK_SIZE && block <= ZP_MAX_BLOCK_SIZE && (block & (block - 1)) == 0;
}

// The documented rules, on a 1-rank communicator: NCCL's in-place layout is send == recv for the collectives.
bool oracleValid(const BufferCall& c) {
  // hpZ is exact unless its Ex form's options ask for bits.
  const bool quantized = c.kind != kHpz && (c.kind != kHpzEx || (c.withOptions && c.options.bits != 0));
  const bool standalone = c.kind == kQuantize || c.kind == kDequantize;
  const bool qgz = c.kind == kQgz || c.kind == kQgzEx;
  if (c.type < 0 || c.type >= zpNumTypes) return false;
  if (quantized && c.type != zpFloat16 && c.type != zpBfloat16 && c.type != zpFloat32) return false;
  if (qgz && c.op != zpSum && c.op != zpAvg) return false;
  int bits = c.bits, block = c.blockSize;
  if (!standalone) {
    bits = qgz ? c.ci->gradBits : c.ci->weightBits;
    block = c.ci->blockSize;
    const bool ex = c.kind == kQwzEx || c.kind == kHpzEx || c.kind == kQgzEx;
    if (ex && c.withOptions && c.options.bits != 0) bits = c.options.bits;
    if (ex && c.withOptions && c.options.blockSize != 0) block = c.options.blockSize;
  }
  if (quantized && (!validBits(bits) || !validBlock(block))) return false;
  // A bad options->blockSize is refused even in hpZ's exact mode, which would not use it.
  if (!quantized && c.kind == kHpzEx && c.withOptions && c.options.blockSize != 0 && !validBlock(c.options.blockSize)) {
    return false;
  }
  if (c.stream) return false;
  if (c.count > kOverflowLimit) return false;
  if (c.count == 0) return true;
  if (c.send == nullptr || c.recv == nullptr) return false;
  const size_t es = zp::typeSize(c.type);
  const size_t payload = quantized ? zp::quantPayloadBytes(c.count, bits, block) : 0;
  const size_t sendBytes = c.kind == kDequantize ? payload : c.count * es;
  const size_t recvBytes = c.kind == kQuantize ? payload : c.count * es;
  const size_t sendAlign = c.kind == kDequantize ? 16 : es, recvAlign = c.kind == kQuantize ? 16 : es;
  if (reinterpret_cast<uintptr_t>(c.send) % sendAlign != 0 || reinterpret_cast<uintptr_t>(c.recv) % recvAlign != 0) {
    return false;
  }
  const uintptr_t s = reinterpret_cast<uintptr_t>(c.send), r = reinterpret_cast<uintptr_t>(c.recv);
  const bool overlap = s < r + recvBytes && r < s + sendBytes;
  if (overlap && (standalone || s != r)) return false;
  return true;
}

// The most bytes any side of any call of `count` elements can touch: 8-byte elements, or a payload of 8-bit
// codes in 32-element blocks.
size_t maxBytes(size_t count) { return count * 8 + count / 8 + 64; }

void* pointer(Reader& in, size_t count) {
  const uint8_t how = in.byte();
  if (how % 8 == 0) return nullptr;
  const int which = (how >> 3) & 1;
  size_t offset = (static_cast<size_t>(in.byte()) << 6) | (in.byte() % 64);  // < 16 KB, any alignment
  if (how & 0x10) offset &= ~size_t{15};                                     // often 16-byte aligned
  // A count past the size limit is refused before any buffer is touched; any other count must fit.
  if (count <= kOverflowLimit && offset + maxBytes(count) > kArenaBytes) return nullptr;
  return arena(which) + offset;
}

void fuzzBufferCall(Reader& in) {
  BufferCall c{};
  c.kind = static_cast<Kind>(in.byte() % kNumKinds);
  c.ci = &comms()[in.byte() % comms().size()];
  c.count = readCount(in);
  static const int kTypes[] = {zpFloat16, zpBfloat16, zpFloat32, zpFloat32, zpInt8, zpFloat64, zpFloat8e5m2};
  c.type = in.byte() % 4 == 0 ? readInt(in) : in.pick(kTypes);
  c.op = in.byte() % 4 == 0 ? readInt(in) : (in.byte() % 2 ? zpSum : zpAvg);
  static const int kBits[] = {4, 8, 4, 8, 0, 3, 16};
  static const int kBlocks[] = {32, 64, 256, 1024, 8192, 0, 16, 48, 16384};
  c.bits = in.byte() % 4 == 0 ? readInt(in) : in.pick(kBits);
  c.blockSize = in.byte() % 4 == 0 ? readInt(in) : in.pick(kBlocks);
  c.withOptions = in.byte() % 2;
  c.options.bits = in.byte() % 4 == 0 ? readInt(in) : in.pick(kBits);
  c.options.blockSize = in.byte() % 4 == 0 ? readInt(in) : in.pick(kBlocks);
  c.stream = in.byte() % 16 == 0;
  c.send = pointer(in, c.count);
  if (in.byte() % 4 == 0) {
    // In place, or near it: the receive side at a small distance from the send side.
    const ptrdiff_t delta = static_cast<int8_t>(in.byte()) * (in.byte() % 2 ? 1 : 16);
    c.recv =
        c.send == nullptr ? nullptr : const_cast<unsigned char*>(static_cast<const unsigned char*>(c.send)) + delta;
    const unsigned char* lo = arena(0);
    const unsigned char* p = static_cast<unsigned char*>(c.recv);
    const bool inArena0 = p >= lo && p < lo + kArenaBytes, inArena1 = p >= arena(1) && p < arena(1) + kArenaBytes;
    const unsigned char* base = inArena0 ? lo : arena(1);
    if (p != nullptr &&
        (!(inArena0 || inArena1) ||
         (c.count <= kOverflowLimit && static_cast<size_t>(p - base) + maxBytes(c.count) > kArenaBytes))) {
      c.recv = nullptr;
    }
  } else {
    c.recv = pointer(in, c.count);
  }

  const bool valid = oracleValid(c);
  zpComm_t comm = c.ci->comm;
  const zpResult_t res = invoke(c, comm);
  const char* message = zpGetLastError(comm);
  FUZZ_CHECK(valid == (res == zpSuccess),
             "%s count %zu type %d op %d bits %d block %d options %d{%d,%d} stream %d send %p recv %p (comm bits "
             "%d/%d block %d): oracle says %s, returned %d '%s'",
             kNames[c.kind], c.count, c.type, c.op, c.bits, c.blockSize, c.withOptions, c.options.bits,
             c.options.blockSize, c.stream, c.send, c.recv, c.ci->weightBits, c.ci->gradBits, c.ci->blockSize,
             valid ? "valid" : "invalid", res, message);
  if (res == zpSuccess) {
    FUZZ_CHECK(message[0] == '\0', "success left the last error '%s'", message);
  } else {
    FUZZ_CHECK(res == zpInvalidArgument || res == zpInvalidUsage, "%s returned %d '%s'", kNames[c.kind], res, message);
    FUZZ_CHECK(mentions(message, kNames[c.kind]), "message '%s' does not name %s", message, kNames[c.kind]);
  }
}

// ---- calls without buffers, bad handles ------------------------------------------------------------------

void fuzzPayloadSize(Reader& in) {
  const size_t count = readCount(in);
  const int bits = in.byte() % 2 ? readInt(in) : (in.byte() % 2 ? 4 : 8);
  const int block = in.byte() % 2 ? readInt(in) : 32 << (in.byte() % 9);
  const bool nullOut = in.byte() % 16 == 0;
  size_t bytes = 0x5a5a;
  const zpResult_t res = zpQuantPayloadSize(count, bits, block, nullOut ? nullptr : &bytes);
  const bool valid = !nullOut && validBits(bits) && validBlock(block) && count <= kOverflowLimit;
  FUZZ_CHECK(valid == (res == zpSuccess), "zpQuantPayloadSize(%zu, %d, %d): %d '%s'", count, bits, block, res,
             zpGetLastError(nullptr));
  if (!valid) {
    FUZZ_CHECK(mentions(zpGetLastError(nullptr), "zpQuantPayloadSize"), "'%s'", zpGetLastError(nullptr));
    return;
  }
  const unsigned __int128 n = count;
  auto up16 = [](unsigned __int128 v) { return (v + 15) / 16 * 16; };
  const unsigned __int128 expected = count == 0 ? 0 : up16((n + block - 1) / block * 4) + up16((n * bits + 7) / 8);
  FUZZ_CHECK(static_cast<unsigned __int128>(bytes) == expected, "zpQuantPayloadSize(%zu, %d, %d) = %zu", count, bits,
             block, bytes);
}

void fuzzLiveCommCall(Reader& in) {
  const CommInfo& ci = comms()[in.byte() % comms().size()];
  zpComm_t comm = ci.comm;
  const bool nullOut = in.byte() % 4 == 0;
  int value = -7;
  zpResult_t res;
  const char* name;
  // The int-valued queries share one signature.
  struct IntQuery {
    const char* name;
    zpResult_t (*fn)(const zpComm_t, int*);
  };
  static const IntQuery kIntQueries[] = {
      {"zpCommCount", zpCommCount},         {"zpCommUserRank", zpCommUserRank}, {"zpCommCuDevice", zpCommCuDevice},
      {"zpCommNodeCount", zpCommNodeCount}, {"zpCommNodeRank", zpCommNodeRank}, {"zpCommLocalRank", zpCommLocalRank},
      {"zpCommLocalSize", zpCommLocalSize}, {"zpCommHpzRank", zpCommHpzRank},   {"zpCommHpzSize", zpCommHpzSize}};
  const int pick = in.byte() % 15;
  switch (pick) {
    case 0:
    case 1:
    case 2:
    case 3:
    case 4:
    case 5:
    case 6:
    case 7:
    case 8:
      name = kIntQueries[pick].name;
      res = kIntQueries[pick].fn(comm, nullOut ? nullptr : &value);
      break;
    case 9: {
      name = "zpCommBackend";
      zpBackend_t backend;
      res = zpCommBackend(comm, nullOut ? nullptr : &backend);
      if (res == zpSuccess) FUZZ_CHECK(backend == zpBackendHost, "backend %d", backend);
      break;
    }
    case 10: {
      name = "zpCommGetAsyncError";
      zpResult_t async = zpInternalError;
      res = zpCommGetAsyncError(comm, nullOut ? nullptr : &async);
      if (res == zpSuccess) FUZZ_CHECK(async == zpSuccess, "async error %d", async);
      break;
    }
    case 11: {
      name = "zpCommReserve";
      res = zpCommReserve(comm, readCount(in));
      FUZZ_CHECK(res == zpSuccess, "zpCommReserve on the host backend: %d '%s'", res, zpGetLastError(comm));
      return;
    }
    case 12:
    case 13: {
      name = "zpHierSecondaryShard";
      const size_t full = readCount(in);
      size_t offset = 1, count = 1;
      const bool nullOffset = nullOut && in.byte() % 2, nullCount = nullOut && !nullOffset;
      res = zpHierSecondaryShard(full, nullOffset ? nullptr : &offset, nullCount ? nullptr : &count, comm);
      if (res == zpSuccess)
        FUZZ_CHECK(offset == 0 && count == full, "1 rank: shard [%zu, +%zu) of %zu", offset, count, full);
      break;
    }
    default: {
      // zpGetLastError on handles that are not live: a message, never a crash.
      alignas(64) unsigned char garbage[256];
      std::memset(garbage, in.byte(), sizeof(garbage));
      FUZZ_CHECK(mentions(zpGetLastError(reinterpret_cast<zpComm_t>(garbage)), "not a live communicator"), "garbage");
      return;
    }
  }
  FUZZ_CHECK((res == zpSuccess) == !nullOut, "%s with %s output: %d '%s'", name, nullOut ? "a NULL" : "an", res,
             zpGetLastError(comm));
  if (res != zpSuccess) FUZZ_CHECK(mentions(zpGetLastError(comm), name), "'%s'", zpGetLastError(comm));
  if (res == zpSuccess) FUZZ_CHECK(zpGetLastError(comm)[0] == '\0', "'%s'", zpGetLastError(comm));
}

zpComm_t destroyedComm() {
  zpComm_t comm = makeComm(8, 4, 256);
  FUZZ_CHECK(zpCommDestroy(comm) == zpSuccess, "%s", zpGetLastError(nullptr));
  return comm;
}

void fuzzBadHandle(Reader& in) {
  alignas(64) unsigned char garbage[1024];
  std::memset(garbage, in.byte(), sizeof(garbage));
  zpComm_t comm = nullptr;
  zpComm_t successor = nullptr;  // created after `comm` was destroyed, likely in its memory: must stay untouched
  switch (in.byte() % 4) {
    case 0:
      break;
    case 1:
      comm = destroyedComm();
      successor = makeComm(8, 4, 256);
      break;
    case 2:
      comm = reinterpret_cast<zpComm_t>(garbage + (in.byte() % 64));
      break;
    default:  // forged: shaped like a live handle (comms()'s first), far ahead in the series, never handed out
      comm = reinterpret_cast<zpComm_t>(reinterpret_cast<uintptr_t>(comms()[0].comm) + (uintptr_t{1} << 40));
      break;
  }
  unsigned char* a = arena(0);
  int value;
  size_t offset, count;
  zpResult_t async;
  zpResult_t res;
  switch (in.byte() % 13) {
    case 0:
      res = zpCommDestroy(comm);
      break;
    case 1:
      res = zpCommAbort(comm);
      break;
    case 2:
      res = zpCommGetAsyncError(comm, &async);
      break;
    case 3:
      res = zpCommReserve(comm, readCount(in));
      break;
    case 4:
      res = zpCommCount(comm, &value);
      break;
    case 5:
      res = zpCommHpzRank(comm, &value);
      break;
    case 6:
      res = zpHierSecondaryShard(readCount(in), &offset, &count, comm);
      break;
    case 7:
      res = zpQuantize(a, a + 4096, 64, zpFloat32, 8, 32, comm, nullptr);
      break;
    case 8:
      res = zpDequantize(a, a + 4096, 64, zpFloat32, 8, 32, comm, nullptr);
      break;
    case 9:
      res = zpQuantAllGather(a, a + 4096, 64, zpFloat32, comm, nullptr);
      break;
    case 10:
      res = zpHierAllGather(a, a + 4096, 64, zpFloat32, comm, nullptr);
      break;
    case 11: {
      const zpQuantOptions_t options = {8, 0};
      res = zpHierAllGatherEx(a, a + 4096, 64, zpFloat32, &options, comm, nullptr);
      break;
    }
    default:
      res = zpQuantReduceScatterA2A(a, a + 4096, 64, zpFloat32, zpSum, comm, nullptr);
      break;
  }
  FUZZ_CHECK(res == zpInvalidArgument, "a bad handle returned %d '%s'", res, zpGetLastError(nullptr));
  FUZZ_CHECK(mentions(zpGetLastError(nullptr), "comm"), "'%s'", zpGetLastError(nullptr));
  if (successor != nullptr) {
    FUZZ_CHECK(zpCommDestroy(successor) == zpSuccess, "the destroyed handle's successor: '%s'",
               zpGetLastError(nullptr));
  }
}

// ---- init --------------------------------------------------------------------------------------------------

void fuzzInit(Reader& in) {
  static const int kRanks[] = {1, 1, 1, 0, -1, 2, 4, INT_MAX, INT_MIN};
  const int nranks = in.pick(kRanks);
  int rank = in.byte() % 4 == 0 ? readInt(in) : 0;
  // A valid nranks > 1 with a valid rank would wait for the absent peers: make the rank invalid instead.
  if (nranks > 1 && rank >= 0 && rank < nranks) rank = nranks;
  zpConfig_t config = ZP_CONFIG_INITIALIZER;
  const bool withConfig = in.byte() % 8 != 0;
  auto field = [&](int* f, const int* typical, size_t n) {
    const uint8_t how = in.byte() % 4;
    if (how == 0) return;  // default
    *f = how == 1 ? readInt(in) : typical[in.byte() % n];
  };
  static const int kBackend[] = {zpBackendHost, zpBackendDefault, -1, 3};
  static const int kRpn[] = {1, 2, 0, -1};
  static const int kNodeId[] = {0, 5, -1, INT_MAX};
  static const int kHpz[] = {1, 2, 0, -1};
  static const int kBits[] = {4, 8, 0, 3};
  static const int kBlock[] = {32, 8192, 256, 48, 0};
  static const int kBlocking[] = {1, 0, 2};
  if (withConfig) {
    if (in.byte() % 16 == 0) config.magic = in.u32();
    if (in.byte() % 16 == 0) config.size = readCount(in);
    field(&config.backend, kBackend, 4);
    if (config.backend == zpBackendCuda) config.backend = zpBackendHost;  // no NCCL bring-up in the fuzzer
    field(&config.ranksPerNode, kRpn, 4);
    field(&config.nodeId, kNodeId, 4);
    field(&config.hpzSize, kHpz, 4);
    field(&config.weightBits, kBits, 4);
    field(&config.gradBits, kBits, 4);
    field(&config.blockSize, kBlock, 5);
    field(&config.blocking, kBlocking, 3);
  }
  // The documented rules (ZP_BACKEND=host makes the default backend host).
  auto set = [](int v) { return v != ZP_CONFIG_UNDEF_INT; };
  const zpConfig_t& c = config;
  bool valid = nranks > 0 && rank >= 0 && rank < nranks;
  if (withConfig) {
    valid = valid && c.magic == ZP_CONFIG_MAGIC && c.size == sizeof(zpConfig_t);
    valid = valid && (!set(c.backend) || c.backend == zpBackendDefault || c.backend == zpBackendHost);
    valid = valid && (!set(c.ranksPerNode) || (c.ranksPerNode > 0 && nranks % c.ranksPerNode == 0));
    valid = valid && (!set(c.nodeId) || (c.nodeId >= 0 && !set(c.ranksPerNode)));
    // hpzSize must divide the node: with one rank, only 1 does.
    valid = valid && (!set(c.hpzSize) || c.hpzSize == 1);
    valid = valid && (!set(c.weightBits) || validBits(c.weightBits)) && (!set(c.gradBits) || validBits(c.gradBits));
    valid = valid && (!set(c.blockSize) || validBlock(c.blockSize)) && (!set(c.blocking) || c.blocking == 1);
  }
  zpUniqueId id;
  FUZZ_CHECK(zpGetUniqueId(&id) == zpSuccess, "%s", zpGetLastError(nullptr));
  zpComm_t comm = reinterpret_cast<zpComm_t>(static_cast<uintptr_t>(0x1));
  const zpResult_t res = zpCommInitRankConfig(&comm, nranks, id, rank, withConfig ? &config : nullptr);
  FUZZ_CHECK(valid == (res == zpSuccess),
             "init nranks %d rank %d config %d {magic %x size %zu backend %d rpn %d node %d hpz %d bits %d/%d block %d "
             "blocking %d}: %d '%s'",
             nranks, rank, withConfig, c.magic, c.size, c.backend, c.ranksPerNode, c.nodeId, c.hpzSize, c.weightBits,
             c.gradBits, c.blockSize, c.blocking, res, zpGetLastError(nullptr));
  if (res == zpSuccess) {
    FUZZ_CHECK(zpCommDestroy(comm) == zpSuccess, "%s", zpGetLastError(nullptr));
  } else {
    FUZZ_CHECK(res == zpInvalidArgument || res == zpInvalidUsage, "init returned %d", res);
    FUZZ_CHECK(mentions(zpGetLastError(nullptr), "zpCommInitRankConfig"), "'%s'", zpGetLastError(nullptr));
  }
}

// ---- tunables ----------------------------------------------------------------------------------------------

void fuzzParamText(Reader& in) {
  static const char kChars[] = "0123456789-+x xXaf9.eM\t";
  std::string text;
  const int length = in.byte() % 24;
  for (int i = 0; i < length; ++i) text += in.byte() % 4 == 0 ? static_cast<char>(in.byte()) : kChars[in.byte() % 24];
  text = text.c_str();  // up to a NUL, as getenv gives it
  static const int64_t kBounds[] = {0, 1, -1, 2, 16, 1024, INT64_MAX, INT64_MIN + 1};
  int64_t lo = in.pick(kBounds), hi = in.pick(kBounds);
  if (lo > hi) std::swap(lo, hi);
  const int64_t def = lo;
  const zp::ParamReading r = zp::readParamText("ZP_FUZZ", text.c_str(), def, lo, hi);
  char* end = nullptr;
  errno = 0;
  const long long parsed = std::strtoll(text.c_str(), &end, 0);
  const bool integer = !text.empty() && end != text.c_str() && *end == '\0';
  const bool inRange = integer && errno != ERANGE && parsed >= lo && parsed <= hi;
  if (text.empty()) {
    FUZZ_CHECK(r.value == def && r.warning.empty(), "'' gave %lld '%s'", static_cast<long long>(r.value),
               r.warning.c_str());
  } else if (inRange) {
    FUZZ_CHECK(r.value == parsed && r.warning.empty(), "'%s' gave %lld '%s'", text.c_str(),
               static_cast<long long>(r.value), r.warning.c_str());
  } else {
    FUZZ_CHECK(r.value == def, "'%s' gave %lld, not the default", text.c_str(), static_cast<long long>(r.value));
    const char* why = integer ? "is outside [" : "is not an integer";
    FUZZ_CHECK(r.warning.find(why) != std::string::npos && r.warning.find("ZP_FUZZ") == 0, "'%s': '%s'", text.c_str(),
               r.warning.c_str());
  }
}

// ---- planners ----------------------------------------------------------------------------------------------

void checkTopology(const std::vector<uint64_t>& keys, int hpzRequest) {
  const int n = static_cast<int>(keys.size());
  const std::set<uint64_t> distinct(keys.begin(), keys.end());
  std::vector<zp::Topology> topo(n);
  for (int r = 0; r < n; ++r) {
    const zpResult_t res = zp::buildTopology(keys, r, hpzRequest, "fuzz", &topo[r]);
    // Expected outcome: hpzRequest < 0, or > 0 without dividing every node, is refused.
    bool divides = true;
    for (uint64_t k : distinct) {
      const int size = static_cast<int>(std::count(keys.begin(), keys.end(), k));
      divides = divides && (hpzRequest <= 0 || size % hpzRequest == 0);
    }
    const bool valid = hpzRequest >= 0 && divides;
    FUZZ_CHECK(valid == (res == zpSuccess), "buildTopology of %d ranks, hpz %d: %d", n, hpzRequest, res);
    if (!valid) return;
  }
  int groups = 0;
  for (int r = 0; r < n; ++r) {
    const zp::Topology& t = topo[r];
    FUZZ_CHECK(t.nranks == n && t.rank == r, "rank %d", r);
    FUZZ_CHECK(t.nodes == static_cast<int>(distinct.size()) && static_cast<int>(t.nodeRanks.size()) == t.nodes,
               "%d nodes for %zu keys", t.nodes, distinct.size());
    // Every rank in exactly one node, at its local rank; nodes share a key; nodes numbered by their lowest rank.
    std::vector<int> seen(n, 0);
    for (int a = 0; a < t.nodes; ++a) {
      FUZZ_CHECK(!t.nodeRanks[a].empty(), "empty node %d", a);
      if (a > 0) FUZZ_CHECK(t.nodeRanks[a - 1][0] < t.nodeRanks[a][0], "node %d numbered out of order", a);
      for (size_t l = 0; l < t.nodeRanks[a].size(); ++l) {
        const int x = t.nodeRanks[a][l];
        FUZZ_CHECK(x >= 0 && x < n && ++seen[x] == 1, "rank %d seen twice", x);
        if (l > 0) FUZZ_CHECK(t.nodeRanks[a][l - 1] < x, "node %d not ascending", a);
        FUZZ_CHECK(t.nodeOfRank[x] == a && t.localRankOf[x] == static_cast<int>(l), "rank %d placement", x);
        FUZZ_CHECK(keys[x] == keys[t.nodeRanks[a][0]], "node %d mixes keys", a);
      }
      if (a > 0) FUZZ_CHECK(keys[t.nodeRanks[a][0]] != keys[t.nodeRanks[0][0]], "two nodes share a key");
    }
    for (int x = 0; x < n; ++x) FUZZ_CHECK(seen[x] == 1, "rank %d in %d nodes", x, seen[x]);
    FUZZ_CHECK(t.node == t.nodeOfRank[r] && t.localRank == t.localRankOf[r], "own placement of %d", r);
    FUZZ_CHECK(t.localSize == static_cast<int>(t.nodeRanks[t.node].size()), "localSize");
    bool even = true;
    for (const auto& ranks : t.nodeRanks) even = even && ranks.size() == t.nodeRanks[0].size();
    FUZZ_CHECK(t.even == even && t.hpzUsable == even, "even %d", even);
    FUZZ_CHECK(t.hierarchical() == (even && t.nodes > 1 && t.localSize > 1), "hierarchical");
    // hpZ: consecutive local ranks of the node, this rank at hpzRank.
    FUZZ_CHECK(t.hpzSize == (hpzRequest > 0 ? hpzRequest : t.localSize), "hpzSize %d", t.hpzSize);
    FUZZ_CHECK(t.hpzRank == t.localRank % t.hpzSize && static_cast<int>(t.hpzRanks.size()) == t.hpzSize, "hpz group");
    for (int i = 0; i < t.hpzSize; ++i) {
      FUZZ_CHECK(t.hpzRanks[i] == t.nodeRanks[t.node][t.localRank - t.hpzRank + i], "hpz member %d", i);
    }
    // Inter-node groups: one rank of this local rank per node (even layouts only).
    if (even) {
      FUZZ_CHECK(static_cast<int>(t.interRanks.size()) == t.nodes, "interRanks");
      for (int a = 0; a < t.nodes; ++a) {
        FUZZ_CHECK(t.nodeOfRank[t.interRanks[a]] == a && t.localRankOf[t.interRanks[a]] == t.localRank, "inter %d", a);
      }
    } else {
      FUZZ_CHECK(t.interRanks.empty(), "interRanks on an uneven layout");
    }
    (void)t.describe();
    groups = std::max(groups, t.hpzGroup + 1);
  }
  // hpZ groups partition the ranks: same group id <=> same members (and distinct members <=> distinct ids)
  // wherever the group size is the same on every node: even layouts, or an explicit hpzSize. (On an uneven
  // layout with the default hpzSize, each node's group is the whole node and hpzGroup, unused there, is not a
  // global index: known and reported.)
  if (topo[0].even || hpzRequest > 0) {
    int expectedGroups = 0;
    for (const auto& ranks : topo[0].nodeRanks) expectedGroups += static_cast<int>(ranks.size()) / topo[0].hpzSize;
    FUZZ_CHECK(groups == expectedGroups, "%d hpz groups, expected %d", groups, expectedGroups);
    for (int r = 0; r < n; ++r) {
      for (int x = 0; x < n; ++x) {
        const bool sameMembers = topo[x].hpzRanks == topo[r].hpzRanks;
        FUZZ_CHECK((topo[x].hpzGroup == topo[r].hpzGroup) == sameMembers, "hpz groups of ranks %d and %d", r, x);
        if (sameMembers)
          FUZZ_CHECK(std::count(topo[r].hpzRanks.begin(), topo[r].hpzRanks.end(), x) == 1, "hpz members");
      }
    }
  }

  // qgZ: simulate the plan's data flow; every destination must get its own slice from every source once.
  for (int r = 0; r < n; ++r) {
    const zp::QgzPlan p = zp::makeQgzPlan(topo[r]);
    const zp::Topology& t = topo[r];
    FUZZ_CHECK(p.nranks == n && static_cast<int>(p.sliceOfSlot.size()) == n, "plan size");
    FUZZ_CHECK(p.twoHop == t.hierarchical(), "twoHop");
    std::vector<int> slices(p.sliceOfSlot);
    std::sort(slices.begin(), slices.end());
    for (int i = 0; i < n; ++i) FUZZ_CHECK(slices[i] == i, "sliceOfSlot is not a permutation");
  }
  const zp::QgzPlan p = zp::makeQgzPlan(topo[0]);
  // got[d][s]: how many times destination d receives source s's slice meant for d (a wrong slice counts -n).
  std::vector<std::vector<int>> got(n, std::vector<int>(n, 0));
  if (!p.twoHop) {
    FUZZ_CHECK(p.nodes == 1 && p.localSize == n, "one hop shape");
    for (int d = 0; d < n; ++d)
      for (int s = 0; s < n; ++s) got[d][s] += p.sliceOfSlot[d] == d ? 1 : -n;
  } else {
    const int N = p.nodes, L = p.localSize;
    FUZZ_CHECK(N * L == n && N == topo[0].nodes && L == topo[0].localSize, "two hop shape");
    const auto& nodeRanks = topo[0].nodeRanks;
    // Hop 1: on node a, local rank m receives from each local peer l the N slots m*N + b; its partial b holds
    // those slices. Hop 2: rank (b, m) receives partial b from local rank m of every node a.
    for (int b = 0; b < N; ++b) {
      for (int m = 0; m < L; ++m) {
        const int d = nodeRanks[b][m];
        for (int a = 0; a < N; ++a) {
          for (int l = 0; l < L; ++l) {
            const int s = nodeRanks[a][l];
            got[d][s] += p.sliceOfSlot[m * N + b] == d ? 1 : -n;
          }
        }
      }
    }
  }
  for (int d = 0; d < n; ++d)
    for (int s = 0; s < n; ++s) FUZZ_CHECK(got[d][s] == 1, "destination %d gets source %d %d times", d, s, got[d][s]);
}

void fuzzTopology(Reader& in) {
  const int n = 1 + in.byte() % 64;
  const int distinct = 1 + in.byte() % n;
  std::vector<uint64_t> labels(distinct);
  for (auto& l : labels) l = in.byte() % 2 ? in.u64() : in.byte();
  std::vector<uint64_t> keys(n);
  const uint8_t mode = in.byte() % 3;
  for (int r = 0; r < n; ++r) {
    // Random, node-major blocks, or interleaved.
    const int which = mode == 0 ? in.byte() % distinct : mode == 1 ? r * distinct / n : r % distinct;
    keys[r] = labels[which];
  }
  static const int kHpz[] = {0, 0, 1, 2, 3, 4, 8, -1, -3, INT_MIN};
  const int hpz = in.byte() % 4 == 0 ? in.byte() % 70 : in.pick(kHpz);
  checkTopology(keys, hpz);
  // A rank out of range is an internal error, never a crash.
  zp::Topology t;
  const int bad = in.byte() % 2 ? n : -1;
  FUZZ_CHECK(zp::buildTopology(keys, bad, 0, "fuzz", &t) == zpInternalError, "rank %d of %d", bad, n);
}

void fuzzChunkPlan(Reader& in) {
  size_t count = readCount(in);
  if (count > kOverflowLimit) count %= kOverflowLimit + 1;  // the domain the argument checks leave
  const int blockSize = 32 << (in.byte() % 9);
  const size_t logicalBytes = in.byte() % 2 ? in.u64() : count * 4 * (1 + in.byte() % 16);
  const int64_t chunkBytes = in.byte() % 2 ? static_cast<int64_t>(in.u64()) : static_cast<int64_t>(in.byte()) << 20;
  // The library passes min(ZP_MAX_CHUNKS, kMaxPipelineChunks = 16): any int up to 16, zero and negatives included.
  const int maxChunks = std::min(16, in.byte() % 4 == 0 ? readInt(in) : 1 + in.byte() % 16);
  const bool ramp = in.byte() % 2;
  const zp::ChunkPlan p = zp::makeChunkPlan(count, blockSize, logicalBytes, chunkBytes, maxChunks, ramp);
  FUZZ_CHECK(p.count == count, "count");
  FUZZ_CHECK(p.chunks >= 0 && p.chunks <= zp::kMaxPipelineChunks, "%d chunks", p.chunks);
  FUZZ_CHECK(p.bounds[0] == 0, "chunk 0 starts at %zu", p.bounds[0]);
  if (count == 0) {
    FUZZ_CHECK(p.chunks == 0, "%d chunks of nothing", p.chunks);
    return;
  }
  FUZZ_CHECK(p.chunks >= 1 && p.chunks <= std::max(1, maxChunks), "%d chunks, max %d", p.chunks, maxChunks);
  size_t covered = 0, largest = 0;
  for (int c = 0; c < p.chunks; ++c) {
    FUZZ_CHECK(p.offset(c) == covered, "chunk %d at %zu, expected %zu", c, p.offset(c), covered);
    const size_t e = p.elems(c);
    FUZZ_CHECK(e > 0, "chunk %d is empty", c);
    // Whole blocks: every chunk but the last starts and ends on a block boundary.
    if (c + 1 < p.chunks) FUZZ_CHECK(e % blockSize == 0, "chunk %d of %zu elements, block %d", c, e, blockSize);
    // Equal chunks but the last, or (ramped) a first and last chunk at most an inner one.
    if (c > 0 && c + 1 < p.chunks && !ramp) FUZZ_CHECK(e == p.elems(0), "inner chunk %d differs", c);
    largest = std::max(largest, e);
    covered += e;
  }
  if (p.chunks >= 2) FUZZ_CHECK(p.elems(p.chunks - 1) <= largest && p.elems(0) <= largest, "ends above inner chunks");
  FUZZ_CHECK(covered == count, "chunks cover %zu of %zu", covered, count);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("ZP_DEBUG", "NONE", 0);    // refused calls would each log a warning
  setenv("ZP_BACKEND", "host", 1);  // the default backend, without a GPU
  comms();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Reader in(data, size);
  for (int ops = 0; ops < 64 && !in.empty(); ++ops) {
    switch (in.byte() % 16) {
      case 0:
        fuzzPayloadSize(in);
        break;
      case 1:
      case 2:
        fuzzLiveCommCall(in);
        break;
      case 3:
        fuzzBadHandle(in);
        break;
      case 4:
        fuzzInit(in);
        break;
      case 5:
      case 6:
        fuzzTopology(in);
        break;
      case 7:
        fuzzChunkPlan(in);
        break;
      case 8:
        fuzzParamText(in);
        break;
      default:
        fuzzBufferCall(in);
        break;
    }
  }
  return 0;
}
