#include "host/base/params.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "host/base/debug.h"

namespace zp {

ParamReading readParamText(const char* env, const char* text, int64_t def, int64_t lo, int64_t hi) {
  if (text == nullptr || *text == '\0') return {def, std::string()};
  char buf[512];
  char* end = nullptr;
  errno = 0;
  const long long value = strtoll(text, &end, 0);
  if (end == text || *end != '\0') {
    snprintf(buf, sizeof(buf), "%s='%s' is not an integer; using the default %lld", env, text,
             static_cast<long long>(def));
    return {def, buf};
  }
  if (errno == ERANGE || value < lo || value > hi) {  // strtoll's ERANGE: beyond int64, so beyond [lo, hi] too
    snprintf(buf, sizeof(buf), "%s=%s is outside [%lld, %lld]; using the default %lld", env, text,
             static_cast<long long>(lo), static_cast<long long>(hi), static_cast<long long>(def));
    return {def, buf};
  }
  return {value, std::string()};
}

int64_t parseParam(const char* env, const char* text, int64_t def, int64_t lo, int64_t hi) {
  const ParamReading r = readParamText(env, text, def, lo, hi);
  if (!r.warning.empty()) {
    ZP_WARN("%s", r.warning.c_str());
  } else if (text != nullptr && *text != '\0') {
    ZP_INFO(kSubsysEnv, "%s set by environment to %lld", env, static_cast<long long>(r.value));
  }
  return r.value;
}

int64_t parseWaitParam(const char* env, const char* text, int64_t def) {
  const int64_t value = parseParam(env, text, def, 0, INT64_MAX);
  if (value == 0) {
    ZP_INFO(kSubsysEnv, "%s=0: never times out", env);
    return kMaxWaitMs;
  }
  if (value <= kMaxWaitMs) return value;
  ZP_INFO(kSubsysEnv, "%s=%lld is longer than the longest wait; waiting %lld ms (about 31 years) instead", env,
          static_cast<long long>(value), static_cast<long long>(kMaxWaitMs));
  return kMaxWaitMs;
}

bool readParam(const char* env, int64_t* value) {
#define ZP_READ_WAIT_PARAM(name, var, def, help)    \
  if (strcmp(env, var) == 0) {                      \
    *value = parseWaitParam(var, getenv(var), def); \
    return true;                                    \
  }
#define ZP_READ_PARAM(name, var, def, lo, hi, help)     \
  if (strcmp(env, var) == 0) {                          \
    *value = parseParam(var, getenv(var), def, lo, hi); \
    return true;                                        \
  }
  ZP_WAIT_PARAMS(ZP_READ_WAIT_PARAM)
  ZP_PARAMS(ZP_READ_PARAM)
#undef ZP_READ_PARAM
#undef ZP_READ_WAIT_PARAM
  return false;
}

#define ZP_DEFINE_WAIT_PARAM(name, env, def, help)                      \
  int64_t param##name() {                                               \
    static const int64_t value = parseWaitParam(env, getenv(env), def); \
    return value;                                                       \
  }
#define ZP_DEFINE_PARAM(name, env, def, lo, hi, help)                       \
  int64_t param##name() {                                                   \
    static const int64_t value = parseParam(env, getenv(env), def, lo, hi); \
    return value;                                                           \
  }
ZP_WAIT_PARAMS(ZP_DEFINE_WAIT_PARAM)
ZP_PARAMS(ZP_DEFINE_PARAM)
#undef ZP_DEFINE_PARAM
#undef ZP_DEFINE_WAIT_PARAM

bool ncclSwitchOn(const char* value) { return value != nullptr && std::atoi(value) != 0; }

const std::string& paramBackend() {
  static const std::string value = [] {
    const char* text = getenv("ZP_BACKEND");
    if (text == nullptr) return std::string();
    ZP_INFO(kSubsysEnv, "ZP_BACKEND set by environment to %s", text);
    return std::string(text);
  }();
  return value;
}

}  // namespace zp
