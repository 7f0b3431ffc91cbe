// A buffer with one page that stalls the first thread to touch it: the page starts inaccessible, and the fault
// handler (in the touching thread) sleeps for a while before it opens the page and lets the access go on. Lets a
// test hold a rank in the middle of reading its peers' data (its recvbuff is this buffer) for as long as it wants,
// to see what its peers do meanwhile. One at a time in a process; a fault anywhere else crashes as it would have.
#pragma once

#include <signal.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace zptest {

class StallPage {
 public:
  // A buffer of `bytes` (page-aligned, zeroed) whose page holding byte `at` stalls its first toucher `stallMs`.
  StallPage(size_t bytes, size_t at, int stallMs) : bytes_(bytes) {
    base_ = static_cast<char*>(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    const size_t pageSize = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    state().page = base_ + at / pageSize * pageSize;
    state().pageSize = pageSize;
    state().stallMs = stallMs;
    state().stalled = false;
    state().resumedNs = 0;
    struct sigaction action = {};
    action.sa_sigaction = &onFault;
    action.sa_flags = SA_SIGINFO;
    sigemptyset(&action.sa_mask);
    sigaction(SIGSEGV, &action, &state().previous);
    mprotect(state().page, pageSize, PROT_NONE);
  }
  ~StallPage() {
    sigaction(SIGSEGV, &state().previous, nullptr);
    state().page = nullptr;
    munmap(base_, bytes_);
  }
  StallPage(const StallPage&) = delete;
  StallPage& operator=(const StallPage&) = delete;

  void* data() const { return base_; }
  bool stalled() const { return state().stalled.load(); }
  // CLOCK_MONOTONIC nanoseconds at which the stalled thread went on (0 before).
  int64_t resumedNs() const { return state().resumedNs.load(); }
  static int64_t nowNs() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
  }

 private:
  struct State {
    char* page = nullptr;
    size_t pageSize = 0;
    int stallMs = 0;
    std::atomic<bool> stalled{false};
    std::atomic<int64_t> resumedNs{0};
    struct sigaction previous;
  };
  static State& state() {
    static State s;
    return s;
  }
  // Only async-signal-safe calls here.
  static void onFault(int, siginfo_t* info, void*) {
    State& s = state();
    char* addr = static_cast<char*>(info->si_addr);
    if (s.page == nullptr || addr < s.page || addr >= s.page + s.pageSize) {
      sigaction(SIGSEGV, &s.previous, nullptr);  // not ours: the access faults again, and crashes as it would have
      return;
    }
    s.stalled = true;
    const timespec wait = {s.stallMs / 1000, (s.stallMs % 1000) * 1000000L};
    nanosleep(&wait, nullptr);
    mprotect(s.page, s.pageSize, PROT_READ | PROT_WRITE);
    s.resumedNs = nowNs();
  }

  char* base_;
  size_t bytes_;
};

}  // namespace zptest
