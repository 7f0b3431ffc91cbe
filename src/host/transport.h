// How the host backend's ranks meet and move bytes: the few exchanges its plans need, behind one interface, so that
// one implementation of the plans and the math serves ranks that are threads of one process (thread_transport.cc:
// peers read each other's memory in place, between barriers of a HostWorld) and ranks that are processes
// (callback_transport.cc: the caller's zpTransport_t callbacks, over torch.distributed or MPI, copy the bytes).
//
// A collective's exchanges, as host_backend.cc makes them: the first one of a call carries the call's signature
// (every rank compares every rank's before any data moves), each exchange is followed by endExchange once this rank
// has read what it received, and the call ends with endCall, which gives every rank the same verdict.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "host/base/keep_for_good.h"
#include "host/rank_init.h"
#include "include/zpccl.h"
#include "src/host/host_world.h"

namespace zp {

// The ranks of one exchange, in the order of their blocks: global ranks, and this rank's index among them.
struct PeerGroup {
  const std::vector<int>* ranks = nullptr;
  int self = 0;
  int size() const { return static_cast<int>(ranks->size()); }
};

// One chunk of an all-to-all: at `offset` of what each member gives, one block of blockBytes for every member of
// the group, in group order.
struct ExchangeChunk {
  size_t offset = 0;
  size_t blockBytes = 0;
};

// Where an exchange's blocks are, to be read until endExchange: block(c, i) is what member i of the group gave this
// rank in chunk c (an all-gather has one chunk: member i's whole contribution). A transport that shares memory
// points into the members' own buffers, one that copies into the space this rank lent it.
class Received {
 public:
  const unsigned char* block(int chunk, int member) const {
    const From& f = from_[member];
    return f.base + chunks_[chunk].offset + f.index * chunks_[chunk].blockBytes;
  }

  // For a transport: the exchange's chunks and group size, then where each member's blocks are: at base, as block
  // `index` of each chunk.
  void reset(const std::vector<ExchangeChunk>& chunks, int members) {
    chunks_ = chunks;
    from_.assign(members, From());
  }
  void setFrom(int member, const unsigned char* base, size_t index) { from_[member] = From{base, index}; }

 private:
  struct From {
    const unsigned char* base = nullptr;
    size_t index = 0;
  };
  std::vector<ExchangeChunk> chunks_;
  std::vector<From> from_;
};

class HostTransport {
 public:
  virtual ~HostTransport() = default;

  // Every rank's RankInit, in rank order, as the ranks met (host/rank_init.h).
  virtual const std::vector<RankInit>& inits() const = 0;
  // Init's last step: every rank publishes whether its init succeeded; all return the verdict of the lowest failing
  // rank (its own when it failed), so that they leave init alike.
  virtual zpResult_t agreeOnInit(zpResult_t mine, const std::string& message, const char* call) = 0;

  // An all-gather among `group`: every member gives `bytes` bytes at `mine`, and *out names where each member's lie.
  // `space` (group.size() * bytes, owned by the communicator) is where a transport that copies may put them. With
  // `signature` set (the call's first exchange) the ranks first compare their signatures: a difference is
  // zpInvalidUsage on every rank, naming the argument and both values, and no data moves.
  virtual zpResult_t allGather(const PeerGroup& group, const void* mine, size_t bytes, unsigned char* space,
                               const CallSignature* signature, const char* call, Received* out) = 0;
  // An all-to-all among `group`, chunk by chunk: in chunk c, block i of `mine` (at chunks[c].offset + i *
  // chunks[c].blockBytes) goes to member i. `space` is laid out as `mine` and lent as in allGather.
  virtual zpResult_t allToAll(const PeerGroup& group, const void* mine, const std::vector<ExchangeChunk>& chunks,
                              unsigned char* space, const CallSignature* signature, const char* call,
                              Received* out) = 0;
  // This rank has read what the last exchange gave it; returns once every member may change what it gave.
  virtual zpResult_t endExchange(const char* call) = 0;
  // This rank stops reading at once, without waiting for anybody (the way out of a failed call).
  virtual void stopReading() = 0;
  // The end of a call that this rank ends with `result`: returns the call's verdict, the same on every rank when a
  // transport failed on any of them (zpRemoteError, naming the rank and what failed).
  virtual zpResult_t endCall(zpResult_t result, const char* call) = 0;

  // Whether members read what a rank gives them in place (threads of one process), so that a caller's buffer may be
  // given to an exchange as it is. Otherwise only the communicator's own memory is.
  virtual bool sharesMemory() const = 0;
  // After a failed call: true once nobody reads or writes what this rank gave to the call's exchanges (it may be
  // freed), false when that cannot be known: what the transport was given must then never be freed or reused.
  virtual bool settle() = 0;

  virtual bool failed() const = 0;
  // Why the communicator failed ("" while it has not).
  virtual std::string failure() const = 0;
  // Fails the communicator: this rank's calls, its waits included, return zpRemoteError naming `why` (the first
  // failure is kept).
  virtual void fail(const std::string& why) = 0;
  // fail() for zpCommAbort on this rank.
  virtual void abort() = 0;
  // The communicator is being freed, after its last call: what the transport holds of its caller's goes (the
  // caller's finalize callback).
  virtual void release() {}
};

// Ranks as threads of this process: joins the HostWorld of `id` (host_world.h) with this rank's RankInit, waiting
// for every rank (ZP_INIT_TIMEOUT_MS).
zpResult_t joinThreadTransport(const zpUniqueId& id, int nranks, int rank, const RankInit& mine, const char* call,
                               std::unique_ptr<HostTransport>* out);
// Ranks as processes: the caller's callbacks (include/zpccl.h, zpTransport_t, checked by the caller), which every rank
// uses to all-gather its RankInit and its view of the ranks (ZP_INIT_TIMEOUT_MS). A failure is agreed with the ranks
// that the transport reaches, and returned.
zpResult_t openCallbackTransport(const zpTransport_t& t, const RankInit& mine, const char* call,
                                 std::unique_ptr<HostTransport>* out);

}  // namespace zp
