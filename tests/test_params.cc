// The environment tunables' parsing (host/base/params.h): a bad value is refused and the default used, never taken;
// a wait in milliseconds is clamped to one that std::chrono can add to now().
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "host/base/debug.h"
#include "host/base/log_env.h"
#include "host/base/params.h"
#include "include/zpccl.h"
#include "tests/child_test.h"

namespace zp {
namespace {

// Sets an environment variable for one scope and restores what was there (set or unset) at its end.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = getenv(name)) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

bool endsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

constexpr const char* kInt64Max = "9223372036854775807";

TEST(Params, UnsetOrEmptyGivesTheDefault) {
  EXPECT_EQ(parseParam("ZP_T", nullptr, 7, 0, 10), 7);
  EXPECT_EQ(parseParam("ZP_T", "", 7, 0, 10), 7);
}

TEST(Params, IntegersInRangeAreTaken) {
  EXPECT_EQ(parseParam("ZP_T", "0", 7, 0, 10), 0);
  EXPECT_EQ(parseParam("ZP_T", "10", 7, 0, 10), 10);
  EXPECT_EQ(parseParam("ZP_T", "-1", 7, -1, 10), -1);
  EXPECT_EQ(parseParam("ZP_T", "0x10", 7, 0, 100), 16);
  EXPECT_EQ(parseParam("ZP_T", "268435456", 7, 0, INT64_MAX), 268435456);
}

TEST(Params, OutOfRangeOrNotAnIntegerGivesTheDefault) {
  EXPECT_EQ(parseParam("ZP_PAIR_ALLGATHER", "3", 2, 0, 2), 2);
  EXPECT_EQ(parseParam("ZP_PAIR_ALLGATHER", "-1", 2, 0, 2), 2);
  EXPECT_EQ(parseParam("ZP_T", "16M", 7, 0, INT64_MAX), 7);
  EXPECT_EQ(parseParam("ZP_T", "yes", 7, 0, 10), 7);
  EXPECT_EQ(parseParam("ZP_T", "1.5", 7, 0, 10), 7);
  EXPECT_EQ(parseParam("ZP_T", "99999999999999999999999", 7, 0, INT64_MAX), 7);  // overflows
}

// The warning says why a value was refused: text that is no integer, or an integer outside the range (one beyond
// int64 too: it is an integer, only a large one).
TEST(Params, TheWarningSaysWhyAValueWasRefused) {
  EXPECT_EQ(readParamText("ZP_T", "yes", 7, 0, 10).warning, "ZP_T='yes' is not an integer; using the default 7");
  EXPECT_EQ(readParamText("ZP_T", "16M", 7, 0, 10).warning, "ZP_T='16M' is not an integer; using the default 7");
  EXPECT_EQ(readParamText("ZP_PAIR_ALLGATHER", "3", 2, 0, 2).warning,
            "ZP_PAIR_ALLGATHER=3 is outside [0, 2]; using the default 2");
  EXPECT_EQ(readParamText("ZP_T", "99999999999999999999999", 7, 0, INT64_MAX).warning,
            "ZP_T=99999999999999999999999 is outside [0, 9223372036854775807]; using the default 7");
  EXPECT_EQ(readParamText("ZP_T", "-99999999999999999999999", 7, -1, 10).warning,
            "ZP_T=-99999999999999999999999 is outside [-1, 10]; using the default 7");
  const ParamReading taken = readParamText("ZP_T", "0x10", 7, 0, 100);
  EXPECT_EQ(taken.value, 16);
  EXPECT_EQ(taken.warning, "");
  EXPECT_EQ(readParamText("ZP_T", nullptr, 7, 0, 100).warning, "");
}

// A wait may be as long as the user likes ("never time out": 0, or INT64_MAX), but what the code waits is
// clamped to kMaxWaitMs, which std::chrono can add to now() without overflowing. 0 means never for every wait.
// Negative values are refused as any tunable's are.
TEST(Params, WaitsTakeAnyLengthClampedToTheLongestSafeOne) {
  EXPECT_EQ(parseWaitParam("ZP_T", kInt64Max, 7), kMaxWaitMs);
  EXPECT_EQ(parseWaitParam("ZP_T", "0x7fffffffffffffff", 7), kMaxWaitMs);
  EXPECT_EQ(parseWaitParam("ZP_T", "1000000000001", 7), kMaxWaitMs);
  EXPECT_EQ(parseWaitParam("ZP_T", "1000000000000", 7), kMaxWaitMs);
  EXPECT_EQ(parseWaitParam("ZP_T", "999999999999", 7), 999999999999);
  EXPECT_EQ(parseWaitParam("ZP_T", "30000", 7), 30000);
  EXPECT_EQ(parseWaitParam("ZP_T", "1", 7), 1);
  EXPECT_EQ(parseWaitParam("ZP_T", nullptr, 7), 7);
  EXPECT_EQ(parseWaitParam("ZP_T", "0", 7), kMaxWaitMs);  // never
  EXPECT_EQ(parseWaitParam("ZP_T", "-1", 7), 7);
  EXPECT_EQ(parseWaitParam("ZP_T", "-9223372036854775808", 7), 7);
  EXPECT_EQ(parseWaitParam("ZP_T", "99999999999999999999999", 7), 7);  // not an int64: refused, not clamped
}

// Every tunable in milliseconds (its variable ends in _MS), as the library reads it from the environment: a
// value past kMaxWaitMs is clamped, 0 is never (kMaxWaitMs), a negative one refused. A new _MS tunable declared in
// ZP_PARAMS instead of ZP_WAIT_PARAMS fails here.
TEST(Params, EveryMillisecondTunableFromTheEnvironmentIsClamped) {
  struct Tunable {
    const char* env;
    int64_t def;
  };
  std::vector<Tunable> all;
#define ZP_LIST_WAIT(name, env, def, ...) all.push_back({env, def});
#define ZP_LIST(name, env, def, ...) all.push_back({env, def});
  ZP_WAIT_PARAMS(ZP_LIST_WAIT)
  ZP_PARAMS(ZP_LIST)
#undef ZP_LIST
#undef ZP_LIST_WAIT
  int waits = 0;
  for (const Tunable& t : all) {
    if (!endsWith(t.env, "_MS")) continue;
    ++waits;
    SCOPED_TRACE(t.env);
    int64_t value = 0;
    {
      ScopedEnv env(t.env, kInt64Max);
      ASSERT_TRUE(readParam(t.env, &value));
      EXPECT_EQ(value, kMaxWaitMs);
    }
    {
      ScopedEnv env(t.env, "2000000000000");
      ASSERT_TRUE(readParam(t.env, &value));
      EXPECT_EQ(value, kMaxWaitMs);
    }
    {
      ScopedEnv env(t.env, "-1");
      ASSERT_TRUE(readParam(t.env, &value));
      EXPECT_EQ(value, t.def);
    }
    {
      ScopedEnv env(t.env, "0");  // never, for every wait alike
      ASSERT_TRUE(readParam(t.env, &value));
      EXPECT_EQ(value, kMaxWaitMs);
    }
    {
      ScopedEnv env(t.env, "45000");
      ASSERT_TRUE(readParam(t.env, &value));
      EXPECT_EQ(value, 45000);
    }
  }
  EXPECT_GE(waits, 3);  // ZP_INIT_TIMEOUT_MS, ZP_HOST_TIMEOUT_MS, ZP_TIMEOUT_MS
  int64_t value = 0;
  EXPECT_FALSE(readParam("ZP_NO_SUCH_TUNABLE", &value));
}

// What the host backend does with ZP_HOST_TIMEOUT_MS (HostWorld::wait): a condition-variable wait_for of that
// many milliseconds for a peer that comes 50 ms later. With INT64_MAX unclamped, now() + the wait overflows
// and the wait ends at once, timed out.
TEST(Params, TheLongestWaitReallyWaits) {
  int64_t timeoutMs = 0;
  {
    ScopedEnv env("ZP_HOST_TIMEOUT_MS", kInt64Max);
    ASSERT_TRUE(readParam("ZP_HOST_TIMEOUT_MS", &timeoutMs));
  }
  EXPECT_GT(std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs), std::chrono::steady_clock::now());
  EXPECT_GT(std::chrono::system_clock::now() + std::chrono::milliseconds(timeoutMs), std::chrono::system_clock::now());
  std::mutex mutex;
  std::condition_variable cv;
  bool arrived = false;
  std::thread peer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::lock_guard<std::mutex> lock(mutex);
    arrived = true;
    cv.notify_all();
  });
  const auto start = std::chrono::steady_clock::now();
  bool done = false;
  {
    std::unique_lock<std::mutex> lock(mutex);
    done = cv.wait_for(lock, std::chrono::milliseconds(timeoutMs), [&] { return arrived; });
  }
  const auto waited = std::chrono::steady_clock::now() - start;
  peer.join();
  EXPECT_TRUE(done) << "the wait of " << timeoutMs << " ms timed out after "
                    << std::chrono::duration_cast<std::chrono::milliseconds>(waited).count() << " ms";
}

// The logging variables: what they take, and a warning (never silence) for what they cannot.
TEST(LogEnv, LevelsAreTakenInAnyCaseAndAnythingElseIsWarnedAbout) {
  const struct {
    const char* text;
    int level;
  } good[] = {{nullptr, kLogWarn}, {"", kLogWarn},     {"NONE", kLogNone},  {"version", kLogVersion},
              {"Warn", kLogWarn},  {"INFO", kLogInfo}, {"trace", kLogTrace}};
  for (const auto& g : good) {
    std::string warning = "poison";
    EXPECT_EQ(readLogLevel(g.text, &warning), g.level) << (g.text ? g.text : "(unset)");
    EXPECT_EQ(warning, "") << (g.text ? g.text : "(unset)");
  }
  for (const char* bad : {"DEBUG", "info ", "3", "WARNING", "INFO,COLL"}) {
    std::string warning;
    EXPECT_EQ(readLogLevel(bad, &warning), kLogWarn) << bad;
    EXPECT_NE(warning.find(std::string("ZP_DEBUG='") + bad + "'"), std::string::npos) << warning;
    EXPECT_NE(warning.find("NONE, VERSION, WARN, INFO or TRACE"), std::string::npos) << warning;
  }
}

TEST(LogEnv, SubsystemsTakeTheWordsTheyKnowAndNameTheOthers) {
  std::string warning = "poison";
  EXPECT_EQ(readLogSubsys("init,Coll", &warning), unsigned{kSubsysInit | kSubsysColl});
  EXPECT_EQ(warning, "");
  EXPECT_EQ(readLogSubsys("^COLL", &warning), ~unsigned{kSubsysColl});
  EXPECT_EQ(warning, "");
  EXPECT_EQ(readLogSubsys("ALL", &warning), unsigned{kSubsysAll});
  EXPECT_EQ(warning, "");
  EXPECT_EQ(readLogSubsys("COLLS,INIT,NET", &warning), unsigned{kSubsysInit});
  EXPECT_NE(warning.find("ZP_DEBUG_SUBSYS='COLLS,INIT,NET'"), std::string::npos) << warning;
  EXPECT_NE(warning.find("COLLS"), std::string::npos) << warning;
  EXPECT_NE(warning.find("NET"), std::string::npos) << warning;
  EXPECT_NE(warning.find("INIT, COLL, QUANT, TOPO, ALLOC, ENV, ALL"), std::string::npos) << warning;
}

TEST(LogEnv, ALogFileThatCannotBeOpenedIsWarnedAbout) {
  std::string warning = "poison";
  EXPECT_EQ(openLogFile("/nonexistent-zpccl-dir/log.%p", &warning), nullptr);
  EXPECT_NE(warning.find("ZP_DEBUG_FILE='/nonexistent-zpccl-dir/log.%p'"), std::string::npos) << warning;
  EXPECT_NE(warning.find("/nonexistent-zpccl-dir/log." + std::to_string(getpid())), std::string::npos) << warning;
  EXPECT_NE(warning.find("stderr"), std::string::npos) << warning;
  char path[] = "/tmp/zpccl-log-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  FILE* f = openLogFile(path, &warning);
  EXPECT_NE(f, nullptr);
  EXPECT_EQ(warning, "");
  if (f != nullptr) fclose(f);
  unlink(path);
}

// WARN is never filtered by subsystem: a ZP_DEBUG_SUBSYS of words it does not know (or ^ALL) must not silence the
// messages of refused calls, nor the warning about itself. Each child reads the variables afresh.
TEST(LogEnv, NoSubsystemSettingSilencesWarnings) {
  for (const char* subsys : {"COLLS", "^ALL"}) {
    const zptest::ChildRun run = zptest::runTestInChild("LogEnvChild.DISABLED_ARefusedCall",
                                                        {std::string("ZP_DEBUG_SUBSYS=") + subsys, "ZP_DEBUG=WARN"});
    EXPECT_EQ(run.exitCode, 0) << run.output;
    EXPECT_NE(run.output.find("WARN zpGetVersion : version is NULL"), std::string::npos) << subsys << run.output;
    const bool unknown = subsys[0] != '^';
    EXPECT_EQ(run.output.find("WARN ZP_DEBUG_SUBSYS='COLLS' names no subsystem COLLS") != std::string::npos, unknown)
        << run.output;
  }
}

TEST(LogEnvChild, DISABLED_ARefusedCall) { EXPECT_EQ(zpGetVersion(nullptr), zpInvalidArgument); }

}  // namespace
}  // namespace zp
