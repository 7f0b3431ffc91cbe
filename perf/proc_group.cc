#include "perf/proc_group.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#ifdef ZP_PERF_MPI
#include <mpi.h>
#endif

namespace zp {
namespace perf {

void ProcGroup::abort(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  // _Exit: other threads may still sit in NCCL or zpccl calls; running static destructors under them would
  // only add a second failure to the report.
  std::_Exit(code);
}

bool ProcGroup::broadcast(void* data, size_t bytes, int root, std::string* error) {
  std::vector<char> all(bytes * size_t(size()));
  if (!allGather(data, bytes, all.data(), error)) return false;
  std::memcpy(data, all.data() + size_t(root) * bytes, bytes);
  return true;
}

bool ProcGroup::barrier(std::string* error) {
  char token = 0;
  std::vector<char> all(static_cast<size_t>(size()));
  return allGather(&token, 1, all.data(), error);
}

double rendezvousTimeoutSeconds() {
  const char* env = std::getenv("ZP_PERF_RENDEZVOUS_TIMEOUT");
  if (env != nullptr && *env != '\0') {
    char* end = nullptr;
    double v = std::strtod(env, &end);
    if (end != env && *end == '\0' && v > 0) return v;
  }
  return 600.0;
}

namespace {

class SingleProcGroup : public ProcGroup {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* kind() const override { return "single"; }
  bool allGather(const void* mine, size_t bytes, void* all, std::string*) override {
    std::memcpy(all, mine, bytes);
    return true;
  }
};

bool writeAll(int fd, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    bytes -= size_t(n);
  }
  return true;
}

// Reads exactly `bytes` bytes of path. 0: done; 1: not there (yet); -1: error (message in *error).
int readExact(const std::string& path, void* data, size_t bytes, std::string* error) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) {
    if (errno == ENOENT) return 1;
    *error = "cannot open " + path + ": " + std::strerror(errno);
    return -1;
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    *error = "cannot stat " + path + ": " + std::strerror(errno);
    return -1;
  }
  if (size_t(st.st_size) != bytes) {
    ::close(fd);
    *error = path + " has " + std::to_string(st.st_size) + " bytes, expected " + std::to_string(bytes) +
             " (do all processes run the same binary with the same flags?)";
    return -1;
  }
  char* p = static_cast<char*>(data);
  size_t left = bytes;
  while (left > 0) {
    ssize_t n = ::read(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      *error = "cannot read " + path;
      return -1;
    }
    p += n;
    left -= size_t(n);
  }
  ::close(fd);
  return 0;
}

class FileProcGroup : public ProcGroup {
 public:
  FileProcGroup(std::string dir, int nprocs, int index, double timeout)
      : dir_(std::move(dir)), nprocs_(nprocs), index_(index), timeout_(timeout) {}

  int rank() const override { return index_; }
  int size() const override { return nprocs_; }
  const char* kind() const override { return "file"; }

  // The first exchange: everyone posts a nonce under a session-less name; process 0's becomes the session.
  bool hello(std::string* error) {
    struct stat st;
    if (::stat(dir_.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      *error = "rendezvous directory " + dir_ + " does not exist";
      return false;
    }
    if (::stat(helloPath(index_).c_str(), &st) == 0) {
      *error = "rendezvous directory " + dir_ + " holds files of an earlier run (" + helloPath(index_) +
               "); give each run a fresh directory";
      return false;
    }
    std::random_device rd;
    unsigned long long nonce =
        (static_cast<unsigned long long>(rd()) << 32) ^ rd() ^ static_cast<unsigned long long>(::getpid()) ^
        static_cast<unsigned long long>(std::chrono::steady_clock::now().time_since_epoch().count());
    std::vector<unsigned long long> all(static_cast<size_t>(nprocs_));
    if (!exchange(
            &nonce, sizeof(nonce), all.data(), [this](int p) { return helloPath(p); }, error))
      return false;
    session_ = all[0];
    return true;
  }

  bool allGather(const void* mine, size_t bytes, void* all, std::string* error) override {
    return exchange(
        mine, bytes, all, [this](int p) { return dataPath(sequence_, p); }, error);
  }

 private:
  std::string helloPath(int p) const { return dir_ + "/hello." + std::to_string(p); }
  std::string dataPath(unsigned long long seq, int p) const {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "/s%016llx.x%llu.%d", session_, seq, p);
    return dir_ + buf;
  }

  template <class PathOf>
  bool exchange(const void* mine, size_t bytes, void* all, PathOf pathOf, std::string* error) {
    const std::string myPath = pathOf(index_);
    const std::string tmp = myPath + ".tmp";
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
      *error = "cannot create " + tmp + ": " + std::strerror(errno);
      return false;
    }
    bool ok = writeAll(fd, mine, bytes);
    ok = (::close(fd) == 0) && ok;
    if (!ok || ::rename(tmp.c_str(), myPath.c_str()) != 0) {
      *error = "cannot write " + myPath + ": " + std::strerror(errno);
      return false;
    }
    auto start = std::chrono::steady_clock::now();
    auto pause = std::chrono::microseconds(200);
    for (int p = 0; p < nprocs_; ++p) {
      char* dst = static_cast<char*>(all) + size_t(p) * bytes;
      for (;;) {
        int r = readExact(pathOf(p), dst, bytes, error);
        if (r < 0) return false;
        if (r == 0) break;
        double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (waited > timeout_) {
          *error = "timed out after " + std::to_string(int(waited)) + " s waiting for process " + std::to_string(p) +
                   " (" + pathOf(p) + "); is it running with the same -P and -D?";
          return false;
        }
        std::this_thread::sleep_for(pause);
        if (pause < std::chrono::milliseconds(20)) pause *= 2;
      }
    }
    // Every process has now posted this exchange, so each has finished reading the previous one: our own
    // previous file can go. The last exchange's files stay (nobody knows when the others read them).
    if (!previous_.empty()) ::unlink(previous_.c_str());
    previous_ = myPath;
    ++sequence_;
    return true;
  }

  std::string dir_;
  int nprocs_;
  int index_;
  double timeout_;
  unsigned long long session_ = 0;
  unsigned long long sequence_ = 0;
  std::string previous_;
};

#ifdef ZP_PERF_MPI
class MpiProcGroup : public ProcGroup {
 public:
  MpiProcGroup(int rank, int size) : rank_(rank), size_(size) {}
  ~MpiProcGroup() override { MPI_Finalize(); }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* kind() const override { return "mpi"; }
  bool allGather(const void* mine, size_t bytes, void* all, std::string* error) override {
    if (bytes > size_t(1) << 30) {
      *error = "MPI exchange too large";
      return false;
    }
    int rc = MPI_Allgather(mine, int(bytes), MPI_BYTE, all, int(bytes), MPI_BYTE, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) {
      *error = "MPI_Allgather failed with " + std::to_string(rc);
      return false;
    }
    return true;
  }
  bool broadcast(void* data, size_t bytes, int root, std::string* error) override {
    if (bytes > size_t(1) << 30) {
      *error = "MPI broadcast too large";
      return false;
    }
    int rc = MPI_Bcast(data, int(bytes), MPI_BYTE, root, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) {
      *error = "MPI_Bcast failed with " + std::to_string(rc);
      return false;
    }
    return true;
  }
  [[noreturn]] void abort(int code) override {
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

 private:
  int rank_;
  int size_;
};
#endif

}  // namespace

std::unique_ptr<ProcGroup> makeSingleProcGroup() { return std::make_unique<SingleProcGroup>(); }

std::unique_ptr<ProcGroup> makeFileProcGroup(const std::string& dir, int nprocs, int index, double timeoutSeconds,
                                             std::string* error) {
  auto group = std::make_unique<FileProcGroup>(dir, nprocs, index, timeoutSeconds);
  if (!group->hello(error)) return nullptr;
  return group;
}

bool launchedByMpi() {
#ifdef ZP_PERF_MPI
  // Open MPI, MPICH/Hydra, PMIx and Slurm launchers each leave one of these.
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"}) {
    const char* s = std::getenv(v);
    if (s != nullptr && *s != '\0') return true;
  }
#endif
  return false;
}

std::unique_ptr<ProcGroup> makeMpiProcGroup(int* argc, char*** argv, std::string* error) {
#ifdef ZP_PERF_MPI
  int provided = 0;
  if (MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
    *error = "MPI_Init_thread failed";
    return nullptr;
  }
  if (provided < MPI_THREAD_SERIALIZED)
    std::fprintf(stderr,
                 "# warning: MPI gives thread level %d < MPI_THREAD_SERIALIZED; the harness talks to MPI "
                 "from one rank thread at a time, which most MPIs accept anyway\n",
                 provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return std::make_unique<MpiProcGroup>(rank, size);
#else
  (void)argc;
  (void)argv;
  *error = "this binary was built without MPI";
  return nullptr;
#endif
}

}  // namespace perf
}  // namespace zp
