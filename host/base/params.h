// Every environment tunable of zpccl, declared once with its default, its valid range and a line of help. Each
// is read on first use and cached; a value that is set is logged (INFO ENV); one that is not an integer or lies
// outside the range is refused with a warning saying which, and the default used. Waits in milliseconds are
// declared apart (ZP_WAIT_PARAMS) and read alike: any value from 0 to INT64_MAX is taken, 0 meaning "never time
// out", and the longest (0 included) are clamped to kMaxWaitMs.
#pragma once

#include <cstdint>
#include <string>

namespace zp {

// The longest wait a millisecond tunable gives: 1e12 ms, about 31.7 years, i.e. "forever". A larger value (users
// write INT64_MAX for "never time out") is taken as this one: waits compute steady_clock::now() +
// milliseconds(value) in int64 nanoseconds, which overflows from INT64_MAX / 1e6 ms (about 9.2e12) and wraps to a
// deadline in the past, so the wait would fail at once instead of lasting forever. 1e12 ms is 1e18 ns, which
// leaves room for any clock's epoch offset (system_clock counts ~1.8e18 ns since 1970) before INT64_MAX.
constexpr int64_t kMaxWaitMs = 1000000000000;

// Waits in milliseconds: X(name, env, default, help), valid in [0, INT64_MAX], 0 meaning never, clamped to
// kMaxWaitMs.
#define ZP_WAIT_PARAMS(X)                                                                                      \
  X(InitTimeoutMs, "ZP_INIT_TIMEOUT_MS", 120000,                                                               \
    "Host backend: how long zpCommInitRank waits for all thread-ranks to join before failing (0: never)")      \
  X(HostTimeoutMs, "ZP_HOST_TIMEOUT_MS", 600000,                                                               \
    "Host backend: how long a collective waits for its peers before failing with zpRemoteError (0: never)")    \
  X(TimeoutMs, "ZP_TIMEOUT_MS", 600000,                                                                        \
    "cuda backend: how long a collective may stay unfinished after its enqueue before the watchdog stops the " \
    "communicator's work and reports zpRemoteError (0: never; NCCL errors are still reported)")

// Every other tunable: X(name, env, default, lo, hi, help), valid in [lo, hi].
#define ZP_PARAMS(X)                                                                                                 \
  X(PipelineChunkBytes, "ZP_CHUNK_BYTES", 0, 0, INT64_MAX,                                                           \
    "cuda backend: logical bytes per pipeline chunk of the quantized collectives (0: chosen by size)")               \
  X(PipelineMaxChunks, "ZP_MAX_CHUNKS", 8, 1, 16, "cuda backend: most pipeline chunks per collective call")          \
  X(PipelineChunkRamp, "ZP_CHUNK_RAMP", 0, 0, 1,                                                                     \
    "cuda backend: 1 makes a pipeline's first and last chunks half the others (when it has three or more) "          \
    "to shorten its exposed ends; 0 (default): equal chunks")                                                        \
  X(TracePipeline, "ZP_TRACE_PIPELINE", 0, 0, 1,                                                                     \
    "cuda backend: time every stage of every chunk of the quantized collectives and log it (INFO COLL), "            \
    "with the overlap achieved; each call then waits for itself on the host: for diagnosis only")                    \
  X(NetChannelsPerPeer, "ZP_NET_CHANNELS_PER_PEER", 0, 0, 32,                                                        \
    "cuda backend: NCCL channels per network peer for the point-to-point exchanges of the communicators "            \
    "zpccl creates (ncclConfig_t.nChannelsPerNetPeer; 0: NCCL's default)")                                           \
  X(NcclMinCtas, "ZP_NCCL_MIN_CTAS", 0, 0, 64,                                                                       \
    "cuda backend: the fewest CTAs (channels) NCCL uses for the communicators zpccl creates "                        \
    "(ncclConfig_t.minCTAs; 0: NCCL's default), whatever the link: for experiments with the channels of "            \
    "zpccl's payloads, which are smaller than the bf16 baseline's (one node over host shared memory: "               \
    "ZP_SHM_MIN_CTAS)")                                                                                              \
  X(ShmMinCtas, "ZP_SHM_MIN_CTAS", 16, 0, 64,                                                                        \
    "cuda backend: on one node whose GPUs talk through host shared memory (NCCL_P2P_DISABLE set, "                   \
    "NCCL_SHM_DISABLE not), the fewest CTAs (channels) NCCL uses for zpccl's transfers (0: NCCL's "                  \
    "choice). More channels move the quantized payloads faster (perf/RESULTS.md)")                                   \
  X(PairAllGather, "ZP_PAIR_ALLGATHER", 2, 0, 2,                                                                     \
    "cuda backend: how qgZ exchanges slots between two ranks: 2 (default) as one ncclAllGather when they "           \
    "are on different nodes (NCCL's sockets run it at ring speed, point-to-point at ~2/3) or share host "            \
    "memory with ZP_SHM_MIN_CTAS channels (the gather gets them, point-to-point does not), else by "                 \
    "ncclSend/ncclRecv (faster over NVLink); 1: always the all-gather; 0: never (perf/RESULTS.md)")                  \
  X(NcclSms, "ZP_NCCL_SMS", 32, 0, 1024,                                                                             \
    "cuda backend: SMs that the quantized gathers' own kernels (qwZ, hpZ with bits) leave free for NCCL's "          \
    "while both run: their quantize and dequantize stages run in a green context of the other SMs "                  \
    "(default 32, measured fastest over NVLink, perf/RESULTS.md; 0: no green context, every SM)")                    \
  X(DirectMinBytes, "ZP_DIRECT_MIN_BYTES", 0, -1, INT64_MAX,                                                         \
    "cuda backend: logical bytes from which qwZ and one-hop qgZ read the peers' payloads straight from "             \
    "their memory when every rank can (one NVLink domain: NCCL's load/store-accessible team, NCCL P2P not "          \
    "disabled), instead of moving them with NCCL (default 0, every size: measured faster from 1 MiB up, "            \
    "perf/RESULTS.md); -1: never (src/cuda/peer_window.h)")                                                          \
  X(DirectInlineWaitBytes, "ZP_DIRECT_INLINE_WAIT_BYTES", 4 << 20, 0, INT64_MAX,                                     \
    "cuda backend: direct-load calls up to this many logical bytes wait for the peers inside their two "             \
    "kernels, on grids of a quarter of the device, instead of in two extra one-thread kernels: two launches fewer, " \
    "which is most of a small call's time (device/peer_sync.h)")                                                     \
  X(OwnSlotEarlyBytes, "ZP_OWN_SLOT_EARLY_BYTES", 16 << 20, -1, INT64_MAX,                                           \
    "cuda backend: over slow links (host shared memory, sockets), from this many logical bytes the slot that "       \
    "never crosses the link is worked while the others travel: qwZ dequantizes its own shard during the gather, "    \
    "one-hop qgZ quantizes the slice it keeps during the exchange (-1: never)")                                      \
  X(GradRounding, "ZP_GRAD_ROUNDING", 0, 0, 1,                                                                       \
    "qgZ's rounding where the config leaves zpConfig_t.gradRounding unset: 0 to nearest (default), 1 stochastic "    \
    "(include/zpccl.h, Gradient rounding)")                                                                          \
  X(GradSeed, "ZP_GRAD_SEED", 0, 0, INT32_MAX,                                                                       \
    "the seed of qgZ's stochastic rounding where the config leaves zpConfig_t.gradSeed unset (default 0)")

#define ZP_DECLARE_PARAM(name, ...) int64_t param##name();
ZP_WAIT_PARAMS(ZP_DECLARE_PARAM)
ZP_PARAMS(ZP_DECLARE_PARAM)
#undef ZP_DECLARE_PARAM

// What a tunable's text gives: its value, and the warning when the text was refused ("" when taken or unset).
struct ParamReading {
  int64_t value;
  std::string warning;
};
// The value of tunable `env` given its text (nullptr when unset): the integer, or `def` when unset, not an integer
// (C syntax: decimal, 0x hex, 0 octal) or outside [lo, hi] (also beyond int64), the last two with a warning.
ParamReading readParamText(const char* env, const char* text, int64_t def, int64_t lo, int64_t hi);
// readParamText's value, its warning logged.
int64_t parseParam(const char* env, const char* text, int64_t def, int64_t lo, int64_t hi);
// parseParam for a wait in milliseconds: valid in [0, INT64_MAX] (negative: refused, the default used); 0 and
// every value above kMaxWaitMs are taken as kMaxWaitMs (logged, INFO ENV).
int64_t parseWaitParam(const char* env, const char* text, int64_t def);
// What tunable `env` reads from the environment now (param<Name>() caches this at its first call): true and
// *value, or false when `env` names no tunable. For tests, which set a variable after the cache may be filled.
bool readParam(const char* env, int64_t* value);

// How NCCL reads its on/off variables (NCCL_P2P_DISABLE, NCCL_SHM_DISABLE): set to a number other than 0.
bool ncclSwitchOn(const char* value);

// ZP_BACKEND: "cuda" or "host" overrides zpBackendDefault's choice; empty when unset.
const std::string& paramBackend();

}  // namespace zp
