// The host backend's transport among threads of one process: every exchange publishes a pointer in the HostWorld
// (host_world.h) and members read each other's memory in place until the barrier that ends the exchange. Nothing is
// copied but what the plans themselves copy.
#include <memory>
#include <string>
#include <vector>

#include "host/base/check.h"
#include "src/host/host_world.h"
#include "src/host/transport.h"

namespace zp {

namespace {

class ThreadTransport final : public HostTransport {
 public:
  ThreadTransport(std::shared_ptr<HostWorld> world, int rank) : world_(std::move(world)), rank_(rank) {}

  const std::vector<RankInit>& inits() const override { return world_->inits(); }

  zpResult_t agreeOnInit(zpResult_t mine, const std::string& message, const char* call) override {
    return world_->agreeOnInit(rank_, mine, message, call);
  }

  zpResult_t allGather(const PeerGroup& group, const void* mine, size_t bytes, unsigned char*,
                       const CallSignature* signature, const char* call, Received* out) override {
    ZPCHECK(publish(mine, signature, call));
    out->reset({ExchangeChunk{0, bytes}}, group.size());
    for (int i = 0; i < group.size(); ++i) out->setFrom(i, peer(group, i), 0);
    return zpSuccess;
  }

  // Member i reads its block of every chunk from this rank's buffer, where it lies at index i: this rank reads
  // block `self` of each member's.
  zpResult_t allToAll(const PeerGroup& group, const void* mine, const std::vector<ExchangeChunk>& chunks,
                      unsigned char*, const CallSignature* signature, const char* call, Received* out) override {
    ZPCHECK(publish(mine, signature, call));
    out->reset(chunks, group.size());
    for (int i = 0; i < group.size(); ++i) out->setFrom(i, peer(group, i), group.self);
    return zpSuccess;
  }

  // Members may read this rank's buffer until every one of them has arrived here.
  zpResult_t endExchange(const char* call) override {
    world_->endReads(rank_);
    return world_->barrier(rank_, call);
  }

  void stopReading() override { world_->endReads(rank_); }

  // The barrier of the last endExchange, or the failed world, already gave every rank the same verdict.
  zpResult_t endCall(zpResult_t result, const char*) override { return result; }

  bool sharesMemory() const override { return true; }

  bool settle() override {
    world_->waitForReaders();
    return true;
  }

  bool failed() const override { return world_->failed(); }
  std::string failure() const override { return world_->failure(); }
  void fail(const std::string& why) override { world_->fail(why); }
  void abort() override { world_->abort(rank_); }

 private:
  zpResult_t publish(const void* mine, const CallSignature* signature, const char* call) {
    return signature != nullptr ? world_->exchangeAgreed(rank_, mine, *signature) : world_->exchange(rank_, mine, call);
  }

  const unsigned char* peer(const PeerGroup& group, int i) const {
    return static_cast<const unsigned char*>(world_->slot((*group.ranks)[i]));
  }

  std::shared_ptr<HostWorld> world_;
  const int rank_;
};

}  // namespace

zpResult_t joinThreadTransport(const zpUniqueId& id, int nranks, int rank, const RankInit& mine, const char* call,
                               std::unique_ptr<HostTransport>* out) {
  std::shared_ptr<HostWorld> world;
  ZPCHECK(HostWorld::join(id, nranks, rank, mine, call, WorldTimeouts::fromParams(), &world));
  *out = std::make_unique<ThreadTransport>(std::move(world), rank);
  return zpSuccess;
}

}  // namespace zp
