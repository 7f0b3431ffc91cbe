// The reader of the perf binaries' JSON (-J; perf/json_out.h writes it): the rows of one or more files, as the
// cost model's calibration (tools/model) and any other tool read them. A small hand-written parser, so that
// nothing beyond the standard library is needed.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace zp {
namespace perf {

// One row of a perf JSON file (perf/json_out.h), with whatever fields it had. Missing numbers are -1 (times)
// or 0 (counts).
struct PerfRow {
  std::string op, regime, type, backend;
  double size = 0;  // logical bytes, nccl-tests' meaning for the op
  int ranks = 0, nodes = 0, bits = 0, block = 0;
  double timeUs = -1;             // out of place (the median of the rounds, where the file has rounds)
  double ncclTimeUs = -1;         // the NCCL baseline measured in the same run
  double ncclMatchedTimeUs = -1;  // NCCL with zpccl's communicators' settings, where they differ from its own
  std::vector<double> roundsUs, ncclRoundsUs;  // each timed round, where the file keeps them
  long long wrong = -1;
  std::map<std::string, std::string> env;  // the ZP_* tunables the run set ("env"; numbers as written)
  std::string commit;  // the file's provenance ("provenance": {"commit"}); empty when it records none
};

// Reads rows from JSON text: a file as the harness writes it ({"provenance": ..., "rows": [...]}), an array of
// rows (the files written before provenance), several of either one after the other, one row per line, or an
// object holding an array. Tolerant of unknown and missing fields and of nulls. False (with *error) only when
// the text is not JSON.
bool parsePerfJson(const std::string& text, std::vector<PerfRow>* rows, std::string* error);

}  // namespace perf
}  // namespace zp
