#include "perf/json_out.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "host/base/params.h"

namespace zp {
namespace perf {

void JsonWriter::separate() {
  if (afterKey_) {
    afterKey_ = false;
    return;
  }
  if (!first_.empty()) {
    if (!first_.back()) out_ += ", ";
    first_.back() = false;
  }
}

JsonWriter& JsonWriter::beginObject() {
  separate();
  out_ += '{';
  first_.push_back(true);
  return *this;
}

JsonWriter& JsonWriter::endObject() {
  out_ += '}';
  first_.pop_back();
  return *this;
}

JsonWriter& JsonWriter::beginArray() {
  separate();
  out_ += '[';
  first_.push_back(true);
  return *this;
}

JsonWriter& JsonWriter::endArray() {
  out_ += ']';
  first_.pop_back();
  return *this;
}

JsonWriter& JsonWriter::key(const char* name) {
  string(name);
  out_ += ": ";
  afterKey_ = true;
  return *this;
}

JsonWriter& JsonWriter::string(const std::string& value) {
  separate();
  out_ += '"';
  for (unsigned char c : value) {
    switch (c) {
      case '"':
        out_ += "\\\"";
        break;
      case '\\':
        out_ += "\\\\";
        break;
      case '\n':
        out_ += "\\n";
        break;
      case '\r':
        out_ += "\\r";
        break;
      case '\t':
        out_ += "\\t";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out_ += buf;
        } else {
          out_ += char(c);
        }
    }
  }
  out_ += '"';
  return *this;
}

JsonWriter& JsonWriter::number(double value) {
  if (!std::isfinite(value)) return null();
  separate();
  char buf[40];
  // 7 significant digits keep microseconds and GB/s exact enough; %g never prints a JSON-invalid form for
  // finite values.
  std::snprintf(buf, sizeof(buf), "%.7g", value);
  out_ += buf;
  return *this;
}

JsonWriter& JsonWriter::integer(long long value) {
  separate();
  out_ += std::to_string(value);
  return *this;
}

JsonWriter& JsonWriter::boolean(bool value) {
  separate();
  out_ += value ? "true" : "false";
  return *this;
}

JsonWriter& JsonWriter::null() {
  separate();
  out_ += "null";
  return *this;
}

namespace {

void writeMeasure(JsonWriter& w, const char* name, const Measure& m, bool withAlgbwAndWrong) {
  w.key(name);
  if (!m.present) {
    w.null();
    return;
  }
  w.beginObject();
  w.key("time_us").number(m.timeUs);
  if (!m.roundsUs.empty()) {
    w.key("min_us").number(*std::min_element(m.roundsUs.begin(), m.roundsUs.end()));
    w.key("max_us").number(*std::max_element(m.roundsUs.begin(), m.roundsUs.end()));
    w.key("rounds_us").beginArray();
    for (double t : m.roundsUs) w.number(t);
    w.endArray();
  }
  w.key("enqueue_us").number(m.enqueueUs);
  if (withAlgbwAndWrong) w.key("algbw").number(m.algbw);
  w.key("busbw").number(m.busbw);
  if (withAlgbwAndWrong) {
    w.key("wrong");
    if (m.checked)
      w.integer(static_cast<long long>(m.wrong));
    else
      w.null();
  }
  w.endObject();
}

void writeWire(JsonWriter& w, const char* name, const WireBytes& b) {
  w.key(name).beginObject();
  w.key("intra").number(b.intra);
  w.key("inter").number(b.inter);
  w.endObject();
}

}  // namespace

std::string rowToJson(const ResultRow& row) {
  JsonWriter w;
  w.beginObject();
  w.key("op").string(row.op);
  w.key("regime").string(row.regime);
  if (!row.grad.empty()) w.key("grad").string(row.grad);
  w.key("backend").string(row.backend);
  w.key("size").integer(static_cast<long long>(row.size));
  w.key("count").integer(static_cast<long long>(row.count));
  w.key("type").string(row.type);
  w.key("redop");
  if (row.redop.empty())
    w.null();
  else
    w.string(row.redop);
  w.key("bits");
  if (row.bits > 0)
    w.integer(row.bits);
  else
    w.null();
  w.key("block");
  if (row.block > 0)
    w.integer(row.block);
  else
    w.null();
  w.key("ranks").integer(row.ranks);
  w.key("nodes").integer(row.nodes);
  writeMeasure(w, "oop", row.oop, true);
  writeMeasure(w, "ip", row.ip, true);
  w.key("baseline");
  if (row.baselineName.empty())
    w.null();
  else
    w.string(row.baselineName);
  // The baseline's numbers live under its own name ("nccl" for collectives, "memcpy" for quantize), so that a
  // reader looking for NCCL never mistakes a memcpy for it. "nccl" is always present, null when not run.
  if (row.baselineName != "nccl") writeMeasure(w, "nccl", Measure(), false);
  if (!row.baselineName.empty()) writeMeasure(w, row.baselineName.c_str(), row.baseline, false);
  const bool speedup = !row.baselineName.empty() && row.baseline.present && row.oop.present;
  w.key("speedup");
  if (speedup)
    w.number(row.speedup);
  else
    w.null();
  if (speedup && row.baseline.roundsUs.size() > 1) {
    w.key("speedup_min").number(row.speedupMin);
    w.key("speedup_max").number(row.speedupMax);
  }
  if (row.baselineName == "nccl") {
    // The settings zpccl's communicators get; null where they keep NCCL's default.
    auto setting = [&w](const char* key, int value) {
      w.key(key);
      if (value > 0)
        w.integer(value);
      else
        w.null();
    };
    w.key("nccl_config").beginObject();
    setting("min_ctas", row.ncclConfig.minCtas);
    setting("max_ctas", row.ncclConfig.maxCtas);
    setting("net_channels_per_peer", row.ncclConfig.netChannelsPerPeer);
    w.endObject();
    if (row.ncclConfig.any()) {
      writeMeasure(w, "nccl_matched", row.matched, false);
      w.key("speedup_matched");
      if (row.matched.present && row.oop.present)
        w.number(row.speedupMatched);
      else
        w.null();
    }
  }
  if (row.hasWire) {
    w.key("wire_bytes_per_rank").beginObject();
    writeWire(w, "zpccl", row.zpWire);
    writeWire(w, "nccl_ring", row.ringWire);
    w.endObject();
  }
  if (!row.env.empty()) {
    w.key("env").beginObject();
    for (const auto& [name, value] : row.env) w.key(name.c_str()).string(value);
    w.endObject();
  }
  w.endObject();
  return w.str();
}

std::vector<std::pair<const char*, int64_t>> pathTunables() {
  return {{"ZP_NCCL_SMS", paramNcclSms()},
          {"ZP_PAIR_ALLGATHER", paramPairAllGather()},
          {"ZP_DIRECT_MIN_BYTES", paramDirectMinBytes()},
          {"ZP_DIRECT_INLINE_WAIT_BYTES", paramDirectInlineWaitBytes()},
          {"ZP_SHM_MIN_CTAS", paramShmMinCtas()},
          {"ZP_OWN_SLOT_EARLY_BYTES", paramOwnSlotEarlyBytes()}};
}

std::vector<std::pair<std::string, std::string>> zpTunablesInEnvironment() {
  std::vector<std::pair<std::string, std::string>> out;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const size_t eq = entry.find('=');
    if (entry.rfind("ZP_", 0) != 0 || eq == std::string::npos || entry.rfind("ZP_DEBUG", 0) == 0) continue;
    // The harness scripts' and the perf binaries' own settings are not zpccl's.
    if (entry.rfind("ZP_GPU_CHECK_", 0) == 0 || entry.rfind("ZP_PERF_", 0) == 0) continue;
    out.emplace_back(entry.substr(0, eq), entry.substr(eq + 1));
  }
  // The settings that choose how a collective runs (pathTunables) may be added, or change their defaults, from one
  // build to the next: every row says what it ran with, set or not, so that a reader (the cost model's
  // calibration) never has to guess from the file's date.
  for (const auto& [name, value] : pathTunables()) {
    const bool set = std::any_of(out.begin(), out.end(), [name = name](const auto& kv) { return kv.first == name; });
    if (!set) out.emplace_back(name, std::to_string(value));
  }
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

void nullableString(JsonWriter& w, const char* key, const std::string& value) {
  w.key(key);
  if (value.empty())
    w.null();
  else
    w.string(value);
}

}  // namespace

std::string provenanceToJson(const Provenance& p) {
  JsonWriter w;
  w.beginObject();
  w.key("schema").string("zpccl-provenance/1");
  nullableString(w, "commit", p.commit);
  w.key("dirty");
  if (p.dirty < 0)
    w.null();
  else
    w.boolean(p.dirty != 0);
  w.key("command").string(p.command);
  w.key("cwd").string(p.cwd);
  w.key("env").beginObject();
  for (const auto& [name, value] : p.env) w.key(name.c_str()).string(value);
  w.endObject();
  nullableString(w, "regime", p.regime);
  w.key("host").string(p.host);
  w.key("time_utc").string(p.timeUtc);
  w.key("python").null();  // the keys of perf/provenance.py, whose records come from Python
  w.key("torch").null();
  w.key("gpu").beginObject();
  w.key("count").integer(p.gpuCount);
  w.key("models").beginArray();
  for (const std::string& model : p.gpuModels) w.string(model);
  w.endArray();
  nullableString(w, "driver", p.driver);
  w.endObject();
  nullableString(w, "cuda_runtime", p.cudaRuntime);
  w.key("nccl").beginObject();
  nullableString(w, "loaded", p.ncclLoaded);
  nullableString(w, "file", p.ncclFile);
  w.key("torch").null();
  w.endObject();
  w.key("zpccl").beginObject();
  nullableString(w, "version", p.zpcclVersion);
  nullableString(w, "library", p.zpcclLibrary);
  w.endObject();
  w.endObject();
  return w.str();
}

std::string perfFileJson(const Provenance& provenance, const std::vector<ResultRow>& rows) {
  std::string out = "{\"provenance\": " + provenanceToJson(provenance) + ",\n \"rows\": [";
  for (size_t i = 0; i < rows.size(); ++i) {
    out += i == 0 ? "\n  " : ",\n  ";
    out += rowToJson(rows[i]);
  }
  out += "\n ]}\n";
  return out;
}

bool writeJsonFile(const std::string& path, const Provenance& provenance, const std::vector<ResultRow>& rows,
                   std::string* error) {
  const std::string tmp = path + ".tmp";
  const std::string text = perfFileJson(provenance, rows);
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) {
    *error = "cannot write " + tmp + ": " + std::strerror(errno);
    return false;
  }
  bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    *error = "cannot write " + path + ": " + std::strerror(errno);
    std::remove(tmp.c_str());
    return false;
  }
  return true;
}

}  // namespace perf
}  // namespace zp
