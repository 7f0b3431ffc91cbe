#include "tools/model/json_in.h"

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <utility>

namespace zp {
namespace perf {

namespace {

struct Json {
  enum Type { kNull, kBool, kNumber, kString, kArray, kObject } type = kNull;
  double number = 0;
  std::string text;
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> members;

  const Json* get(const char* key) const {
    if (type != kObject) return nullptr;
    for (const auto& m : members)
      if (m.first == key) return &m.second;
    return nullptr;
  }
};

// A small recursive-descent reader: enough for the perf files, strict about structure, lenient about NaN and
// Infinity (read as null).
class JsonReader {
 public:
  explicit JsonReader(const std::string& s) : s_(s) {}

  bool atEnd() {
    skipSpace();
    return i_ >= s_.size();
  }
  bool value(Json* out, int depth = 0) {
    skipSpace();
    if (depth > 64) return fail("nested too deep");
    if (i_ >= s_.size()) return fail("unexpected end");
    const char ch = s_[i_];
    if (ch == '{') return object(out, depth);
    if (ch == '[') return array(out, depth);
    if (ch == '"') {
      out->type = Json::kString;
      return string(&out->text);
    }
    if (word("null") || word("NaN") || word("Infinity") || word("-Infinity")) {
      out->type = Json::kNull;
      return true;
    }
    if (word("true") || word("false")) {
      out->type = Json::kBool;
      return true;
    }
    return number(out);
  }
  // Skips commas between top-level values (rows written one per line with a trailing comma).
  void skipSeparators() {
    skipSpace();
    while (i_ < s_.size() && s_[i_] == ',') {
      ++i_;
      skipSpace();
    }
  }
  const std::string& error() const { return error_; }

 private:
  void skipSpace() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  bool fail(const char* what) {
    error_ = std::string("JSON: ") + what + " at offset " + std::to_string(i_);
    return false;
  }
  bool word(const char* w) {
    const size_t len = std::strlen(w);
    if (s_.compare(i_, len, w) != 0) return false;
    i_ += len;
    return true;
  }
  bool expect(char ch) {
    skipSpace();
    if (i_ < s_.size() && s_[i_] == ch) {
      ++i_;
      return true;
    }
    return fail((std::string("expected '") + ch + "'").c_str());
  }
  bool number(Json* out) {
    const char* begin = s_.c_str() + i_;
    char* end = nullptr;
    const double v = std::strtod(begin, &end);
    if (end == begin) return fail("unexpected character");
    i_ += static_cast<size_t>(end - begin);
    out->type = Json::kNumber;
    out->number = v;
    return true;
  }
  bool string(std::string* out) {
    ++i_;  // opening quote
    while (i_ < s_.size() && s_[i_] != '"') {
      char ch = s_[i_++];
      if (ch == '\\') {
        if (i_ >= s_.size()) break;
        const char esc = s_[i_++];
        switch (esc) {
          case 'n':
            ch = '\n';
            break;
          case 't':
            ch = '\t';
            break;
          case 'r':
            ch = '\r';
            break;
          case 'b':
            ch = '\b';
            break;
          case 'f':
            ch = '\f';
            break;
          case 'u': {
            if (i_ + 4 > s_.size()) return fail("bad \\u escape");
            const unsigned code = static_cast<unsigned>(std::strtoul(s_.substr(i_, 4).c_str(), nullptr, 16));
            i_ += 4;
            ch = code < 0x80 ? static_cast<char>(code) : '?';  // names in these files are ASCII
            break;
          }
          default:
            ch = esc;
        }
      }
      out->push_back(ch);
    }
    if (i_ >= s_.size()) return fail("unterminated string");
    ++i_;
    return true;
  }
  bool array(Json* out, int depth) {
    ++i_;
    out->type = Json::kArray;
    skipSpace();
    if (i_ < s_.size() && s_[i_] == ']') return ++i_, true;
    for (;;) {
      out->items.emplace_back();
      if (!value(&out->items.back(), depth + 1)) return false;
      skipSpace();
      if (i_ < s_.size() && s_[i_] == ',') {
        ++i_;
        continue;
      }
      return expect(']');
    }
  }
  bool object(Json* out, int depth) {
    ++i_;
    out->type = Json::kObject;
    skipSpace();
    if (i_ < s_.size() && s_[i_] == '}') return ++i_, true;
    for (;;) {
      skipSpace();
      if (i_ >= s_.size() || s_[i_] != '"') return fail("expected a key");
      std::string key;
      if (!string(&key) || !expect(':')) return false;
      out->members.emplace_back(std::move(key), Json());
      if (!value(&out->members.back().second, depth + 1)) return false;
      skipSpace();
      if (i_ < s_.size() && s_[i_] == ',') {
        ++i_;
        continue;
      }
      return expect('}');
    }
  }

  const std::string& s_;
  size_t i_ = 0;
  std::string error_;
};

double numberOf(const Json* j, double fallback) { return j && j->type == Json::kNumber ? j->number : fallback; }
std::string numberText(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.15g", v);
  return buf;
}
std::string textOf(const Json* j) { return j && j->type == Json::kString ? j->text : std::string(); }
const Json* firstOf(const Json& o, std::initializer_list<const char*> keys) {
  for (const char* k : keys)
    if (const Json* j = o.get(k)) return j;
  return nullptr;
}

// The time of a measured variant: {"time_us": t, ...}, or a bare number.
double timeOf(const Json* m) {
  if (m == nullptr) return -1;
  if (m->type == Json::kNumber) return m->number;
  const double t = numberOf(m->get("time_us"), -1);
  return t > 0 ? t : -1;
}

// Each timed round of a measured variant ({"rounds_us": [...]}), where the file keeps them.
std::vector<double> roundsOf(const Json* m) {
  std::vector<double> out;
  const Json* rounds = m ? m->get("rounds_us") : nullptr;
  if (rounds != nullptr && rounds->type == Json::kArray)
    for (const Json& t : rounds->items)
      if (t.type == Json::kNumber) out.push_back(t.number);
  return out;
}

PerfRow rowOf(const Json& o) {
  PerfRow r;
  r.op = textOf(firstOf(o, {"op", "name", "collective"}));
  r.regime = textOf(o.get("regime"));
  r.type = textOf(firstOf(o, {"type", "dtype"}));
  r.backend = textOf(o.get("backend"));
  r.size = numberOf(firstOf(o, {"size", "bytes"}), 0);
  r.ranks = static_cast<int>(numberOf(firstOf(o, {"ranks", "nranks"}), 0));
  r.nodes = static_cast<int>(numberOf(o.get("nodes"), 0));
  r.bits = static_cast<int>(numberOf(o.get("bits"), 0));
  r.block = static_cast<int>(numberOf(firstOf(o, {"block", "block_size"}), 0));
  const Json* oop = o.get("oop");
  r.timeUs = oop ? timeOf(oop) : timeOf(o.get("time_us"));
  if (oop && oop->type == Json::kObject) r.wrong = static_cast<long long>(numberOf(oop->get("wrong"), -1));
  r.ncclTimeUs = timeOf(o.get("nccl"));
  r.ncclMatchedTimeUs = timeOf(o.get("nccl_matched"));
  r.roundsUs = roundsOf(oop);
  r.ncclRoundsUs = roundsOf(o.get("nccl"));
  if (const Json* env = o.get("env")) {
    for (const auto& m : env->members) {
      if (m.second.type == Json::kString) r.env[m.first] = m.second.text;
      if (m.second.type == Json::kNumber) r.env[m.first] = numberText(m.second.number);
    }
  }
  return r;
}

void collectRows(const Json& v, std::vector<PerfRow>* rows) {
  if (v.type == Json::kArray) {
    for (const Json& item : v.items) collectRows(item, rows);
  } else if (v.type == Json::kObject) {
    if (v.get("op") || v.get("name") || v.get("collective")) {
      rows->push_back(rowOf(v));
      return;
    }
    const size_t first = rows->size();
    for (const auto& m : v.members)
      if (m.second.type == Json::kArray) collectRows(m.second, rows);
    // A file with its provenance: its rows carry its commit.
    const Json* provenance = v.get("provenance");
    const std::string commit = provenance ? textOf(provenance->get("commit")) : std::string();
    for (size_t i = first; i < rows->size(); ++i)
      if ((*rows)[i].commit.empty()) (*rows)[i].commit = commit;
  }
}

}  // namespace

bool parsePerfJson(const std::string& text, std::vector<PerfRow>* rows, std::string* error) {
  JsonReader reader(text);
  while (!reader.atEnd()) {
    Json v;
    if (!reader.value(&v)) {
      if (error) *error = reader.error();
      return false;
    }
    collectRows(v, rows);
    reader.skipSeparators();
  }
  return true;
}

}  // namespace perf
}  // namespace zp
