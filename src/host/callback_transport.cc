// The host backend's transport among processes: the caller's zpTransport_t callbacks (include/zpccl.h) move the
// bytes, over torch.distributed or MPI. Every exchange copies into the communicator's memory, so nobody reads a
// rank's buffers once its callback returned; ranks agree on each call's arguments with a small all-gather before
// any data moves, and on each call's outcome with another after the last exchange.
//
// A callback that fails on one rank leaves the others' exchanges complete or failing, and the failing rank's own
// results wrong: the failure is kept (not returned) until endCall, the rank making the call's remaining exchanges as
// if nothing happened, so that its peers are not left waiting in them, and endCall's all-gather tells every rank.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "host/base/check.h"
#include "host/base/params.h"
#include "src/host/transport.h"

namespace zp {

namespace {

constexpr uint32_t kRecordMagic = 0x7a707872u;  // "zpxr": a record of this library's, not stray bytes

// The tunables that cut a call into chunks (host/chunk_plan.h): each chunk of a hop is one exchange, and a chunk's
// payloads are padded on their own, so the ranks' exchanges have one size only when these agree. Ranks as processes
// read their own environment: init compares them.
struct ChunkTunables {
  int64_t chunkBytes;  // ZP_CHUNK_BYTES
  int32_t maxChunks;   // ZP_MAX_CHUNKS
  int32_t chunkRamp;   // ZP_CHUNK_RAMP

  static ChunkTunables fromParams() {
    return ChunkTunables{paramPipelineChunkBytes(), static_cast<int32_t>(paramPipelineMaxChunks()),
                         static_cast<int32_t>(paramPipelineChunkRamp())};
  }
};

// The first tunable in which rank r's b differs from rank 0's a, as "<variable>: rank 0 has X, rank r has Y"; empty
// when they agree.
std::string chunkTunablesDisagreement(const ChunkTunables& a, const ChunkTunables& b, int r) {
  const struct {
    const char* env;
    int64_t x, y;
  } fields[] = {{"ZP_CHUNK_BYTES", a.chunkBytes, b.chunkBytes},
                {"ZP_MAX_CHUNKS", a.maxChunks, b.maxChunks},
                {"ZP_CHUNK_RAMP", a.chunkRamp, b.chunkRamp}};
  for (const auto& f : fields) {
    if (f.x == f.y) continue;
    char buf[320];
    snprintf(buf, sizeof(buf),
             "ranks disagree on %s: rank 0 has %lld, rank %d has %lld (ZP_CHUNK_BYTES, ZP_MAX_CHUNKS and ZP_CHUNK_RAMP "
             "cut every call into the same chunks on every rank: set them alike on every rank)",
             f.env, static_cast<long long>(f.x), r, static_cast<long long>(f.y));
    return buf;
  }
  return std::string();
}

// What each rank brings to init, all-gathered: the transport's view of the ranks beside the RankInit.
struct InitRecord {
  uint32_t magic;
  uint32_t version;
  int32_t nranks;
  int32_t rank;
  RankInit init;
  ChunkTunables tunables;
};

// A CallSignature as bytes, the call's name inline.
struct SignatureRecord {
  uint64_t count;
  int32_t kind, type, op, bits, blockSize, pad;
  char call[48];
};

// A rank's outcome of init or of a call. transportFailed: a callback failed here (the communicator fails on every
// rank); otherwise result is the rank's own (a mismatch of arguments, alike on every rank, leaves it usable).
struct OutcomeRecord {
  uint32_t magic;
  int32_t result;
  int32_t transportFailed;
  int32_t pad;
  char message[240];
};

void copyText(char* dst, size_t capacity, const std::string& text) {
  const size_t n = std::min(text.size(), capacity - 1);
  memcpy(dst, text.data(), n);
  dst[n] = '\0';
}

std::string textOf(const char* chars, size_t capacity) { return std::string(chars, strnlen(chars, capacity)); }

class CallbackTransport final : public HostTransport {
 public:
  CallbackTransport(const zpTransport_t& t, const WorldTimeouts& timeouts)
      : t_(t), nranks_(t.nranks), rank_(t.rank), timeouts_(timeouts) {}

  // All-gathers every rank's InitRecord and checks that the ranks' transports span the same ranks. On a failure the
  // verdict is agreed at once (the peers are then in agreeOnInit too), and returned.
  zpResult_t join(const RankInit& mine, const char* call) {
    InitRecord record{};
    record.magic = kRecordMagic;
    record.version = ZPCCL_VERSION_CODE;
    record.nranks = nranks_;
    record.rank = rank_;
    record.init = mine;
    record.tunables = ChunkTunables::fromParams();
    std::vector<InitRecord> all(nranks_);
    std::string failed = gatherRecords(&record, all.data(), sizeof(record), timeouts_.initMs, call, "init");
    if (!failed.empty()) {
      if (shortData_) failed += "; every rank's transport must span the same ranks (transport->nranks)";
      keep(failed);
      return agreeOnInit(zpRemoteError, std::string(), call);
    }
    std::string why;
    for (int r = 0; why.empty() && r < nranks_; ++r) {
      const InitRecord& got = all[r];
      char buf[320];
      if (got.magic != kRecordMagic) {
        snprintf(buf, sizeof(buf),
                 "the transport's allGather gave block %d without rank %d's init record: the transports do not connect "
                 "the ranks in rank order",
                 r, r);
      } else if (got.nranks != nranks_ || got.rank != r) {
        snprintf(buf, sizeof(buf),
                 "rank %d's transport says rank %d of %d where this rank's says %d ranks: every rank's transport must "
                 "span the same ranks, numbered alike",
                 r, got.rank, got.nranks, nranks_);
      } else {
        why = chunkTunablesDisagreement(all[0].tunables, got.tunables, r);
        continue;
      }
      why = buf;
    }
    if (!why.empty()) {
      const zpResult_t verdict = agreeOnInit(zpInvalidUsage, std::string(call) + " : " + why, call);
      return verdict != zpSuccess ? verdict : zpInvalidUsage;
    }
    inits_.reserve(nranks_);
    for (const InitRecord& r : all) inits_.push_back(r.init);
    return zpSuccess;
  }

  const std::vector<RankInit>& inits() const override { return inits_; }

  zpResult_t agreeOnInit(zpResult_t mine, const std::string& message, const char* call) override {
    return agree(mine, message, call, true);
  }

  zpResult_t allGather(const PeerGroup& group, const void* mine, size_t bytes, unsigned char* space,
                       const CallSignature* signature, const char* call, Received* out) override {
    if (signature != nullptr) ZPCHECK(agreeOnSignature(*signature, call));
    out->reset({ExchangeChunk{0, bytes}}, group.size());
    for (int i = 0; i < group.size(); ++i) out->setFrom(i, space, i);
    if (bytes == 0) return zpSuccess;
    if (isWorld(group)) {
      keep(gather(mine, space, bytes, timeouts_.hostMs, call, "the call's data"));
      return zpSuccess;
    }
    // A group of some ranks: the same block to each member, through an all-to-all over every rank.
    clearCounts();
    for (int i = 0; i < group.size(); ++i) {
      const int r = (*group.ranks)[i];
      sendCounts_[r] = recvCounts_[r] = bytes;
      recvOffsets_[r] = i * bytes;
    }
    keep(scatter(mine, space, timeouts_.hostMs, call, "the call's data"));
    return zpSuccess;
  }

  zpResult_t allToAll(const PeerGroup& group, const void* mine, const std::vector<ExchangeChunk>& chunks,
                      unsigned char* space, const CallSignature* signature, const char* call, Received* out) override {
    if (signature != nullptr) ZPCHECK(agreeOnSignature(*signature, call));
    out->reset(chunks, group.size());
    for (int i = 0; i < group.size(); ++i) out->setFrom(i, space, i);
    // One exchange per chunk, as the plan's hop makes one per chunk: the members' blocks of a chunk are contiguous
    // in order, those of the whole call are not. This rank's own block goes through the transport too, so that the
    // blocks stay contiguous (an engine moves them in one piece then, as torch's all_to_all_single does).
    for (const ExchangeChunk& c : chunks) {
      clearCounts();
      for (int i = 0; i < group.size(); ++i) {
        const int r = (*group.ranks)[i];
        sendCounts_[r] = recvCounts_[r] = c.blockBytes;
        sendOffsets_[r] = recvOffsets_[r] = c.offset + i * c.blockBytes;
      }
      keep(scatter(mine, space, timeouts_.hostMs, call, "the call's data"));
    }
    return zpSuccess;
  }

  // Nobody reads this rank's memory: what it gave was copied before its callback returned.
  zpResult_t endExchange(const char*) override { return zpSuccess; }
  void stopReading() override {}

  zpResult_t endCall(zpResult_t result, const char* call) override {
    const zpResult_t verdict = agree(result, result == zpSuccess ? std::string() : pendingError(), call, false);
    pending_.clear();
    return verdict;
  }

  bool sharesMemory() const override { return false; }
  // After a callback failed, the engine may not have stopped with the buffers it was given.
  bool settle() override { return !callbackFailed_; }

  bool failed() const override { return failed_.load(); }
  std::string failure() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return failure_;
  }
  void fail(const std::string& why) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failed_) {
      failure_ = why;
      failed_ = true;
    }
  }
  void abort() override { fail("was aborted (zpCommAbort on rank " + std::to_string(rank_) + ")"); }

  void release() override {
    if (t_.finalize != nullptr && !released_) t_.finalize(t_.context);
    released_ = true;
  }

 private:
  // Every rank, in rank order: the transport's allGather serves it.
  bool isWorld(const PeerGroup& group) const {
    if (group.size() != nranks_) return false;
    for (int i = 0; i < nranks_; ++i) {
      if ((*group.ranks)[i] != i) return false;
    }
    return true;
  }

  // Keeps the first failure of the call (an exchange's, "" for none) until endCall.
  void keep(const std::string& why) {
    if (!why.empty() && pending_.empty()) pending_ = why;
  }

  // Compares every rank's signature before any data moves. A difference is zpInvalidUsage on every rank, alike: the
  // communicator stays usable. A failure of the exchange itself is kept, and the call goes on.
  zpResult_t agreeOnSignature(const CallSignature& sig, const char* call) {
    SignatureRecord mine{};
    mine.count = sig.count;
    mine.kind = static_cast<int32_t>(sig.kind);
    mine.type = sig.type;
    mine.op = sig.op;
    mine.bits = sig.bits;
    mine.blockSize = sig.blockSize;
    copyText(mine.call, sizeof(mine.call), sig.call);
    std::vector<SignatureRecord> all(nranks_);
    const std::string why =
        gatherRecords(&mine, all.data(), sizeof(mine), timeouts_.hostMs, call, "the call's arguments");
    if (!why.empty()) {
      keep(why);
      return zpSuccess;
    }
    auto of = [](const SignatureRecord& r) {
      CallSignature s;
      s.call = r.call;
      s.kind = static_cast<CollKind>(r.kind);
      s.count = r.count;
      s.type = r.type;
      s.op = r.op;
      s.bits = r.bits;
      s.blockSize = r.blockSize;
      return s;
    };
    for (SignatureRecord& r : all) r.call[sizeof(r.call) - 1] = '\0';
    for (int r = 1; r < nranks_; ++r) {
      const std::string differs = callDisagreement(of(all[0]), of(all[r]), r);
      if (!differs.empty()) return ZP_ERR(zpInvalidUsage, "%s : ranks disagree on %s", call, differs.c_str());
    }
    return zpSuccess;
  }

  // Every rank's outcome of init or of a call, all-gathered: a rank whose callback failed (the pending failure) fails
  // the communicator on every rank, the lowest such rank named; otherwise each rank keeps its own result, or takes the
  // lowest failing rank's. When this exchange fails too, this rank fails with what it knows.
  zpResult_t agree(zpResult_t mine, const std::string& message, const char* call, bool init) {
    const int64_t timeoutMs = init ? timeouts_.initMs : timeouts_.hostMs;
    const char* what = init ? "init's verdict" : "the call's outcome";
    const char* consequence = init ? "no communicator was made" : "the communicator failed: abort or destroy it";
    const bool failedHere = !pending_.empty();
    OutcomeRecord record{};
    record.magic = kRecordMagic;
    record.result = failedHere ? zpRemoteError : mine;
    record.transportFailed = failedHere ? 1 : 0;
    copyText(record.message, sizeof(record.message), failedHere ? pending_ : message);
    std::vector<OutcomeRecord> all(nranks_);
    const std::string why = gatherRecords(&record, all.data(), sizeof(record), timeoutMs, call, what);
    if (!why.empty()) {
      const std::string first = failedHere ? pending_ : why;
      fail("failed: rank " + std::to_string(rank_) + "'s transport: " + first);
      clearPendingError();  // a transport's failure is the call's, whatever else went wrong
      return ZP_ERR(zpRemoteError, "%s : rank %d's transport: %s; %s", call, rank_, first.c_str(), consequence);
    }
    for (int r = 0; r < nranks_; ++r) {
      const OutcomeRecord& o = all[r];
      if (o.magic != kRecordMagic || !o.transportFailed) continue;
      const std::string text = textOf(o.message, sizeof(o.message));
      fail("failed: rank " + std::to_string(r) + "'s transport: " + text);
      clearPendingError();
      return ZP_ERR(zpRemoteError, "%s : rank %d's transport: %s; %s", call, r, text.c_str(), consequence);
    }
    if (mine != zpSuccess) {
      if (pendingError().empty()) ZP_ERR(mine, "%s", message.c_str());
      return mine;
    }
    for (int r = 0; r < nranks_; ++r) {
      const OutcomeRecord& o = all[r];
      if (o.result == zpSuccess) continue;
      return ZP_ERR(static_cast<zpResult_t>(o.result), "%s : rank %d %s (%s)", call, r,
                    init ? "could not create its communicator" : "failed",
                    textOf(o.message, sizeof(o.message)).c_str());
    }
    return zpSuccess;
  }

  // The transport's allGather of `bytes` a rank into `all` (nranks * bytes), for `what`. Returns why it failed ("" on
  // success), as "<callback> of <what> failed (...)". The call's data moves between the communicator's scratch, which
  // a failed call leaves for good (settle).
  std::string gather(const void* mine, void* all, size_t bytes, int64_t timeoutMs, const char* call, const char* what) {
    zpTransportCall_t c = callOf(call, timeoutMs);
    const int rc = t_.allGather(t_.context, mine, all, bytes, &c);
    return checked(rc, c, bytes * nranks_, timeoutMs, what, "allGather");
  }

  // gather() of this object's records (init's, a call's signature or outcome), which live on the caller's stack and
  // go when it returns: they travel through records_, which a failed callback leaves for good, as its engine may still
  // write into it (a collective that timed out but cannot be cancelled).
  std::string gatherRecords(const void* mine, void* all, size_t bytes, int64_t timeoutMs, const char* call,
                            const char* what) {
    records_.resize(bytes * (nranks_ + 1));
    memcpy(records_.data(), mine, bytes);
    const std::string why = gather(records_.data(), records_.data() + bytes, bytes, timeoutMs, call, what);
    if (why.empty()) {
      memcpy(all, records_.data() + bytes, bytes * nranks_);
    } else {
      keepForGood(&records_);
    }
    return why;
  }

  // The transport's allToAll with this object's counts and offsets, which a failed callback leaves for good.
  std::string scatter(const void* mine, void* space, int64_t timeoutMs, const char* call, const char* what) {
    size_t expected = 0;
    for (size_t n : recvCounts_) expected += n;
    zpTransportCall_t c = callOf(call, timeoutMs);
    const int rc = t_.allToAll(t_.context, mine, sendCounts_.data(), sendOffsets_.data(), space, recvCounts_.data(),
                               recvOffsets_.data(), &c);
    if (rc != 0) {
      for (auto* counts : {&sendCounts_, &sendOffsets_, &recvCounts_, &recvOffsets_}) keepForGood(counts);
    }
    return checked(rc, c, expected, timeoutMs, what, "allToAll");
  }

  static zpTransportCall_t callOf(const char* call, int64_t timeoutMs) {
    zpTransportCall_t c;
    memset(&c, 0, sizeof(c));
    c.call = call;
    c.timeoutMs = timeoutMs >= kMaxWaitMs ? 0 : static_cast<long long>(timeoutMs);
    return c;
  }

  std::string checked(int rc, const zpTransportCall_t& c, size_t expected, int64_t timeoutMs, const char* what,
                      const char* callback) {
    char buf[512];
    const std::string error = textOf(c.error, sizeof(c.error));
    const long long ms = timeoutMs >= kMaxWaitMs ? 0 : static_cast<long long>(timeoutMs);
    shortData_ = rc == 0 && c.received != expected;
    if (rc != 0) {
      snprintf(buf, sizeof(buf), "%s of %s failed (returned %d: %s; timeout %lld ms)", callback, what, rc,
               error.empty() ? "no message" : error.c_str(), ms);
    } else if (c.received != expected) {
      snprintf(buf, sizeof(buf), "%s of %s returned %zu of its %zu bytes", callback, what, c.received, expected);
    } else {
      return std::string();
    }
    callbackFailed_ = true;
    return buf;
  }

  void clearCounts() {
    sendCounts_.assign(nranks_, 0);
    sendOffsets_.assign(nranks_, 0);
    recvCounts_.assign(nranks_, 0);
    recvOffsets_.assign(nranks_, 0);
  }

  const zpTransport_t t_;
  const int nranks_;
  const int rank_;
  const WorldTimeouts timeouts_;
  std::vector<RankInit> inits_;
  std::vector<size_t> sendCounts_, sendOffsets_, recvCounts_, recvOffsets_;
  // What gatherRecords gives the transport: this rank's record, then every rank's.
  std::vector<unsigned char> records_;
  std::string pending_;          // this call's first failure of a callback ("" while none)
  bool callbackFailed_ = false;  // some callback failed: its buffers may still be in use
  bool shortData_ = false;       // the last callback wrote fewer bytes than asked
  bool released_ = false;
  mutable std::mutex mutex_;
  std::atomic<bool> failed_{false};
  std::string failure_;  // under mutex_
};

}  // namespace

zpResult_t openCallbackTransport(const zpTransport_t& t, const RankInit& mine, const char* call,
                                 std::unique_ptr<HostTransport>* out) {
  auto transport = std::make_unique<CallbackTransport>(t, WorldTimeouts::fromParams());
  ZPCHECK(transport->join(mine, call));
  *out = std::move(transport);
  return zpSuccess;
}

}  // namespace zp
