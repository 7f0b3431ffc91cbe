// How a perf binary's result file was made (DESIGN.md, "Evidence"): the record perf/provenance.py makes for the
// Python measurements, with the same keys (perf/json_out.h, Provenance), gathered here from C++.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "perf/json_out.h"

namespace zp {
namespace perf {

// The prefixes of the environment variables that steer a measurement (perf/provenance.py's STEERING_PREFIXES).
extern const char* const kSteeringPrefixes[8];

// The variables of `entries` (name=value, null-terminated, as `environ`) whose names start with a steering prefix,
// sorted by name.
std::vector<std::pair<std::string, std::string>> steeringEnvironment(char** entries);

// One word as a POSIX shell reads it back (Python's shlex.quote): bare when it holds only safe characters, else
// in single quotes.
std::string shellQuote(const std::string& word);
// argv joined as shell words (shlex.join).
std::string commandLine(int argc, char** argv);

// Splits a build's source state, `git describe --always --abbrev=40 --dirty --exclude='*'` (perf/meson.build):
// "<40 hex digits>" is clean, "<hex>-dirty" dirty, anything else (the build's fallback outside a git checkout)
// unknown: commit empty and dirty -1.
void parseSourceState(const std::string& state, std::string* commit, int* dirty);

// "2026-12-04T23:38:23+00:00" for a time in seconds since the epoch.
std::string isoTimeUtc(long long secondsSinceEpoch);

// The record of a run of this process, now: the source state baked into the binary when it was built (so
// "dirty" says whether tracked files differed from the commit when it was last built, not whether they do when it
// runs), the command line, the working directory, the steering environment, the regime label, the host, the
// time, the GPUs the CUDA runtime shows (count 0 without one), the kernel driver's release, the CUDA runtime's
// version, the NCCL this process loaded (ncclGetVersion, and the file it came from) and zpccl's version.
Provenance collectProvenance(int argc, char** argv, const std::string& regime);

}  // namespace perf
}  // namespace zp
