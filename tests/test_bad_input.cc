// Bad input to every call of include/zpccl.h on the host backend, as one table: each row makes one call with
// one bad argument and states the code it must return and what its message must name (the call and the
// argument). One test body runs the rows on the communicator their layout needs (1 rank for most, 2 ranks or an
// uneven 3-rank layout where the check depends on it) and, after every row, makes a good zpQuantAllGather on
// the same communicator: it must succeed, give the reference result and leave zpGetLastError(comm) "", so a
// refused call never leaves the communicator unusable.
//
// What the rows cover: NULL, destroyed (dangling), garbage (a stack buffer) and forged (a stack buffer that
// starts with the live-communicator magic) handles; out-of-range enums as a ctypes caller can pass them (-1,
// 12, 99, INT_MAX); counts whose derived sizes overflow size_t (SIZE_MAX, SIZE_MAX/2, SIZE_MAX/16+1,
// SIZE_MAX/nranks+1); counts whose byte sizes cross 2^31 and 2^32, which the size checks must accept (these
// rows fail on another argument, never on "overflow", and never touch memory); misaligned buffers; send and
// receive buffers overlapping other than in NCCL's in-place layout; a non-NULL stream; bits and block sizes out
// of the format; hpZ on an uneven layout; reduction ops other than Sum and Avg; bad init arguments and config
// fields (the size/magic/version header too). The cuda backend's own buffer checks (host pointers, another GPU's
// memory) are in test_bad_input_gpu.cc.
#include <gtest/gtest.h>

#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "host/quant_format.h"
#include "host/quant_ref.h"
#include "include/zpccl.h"
#include "src/comm.h"
#include "tests/buffer_calls.h"
#include "tests/collective_check.h"
#include "tests/host_ranks.h"

namespace {

using zpcheck::Buffer;
using zpcheck::mentions;

// ---- where a row runs and what it gets ---------------------------------------------------------------------

// The communicators of the rows. kTwo: 2 ranks on one node. kUneven: 3 ranks, nodes {0, 1} and {2} by nodeId.
enum class Layout { kOne, kTwo, kUneven };

int ranksOf(Layout layout) { return layout == Layout::kOne ? 1 : layout == Layout::kTwo ? 2 : 3; }

const char* layoutName(Layout layout) {
  return layout == Layout::kOne ? "1 rank" : layout == Layout::kTwo ? "2 ranks, one node" : "3 ranks, uneven nodes";
}

void configure(Layout layout, int rank, zpConfig_t* c) {
  if (layout == Layout::kTwo) c->ranksPerNode = 2;
  if (layout == Layout::kUneven) c->nodeId = rank < 2 ? 0 : 1;
}

// Where a row's message lands: the communicator's last error, or the thread's (calls without a live
// communicator: init, bad handles, calls that take none).
enum class Msg { kComm, kThread };

constexpr size_t kCount = 64;        // elements of the rows' valid buffers (fp32)
constexpr size_t kBufBytes = 16384;  // every buffer of a rank, 64-byte aligned
constexpr size_t kGib = size_t{1} << 30;

// What a row's call gets: the rank, its communicator and its buffers (poisoned, never read by a refused call).
struct Ctx {
  int rank = 0;
  int nranks = 1;
  zpComm_t comm = nullptr;
  unsigned char* send = nullptr;
  unsigned char* recv = nullptr;
  unsigned char* payload = nullptr;
  unsigned char* area = nullptr;  // for overlapping buffers
};

struct Row {
  std::string name;
  Layout layout;
  std::function<zpResult_t(const Ctx&)> call;
  zpResult_t code;
  std::vector<std::string> mention;  // substrings the message must hold: the call, the argument, the fault
  Msg where = Msg::kComm;
  std::vector<std::string> absent = {};  // substrings it must not hold (a size check that misfired)
  // A defect found by this suite and reported (a misnamed argument, an output left unset): its symptom (a
  // missing substring, a tRowProblem) is printed, not failed, until the library is fixed; the code is still
  // checked.
  const char* knownIssue = nullptr;
};

// The communicator's queries of one int, by name, with the name of their output argument in zpccl.h.
struct IntQuery {
  const char* name;
  zpResult_t (*fn)(const zpComm_t, int*);
  const char* arg;
};
const IntQuery kIntQueries[] = {
    {"zpCommCount", zpCommCount, "count"},
    {"zpCommUserRank", zpCommUserRank, "rank"},
    {"zpCommCuDevice", zpCommCuDevice, "device"},
    {"zpCommNodeCount", zpCommNodeCount, "nodes"},
    {"zpCommNodeRank", zpCommNodeRank, "node"},
    {"zpCommLocalRank", zpCommLocalRank, "localRank"},
    {"zpCommLocalSize", zpCommLocalSize, "localSize"},
    {"zpCommHpzRank", zpCommHpzRank, "hpzRank"},
    {"zpCommHpzSize", zpCommHpzSize, "hpzSize"},
};

// ---- the calls with a bad argument -------------------------------------------------------------------------

using zptest::Call;
using zptest::kCalls;
using zptest::nameOf;
using zptest::recvIsPayload;
using zptest::recvName;
using zptest::rowName;
using zptest::sendIsPayload;
using zptest::sendName;
// Quantized with the good arguments (hpZ is exact unless its Ex options ask for bits).
bool quantized(Call call) { return call != Call::kHpz && call != Call::kHpzEx; }
bool isHpz(Call call) { return call == Call::kHpz || call == Call::kHpzEx; }
bool isQgz(Call call) { return call == Call::kQgz || call == Call::kQgzEx; }
bool hasOptions(Call call) { return call == Call::kQwzEx || call == Call::kHpzEx || call == Call::kQgzEx; }
bool standalone(Call call) { return call == Call::kQuantize || call == Call::kDequantize; }

// Every argument of one call; enums as ints, as a C or ctypes caller passes them.
struct Args {
  const void* send;
  void* recv;
  size_t count = kCount;
  int type = zpFloat32;
  int op = zpSum;
  int bits = 8;
  int blockSize = 256;
  const zpQuantOptions_t* options = nullptr;
  zpComm_t comm;
  cudaStream_t stream = nullptr;
};

// A valid call on this rank's buffers (qgZ and the all-gathers size their buffers for the rank count).
Args goodArgs(Call call, const Ctx& c) {
  Args a;
  a.send = sendIsPayload(call) ? c.payload : c.send;
  a.recv = recvIsPayload(call) ? c.payload : c.recv;
  a.comm = c.comm;
  return a;
}

zpResult_t invoke(Call call, const Args& a) {
  // The enums are cast in the call itself: a C++ enum variable holding an out-of-range value would already be
  // undefined behaviour here (a C caller's int is not).
#define ZP_TYPE static_cast<zpDataType_t>(a.type)
#define ZP_OP static_cast<zpRedOp_t>(a.op)
  switch (call) {
    case Call::kQuantize:
      return zpQuantize(a.send, a.recv, a.count, ZP_TYPE, a.bits, a.blockSize, a.comm, a.stream);
    case Call::kDequantize:
      return zpDequantize(a.send, a.recv, a.count, ZP_TYPE, a.bits, a.blockSize, a.comm, a.stream);
    case Call::kQwz:
      return zpQuantAllGather(a.send, a.recv, a.count, ZP_TYPE, a.comm, a.stream);
    case Call::kQwzEx:
      return zpQuantAllGatherEx(a.send, a.recv, a.count, ZP_TYPE, a.options, a.comm, a.stream);
    case Call::kHpz:
      return zpHierAllGather(a.send, a.recv, a.count, ZP_TYPE, a.comm, a.stream);
    case Call::kHpzEx:
      return zpHierAllGatherEx(a.send, a.recv, a.count, ZP_TYPE, a.options, a.comm, a.stream);
    case Call::kQgz:
      return zpQuantReduceScatterA2A(a.send, a.recv, a.count, ZP_TYPE, ZP_OP, a.comm, a.stream);
    case Call::kQgzEx:
      return zpQuantReduceScatterA2AEx(a.send, a.recv, a.count, ZP_TYPE, ZP_OP, a.options, a.comm, a.stream);
  }
#undef ZP_TYPE
#undef ZP_OP
  return zpInternalError;
}

// A row of `call` whose arguments are the good ones changed by edit.
std::function<zpResult_t(const Ctx&)> edited(Call call, std::function<void(const Ctx&, Args*)> edit) {
  return [call, edit](const Ctx& c) {
    Args a = goodArgs(call, c);
    edit(c, &a);
    return invoke(call, a);
  };
}

// ---- bad communicator handles ------------------------------------------------------------------------------

enum class Handle { kNull, kDangling, kGarbage, kForged };
const Handle kHandles[] = {Handle::kNull, Handle::kDangling, Handle::kGarbage, Handle::kForged};

const char* handleName(Handle h) {
  switch (h) {
    case Handle::kNull:
      return "NULL comm";
    case Handle::kDangling:
      return "destroyed comm";
    case Handle::kGarbage:
      return "garbage comm";
    default:
      return "forged comm";
  }
}

// A live one-rank host communicator.
zpComm_t oneRankComm() {
  zpUniqueId id;
  zpConfig_t config = ZP_CONFIG_INITIALIZER;
  config.backend = zpBackendHost;
  zpComm_t comm = nullptr;
  EXPECT_EQ(zpGetUniqueId(&id), zpSuccess);
  EXPECT_EQ(zpCommInitRankConfig(&comm, 1, id, 0, &config), zpSuccess) << zpGetLastError(nullptr);
  return comm;
}

// A communicator created and destroyed at once: its handle dangles.
zpComm_t destroyedComm() {
  zpComm_t comm = oneRankComm();
  EXPECT_EQ(zpCommDestroy(comm), zpSuccess);
  return comm;
}

// Runs f with a bad handle of kind h; garbage lives on this stack frame.
zpResult_t withHandle(Handle h, const std::function<zpResult_t(zpComm_t)>& f) {
  alignas(64) unsigned char garbage[1024];
  std::memset(garbage, 0xab, sizeof(garbage));
  switch (h) {
    case Handle::kNull:
      return f(nullptr);
    case Handle::kDangling:
      return f(destroyedComm());
    case Handle::kGarbage:
      return f(reinterpret_cast<zpComm_t>(garbage));
    case Handle::kForged: {
      // Shaped like the handles the registry hands out (a live one's, far ahead in the series), never handed out.
      static const zpComm_t live = oneRankComm();  // kept for the whole run
      return f(reinterpret_cast<zpComm_t>(reinterpret_cast<uintptr_t>(live) + (uintptr_t{1} << 40)));
    }
  }
  return zpInternalError;
}

// Every call that takes a communicator, made with `comm` and otherwise valid arguments.
struct CommCall {
  std::string name;     // of the row
  std::string message;  // as messages name the call
  std::function<zpResult_t(const Ctx&, zpComm_t)> call;
};

std::vector<CommCall> commCalls() {
  std::vector<CommCall> calls = {
      {"zpCommDestroy", "zpCommDestroy", [](const Ctx&, zpComm_t comm) { return zpCommDestroy(comm); }},
      {"zpCommAbort", "zpCommAbort", [](const Ctx&, zpComm_t comm) { return zpCommAbort(comm); }},
      {"zpCommGetAsyncError", "zpCommGetAsyncError",
       [](const Ctx&, zpComm_t comm) {
         zpResult_t async;
         return zpCommGetAsyncError(comm, &async);
       }},
      {"zpCommReserve", "zpCommReserve", [](const Ctx&, zpComm_t comm) { return zpCommReserve(comm, 1 << 20); }},
      {"zpCommBackend", "zpCommBackend",
       [](const Ctx&, zpComm_t comm) {
         zpBackend_t backend;
         return zpCommBackend(comm, &backend);
       }},
      {"zpHierSecondaryShard", "zpHierSecondaryShard",
       [](const Ctx&, zpComm_t comm) {
         size_t offset, count;
         return zpHierSecondaryShard(kCount, &offset, &count, comm);
       }},
  };
  for (const IntQuery& q : kIntQueries) {
    calls.push_back({q.name, q.name, [fn = q.fn](const Ctx&, zpComm_t comm) {
                       int value;
                       return fn(comm, &value);
                     }});
  }
  for (Call call : kCalls) {
    calls.push_back({rowName(call), nameOf(call), [call](const Ctx& c, zpComm_t comm) {
                       Args a = goodArgs(call, c);
                       a.comm = comm;
                       return invoke(call, a);
                     }});
  }
  return calls;
}

// ---- init --------------------------------------------------------------------------------------------------

// A violation a row's call found besides its code and message (failed like a missing substring).
thread_local std::string tRowProblem;

// zpCommInitRankConfig with nranks ranks (a refused init returns before waiting for peers); a communicator made
// by mistake is destroyed, and a refused one must leave *comm NULL.
zpResult_t initConfig(int nranks, int rank, const std::function<void(zpConfig_t*)>& edit) {
  zpUniqueId id;
  EXPECT_EQ(zpGetUniqueId(&id), zpSuccess);
  zpConfig_t config = ZP_CONFIG_INITIALIZER;
  config.backend = zpBackendHost;
  if (edit) edit(&config);
  zpComm_t comm = reinterpret_cast<zpComm_t>(static_cast<uintptr_t>(0x1));  // poisoned
  const zpResult_t res = zpCommInitRankConfig(&comm, nranks, id, rank, &config);
  if (res == zpSuccess) {
    zpCommDestroy(comm);
  } else if (comm != nullptr) {
    tRowProblem = "a refused init left *comm unchanged instead of NULL";
  }
  return res;
}

zpResult_t initPlain(int nranks, int rank) {
  zpUniqueId id;
  EXPECT_EQ(zpGetUniqueId(&id), zpSuccess);
  zpComm_t comm = reinterpret_cast<zpComm_t>(static_cast<uintptr_t>(0x1));
  const zpResult_t res = zpCommInitRank(&comm, nranks, id, rank);
  if (res == zpSuccess) {
    zpCommDestroy(comm);
  } else if (comm != nullptr) {
    tRowProblem = "a refused init left *comm unchanged instead of NULL";
  }
  return res;
}

struct ConfigEdit {
  std::string name;
  std::function<void(zpConfig_t*)> edit;
  zpResult_t code;
  const char* field;
  bool needsRankCount = false;  // refused only against the rank count (a positive ranksPerNode not dividing it)
};

std::vector<ConfigEdit> configEdits() {
  std::vector<ConfigEdit> edits = {
      {"magic 0", [](zpConfig_t* c) { c->magic = 0; }, zpInvalidArgument, "magic"},
      {"magic ~", [](zpConfig_t* c) { c->magic = ~ZP_CONFIG_MAGIC; }, zpInvalidArgument, "magic"},
      {"size 0", [](zpConfig_t* c) { c->size = 0; }, zpInvalidArgument, "size"},
      {"size +8", [](zpConfig_t* c) { c->size = sizeof(zpConfig_t) + 8; }, zpInvalidArgument, "size"},
      {"size SIZE_MAX", [](zpConfig_t* c) { c->size = SIZE_MAX; }, zpInvalidArgument, "size"},
      // A 0.2 config of the 0.1 layout's size (and the reverse) is a caller built against another header.
      {"size of 0.1", [](zpConfig_t* c) { c->size = offsetof(zpConfig_t, gradRounding); }, zpInvalidArgument, "size"},
      {"version 100 with this size", [](zpConfig_t* c) { c->version = 100; }, zpInvalidArgument, "size"},
      {"ranksPerNode and nodeId", [](zpConfig_t* c) { c->ranksPerNode = 1, c->nodeId = 0; }, zpInvalidArgument,
       "nodeId"},
      {"hpzSize 2 over ranksPerNode 1", [](zpConfig_t* c) { c->ranksPerNode = 1, c->hpzSize = 2; }, zpInvalidArgument,
       "hpzSize"},
      {"blocking 0", [](zpConfig_t* c) { c->blocking = 0; }, zpInvalidUsage, "config->blocking"},
  };
  // version: a newer header's (the next patch, minor, major), or garbage (below 0.1.0, the first release).
  for (unsigned v : {ZPCCL_VERSION_CODE + 1u, ZPCCL_VERSION_CODE + 100u, ZPCCL_VERSION_CODE + 10000u, UINT_MAX, 0u, 1u,
                     99u, 0x80000000u}) {
    edits.push_back(
        {"version " + std::to_string(v), [v](zpConfig_t* c) { c->version = v; }, zpInvalidArgument, "config->version"});
  }
  struct IntField {
    const char* name;
    int zpConfig_t::*field;
    std::vector<int> bad;
    const char* mention;
  };
  const IntField fields[] = {
      {"backend", &zpConfig_t::backend, {-1, 3, 99, INT_MAX, INT_MIN + 1}, "config->backend"},
      {"ranksPerNode", &zpConfig_t::ranksPerNode, {0, -1, 3, INT_MAX}, "config->ranksPerNode"},
      {"nodeId", &zpConfig_t::nodeId, {-1, INT_MIN + 1}, "config->nodeId"},
      {"hpzSize", &zpConfig_t::hpzSize, {0, -1, INT_MIN + 1}, "config->hpzSize"},
      {"weightBits", &zpConfig_t::weightBits, {0, 3, 16, -1, INT_MAX}, "config->weightBits"},
      {"gradBits", &zpConfig_t::gradBits, {0, 3, 16, -8}, "config->gradBits"},
      {"blockSize", &zpConfig_t::blockSize, {0, 16, 48, 16384, -256, INT_MAX}, "config->blockSize"},
      {"blocking", &zpConfig_t::blocking, {2, -1}, "config->blocking"},
      {"gradRounding", &zpConfig_t::gradRounding, {2, -1, 99, INT_MAX}, "config->gradRounding"},
      {"gradSeed", &zpConfig_t::gradSeed, {-1, INT_MIN + 1}, "config->gradSeed"},
  };
  for (const IntField& f : fields) {
    for (int v : f.bad) {
      const auto member = f.field;
      edits.push_back({std::string(f.name) + " " + std::to_string(v), [member, v](zpConfig_t* c) { c->*member = v; },
                       zpInvalidArgument, f.mention, member == &zpConfig_t::ranksPerNode && v > 0});
    }
  }
  return edits;
}

// ---- the table ---------------------------------------------------------------------------------------------

const char* kBadNames[] = {"-1", "12", "99", "INT_MAX"};
const int kBadEnums[] = {-1, 12, 99, INT_MAX};

std::vector<Row> table() {
  std::vector<Row> rows;
  auto add = [&](Row row) { rows.push_back(std::move(row)); };
  const Layout one = Layout::kOne, two = Layout::kTwo;
  const zpResult_t bad = zpInvalidArgument;

  // Calls that need no communicator.
  add({"zpGetVersion NULL",
       one,
       [](const Ctx&) { return zpGetVersion(nullptr); },
       bad,
       {"zpGetVersion", "version"},
       Msg::kThread});
  add({"zpGetUniqueId NULL",
       one,
       [](const Ctx&) { return zpGetUniqueId(nullptr); },
       bad,
       {"zpGetUniqueId", "uniqueId"},
       Msg::kThread});
  add({"zpQuantPayloadSize NULL bytes",
       one,
       [](const Ctx&) { return zpQuantPayloadSize(100, 8, 256, nullptr); },
       bad,
       {"zpQuantPayloadSize", "bytes"},
       Msg::kThread});
  for (int bits : {0, 3, 16, -1, INT_MAX}) {
    add({"zpQuantPayloadSize bits " + std::to_string(bits),
         one,
         [bits](const Ctx&) {
           size_t bytes;
           return zpQuantPayloadSize(100, bits, 256, &bytes);
         },
         bad,
         {"zpQuantPayloadSize", "bits"},
         Msg::kThread});
  }
  for (int block : {0, 16, 48, 16384, -32, INT_MIN}) {
    add({"zpQuantPayloadSize blockSize " + std::to_string(block),
         one,
         [block](const Ctx&) {
           size_t bytes;
           return zpQuantPayloadSize(100, 8, block, &bytes);
         },
         bad,
         {"zpQuantPayloadSize", "blockSize"},
         Msg::kThread});
  }
  for (size_t count : {SIZE_MAX, SIZE_MAX / 2, SIZE_MAX / 16 + 1}) {
    add({"zpQuantPayloadSize count " + std::to_string(count),
         one,
         [count](const Ctx&) {
           size_t bytes;
           return zpQuantPayloadSize(count, 4, 32, &bytes);
         },
         bad,
         {"zpQuantPayloadSize", "count", "overflow"},
         Msg::kThread});
  }

  // Init.
  add({"zpCommInitRank NULL comm",
       one,
       [](const Ctx&) {
         zpUniqueId id;
         zpGetUniqueId(&id);
         return zpCommInitRank(nullptr, 1, id, 0);
       },
       bad,
       {"zpCommInitRank", "comm is NULL"},
       Msg::kThread});
  add({"zpCommInitRankConfig NULL comm",
       one,
       [](const Ctx&) {
         zpUniqueId id;
         zpGetUniqueId(&id);
         zpConfig_t config = ZP_CONFIG_INITIALIZER;
         return zpCommInitRankConfig(nullptr, 1, id, 0, &config);
       },
       bad,
       {"zpCommInitRankConfig", "comm is NULL"},
       Msg::kThread});
  for (int nranks : {0, -1, INT_MIN}) {
    add({"zpCommInitRank nranks " + std::to_string(nranks),
         one,
         [nranks](const Ctx&) { return initPlain(nranks, 0); },
         bad,
         {"zpCommInitRank", "nranks"},
         Msg::kThread,
         {}});
    add({"zpCommInitRankConfig nranks " + std::to_string(nranks),
         one,
         [nranks](const Ctx&) { return initConfig(nranks, 0, nullptr); },
         bad,
         {"zpCommInitRankConfig", "nranks"},
         Msg::kThread,
         {}});
  }
  for (int rank : {-1, 2, INT_MAX, INT_MIN}) {
    add({"zpCommInitRank rank " + std::to_string(rank) + " of 2",
         one,
         [rank](const Ctx&) { return initPlain(2, rank); },
         bad,
         {"zpCommInitRank", "rank"},
         Msg::kThread,
         {}});
    add({"zpCommInitRankConfig rank " + std::to_string(rank) + " of 2",
         one,
         [rank](const Ctx&) { return initConfig(2, rank, nullptr); },
         bad,
         {"zpCommInitRankConfig", "rank"},
         Msg::kThread,
         {}});
  }
  for (const ConfigEdit& e : configEdits()) {
    const auto edit = e.edit;
    add({"zpCommInitRankConfig config " + e.name,
         one,
         [edit](const Ctx&) { return initConfig(1, 0, edit); },
         e.code,
         {"zpCommInitRankConfig", e.field},
         Msg::kThread});
  }
  add({"zpCommInitFromNccl NULL comm",
       one,
       [](const Ctx&) {
         alignas(64) unsigned char fake[256] = {};
         return zpCommInitFromNccl(nullptr, reinterpret_cast<ncclComm*>(fake), nullptr);
       },
       bad,
       {"zpCommInitFromNccl", "comm is NULL"},
       Msg::kThread});
  add({"zpCommInitFromNccl NULL ncclComm",
       one,
       [](const Ctx&) {
         zpComm_t comm = reinterpret_cast<zpComm_t>(static_cast<uintptr_t>(0x1));
         const zpResult_t res = zpCommInitFromNccl(&comm, nullptr, nullptr);
         EXPECT_EQ(comm, nullptr);
         return res;
       },
       bad,
       {"zpCommInitFromNccl", "ncclComm"},
       Msg::kThread});
  // Refused on the config before the (fake) NCCL communicator is touched.
  add({"zpCommInitFromNccl host backend",
       one,
       [](const Ctx&) {
         alignas(64) unsigned char fake[256] = {};
         zpConfig_t config = ZP_CONFIG_INITIALIZER;
         config.backend = zpBackendHost;
         zpComm_t comm = nullptr;
         return zpCommInitFromNccl(&comm, reinterpret_cast<ncclComm*>(fake), &config);
       },
       bad,
       {"zpCommInitFromNccl", "config->backend"},
       Msg::kThread});
  // The config is checked whole before NCCL is asked anything: a 0.1 config asking for the host backend (its layout
  // is still accepted, so its backend must not be ignored), and a config with a bad header.
  add({"zpCommInitFromNccl host backend in a 0.1 config",
       one,
       [](const Ctx&) {
         alignas(64) unsigned char fake[256] = {};
         zpConfig_t config = ZP_CONFIG_INITIALIZER;
         config.version = 100;
         config.size = offsetof(zpConfig_t, gradRounding);
         config.backend = zpBackendHost;
         zpComm_t comm = nullptr;
         return zpCommInitFromNccl(&comm, reinterpret_cast<ncclComm*>(fake), &config);
       },
       bad,
       {"zpCommInitFromNccl", "config->backend host"},
       Msg::kThread});
  for (const ConfigEdit& e : configEdits()) {
    if (e.needsRankCount) continue;  // NCCL's communicator gives the rank count
    const auto edit = e.edit;
    add({"zpCommInitFromNccl config " + e.name,
         one,
         [edit](const Ctx&) {
           alignas(64) unsigned char fake[256] = {};
           zpConfig_t config = ZP_CONFIG_INITIALIZER;
           edit(&config);
           zpComm_t comm = reinterpret_cast<zpComm_t>(static_cast<uintptr_t>(0x1));
           const zpResult_t res = zpCommInitFromNccl(&comm, reinterpret_cast<ncclComm*>(fake), &config);
           if (comm != nullptr) tRowProblem = "a refused init left *comm unchanged instead of NULL";
           return res;
         },
         e.code,
         {"zpCommInitFromNccl", e.field},
         Msg::kThread,
         {"ncclComm"}});
  }

  // Bad handles, to every call that takes a communicator.
  for (const CommCall& cc : commCalls()) {
    for (Handle h : kHandles) {
      const auto call = cc.call;
      add({cc.name + " " + handleName(h),
           one,
           [call, h](const Ctx& c) { return withHandle(h, [&](zpComm_t comm) { return call(c, comm); }); },
           bad,
           {cc.message, "comm"},
           Msg::kThread});
    }
  }

  // NULL outputs of the calls that take a live communicator.
  add({"zpCommGetAsyncError NULL asyncError",
       one,
       [](const Ctx& c) { return zpCommGetAsyncError(c.comm, nullptr); },
       bad,
       {"zpCommGetAsyncError", "asyncError"}});
  add({"zpCommBackend NULL",
       one,
       [](const Ctx& c) { return zpCommBackend(c.comm, nullptr); },
       bad,
       {"zpCommBackend : backend is NULL"}});
  for (const IntQuery& q : kIntQueries) {
    add({std::string(q.name) + " NULL",
         one,
         [fn = q.fn](const Ctx& c) { return fn(c.comm, nullptr); },
         bad,
         {std::string(q.name) + " : " + q.arg + " is NULL"}});
  }
  add({"zpHierSecondaryShard NULL offset",
       one,
       [](const Ctx& c) {
         size_t count;
         return zpHierSecondaryShard(kCount, nullptr, &count, c.comm);
       },
       bad,
       {"zpHierSecondaryShard", "offset"}});
  add({"zpHierSecondaryShard NULL count",
       one,
       [](const Ctx& c) {
         size_t offset;
         return zpHierSecondaryShard(kCount, &offset, nullptr, c.comm);
       },
       bad,
       {"zpHierSecondaryShard", "count"}});
  for (size_t full : {size_t{3}, size_t{kCount + 1}, SIZE_MAX}) {
    add({"zpHierSecondaryShard fullCount " + std::to_string(full) + " on 2 ranks",
         two,
         [full](const Ctx& c) {
           size_t offset, count;
           return zpHierSecondaryShard(full, &offset, &count, c.comm);
         },
         bad,
         {"zpHierSecondaryShard", "fullCount"}});
  }

  // The calls with buffers: one bad argument each.
  for (Call call : kCalls) {
    const std::string rn = rowName(call);
    const char* cn = nameOf(call);
    auto addEdit = [&](const std::string& what, Layout layout, std::function<void(const Ctx&, Args*)> edit,
                       zpResult_t code, std::vector<std::string> mention, std::vector<std::string> absent = {},
                       const char* knownIssue = nullptr) {
      mention.insert(mention.begin(), cn);
      add({rn + " " + what, layout, edited(call, std::move(edit)), code, std::move(mention), Msg::kComm,
           std::move(absent), knownIssue});
    };
    const char* sn = sendName(call);
    const char* rv = recvName(call);

    addEdit("NULL " + std::string(sn), one, [](const Ctx&, Args* a) { a->send = nullptr; }, bad, {sn, "NULL"});
    addEdit("NULL " + std::string(rv), one, [](const Ctx&, Args* a) { a->recv = nullptr; }, bad, {rv, "NULL"});
    for (size_t i = 0; i < 4; ++i) {
      const int type = kBadEnums[i];
      addEdit(std::string("type ") + kBadNames[i], one, [type](const Ctx&, Args* a) { a->type = type; }, bad,
              {"invalid type " + std::to_string(type)});
    }
    if (quantized(call) || call == Call::kHpzEx) {
      // hpZ's Ex form quantizes (and so takes only float types) when its options ask for bits.
      for (int type : {zpInt8, zpInt32, zpFloat64, zpFloat8e4m3}) {
        addEdit(std::string("type ") + zp::typeName(type) + (quantized(call) ? "" : " with options->bits 8"), one,
                [type, call](const Ctx&, Args* a) {
                  static thread_local zpQuantOptions_t options;
                  options = {8, 0};
                  if (call == Call::kHpzEx) a->options = &options;
                  a->type = type;
                },
                bad, {std::string("type ") + zp::typeName(type), "not supported"});
      }
    }
    addEdit("stream", one, [](const Ctx&, Args* a) { a->stream = zpcheck::bogusStream(); }, bad,
            {"stream must be NULL"});

    // Misaligned buffers: an fp32 pointer at +2 bytes, a payload at +8.
    addEdit(std::string(sn) + " misaligned", one,
            [call](const Ctx&, Args* a) {
              a->send = static_cast<const unsigned char*>(a->send) + (sendIsPayload(call) ? 8 : 2);
            },
            bad, {sn, "not aligned"});
    addEdit(
        std::string(rv) + " misaligned", one,
        [call](const Ctx&, Args* a) { a->recv = static_cast<unsigned char*>(a->recv) + (recvIsPayload(call) ? 8 : 2); },
        bad, {rv, "not aligned"});
    if (!sendIsPayload(call)) {
      addEdit(std::string(sn) + " bf16 at +1 byte", one,
              [](const Ctx&, Args* a) {
                a->type = zpBfloat16;
                a->send = static_cast<const unsigned char*>(a->send) + 1;
              },
              bad, {sn, "not aligned"});
    }

    // Overlaps that are not NCCL's in-place layout.
    if (standalone(call)) {
      // The payload inside the elements (or the elements inside the payload), both aligned.
      // These calls have no in-place form: the message must not send the reader to NCCL's.
      addEdit("payload overlapping", one,
              [call](const Ctx& c, Args* a) {
                a->send = c.area;
                a->recv = c.area + (call == Call::kQuantize ? 64 : 4);
              },
              bad, {sn, rv, "overlap", "has no in-place form"}, {"NCCL"});
      addEdit("payload overlapping from below", one,
              [call](const Ctx& c, Args* a) {
                a->send = c.area + (call == Call::kQuantize ? 4 : 64);
                a->recv = c.area;
              },
              bad, {sn, rv, "overlap", "has no in-place form"}, {"NCCL"});
    } else {
      // One element off the in-place position, on one rank and on two.
      for (Layout layout : {one, two}) {
        const std::string suffix = layout == one ? "" : " on 2 ranks";
        addEdit("sendbuff one element past in place" + suffix, layout,
                [call](const Ctx& c, Args* a) {
                  const size_t slice = kCount * 4;
                  if (isQgz(call)) {  // in place: recvbuff == sendbuff + rank * recvcount
                    a->send = c.area;
                    a->recv = c.area + c.rank * slice + 4;
                  } else {  // in place: sendbuff == recvbuff + rank * sendcount
                    a->recv = c.area;
                    a->send = c.area + c.rank * slice + 4;
                  }
                },
                bad, {"overlap"});
        addEdit("buffers one element before in place" + suffix, layout,
                [call](const Ctx& c, Args* a) {
                  const size_t slice = kCount * 4;
                  if (isQgz(call)) {
                    a->send = c.area + 4;
                    a->recv = c.area + 4 + c.rank * slice - 4;
                  } else {
                    a->recv = c.area + 4;
                    a->send = c.area + 4 + c.rank * slice - 4;
                  }
                },
                bad, {"overlap"});
      }
      // On the peer's place.
      addEdit("on the peer's in-place slot, 2 ranks", two,
              [call](const Ctx& c, Args* a) {
                const size_t peerSlot = ((c.rank + 1) % c.nranks) * kCount * 4;
                if (isQgz(call)) {
                  a->send = c.area;
                  a->recv = c.area + peerSlot;
                } else {
                  a->recv = c.area;
                  a->send = c.area + peerSlot;
                }
              },
              bad, {"overlap"});
    }

    // Counts whose sizes overflow size_t, with the valid small buffers: the checks must refuse before any read.
    for (size_t count : {SIZE_MAX, SIZE_MAX / 2, SIZE_MAX / 4 + 1, SIZE_MAX / 16 + 1}) {
      addEdit("count " + std::to_string(count), one, [count](const Ctx&, Args* a) { a->count = count; }, bad,
              {"count", "overflows size_t"});
    }
    if (!standalone(call)) {
      // SIZE_MAX / nranks + 1: the gathered (or scattered) side overflows. int8 for hpZ, where only the rank
      // product overflows (count bytes themselves fit).
      addEdit("count SIZE_MAX/nranks+1 on 2 ranks", two,
              [call](const Ctx& c, Args* a) {
                a->count = SIZE_MAX / c.nranks + 1;
                if (isHpz(call)) a->type = zpInt8;
              },
              bad, {"count", "overflows size_t"});
    }

    // Counts crossing 2^31 and 2^32 bytes (locally, or gathered over 2 ranks) are legal: the size checks must let
    // them through, and the call fails on the NULL or misaligned buffer, before any memory is touched.
    struct Big {
      size_t count;
      int type;
    };
    const Big bigs[] = {{2 * kGib + 1, zpInt8},          {kGib + 1, zpFloat16}, {2 * kGib + 1, zpFloat16},
                        {kGib / 2 + 1, zpFloat32},       {kGib + 1, zpFloat32}, {4 * kGib + 1, zpFloat32},
                        {(4 * kGib + 1) / 2, zpBfloat16}};
    // The Ex calls quantize with 4-bit codes in 32-element blocks (hpZ's Ex form too), so that the payload
    // sizes cross the same boundaries.
    auto sizeBig = [call](const Big& big, Args* a) {
      static thread_local zpQuantOptions_t options;
      options = {4, 32};
      a->count = big.count;
      a->type = big.type;
      if (hasOptions(call) && big.type != zpInt8) a->options = &options;
    };
    for (const Big& b : bigs) {
      if (quantized(call) && b.type == zpInt8) continue;
      const std::string what = "count " + std::to_string(b.count) + " " + zp::typeName(b.type);
      const Big big = b;
      for (Layout layout : {one, two}) {
        if (layout == two && standalone(call)) continue;
        const std::string suffix = layout == one ? "" : " on 2 ranks";
        addEdit(what + " NULL " + sn + suffix, layout,
                [big, sizeBig](const Ctx&, Args* a) {
                  sizeBig(big, a);
                  a->send = nullptr;
                },
                bad, {sn, "is NULL"}, {"overflow"});
        if (big.type == zpInt8) {  // every address is aligned: overlap one byte off in place instead
          addEdit(what + " overlapping" + suffix, layout,
                  [big, sizeBig](const Ctx& c, Args* a) {
                    sizeBig(big, a);
                    a->send = c.area;
                    a->recv = c.area + 1;
                  },
                  bad, {"overlap"}, {"overflow"});
          continue;
        }
        addEdit(what + " misaligned " + rv + suffix, layout,
                [big, call, sizeBig](const Ctx&, Args* a) {
                  sizeBig(big, a);
                  a->recv = static_cast<unsigned char*>(a->recv) + (recvIsPayload(call) ? 8 : 1);
                },
                bad, {rv, "not aligned"}, {"overflow"});
      }
    }

    // Bits and block sizes out of the format: the standalone calls' arguments, the Ex calls' options.
    if (standalone(call)) {
      for (int bits : {0, 3, 16, -1, INT_MAX}) {
        addEdit("bits " + std::to_string(bits), one, [bits](const Ctx&, Args* a) { a->bits = bits; }, bad,
                {"bits " + std::to_string(bits)});
      }
      for (int block : {0, 16, 48, 16384, -256, INT_MIN}) {
        addEdit("blockSize " + std::to_string(block), one, [block](const Ctx&, Args* a) { a->blockSize = block; }, bad,
                {"blockSize " + std::to_string(block)});
      }
    }
    if (hasOptions(call)) {
      for (int bits : {3, 16, -1, INT_MAX}) {
        addEdit("options->bits " + std::to_string(bits), one,
                [bits](const Ctx&, Args* a) {
                  static thread_local zpQuantOptions_t options;
                  options = {bits, 0};
                  a->options = &options;
                },
                bad, {"options->bits"});
      }
      for (int block : {16, 48, 16384, -64, 31}) {
        addEdit("options->blockSize " + std::to_string(block), one,
                [block, call](const Ctx&, Args* a) {
                  static thread_local zpQuantOptions_t options;
                  options = {call == Call::kHpzEx ? 8 : 0, block};  // hpZ checks a block size only with bits
                  a->options = &options;
                },
                bad, {"options->blockSize"});
      }
    }

    // Reduction ops: only Sum and Avg.
    if (isQgz(call)) {
      for (int op : {zpProd, zpMax, zpMin}) {
        addEdit(std::string("op ") + zp::opName(op), one, [op](const Ctx&, Args* a) { a->op = op; }, bad,
                {std::string("op ") + zp::opName(op), "not supported"});
      }
      for (int op : {-1, static_cast<int>(zpNumOps), 99, INT_MAX}) {
        addEdit("op " + std::to_string(op), one, [op](const Ctx&, Args* a) { a->op = op; }, bad,
                {"invalid op " + std::to_string(op)});
      }
    }
  }

  // hpZ on a layout that cannot serve it: uneven nodes.
  add({"zpHierAllGather on uneven nodes",
       Layout::kUneven,
       edited(Call::kHpz, [](const Ctx&, Args*) {}),
       zpInvalidUsage,
       {"zpHierAllGather", "hpZ", "uneven"}});
  add({"zpHierAllGatherEx quantized on uneven nodes",
       Layout::kUneven,
       edited(Call::kHpzEx,
              [](const Ctx&, Args* a) {
                static thread_local zpQuantOptions_t options;
                options = {4, 64};
                a->options = &options;
              }),
       zpInvalidUsage,
       {"zpHierAllGather", "hpZ", "uneven"}});
  add({"zpHierSecondaryShard on uneven nodes",
       Layout::kUneven,
       [](const Ctx& c) {
         size_t offset, count;
         return zpHierSecondaryShard(3 * kCount, &offset, &count, c.comm);
       },
       zpInvalidUsage,
       {"zpHierSecondaryShard", "hpZ"}});
  return rows;
}

// ---- the test body -----------------------------------------------------------------------------------------

// The good call made after every row: a qwZ gather of kCount fp32 elements per rank, equal to the reference.
class GoodCall {
 public:
  GoodCall(int rank, int nranks)
      : nranks_(nranks), send_(kCount * 4), recv_(kCount * 4 * nranks), expected_(kCount * 4 * nranks) {
    Buffer shard(kCount * 4), payload(zp::quantPayloadBytes(kCount, 8, 256));
    for (int r = 0; r < nranks; ++r) {
      zpcheck::fillRandom(zpFloat32, shard.data(), kCount, 99, r);
      if (r == rank) std::memcpy(send_.data(), shard.data(), kCount * 4);
      zp::quantizeRef(shard.data(), zpFloat32, kCount, 8, 256, payload.data());
      zp::dequantizeRef(payload.data(), zpFloat32, kCount, 8, 256, expected_.data() + r * kCount * 4);
    }
  }

  void check(zpComm_t comm, const std::string& after) {
    recv_.poison();
    ASSERT_EQ(zpQuantAllGather(send_.data(), recv_.data(), kCount, zpFloat32, comm, nullptr), zpSuccess)
        << "after " << after << ": " << zpGetLastError(comm);
    EXPECT_STREQ(zpGetLastError(comm), "") << "after " << after;
    EXPECT_TRUE(zpcheck::sameBits(recv_.data(), expected_.data(), kCount * nranks_, zpFloat32)) << "after " << after;
  }

 private:
  int nranks_;
  Buffer send_, recv_, expected_;
};

void runRow(const Row& row, const Ctx& c, GoodCall* good, int* knownIssues) {
  tRowProblem.clear();
  const zpResult_t res = row.call(c);
  const std::string message = row.where == Msg::kComm ? zpGetLastError(c.comm) : zpGetLastError(nullptr);
  EXPECT_EQ(res, row.code) << row.name << ": " << message;
  bool missing = false;
  for (const std::string& m : row.mention) {
    if (mentions(message.c_str(), m.c_str())) continue;
    missing = true;
    if (row.knownIssue == nullptr) ADD_FAILURE() << row.name << ": message '" << message << "' lacks '" << m << "'";
  }
  for (const std::string& m : row.absent) {
    EXPECT_FALSE(mentions(message.c_str(), m.c_str()))
        << row.name << ": message '" << message << "' holds '" << m << "'";
  }
  if (!tRowProblem.empty()) {
    missing = true;
    if (row.knownIssue == nullptr) ADD_FAILURE() << row.name << ": " << tRowProblem;
  }
  if (missing && row.knownIssue != nullptr && c.rank == 0) {
    ++*knownIssues;
    std::printf("[ KNOWN    ] %s: '%s'%s%s (%s)\n", row.name.c_str(), message.c_str(), tRowProblem.empty() ? "" : "; ",
                tRowProblem.c_str(), row.knownIssue);
  }
  if (row.where == Msg::kThread) {
    // A failure recorded for the thread never lands on an unrelated communicator.
    EXPECT_STREQ(zpGetLastError(c.comm), "") << row.name;
  }
  good->check(c.comm, row.name);
}

TEST(BadInput, EveryCallEveryArgumentAndTheCommunicatorStaysUsable) {
  const std::vector<Row> rows = table();
  int ran = 0, knownIssues = 0;
  for (Layout layout : {Layout::kOne, Layout::kTwo, Layout::kUneven}) {
    const int nranks = ranksOf(layout);
    zptest::runHostRanks(
        nranks, [&](int rank, zpConfig_t* c) { configure(layout, rank, c); },
        [&](int rank, zpComm_t comm) {
          SCOPED_TRACE(std::string(layoutName(layout)) + ", rank " + std::to_string(rank));
          Buffer send(kBufBytes), recv(kBufBytes), payload(kBufBytes), area(kBufBytes);
          const Ctx c{rank, nranks, comm, send.data(), recv.data(), payload.data(), area.data()};
          GoodCall good(rank, nranks);
          good.check(comm, "creation");
          int issues = 0;
          for (const Row& row : rows) {
            if (row.layout != layout) continue;
            runRow(row, c, &good, &issues);
            if (rank == 0) ++ran;
          }
          if (rank == 0) knownIssues += issues;
        });
  }
  EXPECT_EQ(static_cast<size_t>(ran), rows.size());
  std::printf("[ BadInput ] %zu rows, %d showing a known, reported defect\n", rows.size(), knownIssues);
}

// A config's version may be this library's (ZP_CONFIG_INITIALIZER) or an older release's with its layout: 0.1.x
// configs end before gradRounding (a 0.1 caller's struct is that much shorter: the fields after it are not read).
// Checked beside the table's refused versions (configEdits).
TEST(BadInput, ConfigVersionsOfThisLibraryAndOlderAreAccepted) {
  for (unsigned v : {static_cast<unsigned>(ZPCCL_VERSION_CODE), 100u, 101u}) {
    zpUniqueId id;
    ASSERT_EQ(zpGetUniqueId(&id), zpSuccess);
    zpConfig_t config = ZP_CONFIG_INITIALIZER;
    config.backend = zpBackendHost;
    config.version = v;
    if (v < 200) {
      config.size = offsetof(zpConfig_t, gradRounding);
      config.gradRounding = 12345;  // beyond a 0.1 struct: garbage there, never read
    }
    zpComm_t comm = nullptr;
    ASSERT_EQ(zpCommInitRankConfig(&comm, 1, id, 0, &config), zpSuccess) << v << ": " << zpGetLastError(nullptr);
    EXPECT_EQ(zpCommDestroy(comm), zpSuccess);
  }
}

// The two calls that return strings: any value, any handle, never a crash.
TEST(BadInput, StringCallsTakeAnyValue) {
  for (int r : {-1, static_cast<int>(zpNumResults), 99, INT_MAX, INT_MIN}) {
    EXPECT_STREQ(zpGetErrorString(static_cast<zpResult_t>(r)), "unknown result code") << r;
  }
  for (Handle h : {Handle::kDangling, Handle::kGarbage, Handle::kForged}) {
    withHandle(h, [&](zpComm_t comm) {
      EXPECT_TRUE(mentions(zpGetLastError(comm), "not a live communicator")) << handleName(h);
      return zpSuccess;
    });
  }
}

// zpQuantPayloadSize just past 2^31 and 2^32 elements is the format's formula, exactly (no 32-bit arithmetic
// anywhere): scales padded to 16 bytes, then codes padded to 16 bytes; and the largest count it accepts.
TEST(BadInput, PayloadSizeIsExactAcross2To31And2To32) {
  auto formula = [](unsigned __int128 count, int bits, int block) {
    auto up16 = [](unsigned __int128 v) { return (v + 15) / 16 * 16; };
    return up16((count + block - 1) / block * 4) + up16((count * bits + 7) / 8);
  };
  const size_t counts[] = {(size_t{1} << 31) - 1, (size_t{1} << 31),     (size_t{1} << 31) + 1,
                           (size_t{1} << 32) - 1, (size_t{1} << 32),     (size_t{1} << 32) + 1,
                           (size_t{1} << 33) + 3, (size_t{1} << 40) + 7, SIZE_MAX / 16};
  for (size_t count : counts) {
    for (int bits : {4, 8}) {
      for (int block : {32, 256, 8192}) {
        size_t bytes = 0;
        ASSERT_EQ(zpQuantPayloadSize(count, bits, block, &bytes), zpSuccess)
            << count << ": " << zpGetLastError(nullptr);
        EXPECT_TRUE(static_cast<unsigned __int128>(bytes) == formula(count, bits, block))
            << "count " << count << " bits " << bits << " block " << block << ": " << bytes;
        EXPECT_EQ(bytes % 16, 0u);
      }
    }
  }
}

}  // namespace
