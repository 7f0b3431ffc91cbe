// The host backend over a caller's transport (zpCommInitFromTransport, include/zpccl.h), with a transport among
// threads that copies every byte as one between processes does (tests/loopback_transport.h): the collective suites
// pass over it as they pass on threads (their references, and so the threaded backend, bit for bit), chunked calls
// included; outputs equal the threaded backend's byte for byte; a callback that fails, returns short data, or whose
// rank leaves fails the call on every rank with one message naming the rank and the exchange, and the communicator
// refuses every later call; waits end at ZP_INIT_TIMEOUT_MS / ZP_HOST_TIMEOUT_MS; a bad transport is refused at init
// by name; finalize runs once, when the communicator goes.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "include/zpccl.h"
#include "tests/child_test.h"
#include "tests/collective_check.h"
#include "tests/loopback_transport.h"
#include "tests/transport_battery.h"

namespace {

using zpcheck::Buffer;
using zptest::LoopbackHub;
using Clock = std::chrono::steady_clock;

bool mentions(const std::string& message, const char* what) { return message.find(what) != std::string::npos; }

// The tests of this binary matching `filter`, run in a child with `env` added: all of them pass, and at least
// `atLeast` ran (so that a filter that matches nothing fails). Returns the child's output.
std::string expectChildSuitesPass(const std::string& filter, const std::vector<std::string>& env, int atLeast) {
  const zptest::ChildRun run = zptest::runSelf("--gtest_brief=1 --gtest_filter='" + filter + "'", env);
  EXPECT_EQ(run.exitCode, 0) << zptest::outputTail(run);
  std::smatch m;
  EXPECT_TRUE(std::regex_search(run.output, m, std::regex(R"(\[  PASSED  \] (\d+) tests?)")));
  if (!m.empty()) EXPECT_GE(std::stoi(m[1]), atLeast);
  return run.output;
}

// The host-backend collective suites, whose bodies run through tests/host_ranks.h, over the loopback transport.
const char* kSuites = "Qwz*:Hpz*:Qgz*:Shapes/*:MismatchHost*:GradRounding*:GradQgzHost*:BadInputGrad*:AllReduce*";

// Whether a line of the plans' log (INFO COLL) that contains `kind` plans one chunk (`several` false) or several.
bool loggedPlan(const std::string& log, const std::string& kind, bool several) {
  const std::regex chunks(R"(, (\d+) chunks?\b)");
  std::istringstream lines(log);
  std::smatch m;
  for (std::string line; std::getline(lines, line);) {
    if (line.find(kind) == std::string::npos) continue;
    if (std::regex_search(line, m, chunks) && (std::stoi(m[1]) > 1) == several) return true;
  }
  return false;
}

// In chunks of 64 KiB: the suites' small calls are one chunk, as every call is at the default chunk size, and the
// larger calls of qgZ and the all-reduce take several, each all-to-all hop one exchange a chunk (the gathers move
// every chunk in one all-gather, chunked or not). The plans' log says that both kinds ran.
TEST(CallbackTransport, CollectiveSuitesPassOverCallbacks) {
  const std::string log = expectChildSuitesPass(
      kSuites, {"ZP_TEST_TRANSPORT=loopback", "ZP_CHUNK_BYTES=65536", "ZP_DEBUG=INFO", "ZP_DEBUG_SUBSYS=COLL"}, 100);
  for (const char* kind : {"zpQuantReduceScatterA2A : ", "zpQuantAllReduce : "}) {
    EXPECT_TRUE(loggedPlan(log, kind, false)) << "no plan of one chunk: " << kind;
    EXPECT_TRUE(loggedPlan(log, kind, true)) << "no plan of several chunks: " << kind;
  }
}

// ---- ranks over the loopback hub ---------------------------------------------------------------------------------

using RankBody = std::function<void(int rank, zpComm_t comm)>;

// Creates nranks communicators over `hub` (config from configure), runs body on each rank's thread, and leaves the
// communicators to the body (it destroys or aborts them).
void runOverHub(LoopbackHub& hub, int nranks, const std::function<void(int, zpConfig_t*)>& configure,
                const RankBody& body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < nranks; ++r) {
    threads.emplace_back([&, r] {
      zpConfig_t config = ZP_CONFIG_INITIALIZER;
      if (configure) configure(r, &config);
      const zpTransport_t t = hub.transport(r);
      zpComm_t comm = nullptr;
      ASSERT_EQ(zpCommInitFromTransport(&comm, &t, &config), zpSuccess) << zpGetLastError(nullptr);
      body(r, comm);
    });
  }
  for (auto& t : threads) t.join();
}

// Two nodes of two (two-hop qgZ, hpZ groups of two), as config->ranksPerNode gives them.
void twoNodes(int, zpConfig_t* c) { c->ranksPerNode = 2; }

// Thread-ranks and ranks over the loopback hub run the same battery on the same inputs, on two nodes of two.
TEST(CallbackTransport, OutputsAreBitEqualToThreads) {
  const int nranks = 4;
  const std::vector<zptest::BatteryOutputs> threads = zptest::batteryOverThreads(nranks, twoNodes);
  std::vector<zptest::BatteryOutputs> over(nranks);
  LoopbackHub hub(nranks);
  runOverHub(hub, nranks, twoNodes, [&](int r, zpComm_t comm) {
    over[r] = zptest::runBattery(r, nranks, comm);
    EXPECT_EQ(zpCommDestroy(comm), zpSuccess);
  });
  for (int r = 0; r < nranks; ++r) zptest::expectSameOutputs(over[r], threads[r], "rank " + std::to_string(r));
}

// ---- failures ----------------------------------------------------------------------------------------------------

// Each rank's init makes two callbacks (its record, then the verdict); a collective then makes one for its
// arguments, one per hop and chunk, and one for its outcome.
constexpr int kInitCallbacks = 2;

struct Seen {
  zpResult_t result = zpInternalError;
  std::string message, later;
  zpResult_t laterResult = zpInternalError, async = zpInternalError;
};

// Four ranks on two nodes; rank `faulty` gets `fault`; each rank calls qgZ (two hops) then qwZ, keeps what happened,
// and destroys its communicator.
std::vector<Seen> qgzWithFault(LoopbackHub& hub, int faulty, const LoopbackHub::Fault& fault) {
  const int nranks = 4;
  std::vector<Seen> seen(nranks);
  hub.setFault(faulty, fault);
  runOverHub(hub, nranks, twoNodes, [&](int r, zpComm_t comm) {
    const size_t n = 300;
    std::vector<float> grads(nranks * n, 1.0f + r), out(n), full(nranks * n);
    seen[r].result = zpQuantReduceScatterA2A(grads.data(), out.data(), n, zpFloat32, zpSum, comm, nullptr);
    seen[r].message = zpGetLastError(comm);
    seen[r].laterResult = zpQuantAllGather(out.data(), full.data(), n, zpFloat32, comm, nullptr);
    seen[r].later = zpGetLastError(comm);
    EXPECT_EQ(zpCommGetAsyncError(comm, &seen[r].async), zpSuccess);
    EXPECT_EQ(zpCommDestroy(comm), zpSuccess) << zpGetLastError(nullptr);
  });
  return seen;
}

// Rank 2's first hop returns an error after moving its data: every rank's qgZ fails with rank 2's message, and the
// next call is refused at once.
TEST(CallbackTransport, ACallbackErrorFailsTheCallOnEveryRank) {
  LoopbackHub hub(4);
  LoopbackHub::Fault f;
  f.call = kInitCallbacks + 2;  // arguments, then hop 1
  f.error = true;
  const std::vector<Seen> seen = qgzWithFault(hub, 2, f);
  const std::regex expected(
      "zpQuantReduceScatterA2A : rank 2's transport: allToAll of the call's data failed \\(returned 1: injected "
      "failure; timeout [0-9]+ ms\\); the communicator failed: abort or destroy it");
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(seen[r].result, zpRemoteError) << "rank " << r;
    EXPECT_TRUE(std::regex_match(seen[r].message, expected)) << "rank " << r << ": " << seen[r].message;
    EXPECT_EQ(seen[r].message, seen[0].message);
    EXPECT_EQ(seen[r].laterResult, zpRemoteError);
    EXPECT_TRUE(std::regex_match(seen[r].later,
                                 std::regex("zpQuantAllGather : the communicator failed: rank 2's transport: allToAll "
                                            "of the call's data failed \\(returned 1: injected failure; .*")))
        << seen[r].later;
    EXPECT_EQ(seen[r].async, zpRemoteError);
    EXPECT_EQ(hub.callbacks(r), kInitCallbacks + 4) << "rank " << r << ": arguments, two hops, outcome; none after";
    EXPECT_EQ(hub.finalized(r), 1);
  }
}

// Rank 1 reports 16 bytes fewer than it received in hop 2: the same on every rank, naming the count.
TEST(CallbackTransport, ShortDataFailsTheCallOnEveryRank) {
  LoopbackHub hub(4);
  LoopbackHub::Fault f;
  f.call = kInitCallbacks + 3;  // arguments, hop 1, then hop 2
  f.shortBy = 16;
  const std::vector<Seen> seen = qgzWithFault(hub, 1, f);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(seen[r].result, zpRemoteError) << "rank " << r;
    EXPECT_TRUE(std::regex_match(seen[r].message,
                                 std::regex("zpQuantReduceScatterA2A : rank 1's transport: allToAll of the call's "
                                            "data returned [0-9]+ of its [0-9]+ bytes; the communicator failed: .*")))
        << seen[r].message;
    EXPECT_EQ(seen[r].laterResult, zpRemoteError);
  }
  EXPECT_EQ(seen[0].message, seen[3].message);
}

// Rank 3 leaves in the middle of qgZ (its connections close): every rank's call fails at once, each naming a rank
// and what its transport said; nobody hangs.
TEST(CallbackTransport, ARankThatLeavesFailsEveryRankAtOnce) {
  LoopbackHub hub(4);
  LoopbackHub::Fault f;
  f.call = kInitCallbacks + 2;
  f.leave = true;
  const auto start = Clock::now();
  const std::vector<Seen> seen = qgzWithFault(hub, 3, f);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(seen[r].result, zpRemoteError) << "rank " << r;
    EXPECT_TRUE(mentions(seen[r].message, "rank 3 left")) << seen[r].message;
    EXPECT_TRUE(mentions(seen[r].message, "zpQuantReduceScatterA2A : rank ")) << seen[r].message;
    EXPECT_EQ(seen[r].laterResult, zpRemoteError);
  }
}

// ---- init ----------------------------------------------------------------------------------------------------------

struct InitSeen {
  zpResult_t result = zpInternalError;
  std::string message;
  zpComm_t comm = nullptr;
};

// Inits `nranks` ranks over `hub`, rank r's transport changed by adjust(r, &t).
std::vector<InitSeen> initOverHub(LoopbackHub& hub, int nranks,
                                  const std::function<void(int, zpTransport_t*)>& adjust) {
  std::vector<InitSeen> seen(nranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < nranks; ++r) {
    threads.emplace_back([&, r] {
      zpTransport_t t = hub.transport(r);
      if (adjust) adjust(r, &t);
      seen[r].result = zpCommInitFromTransport(&seen[r].comm, &t, nullptr);
      seen[r].message = zpGetLastError(nullptr);
    });
  }
  for (auto& t : threads) t.join();
  return seen;
}

// Rank 2's transport claims four ranks where the hub (and the others) have three: every rank fails, rank 2's short
// all-gather named, and no communicator is made; finalize is not called (the caller still owns the context).
TEST(CallbackTransport, ATransportOfAnotherSizeIsRefusedOnEveryRank) {
  LoopbackHub hub(3);
  const auto seen = initOverHub(hub, 3, [](int r, zpTransport_t* t) { t->nranks = r == 2 ? 4 : 3; });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(seen[r].result, zpRemoteError) << "rank " << r << ": " << seen[r].message;
    EXPECT_EQ(seen[r].comm, nullptr);
    EXPECT_TRUE(mentions(seen[r].message, "zpCommInitFromTransport : rank 2's transport: allGather of init returned "))
        << seen[r].message;
    EXPECT_TRUE(mentions(seen[r].message, "every rank's transport must span the same ranks")) << seen[r].message;
    EXPECT_EQ(hub.finalized(r), 0);
  }
}

// Ranks numbered otherwise than the transport orders its blocks: refused on every rank as zpInvalidUsage.
TEST(CallbackTransport, RanksNumberedOtherwiseThanTheTransportAreRefused) {
  LoopbackHub hub(3);
  const auto seen = initOverHub(hub, 3, [](int r, zpTransport_t* t) { t->rank = (r + 1) % 3; });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(seen[r].result, zpInvalidUsage) << "rank " << r << ": " << seen[r].message;
    EXPECT_EQ(seen[r].message,
              "zpCommInitFromTransport : rank 0's transport says rank 1 of 3 where this rank's says 3 ranks: every "
              "rank's transport must span the same ranks, numbered alike");
  }
}

// Settings that differ are refused on every rank, as over threads.
TEST(CallbackTransport, SettingsThatDifferAreRefusedOnEveryRank) {
  LoopbackHub hub(2);
  std::vector<InitSeen> seen(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      zpTransport_t t = hub.transport(r);
      zpConfig_t c = ZP_CONFIG_INITIALIZER;
      c.weightBits = r == 0 ? 8 : 4;
      seen[r].result = zpCommInitFromTransport(&seen[r].comm, &t, &c);
      seen[r].message = zpGetLastError(nullptr);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(seen[r].result, zpInvalidUsage);
    EXPECT_EQ(seen[r].message,
              "zpCommInitFromTransport : ranks disagree on config->weightBits: 8 on rank 0, 4 on rank 1");
  }
}

TEST(CallbackTransport, BadTransportsAreRefusedByName) {
  LoopbackHub hub(2);
  zpComm_t comm = reinterpret_cast<zpComm_t>(0x1);
  auto refused = [&](const zpTransport_t* t, zpConfig_t* c) {
    EXPECT_EQ(zpCommInitFromTransport(&comm, t, c), zpInvalidArgument);
    EXPECT_EQ(comm, nullptr);
    return std::string(zpGetLastError(nullptr));
  };
  EXPECT_EQ(refused(nullptr, nullptr), "zpCommInitFromTransport : transport is NULL");
  zpTransport_t t = hub.transport(0);
  t.magic = 0;
  EXPECT_TRUE(mentions(refused(&t, nullptr), "transport has a bad magic 0x0")) << zpGetLastError(nullptr);
  t = hub.transport(0);
  t.version = ZPCCL_VERSION_CODE + 1;
  EXPECT_TRUE(mentions(refused(&t, nullptr), "transport->version")) << zpGetLastError(nullptr);
  t = hub.transport(0);
  t.size = sizeof(zpTransport_t) - 8;
  EXPECT_TRUE(mentions(refused(&t, nullptr), "transport size")) << zpGetLastError(nullptr);
  t = hub.transport(0);
  t.nranks = 0;
  EXPECT_EQ(refused(&t, nullptr), "zpCommInitFromTransport : transport->nranks 0 must be positive");
  t = hub.transport(0);
  t.rank = 2;
  EXPECT_EQ(refused(&t, nullptr), "zpCommInitFromTransport : transport->rank 2 is out of range [0, 2)");
  t = hub.transport(0);
  t.allToAll = nullptr;
  EXPECT_EQ(refused(&t, nullptr), "zpCommInitFromTransport : transport->allToAll is NULL");
  t = hub.transport(0);
  zpConfig_t c = ZP_CONFIG_INITIALIZER;
  c.backend = zpBackendCuda;
  EXPECT_TRUE(mentions(refused(&t, &c), "config->backend cuda cannot run over a transport")) << zpGetLastError(nullptr);
  EXPECT_EQ(hub.callbacks(0), 0);
  EXPECT_EQ(hub.finalized(0), 0);
}

// A communicator over a transport: a host-backend one with the transport's ranks; abort frees it too, and finalize
// runs once on every rank.
TEST(CallbackTransport, QueriesAndAbort) {
  LoopbackHub hub(3);
  runOverHub(hub, 3, nullptr, [&](int r, zpComm_t comm) {
    int count = 0, rank = -1;
    zpBackend_t backend = zpBackendDefault;
    EXPECT_EQ(zpCommCount(comm, &count), zpSuccess);
    EXPECT_EQ(zpCommUserRank(comm, &rank), zpSuccess);
    EXPECT_EQ(zpCommBackend(comm, &backend), zpSuccess);
    EXPECT_EQ(count, 3);
    EXPECT_EQ(rank, r);
    EXPECT_EQ(backend, zpBackendHost);
    EXPECT_EQ(r == 1 ? zpCommAbort(comm) : zpCommDestroy(comm), zpSuccess);
  });
  for (int r = 0; r < 3; ++r) EXPECT_EQ(hub.finalized(r), 1);
}

// ---- calls from inside a callback --------------------------------------------------------------------------------

// A transport of one rank whose allGather, once armed, calls `reentry` on the communicator it serves from inside the
// callback (the calling thread is inside that communicator's collective), keeping what the call returned and said.
struct ReentrantTransport {
  zpComm_t comm = nullptr;
  std::function<zpResult_t(zpComm_t)> reentry;
  bool threadMessage = false;  // the call's message is the thread's (zpGetLastError(NULL)), not the communicator's
  bool armed = false;
  zpResult_t result = zpInternalError;
  std::string message;

  static int allGather(void* context, const void* sendbuf, void* recvbuf, size_t bytes, zpTransportCall_t* call) {
    auto* self = static_cast<ReentrantTransport*>(context);
    memcpy(recvbuf, sendbuf, bytes);
    call->received = bytes;
    if (self->armed) {
      self->armed = false;
      self->result = self->reentry(self->comm);
      self->message = zpGetLastError(self->threadMessage ? nullptr : self->comm);
    }
    return 0;
  }
  static int allToAll(void*, const void* sendbuf, const size_t* sendCounts, const size_t* sendOffsets, void* recvbuf,
                      const size_t* recvCounts, const size_t* recvOffsets, zpTransportCall_t* call) {
    memcpy(static_cast<char*>(recvbuf) + recvOffsets[0], static_cast<const char*>(sendbuf) + sendOffsets[0],
           sendCounts[0]);
    call->received = recvCounts[0];
    return 0;
  }
};

// zpCommDestroy or zpCommAbort from inside a callback would wait for the collective that runs the callback: it is
// refused with zpInvalidUsage, naming the call it is inside, and the collective goes on; so is a collective, which
// must not say that another thread holds the communicator. The communicator stays usable.
TEST(CallbackTransport, CallsFromInsideACallbackOfTheSameCommunicatorAreRefused) {
  const struct {
    const char* name;
    std::function<zpResult_t(zpComm_t)> call;
    bool threadMessage;
  } reentries[] = {
      {"zpCommDestroy", [](zpComm_t c) { return zpCommDestroy(c); }, true},
      {"zpCommAbort", [](zpComm_t c) { return zpCommAbort(c); }, true},
      {"zpQuantAllGather",
       [](zpComm_t c) {
         float x[4] = {1, 2, 3, 4}, y[4];
         return zpQuantAllGather(x, y, 4, zpFloat32, c, nullptr);
       },
       false},
  };
  for (const auto& reentry : reentries) {
    SCOPED_TRACE(reentry.name);
    ReentrantTransport rt;
    rt.reentry = reentry.call;
    rt.threadMessage = reentry.threadMessage;
    zpTransport_t t = ZP_TRANSPORT_INITIALIZER;
    t.nranks = 1;
    t.rank = 0;
    t.context = &rt;
    t.allGather = &ReentrantTransport::allGather;
    t.allToAll = &ReentrantTransport::allToAll;
    ASSERT_EQ(zpCommInitFromTransport(&rt.comm, &t, nullptr), zpSuccess) << zpGetLastError(nullptr);
    // The collective runs on a thread of its own, so that a call that waits for it forever fails this test instead
    // of hanging it (the stuck thread is then left behind).
    std::vector<float> send(64), recv(64), expected(64);
    for (size_t i = 0; i < send.size(); ++i) send[i] = 0.25f * static_cast<float>(i) - 3.0f;
    ASSERT_EQ(zpQuantAllGather(send.data(), expected.data(), 64, zpFloat32, rt.comm, nullptr), zpSuccess);
    rt.armed = true;
    auto outcome = std::make_shared<std::promise<zpResult_t>>();
    std::future<zpResult_t> done = outcome->get_future();
    std::thread([&, outcome] {
      outcome->set_value(zpQuantAllGather(send.data(), recv.data(), 64, zpFloat32, rt.comm, nullptr));
    }).detach();
    if (done.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
      ADD_FAILURE() << reentry.name << " from inside a callback waits forever";
      continue;
    }
    EXPECT_EQ(done.get(), zpSuccess) << zpGetLastError(rt.comm);
    EXPECT_EQ(rt.result, zpInvalidUsage);
    EXPECT_TRUE(mentions(rt.message, reentry.name)) << rt.message;
    EXPECT_TRUE(mentions(rt.message, "inside")) << rt.message;
    EXPECT_FALSE(mentions(rt.message, "another thread")) << rt.message;
    EXPECT_EQ(memcmp(recv.data(), expected.data(), recv.size() * sizeof(float)), 0);
    int count = 0;
    EXPECT_EQ(zpCommCount(rt.comm, &count), zpSuccess);
    EXPECT_EQ(zpCommDestroy(rt.comm), zpSuccess) << zpGetLastError(nullptr);
  }
}

// ---- timeouts, in children with short ones ---------------------------------------------------------------------

const std::vector<std::string> kShortTimeouts = {"ZP_INIT_TIMEOUT_MS=300", "ZP_HOST_TIMEOUT_MS=300"};

TEST(CallbackTransport, AMissingRankAtInit) {
  zptest::expectChildPassed("CallbackTransportChild.DISABLED_AMissingRankAtInit", kShortTimeouts);
}
TEST(CallbackTransport, ARankThatStopsCalling) {
  zptest::expectChildPassed("CallbackTransportChild.DISABLED_ARankThatStopsCalling", kShortTimeouts);
}

// Rank 1 of 3 never comes: the others' callbacks give up at ZP_INIT_TIMEOUT_MS, and they say so.
TEST(CallbackTransportChild, DISABLED_AMissingRankAtInit) {
  LoopbackHub hub(3);
  std::vector<InitSeen> seen(3);
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int r : {0, 2}) {
    threads.emplace_back([&, r] {
      const zpTransport_t t = hub.transport(r);
      seen[r].result = zpCommInitFromTransport(&seen[r].comm, &t, nullptr);
      seen[r].message = zpGetLastError(nullptr);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  for (int r : {0, 2}) {
    EXPECT_EQ(seen[r].result, zpRemoteError) << seen[r].message;
    EXPECT_TRUE(std::regex_match(seen[r].message,
                                 std::regex("zpCommInitFromTransport : rank [02]'s transport: allGather of init failed "
                                            "\\(returned 1: timed out after 300 ms; timeout 300 ms\\).*")))
        << seen[r].message;
  }
}

// Rank 2 of 3 calls qwZ once with the others, then not again: the others give up at ZP_HOST_TIMEOUT_MS with
// zpRemoteError, and refuse the next call at once.
TEST(CallbackTransportChild, DISABLED_ARankThatStopsCalling) {
  LoopbackHub hub(3);
  std::vector<Seen> seen(3);
  runOverHub(hub, 3, nullptr, [&](int r, zpComm_t comm) {
    std::vector<float> send(64, 1.0f), recv(192);
    EXPECT_EQ(zpQuantAllGather(send.data(), recv.data(), 64, zpFloat32, comm, nullptr), zpSuccess);
    if (r != 2) {
      const auto start = Clock::now();
      seen[r].result = zpQuantAllGather(send.data(), recv.data(), 64, zpFloat32, comm, nullptr);
      seen[r].message = zpGetLastError(comm);
      EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
      const auto again = Clock::now();
      seen[r].laterResult = zpQuantAllGather(send.data(), recv.data(), 64, zpFloat32, comm, nullptr);
      EXPECT_LT(Clock::now() - again, std::chrono::milliseconds(100));
    }
    EXPECT_EQ(zpCommDestroy(comm), zpSuccess);
  });
  for (int r : {0, 1}) {
    EXPECT_EQ(seen[r].result, zpRemoteError) << seen[r].message;
    EXPECT_TRUE(mentions(seen[r].message, "zpQuantAllGather : rank ")) << seen[r].message;
    EXPECT_TRUE(mentions(seen[r].message, "timed out after 300 ms")) << seen[r].message;
    EXPECT_EQ(seen[r].laterResult, zpRemoteError);
  }
}

}  // namespace
