// The collective entry points: each fills a CollArgs and hands it to one path that checks and runs it.
#include "host/all_reduce_shards.h"
#include "host/base/check.h"
#include "host/quant_format.h"
#include "src/api_guard.h"
#include "src/argcheck.h"
#include "src/comm.h"

namespace zp {
namespace {

// The gradient collectives: qgZ and the all-reduce (gradBits, gradient rounding, sequence numbers).
bool isGradient(CollKind kind) { return kind == CollKind::kQuantReduceScatter || kind == CollKind::kQuantAllReduce; }

int defaultBits(const Communicator* comm, CollKind kind) {
  return isGradient(kind) ? comm->settings.gradBits : comm->settings.weightBits;
}

// The one enqueue path: resolve defaults, check everything, run. gradOptions: zpGradOptions_t of
// zpQuantReduceScatterA2AEx2 or zpQuantAllReduceEx (its bits and block size then come in `options`).
zpResult_t enqueue(Communicator* comm, const zpQuantOptions_t* options, const zpGradOptions_t* gradOptions,
                   CollArgs args) {
  // Collectives take the communicator's settings; zpQuantize/zpDequantize name theirs explicitly.
  const bool standalone = args.kind == CollKind::kQuantize || args.kind == CollKind::kDequantize;
  if (!standalone) {
    args.bits = args.kind == CollKind::kHierAllGather ? 0 : defaultBits(comm, args.kind);  // 0: exact
    args.blockSize = comm->settings.blockSize;
  }
  ZPCHECK(checkCollArgs(comm, options, &args));
  if (isGradient(args.kind)) {
    ZPCHECK(checkGradArgs(comm, gradOptions, &args));
    // Every gradient call that passed its checks takes the next number, on every rank alike (include/zpccl.h).
    const uint32_t next = comm->gradSequence.fetch_add(1, std::memory_order_relaxed);
    args.grad.sequence = args.grad.sequenceOverride >= 0 ? static_cast<uint32_t>(args.grad.sequenceOverride) : next;
  }
  if (args.count == 0) return standalone ? zpSuccess : comm->backend->runEmpty(args);
  return comm->backend->run(args);
}

zpResult_t call(const char* opName, CollKind kind, const void* sendbuff, void* recvbuff, size_t count,
                zpDataType_t type, zpRedOp_t op, int bits, int blockSize, const zpQuantOptions_t* options,
                zpComm_t comm, cudaStream_t stream, const zpGradOptions_t* gradOptions = nullptr) {
  CollArgs args{opName, kind, sendbuff, recvbuff, count, type, op, bits, blockSize, stream, GradArgs()};
  return guardedCall(opName, &comm, [&] {
    return whileExclusive(comm, opName, [&](Communicator* c) -> zpResult_t {
      if (gradOptions == nullptr) return enqueue(c, options, nullptr, args);
      zpQuantOptions_t quant;
      ZPCHECK(checkGradOptionsHeader(gradOptions, opName, &quant));
      return enqueue(c, &quant, gradOptions, args);
    });
  });
}

}  // namespace
}  // namespace zp

using zp::CollKind;

ZP_EXPORT zpResult_t zpQuantPayloadSize(size_t count, int bits, int blockSize, size_t* bytes) {
  return zp::guardedCall("zpQuantPayloadSize", nullptr, [&]() -> zpResult_t {
    ZPCHECK(zp::checkNotNull(bytes, "zpQuantPayloadSize", "bytes"));
    ZPCHECK(zp::checkBits(bits, "zpQuantPayloadSize", "bits"));
    ZPCHECK(zp::checkBlockSize(blockSize, "zpQuantPayloadSize", "blockSize"));
    if (count > SIZE_MAX / 16) {
      return ZP_ERR(zpInvalidArgument, "zpQuantPayloadSize : count %zu overflows the payload size", count);
    }
    *bytes = zp::quantPayloadBytes(count, bits, blockSize);
    return zpSuccess;
  });
}

ZP_EXPORT zpResult_t zpQuantize(const void* input, void* payload, size_t count, zpDataType_t datatype, int bits,
                                int blockSize, zpComm_t comm, cudaStream_t stream) {
  return zp::call("zpQuantize", CollKind::kQuantize, input, payload, count, datatype, zpSum, bits, blockSize, nullptr,
                  comm, stream);
}

ZP_EXPORT zpResult_t zpDequantize(const void* payload, void* output, size_t count, zpDataType_t datatype, int bits,
                                  int blockSize, zpComm_t comm, cudaStream_t stream) {
  return zp::call("zpDequantize", CollKind::kDequantize, payload, output, count, datatype, zpSum, bits, blockSize,
                  nullptr, comm, stream);
}

ZP_EXPORT zpResult_t zpQuantAllGatherEx(const void* sendbuff, void* recvbuff, size_t sendcount, zpDataType_t datatype,
                                        const zpQuantOptions_t* options, zpComm_t comm, cudaStream_t stream) {
  return zp::call("zpQuantAllGatherEx", CollKind::kQuantAllGather, sendbuff, recvbuff, sendcount, datatype, zpSum, 0, 0,
                  options, comm, stream);
}

ZP_EXPORT zpResult_t zpQuantAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, zpDataType_t datatype,
                                      zpComm_t comm, cudaStream_t stream) {
  return zp::call("zpQuantAllGather", CollKind::kQuantAllGather, sendbuff, recvbuff, sendcount, datatype, zpSum, 0, 0,
                  nullptr, comm, stream);
}

ZP_EXPORT zpResult_t zpHierAllGatherEx(const void* sendbuff, void* recvbuff, size_t sendcount, zpDataType_t datatype,
                                       const zpQuantOptions_t* options, zpComm_t comm, cudaStream_t stream) {
  return zp::call("zpHierAllGatherEx", CollKind::kHierAllGather, sendbuff, recvbuff, sendcount, datatype, zpSum, 0, 0,
                  options, comm, stream);
}

ZP_EXPORT zpResult_t zpHierAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, zpDataType_t datatype,
                                     zpComm_t comm, cudaStream_t stream) {
  return zp::call("zpHierAllGather", CollKind::kHierAllGather, sendbuff, recvbuff, sendcount, datatype, zpSum, 0, 0,
                  nullptr, comm, stream);
}

ZP_EXPORT zpResult_t zpHierSecondaryShard(size_t fullCount, size_t* offset, size_t* count, zpComm_t comm) {
  return zp::guardedCall("zpHierSecondaryShard", &comm, [&]() -> zpResult_t {
    const char* call = "zpHierSecondaryShard";
    return zp::whileInUse(comm, call, [&](zp::Communicator* c) -> zpResult_t {
      ZPCHECK(zp::checkNotNull(offset, call, "offset"));
      ZPCHECK(zp::checkNotNull(count, call, "count"));
      const zp::Topology& t = c->topo;
      if (!t.hpzUsable) return ZP_ERR(zpInvalidUsage, "%s : hpZ needs nodes of equal size", call);
      if (fullCount % t.hpzSize != 0) {
        return ZP_ERR(zpInvalidArgument, "%s : fullCount %zu is not a multiple of hpzSize %d", call, fullCount,
                      t.hpzSize);
      }
      *count = fullCount / t.hpzSize;
      *offset = *count * t.hpzRank;
      return zpSuccess;
    });
  });
}

ZP_EXPORT zpResult_t zpQuantReduceScatterA2AEx(const void* sendbuff, void* recvbuff, size_t recvcount,
                                               zpDataType_t datatype, zpRedOp_t op, const zpQuantOptions_t* options,
                                               zpComm_t comm, cudaStream_t stream) {
  return zp::call("zpQuantReduceScatterA2AEx", CollKind::kQuantReduceScatter, sendbuff, recvbuff, recvcount, datatype,
                  op, 0, 0, options, comm, stream);
}

ZP_EXPORT zpResult_t zpQuantReduceScatterA2A(const void* sendbuff, void* recvbuff, size_t recvcount,
                                             zpDataType_t datatype, zpRedOp_t op, zpComm_t comm, cudaStream_t stream) {
  return zp::call("zpQuantReduceScatterA2A", CollKind::kQuantReduceScatter, sendbuff, recvbuff, recvcount, datatype, op,
                  0, 0, nullptr, comm, stream);
}

ZP_EXPORT zpResult_t zpQuantReduceScatterA2AEx2(const void* sendbuff, void* recvbuff, size_t recvcount,
                                                zpDataType_t datatype, zpRedOp_t op, const zpGradOptions_t* options,
                                                zpComm_t comm, cudaStream_t stream) {
  return zp::call("zpQuantReduceScatterA2AEx2", CollKind::kQuantReduceScatter, sendbuff, recvbuff, recvcount, datatype,
                  op, 0, 0, nullptr, comm, stream, options);
}

ZP_EXPORT zpResult_t zpGradHopResidualCount(size_t recvcount, size_t* count, zpComm_t comm) {
  return zp::guardedCall("zpGradHopResidualCount", &comm, [&]() -> zpResult_t {
    const char* call = "zpGradHopResidualCount";
    return zp::whileInUse(comm, call, [&](zp::Communicator* c) -> zpResult_t {
      ZPCHECK(zp::checkNotNull(count, call, "count"));
      const zp::Topology& t = c->topo;
      if (t.hierarchical() && recvcount > SIZE_MAX / 2 / static_cast<size_t>(t.nodes)) {
        return ZP_ERR(zpInvalidArgument, "%s : recvcount %zu x %d nodes overflows size_t", call, recvcount, t.nodes);
      }
      *count = t.hierarchical() ? recvcount * t.nodes : 0;
      return zpSuccess;
    });
  });
}

ZP_EXPORT zpResult_t zpQuantAllReduce(const void* sendbuff, void* recvbuff, size_t count, zpDataType_t datatype,
                                      zpRedOp_t op, zpComm_t comm, cudaStream_t stream) {
  return zp::call("zpQuantAllReduce", CollKind::kQuantAllReduce, sendbuff, recvbuff, count, datatype, op, 0, 0, nullptr,
                  comm, stream);
}

ZP_EXPORT zpResult_t zpQuantAllReduceEx(const void* sendbuff, void* recvbuff, size_t count, zpDataType_t datatype,
                                        zpRedOp_t op, const zpGradOptions_t* options, zpComm_t comm,
                                        cudaStream_t stream) {
  return zp::call("zpQuantAllReduceEx", CollKind::kQuantAllReduce, sendbuff, recvbuff, count, datatype, op, 0, 0,
                  nullptr, comm, stream, options);
}

ZP_EXPORT zpResult_t zpQuantAllReduceShardCount(size_t count, int blockSize, size_t* shardCount, zpComm_t comm) {
  return zp::guardedCall("zpQuantAllReduceShardCount", &comm, [&]() -> zpResult_t {
    const char* call = "zpQuantAllReduceShardCount";
    return zp::whileInUse(comm, call, [&](zp::Communicator* c) -> zpResult_t {
      ZPCHECK(zp::checkNotNull(shardCount, call, "shardCount"));
      if (blockSize != 0) ZPCHECK(zp::checkBlockSize(blockSize, call, "blockSize"));
      if (count > SIZE_MAX / 16) {
        return ZP_ERR(zpInvalidArgument, "%s : count %zu overflows the payload size", call, count);
      }
      *shardCount = zp::allReduceShardCount(count, c->topo.nranks, blockSize != 0 ? blockSize : c->settings.blockSize);
      return zpSuccess;
    });
  });
}
