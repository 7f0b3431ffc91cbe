// Logging, as NCCL's: WARN always (with file:line), INFO behind a cheap level and subsystem check, TRACE
// compiled out unless ZP_ENABLE_TRACE. Controlled by ZP_DEBUG (VERSION, WARN, INFO, TRACE), ZP_DEBUG_SUBSYS
// (comma-separated INIT, COLL, QUANT, TOPO, ALLOC, ENV, ALL; a leading ^ inverts) and ZP_DEBUG_FILE (a path;
// %h becomes the hostname and %p the pid).
#pragma once

#include <atomic>

namespace zp {

enum LogLevel { kLogUnset = -1, kLogNone = 0, kLogVersion = 1, kLogWarn = 2, kLogInfo = 3, kLogTrace = 4 };

enum LogSubsys : unsigned {
  kSubsysInit = 1u << 0,
  kSubsysColl = 1u << 1,
  kSubsysQuant = 1u << 2,
  kSubsysTopo = 1u << 3,
  kSubsysAlloc = 1u << 4,
  kSubsysEnv = 1u << 5,
  kSubsysAll = ~0u,
};

extern std::atomic<int> gLogLevel;  // kLogUnset until the environment has been read
extern unsigned gLogSubsys;

void logInit();
void logMessage(LogLevel level, unsigned subsys, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 5, 6)));

inline bool logEnabled(LogLevel level, unsigned subsys) {
  int current = gLogLevel.load(std::memory_order_relaxed);
  if (current == kLogUnset) {
    logInit();
    current = gLogLevel.load(std::memory_order_relaxed);
  }
  return current >= level && (gLogSubsys & subsys) != 0;
}

}  // namespace zp

#define ZP_WARN(...) ::zp::logMessage(::zp::kLogWarn, ::zp::kSubsysAll, __FILE__, __LINE__, __VA_ARGS__)
#define ZP_INFO(subsys, ...)                                                       \
  do {                                                                             \
    if (::zp::logEnabled(::zp::kLogInfo, (subsys)))                                \
      ::zp::logMessage(::zp::kLogInfo, (subsys), __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)
#ifdef ZP_ENABLE_TRACE
#define ZP_TRACE(subsys, ...)                                                       \
  do {                                                                              \
    if (::zp::logEnabled(::zp::kLogTrace, (subsys)))                                \
      ::zp::logMessage(::zp::kLogTrace, (subsys), __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)
#else
#define ZP_TRACE(...) \
  do {                \
  } while (0)
#endif
