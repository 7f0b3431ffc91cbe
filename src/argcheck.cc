#include "src/argcheck.h"

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "host/all_reduce_shards.h"
#include "host/base/check.h"
#include "host/dtype.h"
#include "host/quant_format.h"

namespace zp {

namespace {

// ZPCCL_VERSION_CODE of 0.1.0, the first release, which introduced zpConfig_t.
constexpr unsigned kFirstConfigVersion = 100;
// 0.2.0 appended gradRounding and gradSeed to zpConfig_t and introduced zpGradOptions_t.
constexpr unsigned kGradConfigVersion = 200;
constexpr size_t kConfigSize01 = offsetof(zpConfig_t, gradRounding);
// The first release with zpTransport_t.
constexpr unsigned kTransportVersion = 200;

bool mulOverflows(size_t a, size_t b, size_t* out) { return __builtin_mul_overflow(a, b, out); }

// [a, a+aBytes) and [b, b+bBytes) share a byte.
bool overlaps(const void* a, size_t aBytes, const void* b, size_t bBytes) {
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return aBytes != 0 && bBytes != 0 && x < y + bBytes && y < x + aBytes;
}

zpResult_t checkBuffer(Communicator* comm, const void* ptr, const char* call, const char* arg) {
  const char* why = nullptr;
  if (!comm->backend->bufferUsable(ptr, &why)) return ZP_ERR(zpInvalidArgument, "%s : %s %s", call, arg, why);
  return zpSuccess;
}

}  // namespace

namespace {
// The calls this thread is inside, innermost last (a callback of one communicator may call another's collective).
thread_local std::vector<std::pair<zpComm_t, const char*>> tInsideCalls;
}  // namespace

const char* callInsideOn(zpComm_t comm) {
  for (const auto& frame : tInsideCalls) {
    if (frame.first == comm) return frame.second;
  }
  return nullptr;
}

InsideCall::InsideCall(zpComm_t comm, const char* call) { tInsideCalls.emplace_back(comm, call); }

InsideCall::~InsideCall() { tInsideCalls.pop_back(); }

zpResult_t checkNotNullComm(zpComm_t comm, const char* call) {
  if (comm == nullptr) return ZP_ERR(zpInvalidArgument, "%s : comm is NULL", call);
  return zpSuccess;
}

zpResult_t checkComm(zpComm_t comm, const char* call) {
  ZPCHECK(checkNotNullComm(comm, call));
  if (!isLiveComm(comm)) {
    return ZP_ERR(zpInvalidArgument, "%s : comm %p is not a live communicator (destroyed or garbage)", call,
                  static_cast<const void*>(comm));
  }
  return zpSuccess;
}

zpResult_t checkNotNull(const void* ptr, const char* call, const char* arg) {
  if (ptr == nullptr) return ZP_ERR(zpInvalidArgument, "%s : %s is NULL", call, arg);
  return zpSuccess;
}

zpResult_t checkInitArgs(const zpComm_t* comm, int nranks, int rank, const char* call) {
  ZPCHECK(checkNotNull(comm, call, "comm"));
  if (nranks <= 0) return ZP_ERR(zpInvalidArgument, "%s : nranks %d must be positive", call, nranks);
  if (rank < 0 || rank >= nranks) {
    return ZP_ERR(zpInvalidArgument, "%s : rank %d is out of range [0, %d)", call, rank, nranks);
  }
  return zpSuccess;
}

zpResult_t checkTransport(const zpTransport_t* t, const char* call) {
  ZPCHECK(checkNotNull(t, call, "transport"));
  if (t->magic != ZP_TRANSPORT_MAGIC) {
    return ZP_ERR(zpInvalidArgument, "%s : transport has a bad magic 0x%x: initialize it with ZP_TRANSPORT_INITIALIZER",
                  call, t->magic);
  }
  if (t->version > static_cast<unsigned>(ZPCCL_VERSION_CODE) || t->version < kTransportVersion) {
    return ZP_ERR(zpInvalidArgument,
                  "%s : transport->version %u is not one this library (%d) knows (the first with zpTransport_t is %u): "
                  "initialize it with ZP_TRANSPORT_INITIALIZER of this library's zpccl.h",
                  call, t->version, ZPCCL_VERSION_CODE, kTransportVersion);
  }
  if (t->size != sizeof(zpTransport_t)) {
    return ZP_ERR(zpInvalidArgument,
                  "%s : transport size %zu differs from this library's %zu: rebuild against its "
                  "zpccl.h",
                  call, t->size, sizeof(zpTransport_t));
  }
  if (t->nranks <= 0) return ZP_ERR(zpInvalidArgument, "%s : transport->nranks %d must be positive", call, t->nranks);
  if (t->rank < 0 || t->rank >= t->nranks) {
    return ZP_ERR(zpInvalidArgument, "%s : transport->rank %d is out of range [0, %d)", call, t->rank, t->nranks);
  }
  if (t->allGather == nullptr) return ZP_ERR(zpInvalidArgument, "%s : transport->allGather is NULL", call);
  if (t->allToAll == nullptr) return ZP_ERR(zpInvalidArgument, "%s : transport->allToAll is NULL", call);
  return zpSuccess;
}

zpResult_t checkBits(int bits, const char* call, const char* arg) {
  if (!isValidBits(bits)) {
    return ZP_ERR(zpInvalidArgument, "%s : %s %d must be %s", call, arg, bits, kBitsRule);
  }
  return zpSuccess;
}

zpResult_t checkBlockSize(int blockSize, const char* call, const char* arg) {
  if (!isValidBlockSize(blockSize)) {
    return ZP_ERR(zpInvalidArgument, "%s : %s %d must be %s", call, arg, blockSize, kBlockSizeRule);
  }
  return zpSuccess;
}

zpResult_t resolveConfig(const zpConfig_t* config, int nranks, const char* call, Settings* s) {
  *s = Settings();
  if (config == nullptr) return zpSuccess;
  if (config->magic != ZP_CONFIG_MAGIC) {
    return ZP_ERR(zpInvalidArgument, "%s : config has a bad magic 0x%x: initialize it with ZP_CONFIG_INITIALIZER", call,
                  config->magic);
  }
  // version is the ZPCCL_VERSION_CODE of the zpccl.h the caller was built against. One above this library's may
  // carry fields or meanings it does not know, so it is refused (before size: a newer header's larger struct is
  // better explained by its version); one below 0.1.0, the first release with a zpConfig_t, is garbage. Older
  // releases' configs are accepted as long as their layout (size) is this one's.
  if (config->version > static_cast<unsigned>(ZPCCL_VERSION_CODE)) {
    return ZP_ERR(zpInvalidArgument,
                  "%s : config->version %u is newer than this library's %d: rebuild against its zpccl.h or load a "
                  "newer libzpccl",
                  call, config->version, ZPCCL_VERSION_CODE);
  }
  if (config->version < kFirstConfigVersion) {
    return ZP_ERR(zpInvalidArgument,
                  "%s : config->version %u is not a zpccl version (the first with zpConfig_t is %u): initialize the "
                  "config with ZP_CONFIG_INITIALIZER",
                  call, config->version, kFirstConfigVersion);
  }
  // A 0.1 config ends before gradRounding: its size is that layout's, and the later fields are not read.
  const bool config01 = config->version < kGradConfigVersion;
  const size_t expected = config01 ? kConfigSize01 : sizeof(zpConfig_t);
  if (config->size != expected) {
    return ZP_ERR(zpInvalidArgument,
                  "%s : config size %zu differs from the %zu of a version %u config: rebuild against this library's "
                  "zpccl.h",
                  call, config->size, expected, config->version);
  }
  auto set = [](int value) { return value != ZP_CONFIG_UNDEF_INT; };
  if (set(config->backend)) {
    if (config->backend < zpBackendDefault || config->backend > zpBackendHost) {
      return ZP_ERR(zpInvalidArgument, "%s : config->backend %d is not a zpBackend_t", call, config->backend);
    }
    s->backend = static_cast<zpBackend_t>(config->backend);
  }
  if (set(config->ranksPerNode)) {
    if (config->ranksPerNode <= 0) {
      return ZP_ERR(zpInvalidArgument, "%s : config->ranksPerNode %d must be positive", call, config->ranksPerNode);
    }
    if (nranks > 0 && nranks % config->ranksPerNode != 0) {
      return ZP_ERR(zpInvalidArgument, "%s : config->ranksPerNode %d must divide nranks %d", call, config->ranksPerNode,
                    nranks);
    }
    s->ranksPerNode = config->ranksPerNode;
  }
  if (set(config->nodeId)) {
    if (config->nodeId < 0)
      return ZP_ERR(zpInvalidArgument, "%s : config->nodeId %d is negative", call, config->nodeId);
    if (s->ranksPerNode > 0) {
      return ZP_ERR(zpInvalidArgument, "%s : config->nodeId and config->ranksPerNode are exclusive", call);
    }
    s->nodeId = config->nodeId;
  }
  if (set(config->hpzSize)) {
    if (config->hpzSize <= 0) {
      return ZP_ERR(zpInvalidArgument, "%s : config->hpzSize %d must be positive", call, config->hpzSize);
    }
    if (s->ranksPerNode > 0 && s->ranksPerNode % config->hpzSize != 0) {
      return ZP_ERR(zpInvalidArgument, "%s : config->hpzSize %d does not divide ranksPerNode %d", call, config->hpzSize,
                    s->ranksPerNode);
    }
    s->hpzSize = config->hpzSize;
  }
  if (set(config->weightBits)) {
    ZPCHECK(checkBits(config->weightBits, call, "config->weightBits"));
    s->weightBits = config->weightBits;
  }
  if (set(config->gradBits)) {
    ZPCHECK(checkBits(config->gradBits, call, "config->gradBits"));
    s->gradBits = config->gradBits;
  }
  if (set(config->blockSize)) {
    ZPCHECK(checkBlockSize(config->blockSize, call, "config->blockSize"));
    s->blockSize = config->blockSize;
  }
  if (set(config->blocking)) {
    if (config->blocking != 0 && config->blocking != 1) {
      return ZP_ERR(zpInvalidArgument, "%s : config->blocking %d must be 0 or 1", call, config->blocking);
    }
    if (config->blocking == 0) {
      return ZP_ERR(zpInvalidUsage, "%s : config->blocking 0 (nonblocking communicators) is not implemented yet", call);
    }
    s->blocking = config->blocking;
  }
  if (!config01 && set(config->gradRounding)) {
    ZPCHECK(checkRounding(config->gradRounding, call, "config->gradRounding"));
    s->gradRounding = config->gradRounding;
  }
  if (!config01 && set(config->gradSeed)) {
    if (config->gradSeed < 0) {
      return ZP_ERR(zpInvalidArgument, "%s : config->gradSeed %d is negative", call, config->gradSeed);
    }
    s->gradSeed = config->gradSeed;
  }
  return zpSuccess;
}

zpResult_t checkRounding(int rounding, const char* call, const char* arg) {
  if (rounding != zpRoundNearest && rounding != zpRoundStochastic) {
    return ZP_ERR(zpInvalidArgument, "%s : %s %d is not a zpRounding_t (0 nearest, 1 stochastic)", call, arg, rounding);
  }
  return zpSuccess;
}

zpResult_t checkCollArgs(Communicator* comm, const zpQuantOptions_t* options, CollArgs* a) {
  const char* call = a->opName;
  const Topology& topo = comm->topo;
  // hpZ moves its shards exactly unless the call asks for bits (its optional quantized mode).
  const bool quantized = a->kind != CollKind::kHierAllGather || (options != nullptr && options->bits != 0);

  // Type and op.
  if (!isValidType(a->type)) {
    return ZP_ERR(zpInvalidArgument, "%s : invalid type %d", call, static_cast<int>(a->type));
  }
  if (quantized && !isQuantType(a->type)) {
    return ZP_ERR(zpInvalidArgument, "%s : type %s is not supported (float16, bfloat16 and float32 are)", call,
                  typeName(a->type));
  }
  const bool reduces = a->kind == CollKind::kQuantReduceScatter || a->kind == CollKind::kQuantAllReduce;
  if (reduces && a->op != zpSum && a->op != zpAvg) {
    if (a->op < 0 || a->op >= zpNumOps) {
      return ZP_ERR(zpInvalidArgument, "%s : invalid op %d", call, static_cast<int>(a->op));
    }
    return ZP_ERR(zpInvalidArgument, "%s : op %s is not supported (sum and avg are)", call, opName(a->op));
  }

  // Quantization settings: per-call override, else the communicator's. A bad override is refused even where the
  // call would not use it (hpZ's exact mode), so that a mistake never passes silently.
  if (options != nullptr && options->blockSize != 0 && !quantized) {
    ZPCHECK(checkBlockSize(options->blockSize, call, "options->blockSize"));
  }
  if (quantized) {
    if (options != nullptr && options->bits != 0) {
      ZPCHECK(checkBits(options->bits, call, "options->bits"));
      a->bits = options->bits;
    }
    if (options != nullptr && options->blockSize != 0) {
      ZPCHECK(checkBlockSize(options->blockSize, call, "options->blockSize"));
      a->blockSize = options->blockSize;
    }
    ZPCHECK(checkBits(a->bits, call, "bits"));
    ZPCHECK(checkBlockSize(a->blockSize, call, "blockSize"));
  }

  // Stream.
  if (comm->settings.backend == zpBackendHost && a->stream != nullptr) {
    return ZP_ERR(zpInvalidArgument, "%s : stream must be NULL on the host backend", call);
  }

  // Sizes: the local side, the gathered/scattered side, and every quantized payload must fit in size_t.
  const size_t elemBytes = typeSize(a->type);
  size_t groupRanks = 1;
  switch (a->kind) {
    case CollKind::kQuantAllGather:
    case CollKind::kQuantReduceScatter:
      groupRanks = topo.nranks;
      break;
    case CollKind::kHierAllGather:
      groupRanks = topo.hpzSize;
      break;
    default:
      break;
  }
  size_t localBytes = 0, totalElems = 0, totalBytes = 0, payloadTotal = 0;
  if (mulOverflows(a->count, elemBytes, &localBytes) || mulOverflows(a->count, groupRanks, &totalElems) ||
      mulOverflows(totalElems, elemBytes, &totalBytes) || a->count > SIZE_MAX / 16 ||
      (quantized && mulOverflows(quantPayloadBytes(a->count, a->bits, a->blockSize), groupRanks, &payloadTotal))) {
    return ZP_ERR(zpInvalidArgument, "%s : count %zu x %zu ranks x %zu bytes overflows size_t", call, a->count,
                  groupRanks, elemBytes);
  }
  // The all-reduce's payloads: a shard's for every rank.
  if (a->kind == CollKind::kQuantAllReduce &&
      mulOverflows(quantPayloadBytes(allReduceShardCount(a->count, topo.nranks, a->blockSize), a->bits, a->blockSize),
                   static_cast<size_t>(topo.nranks), &payloadTotal)) {
    return ZP_ERR(zpInvalidArgument, "%s : count %zu on %d ranks overflows size_t in its payloads", call, a->count,
                  topo.nranks);
  }
  if (a->count == 0) return zpSuccess;  // a successful no-op, whatever the pointers and the layout

  // Layout.
  if (a->kind == CollKind::kHierAllGather && !topo.hpzUsable) {
    return ZP_ERR(zpInvalidUsage, "%s : hpZ needs nodes of equal size; this layout is uneven (%s)", call,
                  topo.describe().c_str());
  }

  // Buffers, named as the call names them.
  const bool sendIsPayload = a->kind == CollKind::kDequantize;
  const bool recvIsPayload = a->kind == CollKind::kQuantize;
  const char* sendName = sendIsPayload ? "payload" : (a->kind == CollKind::kQuantize ? "input" : "sendbuff");
  const char* recvName = recvIsPayload ? "payload" : (a->kind == CollKind::kDequantize ? "output" : "recvbuff");
  ZPCHECK(checkBuffer(comm, a->sendbuff, call, sendName));
  ZPCHECK(checkBuffer(comm, a->recvbuff, call, recvName));
  auto misaligned = [](const void* p, size_t align) { return reinterpret_cast<uintptr_t>(p) % align != 0; };
  const size_t sendAlign = sendIsPayload ? kPayloadAlign : elemBytes;
  const size_t recvAlign = recvIsPayload ? kPayloadAlign : elemBytes;
  if (misaligned(a->sendbuff, sendAlign)) {
    return ZP_ERR(zpInvalidArgument, "%s : %s %p is not aligned to %zu bytes", call, sendName, a->sendbuff, sendAlign);
  }
  if (misaligned(a->recvbuff, recvAlign)) {
    return ZP_ERR(zpInvalidArgument, "%s : %s %p is not aligned to %zu bytes", call, recvName, a->recvbuff, recvAlign);
  }

  // Overlap: only NCCL's in-place layouts (the collectives'; zpQuantize and zpDequantize have none).
  const char* sendChar = static_cast<const char*>(a->sendbuff);
  const char* recvChar = static_cast<const char*>(a->recvbuff);
  size_t sendBytes = localBytes, recvBytes = localBytes;
  const char* inPlaceSend = nullptr;  // where sendbuff must be for the call to be in place
  switch (a->kind) {
    case CollKind::kQuantize:
      recvBytes = quantPayloadBytes(a->count, a->bits, a->blockSize);
      break;
    case CollKind::kDequantize:
      sendBytes = quantPayloadBytes(a->count, a->bits, a->blockSize);
      break;
    case CollKind::kQuantAllGather:
      recvBytes = totalBytes;
      inPlaceSend = recvChar + static_cast<size_t>(topo.rank) * localBytes;
      break;
    case CollKind::kHierAllGather:
      recvBytes = totalBytes;
      inPlaceSend = recvChar + static_cast<size_t>(topo.hpzRank) * localBytes;
      break;
    case CollKind::kQuantReduceScatter:
      sendBytes = totalBytes;
      inPlaceSend = recvChar - static_cast<size_t>(topo.rank) * localBytes;
      break;
    case CollKind::kQuantAllReduce:
      inPlaceSend = recvChar;
      break;
  }
  if (overlaps(a->sendbuff, sendBytes, a->recvbuff, recvBytes) && sendChar != inPlaceSend) {
    if (inPlaceSend == nullptr) {  // zpQuantize, zpDequantize
      return ZP_ERR(zpInvalidArgument, "%s : %s %p and %s %p overlap (%s has no in-place form)", call, sendName,
                    a->sendbuff, recvName, a->recvbuff, call);
    }
    return ZP_ERR(zpInvalidArgument, "%s : %s %p and %s %p overlap without being in NCCL's in-place layout", call,
                  sendName, a->sendbuff, recvName, a->recvbuff);
  }
  return zpSuccess;
}

zpResult_t checkGradOptionsHeader(const zpGradOptions_t* g, const char* call, zpQuantOptions_t* quant) {
  *quant = zpQuantOptions_t{0, 0};
  if (g == nullptr) return zpSuccess;
  if (g->magic != ZP_GRAD_OPTIONS_MAGIC) {
    return ZP_ERR(zpInvalidArgument,
                  "%s : options has a bad magic 0x%x: initialize it with ZP_GRAD_OPTIONS_INITIALIZER", call, g->magic);
  }
  if (g->version > static_cast<unsigned>(ZPCCL_VERSION_CODE)) {
    return ZP_ERR(zpInvalidArgument,
                  "%s : options->version %u is newer than this library's %d: rebuild against its zpccl.h or load a "
                  "newer libzpccl",
                  call, g->version, ZPCCL_VERSION_CODE);
  }
  if (g->version < kGradConfigVersion) {
    return ZP_ERR(zpInvalidArgument,
                  "%s : options->version %u is not a zpccl version with zpGradOptions_t (the first is %u): "
                  "initialize the options with ZP_GRAD_OPTIONS_INITIALIZER",
                  call, g->version, kGradConfigVersion);
  }
  if (g->size != sizeof(zpGradOptions_t)) {
    return ZP_ERR(zpInvalidArgument,
                  "%s : options size %zu differs from this library's %zu: rebuild against its zpccl.h", call, g->size,
                  sizeof(zpGradOptions_t));
  }
  auto keep = [](int v) { return v == 0 || v == ZP_CONFIG_UNDEF_INT; };
  // A value that is neither kept nor valid reaches checkCollArgs, which names it options->bits / ->blockSize.
  quant->bits = keep(g->bits) ? 0 : g->bits;
  quant->blockSize = keep(g->blockSize) ? 0 : g->blockSize;
  if (quant->bits < 0) return checkBits(quant->bits, call, "options->bits");
  if (quant->blockSize < 0) return checkBlockSize(quant->blockSize, call, "options->blockSize");
  return zpSuccess;
}

namespace {

// Elements of the call's sendbuff and recvbuff: qgZ's or the all-reduce's.
size_t sendElemsOf(const Communicator* comm, const CollArgs& a) {
  return a.kind == CollKind::kQuantAllReduce ? a.count : a.count * comm->topo.nranks;
}
size_t recvElemsOf(const CollArgs& a) { return a.count; }

// One residual of zpGradOptions_t: its type, count, buffer, alignment and overlaps with the call's buffers.
zpResult_t checkResidual(Communicator* comm, const CollArgs& a, const void* ptr, size_t count, size_t expected,
                         int type, const char* name, const char* countName, const void* other, size_t otherBytes,
                         const char* otherName) {
  const char* call = a.opName;
  if (type != zpBfloat16) {
    if (!isValidType(static_cast<zpDataType_t>(type))) {
      return ZP_ERR(zpInvalidArgument, "%s : options->residualType %d is not a type", call, type);
    }
    return ZP_ERR(zpInvalidArgument, "%s : options->residualType %s is not supported (bfloat16 is)", call,
                  typeName(static_cast<zpDataType_t>(type)));
  }
  if (count != expected) {
    return ZP_ERR(zpInvalidArgument, "%s : %s %zu must be %zu for %s %zu on %d ranks", call, countName, count, expected,
                  a.kind == CollKind::kQuantAllReduce ? "count" : "recvcount", a.count, comm->topo.nranks);
  }
  if (a.count == 0) return zpSuccess;
  ZPCHECK(checkBuffer(comm, ptr, call, name));
  if (reinterpret_cast<uintptr_t>(ptr) % 2 != 0) {
    return ZP_ERR(zpInvalidArgument, "%s : %s %p is not aligned to 2 bytes", call, name, ptr);
  }
  const size_t bytes = count * 2;
  const size_t elemBytes = typeSize(a.type);
  const struct {
    const void* p;
    size_t bytes;
    const char* name;
  } others[] = {{a.sendbuff, sendElemsOf(comm, a) * elemBytes, "sendbuff"},
                {a.recvbuff, recvElemsOf(a) * elemBytes, "recvbuff"},
                {other, otherBytes, otherName}};
  for (const auto& o : others) {
    if (o.p != nullptr && overlaps(ptr, bytes, o.p, o.bytes)) {
      return ZP_ERR(zpInvalidArgument, "%s : %s %p overlaps %s %p", call, name, ptr, o.name, o.p);
    }
  }
  return zpSuccess;
}

}  // namespace

zpResult_t checkGradArgs(Communicator* comm, const zpGradOptions_t* g, CollArgs* a) {
  const char* call = a->opName;
  int rounding = comm->settings.gradRounding;
  int seed = comm->settings.gradSeed;
  if (g != nullptr) {
    if (g->rounding != ZP_CONFIG_UNDEF_INT) {
      ZPCHECK(checkRounding(g->rounding, call, "options->rounding"));
      rounding = g->rounding;
    }
    if (g->seed != ZP_CONFIG_UNDEF_INT) {
      if (g->seed < 0) return ZP_ERR(zpInvalidArgument, "%s : options->seed %d is negative", call, g->seed);
      seed = g->seed;
    }
    if (g->sequence != ZP_CONFIG_UNDEF_INT && g->sequence < 0) {
      return ZP_ERR(zpInvalidArgument, "%s : options->sequence %d is negative", call, g->sequence);
    }
    const Topology& t = comm->topo;
    const size_t full = sendElemsOf(comm, *a);
    if (g->residual != nullptr) {
      ZPCHECK(checkResidual(comm, *a, g->residual, g->residualCount, full, g->residualType, "options->residual",
                            "options->residualCount", nullptr, 0, ""));
    } else if (g->residualCount != 0) {
      return ZP_ERR(zpInvalidArgument, "%s : options->residualCount %zu without options->residual", call,
                    g->residualCount);
    }
    // The hop residual holds a slice of every destination node: qgZ's recvcount, the all-reduce's shard.
    const size_t slice =
        a->kind == CollKind::kQuantAllReduce ? allReduceShardCount(a->count, t.nranks, a->blockSize) : a->count;
    const size_t hopCount = t.hierarchical() ? slice * t.nodes : 0;
    if (g->hopResidual != nullptr && hopCount != 0) {
      ZPCHECK(checkResidual(comm, *a, g->hopResidual, g->hopResidualCount, hopCount, g->residualType,
                            "options->hopResidual", "options->hopResidualCount", g->residual,
                            g->residual != nullptr ? full * 2 : 0, "options->residual"));
    } else if (g->hopResidualCount != 0 && g->hopResidual == nullptr) {
      return ZP_ERR(zpInvalidArgument, "%s : options->hopResidualCount %zu without options->hopResidual", call,
                    g->hopResidualCount);
    } else if (g->hopResidualCount != 0) {
      return ZP_ERR(
          zpInvalidArgument,
          "%s : options->hopResidualCount %zu must be 0: the reduce-scatter takes one hop on this layout (%s)", call,
          g->hopResidualCount, t.describe().c_str());
    }
    if (a->count > 0) {
      a->grad.residual = static_cast<uint16_t*>(g->residual);
      a->grad.hopResidual = hopCount != 0 ? static_cast<uint16_t*>(g->hopResidual) : nullptr;
    }
  }
  a->grad.stochastic = rounding == zpRoundStochastic;
  a->grad.seed = static_cast<uint32_t>(seed);
  a->grad.sequenceOverride = g != nullptr && g->sequence != ZP_CONFIG_UNDEF_INT ? g->sequence : -1;
  return zpSuccess;
}

}  // namespace zp
