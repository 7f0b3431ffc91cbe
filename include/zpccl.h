/*
 * zpccl: ZeRO++ collectives (quantized weight all-gather, hierarchical all-gather, quantized gradient
 * reduce-scatter) and a quantized gradient all-reduce behind an NCCL-style C ABI.
 *
 * Conventions, as NCCL's:
 * - Every call returns a zpResult_t. On failure, zpGetLastError(comm) holds a message naming the call and the
 *   argument at fault. An argument error leaves the communicator usable. A collective refused by its argument checks
 *   is not made: it meets no other rank, so their matching call waits for this rank's next one.
 * - Threads: different communicators may be used from different threads at once. One communicator serves one thread
 *   at a time: a collective, zpQuantize, zpDequantize or zpCommReserve called while another thread's runs on the same
 *   communicator is refused with zpInvalidUsage (it runs nothing). zpGetLastError, the queries, zpCommGetAsyncError
 *   and zpCommAbort may be called from any thread meanwhile.
 * - Collectives are enqueued on the caller's CUDA stream and return once enqueued (cuda backend). On the host
 *   backend the stream argument must be NULL and the call returns when the collective is done.
 * - Among ranks of one NVLink domain (cuda backend), qwZ and one-hop qgZ of at least ZP_DIRECT_MIN_BYTES
 *   (default 0: every size) read the peers' payloads from their memory, through a window NCCL registers on every
 *   rank. The first call that needs a larger window than any before registers it with every rank: like NCCL's
 *   first use of a connection, it waits on the host until the other ranks make the same call. zpCommReserve
 *   does it up front.
 * - Collectives are called by every rank of a communicator, in the same order.
 * - Element counts are in elements of the data type, never bytes. Buffers must be aligned to their element size
 *   (payloads to 16 bytes); a count of 0 is a successful no-op.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef ZPCCL_H_
#define ZPCCL_H_

#include <cuda_runtime.h>
#include <stddef.h>

#define ZPCCL_MAJOR 0
#define ZPCCL_MINOR 2
#define ZPCCL_PATCH 0
#define ZPCCL_VERSION_CODE (ZPCCL_MAJOR * 10000 + ZPCCL_MINOR * 100 + ZPCCL_PATCH)

#ifdef __cplusplus
extern "C" {
#endif

/* In C++ the enums get int as their fixed underlying type, so that any int a C or ctypes caller passes (an
 * out-of-range type, say) is a valid value that the argument checks can refuse, not undefined behaviour. */
#ifdef __cplusplus
#define ZP_ENUM_INT : int
#else
#define ZP_ENUM_INT
#endif

/* Result codes: numerically equal to ncclResult_t. */
typedef enum ZP_ENUM_INT {
  zpSuccess = 0,
  zpUnhandledCudaError = 1,
  zpSystemError = 2,
  zpInternalError = 3,
  zpInvalidArgument = 4,
  zpInvalidUsage = 5,
  zpRemoteError = 6,
  zpInProgress = 7,
  zpNumResults = 8
} zpResult_t;

/* Data types: numerically equal to ncclDataType_t. Quantized collectives take zpFloat16, zpBfloat16 and
 * zpFloat32; zpHierAllGather moves bytes and takes every type. */
typedef enum ZP_ENUM_INT {
  zpInt8 = 0,
  zpChar = 0,
  zpUint8 = 1,
  zpInt32 = 2,
  zpInt = 2,
  zpUint32 = 3,
  zpInt64 = 4,
  zpUint64 = 5,
  zpFloat16 = 6,
  zpHalf = 6,
  zpFloat32 = 7,
  zpFloat = 7,
  zpFloat64 = 8,
  zpDouble = 8,
  zpBfloat16 = 9,
  zpFloat8e4m3 = 10,
  zpFloat8e5m2 = 11,
  zpNumTypes = 12
} zpDataType_t;

/* Reduction operations: numerically equal to ncclRedOp_t. zpQuantReduceScatterA2A takes zpSum and zpAvg. */
typedef enum ZP_ENUM_INT { zpSum = 0, zpProd = 1, zpMax = 2, zpMin = 3, zpAvg = 4, zpNumOps = 5 } zpRedOp_t;

/* How qgZ (zpQuantReduceScatterA2A) rounds gradients to their codes; see "Gradient rounding" below. */
typedef enum ZP_ENUM_INT {
  zpRoundNearest = 0,    /* to nearest, ties to even: the block format's rule */
  zpRoundStochastic = 1, /* stochastically, unbiased: up with probability equal to the fraction */
  zpNumRoundings = 2
} zpRounding_t;

/* Where a communicator runs its collectives. */
typedef enum ZP_ENUM_INT {
  zpBackendDefault = 0, /* cuda when a CUDA device is visible, else host (overridden by ZP_BACKEND) */
  zpBackendCuda = 1,    /* NCCL and the device kernels; buffers are device memory */
  zpBackendHost = 2     /* buffers are host memory, stream must be NULL; ranks are threads of one process, or
                           processes over the caller's transport (zpCommInitFromTransport) */
} zpBackend_t;

#define ZP_UNIQUE_ID_BYTES 128
/* Shared by all ranks (out of band) before zpCommInitRank. On the cuda backend it carries an ncclUniqueId; on
 * the host backend it is the key under which thread-ranks meet. Take a fresh id for each communicator: NCCL's
 * serves one init; the host backend's is free for another once its communicator has formed or its init failed. */
typedef struct {
  char internal[ZP_UNIQUE_ID_BYTES];
} zpUniqueId;

/* Opaque communicator handle. */
typedef struct zpComm* zpComm_t;

/* NCCL's communicator (ncclComm_t is a struct ncclComm*), for zpCommInitFromNccl without including nccl.h. */
struct ncclComm;

/* Value of an integer config field left to its default. It is a marker, not a value: a field holding it (INT_MIN)
 * is unset, whoever wrote it there. No field takes a negative value as a setting, so none is lost. */
#define ZP_CONFIG_UNDEF_INT (-2147483647 - 1)
#define ZP_CONFIG_MAGIC 0x7a70636fu /* "zpco" */

/* Communicator configuration. Always start from ZP_CONFIG_INITIALIZER and set only the fields you need; a
 * field left at ZP_CONFIG_UNDEF_INT takes its default. size, magic and version let the library check that the
 * struct was initialized and which version of it the caller was built against. */
typedef struct {
  size_t size;          /* sizeof(zpConfig_t), set by the initializer */
  unsigned int magic;   /* ZP_CONFIG_MAGIC, set by the initializer */
  unsigned int version; /* ZPCCL_VERSION_CODE, set by the initializer */
  int backend;          /* zpBackend_t; default zpBackendDefault */
  int ranksPerNode;     /* emulate nodes of this many consecutive ranks (node = rank / ranksPerNode) instead of
                           grouping by host; must divide the rank count. Default: group by host hash */
  int nodeId;           /* this rank's node label (>= 0), overriding the host hash: lets one process emulate
                           any layout, interleaved or uneven. Default: the host hash (hostname or NCCL_HOSTID) */
  int hpzSize;          /* ranks in an hpZ group, a divisor of the ranks per node. Default: all ranks of the node */
  int weightBits;       /* bits of zpQuantAllGather's codes, 4 or 8. Default 8 */
  int gradBits;         /* bits of zpQuantReduceScatterA2A's codes, 4 or 8. Default 4 */
  int blockSize;        /* elements per quantization block, a power of two in [32, 8192]. Default 256 */
  int blocking;         /* 1: calls block until done (the only mode supported today). Default 1 */
  /* Since 0.2.0 (a 0.1 config, without these fields, is still accepted; they then take their defaults): */
  int gradRounding; /* zpRounding_t of zpQuantReduceScatterA2A's quantizations. Default ZP_GRAD_ROUNDING, else
                       zpRoundNearest. May differ between ranks */
  int gradSeed;     /* key of stochastic rounding, >= 0. Default ZP_GRAD_SEED, else 0. Ranks with the same seed and
                       layout draw reproducible bits; the seed may differ between ranks */
} zpConfig_t;

#define ZP_CONFIG_INITIALIZER                                                                                    \
  {                                                                                                              \
    sizeof(zpConfig_t), ZP_CONFIG_MAGIC, ZPCCL_VERSION_CODE, ZP_CONFIG_UNDEF_INT, ZP_CONFIG_UNDEF_INT,           \
        ZP_CONFIG_UNDEF_INT, ZP_CONFIG_UNDEF_INT, ZP_CONFIG_UNDEF_INT, ZP_CONFIG_UNDEF_INT, ZP_CONFIG_UNDEF_INT, \
        ZP_CONFIG_UNDEF_INT, ZP_CONFIG_UNDEF_INT, ZP_CONFIG_UNDEF_INT                                            \
  }

/* Per-call override of the communicator's quantization settings. A field left at 0 keeps the
 * communicator's value. */
typedef struct {
  int bits;      /* 4 or 8 */
  int blockSize; /* power of two in [32, 8192] */
} zpQuantOptions_t;

/* ---------------------------------------------------------------------------------------------------------- */
/* Versions and errors                                                                                        */

/* Writes ZPCCL_VERSION_CODE of the library (not of the header) to *version. */
zpResult_t zpGetVersion(int* version);

/* A static, human-readable name of a result code. */
const char* zpGetErrorString(zpResult_t result);

/* The message of the last failed call made on comm, or "" if the last call on comm succeeded. With
 * comm == NULL: the same for this thread's last call that had no live communicator on entry (an init, zpCommDestroy,
 * zpCommAbort, a call given a bad handle, a call that takes no communicator): its message, or "" if it succeeded.
 * The returned pointer stays valid in the calling thread until its next zpGetLastError call. */
const char* zpGetLastError(zpComm_t comm);

/* ---------------------------------------------------------------------------------------------------------- */
/* Communicators                                                                                              */

/* Creates a unique id, to be shared with every rank before zpCommInitRank. Needs no communicator. */
zpResult_t zpGetUniqueId(zpUniqueId* uniqueId);

/* Creates a communicator of nranks ranks, this caller being rank (0 <= rank < nranks), with the default
 * config. Collective over all ranks: each calls it with the same id and nranks, and its own rank. On the cuda
 * backend the communicator uses the CUDA device current at the call. On the host backend, callers of one id that
 * pass different nranks, or the same rank, are all refused with zpInvalidUsage. A rank whose arguments or config
 * are refused before the ranks meet (zpInvalidArgument) never comes: the others fail after ZP_INIT_TIMEOUT_MS on
 * the host backend, or wait as NCCL's init does on the cuda backend. */
zpResult_t zpCommInitRank(zpComm_t* comm, int nranks, zpUniqueId commId, int rank);

/* As zpCommInitRank, with a config (NULL: defaults). The node layout is found here: host hashes (hostname,
 * or NCCL_HOSTID when set, as NCCL does) are exchanged, or taken from config->ranksPerNode / nodeId.
 * Uneven nodes are allowed; hierarchical paths then fall back to flat ones, and the log says so. The settings
 * that shape the communicator (how nodes are given, ranksPerNode, hpzSize, weightBits, gradBits, blockSize) must
 * be the same on every rank: a difference is zpInvalidUsage on every rank, naming the field and both values. So
 * must the backend (as config->backend, ZP_BACKEND or the visible devices resolve it), which cannot be compared:
 * ranks of two backends never meet. */
zpResult_t zpCommInitRankConfig(zpComm_t* comm, int nranks, zpUniqueId commId, int rank, zpConfig_t* config);

/* Wraps a caller's NCCL communicator (e.g. PyTorch's) in a cuda-backend zpccl communicator. Collective over
 * all ranks of ncclComm. The caller keeps ownership: zpCommDestroy leaves ncclComm alive; the caller must
 * keep it alive until then. Sub-communicators are split from it. config may be NULL. */
zpResult_t zpCommInitFromNccl(zpComm_t* comm, struct ncclComm* ncclComm, zpConfig_t* config);

/* ---------------------------------------------------------------------------------------------------------- */
/* Host backend across processes: the caller's transport                                                      */
/*
 * On the host backend, ranks are threads of one process by default (zpCommInitRank: they meet under the unique
 * id). Ranks that are processes meet through a transport the caller provides: a few callbacks that move bytes among
 * the ranks with an existing engine (torch.distributed, MPI), given to zpCommInitFromTransport. The collectives, their
 * plans and their math are the host backend's whichever way the bytes move, so results are bit-equal to the threaded
 * host backend on the same inputs.
 *
 * Who calls what: the library calls allGather and allToAll from the thread that called zpccl (init, a collective),
 * one callback at a time per communicator, in the same order on every rank (every rank calls the communicator's
 * collectives in the same order), so a callback may run the matching collective of its engine directly. Each
 * collective makes a few exchanges: a small all-gather of the call's arguments (a mismatch is zpInvalidUsage on every
 * rank, before any data moves), one exchange per hop of its plan and chunk (all-to-alls among groups of ranks are
 * all-to-alls over every rank, with counts of 0 for ranks outside the group), and a small all-gather of every rank's
 * outcome. Buffers are the library's own host memory (never the caller's sendbuff or recvbuff); a send buffer never
 * overlaps a receive buffer.
 *
 * Errors: a callback returns 0 on success, else any nonzero value, with a message in call->error. A callback that
 * fails, writes fewer bytes than asked (call->received), or does not come back within call->timeoutMs fails the
 * communicator: the collective returns zpRemoteError on every rank (whose transport still works), naming the rank,
 * the exchange and the message, and every later call on it returns zpRemoteError at once; abort or destroy it. A rank
 * that met a failure still makes the call's remaining exchanges (ignoring their data), so that its peers are not
 * left waiting. A peer that died makes the engine fail or time out: the same happens. The library cannot interrupt a
 * callback: zpCommAbort from another thread returns once a callback in flight has returned. A callback must return
 * within call->timeoutMs (ZP_INIT_TIMEOUT_MS during init, ZP_HOST_TIMEOUT_MS in a collective; 0: no limit), with an
 * error when its peers did not come, and must be done with the buffers when it returns; after a failed callback the
 * library never frees or reuses the memory it gave that call all the same (an engine may not stop at once).
 *
 * A callback runs inside a call on the communicator it serves: there it may call zpGetLastError, the queries and
 * zpCommGetAsyncError on it, but its collectives, zpQuantize, zpDequantize, zpCommReserve, zpCommDestroy and
 * zpCommAbort are refused with zpInvalidUsage (they would wait for the call that runs the callback); to give up, return
 * nonzero.
 *
 * Exceptions (C++, Python) must not unwind through the library: catch them in the callback and return nonzero.
 */

#define ZP_TRANSPORT_MAGIC 0x7a707472u /* "zptr" */
#define ZP_TRANSPORT_ERROR_BYTES 256

/* One exchange, as the library asks a callback for it. */
typedef struct {
  const char* call;    /* the zpccl call it serves ("zpQuantAllGather", "zpCommInitFromTransport"), for messages */
  long long timeoutMs; /* return within this many milliseconds, with an error if the peers did not come; 0: none */
  size_t received;     /* out: the bytes the callback wrote into recvbuf, in all (the library checks it) */
  char error[ZP_TRANSPORT_ERROR_BYTES]; /* out: on failure, why, NUL-terminated (the library sets it to "") */
} zpTransportCall_t;

/* A transport of nranks ranks, this caller being rank. Start from ZP_TRANSPORT_INITIALIZER and set every other
 * field; size, magic and version as in zpConfig_t. The library copies the struct; context must stay valid until
 * finalize is called. */
typedef struct {
  size_t size;          /* sizeof(zpTransport_t), set by the initializer */
  unsigned int magic;   /* ZP_TRANSPORT_MAGIC, set by the initializer */
  unsigned int version; /* ZPCCL_VERSION_CODE, set by the initializer */
  int nranks;           /* ranks of the transport (> 0) */
  int rank;             /* this rank, in [0, nranks) */
  void* context;        /* handed back to every callback as it is */
  /* All-gather over every rank: each sends bytes bytes from sendbuf; rank r's land at recvbuf + r * bytes (recvbuf
   * holds nranks * bytes, this rank's own block included). bytes is equal on every rank. */
  int (*allGather)(void* context, const void* sendbuf, void* recvbuf, size_t bytes, zpTransportCall_t* call);
  /* All-to-all over every rank: rank r receives sendCounts[r] bytes from sendbuf + sendOffsets[r] (send regions may
   * overlap: the same bytes may go to several ranks), and this rank receives recvCounts[r] bytes from rank r at
   * recvbuf + recvOffsets[r]; sendCounts[r] on this rank equals recvCounts[this rank] on rank r. Counts may be 0
   * (this rank's own included); each array holds nranks entries. */
  int (*allToAll)(void* context, const void* sendbuf, const size_t* sendCounts, const size_t* sendOffsets,
                  void* recvbuf, const size_t* recvCounts, const size_t* recvOffsets, zpTransportCall_t* call);
  /* May be NULL. Called once, after the last callback, when zpCommDestroy or zpCommAbort frees the communicator that
   * holds the transport: the context may be freed then. Not called when zpCommInitFromTransport fails (the caller
   * still owns the context then). */
  void (*finalize)(void* context);
} zpTransport_t;

#define ZP_TRANSPORT_INITIALIZER \
  { sizeof(zpTransport_t), ZP_TRANSPORT_MAGIC, ZPCCL_VERSION_CODE, 0, -1, NULL, NULL, NULL, NULL }

/* Creates a host-backend communicator of transport->nranks ranks, this caller being transport->rank, whose ranks
 * meet and move bytes through the transport. Collective over the transport's ranks: each calls it with its own
 * transport of the same ranks. config may be NULL; its backend must be unset, zpBackendDefault or zpBackendHost. A
 * rank's node is its host hash unless config->ranksPerNode or nodeId says otherwise, and the settings that shape the
 * communicator are compared across ranks, as in zpCommInitRankConfig, and so are the environment's tunables that cut
 * calls into chunks (ZP_CHUNK_BYTES, ZP_MAX_CHUNKS, ZP_CHUNK_RAMP: each process reads its own), a difference being
 * zpInvalidUsage on every rank naming the variable and both values. Ranks whose transports do not span the same
 * ranks, a transport that fails, returns short data, or does not bring every rank within ZP_INIT_TIMEOUT_MS: an error
 * on every rank whose transport reaches the others, naming the rank and what happened; no communicator. */
zpResult_t zpCommInitFromTransport(zpComm_t* comm, const zpTransport_t* transport, zpConfig_t* config);

/* Frees a communicator after the work enqueued on it has completed. The handle is invalid afterwards, for good
 * (handles are never reused): passing it again returns zpInvalidArgument. */
zpResult_t zpCommDestroy(zpComm_t comm);

/* Frees a communicator at once, aborting any work in flight (e.g. after a peer failed). On the host backend a
 * peer's call that is still copying from this rank's memory finishes its copy first; nothing waits for a peer
 * that does not come. */
zpResult_t zpCommAbort(zpComm_t comm);

/* Writes the first asynchronous error seen by comm (a failed peer, an aborted communicator) to *asyncError,
 * zpSuccess when none, zpInProgress while an operation is still being set up. On the cuda backend a watchdog
 * thread fails the communicator when NCCL reports an error or a collective stays unfinished ZP_TIMEOUT_MS
 * (default 600000) after its enqueue: its work is stopped so the stream drains, this returns the error
 * (zpRemoteError for a timeout), and later calls on comm return it at once. Then call zpCommAbort. */
zpResult_t zpCommGetAsyncError(zpComm_t comm, zpResult_t* asyncError);

/* Reserves the communicator's scratch memory for collectives of up to maxBytes logical (unquantized) bytes
 * of output, so that later calls allocate nothing and can be captured in a CUDA graph. Collective on the cuda
 * backend: every rank calls it with the same maxBytes (it connects NCCL's peers and registers the window of
 * the direct loads with every rank). */
zpResult_t zpCommReserve(zpComm_t comm, size_t maxBytes);

/* Queries. */
zpResult_t zpCommCount(const zpComm_t comm, int* count);     /* ranks in comm */
zpResult_t zpCommUserRank(const zpComm_t comm, int* rank);   /* this rank */
zpResult_t zpCommCuDevice(const zpComm_t comm, int* device); /* CUDA device; -1 on the host backend */
zpResult_t zpCommBackend(const zpComm_t comm, zpBackend_t* backend);
zpResult_t zpCommNodeCount(const zpComm_t comm, int* nodes);     /* distinct nodes */
zpResult_t zpCommNodeRank(const zpComm_t comm, int* node);       /* index of this rank's node, 0..nodes-1, in
                                                                    order of each node's lowest rank */
zpResult_t zpCommLocalRank(const zpComm_t comm, int* localRank); /* rank inside the node */
zpResult_t zpCommLocalSize(const zpComm_t comm, int* localSize); /* ranks of this rank's node */
zpResult_t zpCommHpzRank(const zpComm_t comm, int* hpzRank);     /* rank inside the hpZ group */
zpResult_t zpCommHpzSize(const zpComm_t comm, int* hpzSize);     /* ranks of the hpZ group */

/* ---------------------------------------------------------------------------------------------------------- */
/* Block quantization format                                                                                  */
/*
 * Blocks of blockSize contiguous elements (the last one may be partial). Per block, in fp32:
 *   scale = absmax / qmax (qmax = 127 for int8, 7 for int4);  q = clamp(rint(x / scale), -qmax, qmax);
 *   x' = q * scale, rounded to the output type to nearest even; a product beyond the type's largest finite
 *   value (only when absmax is within a rounding of it, e.g. FLT_MAX in fp32) gives that value, of its sign.
 * The block maximum is never clipped, and a finite block never dequantizes to Inf. An all-zero block has scale 0
 * and dequantizes to zeros. A block holding NaN or +-Inf dequantizes to all NaN. int4 packs two codes a byte,
 * element 2i in the low nibble, two's complement.
 * A payload is one contiguous region, 16-byte aligned: the fp32 scales of all blocks, padded to 16 bytes,
 * then the packed codes, padded to 16 bytes. Its size is zpQuantPayloadSize's.
 */

/* The format's bounds, as every call checks them (and the Python package's zpccl.enums repeats them): codes of
 * ZP_BITS_INT4 or ZP_BITS_INT8 bits, nothing between; blocks of a power of two in
 * [ZP_MIN_BLOCK_SIZE, ZP_MAX_BLOCK_SIZE] elements; payloads and their regions aligned to ZP_PAYLOAD_ALIGN bytes. */
#define ZP_BITS_INT4 4
#define ZP_BITS_INT8 8
#define ZP_MIN_BLOCK_SIZE 32
#define ZP_MAX_BLOCK_SIZE 8192
#define ZP_PAYLOAD_ALIGN 16

/* Bytes of the payload of count elements. bits 4 or 8, blockSize a power of two in [32, 8192]. */
zpResult_t zpQuantPayloadSize(size_t count, int bits, int blockSize, size_t* bytes);

/* Quantizes count elements of input (fp16, bf16 or fp32) into payload (16-byte aligned, at least
 * zpQuantPayloadSize bytes). Uses comm's backend (device pointers and stream on cuda; host pointers and a
 * NULL stream on host). count 0 is a no-op. */
zpResult_t zpQuantize(const void* input, void* payload, size_t count, zpDataType_t datatype, int bits, int blockSize,
                      zpComm_t comm, cudaStream_t stream);

/* Dequantizes a payload made by zpQuantize with the same count, bits and blockSize into output. */
zpResult_t zpDequantize(const void* payload, void* output, size_t count, zpDataType_t datatype, int bits, int blockSize,
                        zpComm_t comm, cudaStream_t stream);

/* ---------------------------------------------------------------------------------------------------------- */
/* Collectives                                                                                                */

/* qwZ: all-gather of block-quantized shards (the forward weight gather). As ncclAllGather: recvbuff holds
 * nranks*sendcount elements in rank order; in place when sendbuff == recvbuff + rank*sendcount. Each shard
 * travels quantized with the communicator's weightBits and blockSize and is dequantized on arrival: every
 * rank's recvbuff is bit-identical, its own shard included (dequantized values, not the original). */
zpResult_t zpQuantAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, zpDataType_t datatype,
                            zpComm_t comm, cudaStream_t stream);
zpResult_t zpQuantAllGatherEx(const void* sendbuff, void* recvbuff, size_t sendcount, zpDataType_t datatype,
                              const zpQuantOptions_t* options, zpComm_t comm, cudaStream_t stream);

/* hpZ: all-gather inside this rank's hpZ group only (the backward weight gather). sendbuff is the rank's
 * secondary shard of sendcount elements; recvbuff receives hpzSize*sendcount elements in hpZ-rank order.
 * Exact for every type. Memory cost: each rank keeps full/hpzSize elements between forward and backward. */
zpResult_t zpHierAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, zpDataType_t datatype, zpComm_t comm,
                           cudaStream_t stream);
/* As zpHierAllGather. With options->bits 8 or 4 (fp16, bf16, fp32 only) the shards travel block-quantized as
 * in zpQuantAllGather (DeepSpeed's behaviour: every rank's recvbuff holds the dequantized shards, its own
 * included, bit-identical across the group); options NULL or bits 0 keep the exact default. */
zpResult_t zpHierAllGatherEx(const void* sendbuff, void* recvbuff, size_t sendcount, zpDataType_t datatype,
                             const zpQuantOptions_t* options, zpComm_t comm, cudaStream_t stream);

/* Where this rank's secondary shard lies in a full tensor of fullCount elements (as gathered by
 * zpQuantAllGather): elements [*offset, *offset + *count). fullCount must be a multiple of hpzSize. */
zpResult_t zpHierSecondaryShard(size_t fullCount, size_t* offset, size_t* count, zpComm_t comm);

/* qgZ: quantized reduce-scatter by all-to-all (the gradient reduce-scatter). As ncclReduceScatter: sendbuff
 * holds nranks*recvcount elements, rank r receives the reduction of the r-th block; in place when
 * recvbuff == sendbuff + rank*recvcount. op is zpSum or zpAvg (divides by the rank count). Codes use the
 * communicator's gradBits and blockSize. Deterministic. Sums are fp32: a block of the output in which a sum
 * overflows fp32 (or a rank's input block held NaN or Inf) is all NaN, with one hop as with two; a finite sum
 * beyond the output type's range (fp16, bf16) is +-Inf. */
zpResult_t zpQuantReduceScatterA2A(const void* sendbuff, void* recvbuff, size_t recvcount, zpDataType_t datatype,
                                   zpRedOp_t op, zpComm_t comm, cudaStream_t stream);
zpResult_t zpQuantReduceScatterA2AEx(const void* sendbuff, void* recvbuff, size_t recvcount, zpDataType_t datatype,
                                     zpRedOp_t op, const zpQuantOptions_t* options, zpComm_t comm, cudaStream_t stream);

/* ---------------------------------------------------------------------------------------------------------- */
/* Gradient rounding: stochastic rounding and error feedback for qgZ                                          */
/*
 * Stochastic rounding (zpRoundStochastic) replaces the format's round-to-nearest in both of qgZ's quantizations,
 * the sender's and the intermediate requantize of two hops: with v = clamp(x / scale, -qmax, qmax), |v| rounds up
 * when frac(|v|) > (2u + 1) / 2^17 for 16 random bits u, so E[code] = v up to 2^-17 of a step (exact when frac is a
 * multiple of 2^-16). The bits are counter-based, Philox4x32-10 (Random123, cuRAND's curand_Philox4x32_10):
 *   key = (seed, sequence), counter = (j / 8 mod 2^32, (j / 8) >> 32 | hop << 31, slice, rank),
 * for element j of a slice; hop 0 (the sender: slice = destination rank) or 1 (the intermediate rank of two hops:
 * slice = destination node); rank = the quantizing rank; one Philox output gives 8 consecutive elements 16 bits
 * each (element j: bits 16 (j % 2) of word (j % 8) / 2). sequence is the call's number among the communicator's
 * qgZ calls (zpQuantReduceScatterA2A, ...Ex and ...Ex2 alike, every rounding, count 0 included; a call refused by
 * its argument checks does not count, one that the ranks refuse for disagreeing does, on every rank), from 0, mod
 * 2^32: every rank calls collectives in the same order, so it is equal on every rank. Results are deterministic: the
 * same seed, layout and call order give the same bits, on the host backend and the GPU alike; a resumed job that wants
 * fresh draws passes a per-call seed (say, seed + step).
 *
 * Error feedback: the caller keeps, per gradient tensor, a residual of what the last quantization lost and passes
 * it to each call. The sender quantizes x + residual (fp32) and stores residual = (x + residual) - dequantized,
 * rounded to bf16. Layout: the sendbuff's, nranks * recvcount bfloat16 elements, element i for sendbuff[i]; zero
 * it before the first call. bf16 because its 8 significant bits keep every element's error to 2^-8 relative (an
 * int8 residual with a block scale, as LoCo, costs half the bytes but rounds small errors next to a large one to
 * zero), and the kernels read and write it in the pass that reads the gradient, with no second scale.
 * The intermediate requantize of two hops loses a second error, on the rank that sums the node's partials: it is
 * kept there, in a second residual of zpGradHopResidualCount elements (nodes * recvcount, bf16; element
 * b * recvcount + j for element j of destination node b's partial), added to the partial sums before they are
 * requantized. It cannot be folded into the senders' residuals: it belongs to a sum of several senders.
 * Memory: 2 bytes x nranks * recvcount per rank for the residual (the reduce-scatter's input, in bf16), plus
 * 2 bytes x nranks * recvcount / localSize for the hop residual on two-hop layouts.
 * A block that held NaN or Inf (or whose partial sum overflowed) stores a zero residual.
 */

#define ZP_GRAD_OPTIONS_MAGIC 0x7a70676fu /* "zpgo" */

/* Per-call options of zpQuantReduceScatterA2AEx2. Start from ZP_GRAD_OPTIONS_INITIALIZER; a field left as the
 * initializer set it takes the communicator's value or does nothing. size, magic and version as in zpConfig_t. */
typedef struct {
  size_t size;             /* sizeof(zpGradOptions_t), set by the initializer */
  unsigned int magic;      /* ZP_GRAD_OPTIONS_MAGIC, set by the initializer */
  unsigned int version;    /* ZPCCL_VERSION_CODE, set by the initializer */
  int bits;                /* 4 or 8; 0 or ZP_CONFIG_UNDEF_INT: the communicator's gradBits */
  int blockSize;           /* power of two in [32, 8192]; 0 or ZP_CONFIG_UNDEF_INT: the communicator's */
  int rounding;            /* zpRounding_t; ZP_CONFIG_UNDEF_INT: the communicator's gradRounding */
  int seed;                /* >= 0; ZP_CONFIG_UNDEF_INT: the communicator's gradSeed */
  void* residual;          /* error feedback of the sender: NULL (none) or residualCount elements, see above */
  size_t residualCount;    /* elements of residual: nranks * recvcount */
  int residualType;        /* zpBfloat16 (the only type); the initializer sets it */
  void* hopResidual;       /* error feedback of the intermediate hop: NULL (none) or hopResidualCount elements */
  size_t hopResidualCount; /* elements of hopResidual: zpGradHopResidualCount's (0 on one-hop layouts: then
                              hopResidual is not used) */
  int sequence;            /* >= 0: the sequence number of this call's draws, in place of the communicator's (which
                              advances all the same): for a job resumed from a checkpoint, or draws that must not
                              depend on earlier calls. The caller keeps it equal on every rank.
                              ZP_CONFIG_UNDEF_INT: the communicator's */
} zpGradOptions_t;

#define ZP_GRAD_OPTIONS_INITIALIZER                                                                               \
  {                                                                                                               \
    sizeof(zpGradOptions_t), ZP_GRAD_OPTIONS_MAGIC, ZPCCL_VERSION_CODE, ZP_CONFIG_UNDEF_INT, ZP_CONFIG_UNDEF_INT, \
        ZP_CONFIG_UNDEF_INT, ZP_CONFIG_UNDEF_INT, NULL, 0, zpBfloat16, NULL, 0, ZP_CONFIG_UNDEF_INT               \
  }

/* As zpQuantReduceScatterA2A, with gradient options (NULL: as zpQuantReduceScatterA2A): bits and block size,
 * rounding and seed, and the residuals of error feedback (read and rewritten by the call; on the cuda backend
 * device memory of the communicator's GPU, on the host backend host memory). Residuals must not overlap each other,
 * sendbuff or recvbuff. Bad options are zpInvalidArgument naming the field; the communicator stays usable. */
zpResult_t zpQuantReduceScatterA2AEx2(const void* sendbuff, void* recvbuff, size_t recvcount, zpDataType_t datatype,
                                      zpRedOp_t op, const zpGradOptions_t* options, zpComm_t comm, cudaStream_t stream);

/* Elements of the intermediate hop's residual for a call of recvcount: nodes * recvcount on a two-hop layout
 * (several nodes of several ranks, all of equal size), 0 where qgZ takes one hop. */
zpResult_t zpGradHopResidualCount(size_t recvcount, size_t* count, zpComm_t comm);

/* ---------------------------------------------------------------------------------------------------------- */
/* Quantized all-reduce (the gradient all-reduce of DDP and of HSDP's replicate dimension)                    */
/*
 * zpQuantAllReduce(sendbuff, recvbuff, count, ...) is ncclAllReduce with Sum or Avg (which divides by the rank count)
 * on fp16, bf16 or fp32, in place when sendbuff == recvbuff (any other overlap is refused), any count.
 * Backends: both run the two calls below (the host backend with ranks as threads, or as processes through
 * zpCommInitFromTransport). On the cuda backend a count that is not nranks x shardCount goes through a padded copy
 * of nranks x shardCount elements in the communicator's scratch (and of the residual, with error feedback), which
 * zpCommReserve sizes, at the cost of a copy each way.
 *
 * Shards. The tensor is cut into one shard per rank, every shard a whole number of blocks: with G the call's block
 * size and n the rank count, shardCount = ceil(ceil(count / n) / G) * G (zpQuantAllReduceShardCount), and rank r
 * reduces elements [min(r * shardCount, count), min((r + 1) * shardCount, count)): every shard but the last non-empty
 * one holds shardCount elements, later ones none (count 1000, 8 ranks, G 256: ranks 0-2 reduce 256 elements, rank 3
 * 232, ranks 4-7 none). So the blocks of both quantizations are the tensor's own G-element blocks, from its first
 * element, whatever the rank count: a block never straddles two shards, and the rules below hold per block of the
 * tensor. A rank reduces at most G - 1 elements more than count / n (and moves payloads of shardCount elements).
 *
 * Two calls, each planned as a call of its own (host/all_reduce_shards.h, host/coll_plan.h), with the codes of the
 * call's bits (default: the communicator's gradBits):
 * 1. qgZ's reduce-scatter over the shards, as zpQuantReduceScatterA2A with recvcount = shardCount, over the tensor
 *    padded with zeros to n * shardCount elements where count is not n whole shards (zeros change no block's scale
 *    and code to 0: the output's bits are its own elements'): each rank quantizes every destination's part of its
 *    sendbuff, one all-to-all (one node, one rank a node, or uneven nodes) or two (several nodes of L ranks each:
 *    inside the node, fp32 sums of the L contributions requantized, then across nodes), the fp32 sums in a fixed
 *    order, Avg's division, and the rounding to the output type, into the rank's shard of recvbuff.
 * 2. The all-gather of the reduced shards, in qwZ's format (zpQuantAllGather): each rank quantizes its reduced shard
 *    (to nearest, always) and every rank dequantizes every rank's payload into its place, its own included. Where
 *    reduce-scatter took two hops, so does the gather, in the reverse order: an all-gather among the ranks of this
 *    local rank, one a node (the second hop's peers), then an all-gather inside the node of the N payloads each
 *    rank then holds, forwarded as they arrived (never requantized). Each shard enters each other node once, on the
 *    link of its own local rank there, as the second hop's partial sums left it: a node receives n - L payloads
 *    from the network (a ring through the node, n - 1), spread evenly over its L ranks' links, on the same
 *    sub-communicators as qgZ's hops, in N - 1 + L - 1 steps instead of n - 1; the rest moves over the node's own
 *    links. The payloads are bit for bit those of a flat gather, so the output does not depend on the hops.
 * Three quantization round trips at most (sender, intermediate of two hops, gather), whatever the scale.
 *
 * Guarantees: every rank's recvbuff is bit-identical, its own shard included (it holds the dequantized values, not
 * the reduce-scatter's), so replicas never drift apart; deterministic; equal to the host backend's, which is the
 * reference. Gradient rounding (zpQuantAllReduceEx): the options and the rules of qgZ's (above) for the
 * reduce-scatter's quantizations, drawn as qgZ's with recvcount = shardCount (slice = destination rank or node,
 * element j of the slice); all-reduce calls take sequence numbers from the same count as qgZ's calls. The residual
 * has the sendbuff's layout (count elements); the hop residual zpGradHopResidualCount(shardCount) elements. The
 * gather's quantization always rounds to nearest and keeps no residual: every rank must dequantize the same codes.
 *
 * NaN, Inf and overflow, as qgZ (a loss scaler still sees them), per block of G elements of the tensor: a block is
 * all NaN on every rank when some rank's input block held NaN or +-Inf, when some fp32 sum in it overflows, or when
 * some element of the reduced block rounds beyond the output type's range (fp16, bf16: qgZ's +-Inf in that element
 * then makes the gather's block NaN). Every other block is finite.
 *
 * Error bound, per element i of block B, for values in the types' normal ranges: with q = qmax (127 for int8, 7 for
 * int4), S_i the exact sum of the n inputs, A = sum over ranks r of max_{j in B} |x_r[j]| (the sum of the ranks' block
 * maxima), M = max_{j in B} |S_j|, u the unit roundoff of the output type (2^-24 fp32, 2^-11 fp16, 2^-8 bf16), and E
 * the reduce-scatter's bound,
 *   E = A / (2q) with one hop,  E = (A / (2q)) (2 + 1/(2q)) with two hops,
 *   |out_i - S_i| <= E + (M + E) (1/(2q) + 3u) + (n + 1) 2^-16 A
 * (Avg: every term divided by n). E is each sender's half step (absmax / qmax / 2), plus on two hops each partial
 * sum's half step; (M + E) / (2q) is the gather's half step on the reduced block; the u terms are the roundings to
 * the output type, before and after the gather; the last term bounds the fp32 arithmetic (quotients, scales, sums).
 * Below the output type's smallest normal each of the two roundings to it costs up to half its smallest subnormal
 * (2^-150 fp32, 2^-25 fp16, 2^-134 bf16) instead of u: add both, undivided for Avg. With stochastic rounding a code may
 * move a whole step: E doubles (A / q, and (A / q)(2 + 1/q)), unbiased. With error feedback the inputs are
 * x + residual.
 */

/* zpQuantAllReduce: the quantized all-reduce above. sendbuff and recvbuff hold count elements; op is zpSum or zpAvg;
 * codes of the communicator's gradBits and blockSize. */
zpResult_t zpQuantAllReduce(const void* sendbuff, void* recvbuff, size_t count, zpDataType_t datatype, zpRedOp_t op,
                            zpComm_t comm, cudaStream_t stream);
/* As zpQuantAllReduce, with per-call options (NULL: as zpQuantAllReduce): zpGradOptions_t's bits and block size,
 * rounding, seed and sequence, and the residuals of error feedback (residualCount = count; hopResidualCount =
 * zpGradHopResidualCount(shardCount)), all as zpQuantReduceScatterA2AEx2 takes them. One struct carries the codes and
 * the gradient rounding alike (versioned, so it grows without a further variant). Bad options are zpInvalidArgument
 * naming the field; the communicator stays usable. */
zpResult_t zpQuantAllReduceEx(const void* sendbuff, void* recvbuff, size_t count, zpDataType_t datatype, zpRedOp_t op,
                              const zpGradOptions_t* options, zpComm_t comm, cudaStream_t stream);

/* Elements of a full shard of zpQuantAllReduce for count elements with blocks of blockSize (0: the communicator's):
 * ceil(ceil(count / nranks) / blockSize) * blockSize; rank r reduces elements [min(r * shardCount, count),
 * min((r + 1) * shardCount, count)). */
zpResult_t zpQuantAllReduceShardCount(size_t count, int blockSize, size_t* shardCount, zpComm_t comm);

#ifdef __cplusplus
}
#endif

#endif /* ZPCCL_H_ */
