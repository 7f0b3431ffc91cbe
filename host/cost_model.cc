#include "host/cost_model.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <utility>

#include "host/qgz_plan.h"
#include "host/quant_format.h"
#include "host/topology.h"

namespace zp {

LinkParams LinkParams::uniform(double bwGBs, double latencyUs) {
  LinkParams p;
  p.allGather = p.reduceScatter = p.allToAll = LinkCost{bwGBs, latencyUs};
  return p;
}

ClusterSpec ClusterSpec::even(int nodes, int gpusPerNode) {
  ClusterSpec c;
  c.gpusPerNode.assign(std::max(nodes, 0), gpusPerNode);
  return c;
}

int ClusterSpec::nranks() const {
  int n = 0;
  for (int g : gpusPerNode) n += g;
  return n;
}

bool ClusterSpec::isEven() const {
  for (int g : gpusPerNode)
    if (g != gpusPerNode.front()) return false;
  return true;
}

Traffic& Traffic::operator+=(const Traffic& o) {
  intraBytes += o.intraBytes;
  interBytes += o.interBytes;
  nodeEgressBytes += o.nodeEgressBytes;
  kernelBytes += o.kernelBytes;
  launches += o.launches;
  linkUs += o.linkUs;
  latencyUs += o.latencyUs;
  kernelUs += o.kernelUs;
  return *this;
}

Traffic Traffic::scaled(double k) const {
  Traffic t = *this;
  t.intraBytes *= k;
  t.interBytes *= k;
  t.nodeEgressBytes *= k;
  t.kernelBytes *= k;
  t.launches *= k;
  t.linkUs *= k;
  t.latencyUs *= k;
  t.kernelUs *= k;
  return t;
}

namespace {

// The layout as qgZ's plan and hpZ's groups see it, from the library's own topology code (rank 0's view).
struct LayoutFacts {
  bool hierarchical = false;  // qgZ runs two hops
  bool hpzUsable = false;
  int hpzSize = 1;
};

LayoutFacts layoutFacts(const ClusterSpec& c, int hpzRequest) {
  LayoutFacts f;
  std::vector<uint64_t> keys;
  for (size_t node = 0; node < c.gpusPerNode.size(); ++node)
    for (int g = 0; g < c.gpusPerNode[node]; ++g) keys.push_back(1000 + node);
  for (int g : c.gpusPerNode)
    if (hpzRequest > 0 && g % hpzRequest != 0) hpzRequest = 0;  // validate() reports it; never log from here
  Topology t;
  if (keys.empty() || buildTopology(keys, 0, hpzRequest, "zpccl-model", &t) != zpSuccess) return f;
  f.hierarchical = makeQgzPlan(t).twoHop;
  f.hpzUsable = t.hpzUsable;
  f.hpzSize = t.hpzSize;
  return f;
}

// ===========================================================================================================
// The formulas. Every time and byte count of the model comes from this section.
//
//   n ranks on N nodes, node a holding L_a GPUs (L when even); S the logical bytes of a collective; e the bytes
//   per element; pb(k) = quantPayloadBytes(k, bits, G): fp32 scales of ceil(k/G) blocks padded to 16 bytes, then
//   the packed codes padded to 16 bytes (host/quant_format.h).
//   B_intra: bus bandwidth of a GPU's intra-node links; B_inter: bus bandwidth of a node's NICs together.
//   alpha: latency per step. t(bytes, B) = bytes / B.
//
//   Ring all-gather / reduce-scatter (NCCL), S = gathered tensor / each rank's input:
//     every rank sends (n-1)/n * S (n-1 steps of S/n). One node: all of it on NVLink.
//     Several nodes: every ring (channel) leaves each node once, so (n-1)/n * S leaves every node
//     (node egress), N of the ring's n hops cross nodes: inter per GPU = (n-1)/n * S * N/n, the rest is intra.
//     time = (n-1) * alpha_link + max(t(egress, B_inter), t(intra per GPU, B_intra)), where alpha_link is
//     the inter-node latency when the ring crosses nodes (each step waits for its slowest hop).
//   All-to-all, p bytes to each peer: a GPU of node a sends p*(L_a-1) intra and p*(n-L_a) inter; node a's
//     egress is L_a*p*(n-L_a). time = (n-1) * alpha + max over nodes of the two transfer times.
//   Kernels (quantize, dequantize, reduce): memory-bound, launches * launchUs + bytes read and written / memBw.
//
//   qwZ (count k per rank):   quantize k*e -> pb(k); ring all-gather of n*pb(k) bytes; dequantize n*pb(k) ->
//                             n*k*e. Kernel bytes k*e + pb + n*pb + n*k*e, 2 launches.
//   hpZ (full tensor F*e):    ring all-gather of F*e inside each group of h ranks of one node: (h-1)/h * F*e
//                             intra per GPU, (h-1) intra steps, nothing across nodes, no kernel. Uneven layout:
//                             unavailable, the flat ring all-gather instead. h = 1: nothing moves (the
//                             secondary shard is the whole tensor).
//   qgZ (recvcount k):        a rank's input is n*k elements, quantized into n payloads pb(k).
//     two hops (N nodes of L > 1 GPUs, qgz_plan.h): hop 1 all-to-all inside the node, N*pb to each of the L-1
//       local peers: intra (L-1)*N*pb; fused dequantize + sum + requantize of the N partials (reads L*N*pb,
//       writes N*pb); hop 2 all-to-all among the N ranks of one local rank (L such groups at once): inter
//       (N-1)*pb per GPU, node egress L*(N-1)*pb; final dequantize + sum (reads N*pb, writes k*e).
//       Kernel bytes n*k*e + n*pb + (L+1)*N*pb + N*pb + k*e, 3 launches. The hops are summed: the library's
//       overlap of hop 1 (chunk i+1) with hop 2 (chunk i) is not credited.
//     one hop (one node, one GPU per node, or uneven nodes): all-to-all of pb to each of the n-1 peers; final
//       dequantize + sum (reads n*pb, writes k*e). Kernel bytes n*k*e + n*pb + n*pb + k*e, 2 launches.
//   ZeRO-3: ring all-gather forward and backward (S = the parameters x e), ring reduce-scatter of gradients.
//   The chunk pipelines inside qwZ and qgZ (kernels of chunk c under the transfer of chunk c+1) are not credited
//   either: kernel times add to transfer times, and calibration absorbs the difference.
//
//   Step: comm = forward + backward + gradient; step = compute + comm - overlap * min(compute, comm)
//   (overlap 0: compute + comm; 1: max(compute, comm)).
// ===========================================================================================================

double transferUs(double bytes, double bwGBs) { return bytes > 0 ? bytes / (bwGBs * 1e3) : 0.0; }  // GB/s = 1e3 B/us

void addKernels(const KernelParams& k, double launches, double bytes, Traffic* t) {
  t->launches += launches;
  t->kernelBytes += bytes;
  t->kernelUs += launches * k.launchUs + transferUs(bytes, k.memBwGBs);
}

double payloadBytes(double count, int bits, int blockSize) {
  return static_cast<double>(quantPayloadBytes(static_cast<size_t>(std::ceil(count)), bits, blockSize));
}

Traffic ringCost(const ClusterSpec& c, double S, LinkCost LinkParams::*kind) {
  Traffic t;
  const int n = c.nranks(), N = c.nodes();
  if (n <= 1 || S <= 0) return t;
  const double perRank = (n - 1.0) / n * S;
  const LinkCost& in = c.intra.*kind;
  const LinkCost& out = c.inter.*kind;
  if (N == 1) {
    t.intraBytes = perRank;
    t.linkUs = transferUs(perRank, in.bwGBs);
    t.latencyUs = (n - 1) * in.latencyUs;
    return t;
  }
  t.nodeEgressBytes = perRank;
  t.interBytes = perRank * N / n;
  t.intraBytes = perRank - t.interBytes;
  t.linkUs = std::max(transferUs(t.nodeEgressBytes, out.bwGBs), transferUs(t.intraBytes, in.bwGBs));
  t.latencyUs = (n - 1) * out.latencyUs;
  return t;
}

// qgZ hop 1: all-to-all inside every node (groups of L), p bytes to each local peer.
Traffic intraAllToAll(const ClusterSpec& c, int L, double p) {
  Traffic t;
  if (L <= 1) return t;
  t.intraBytes = (L - 1) * p;
  t.linkUs = transferUs(t.intraBytes, c.intra.allToAll.bwGBs);
  t.latencyUs = (L - 1) * c.intra.allToAll.latencyUs;
  return t;
}

// qgZ hop 2: L all-to-alls at once, each among the N ranks of one local rank, p bytes to each peer.
Traffic interAllToAll(const ClusterSpec& c, int N, int L, double p) {
  Traffic t;
  if (N <= 1) return t;
  t.interBytes = (N - 1) * p;
  t.nodeEgressBytes = L * t.interBytes;
  t.linkUs = transferUs(t.nodeEgressBytes, c.inter.allToAll.bwGBs);
  t.latencyUs = (N - 1) * c.inter.allToAll.latencyUs;
  return t;
}

}  // namespace

Traffic ringAllGatherCost(const ClusterSpec& c, double totalBytes) {
  return ringCost(c, totalBytes, &LinkParams::allGather);
}

Traffic ringReduceScatterCost(const ClusterSpec& c, double totalBytes) {
  return ringCost(c, totalBytes, &LinkParams::reduceScatter);
}

Traffic allToAllCost(const ClusterSpec& c, double p) {
  Traffic t;
  const int n = c.nranks(), N = c.nodes();
  if (n <= 1 || p <= 0) return t;
  double intraMaxUs = 0, egressMax = 0;
  for (int L : c.gpusPerNode) {
    const double intra = p * (L - 1), inter = p * (n - L);
    t.intraBytes += L * intra / n;
    t.interBytes += L * inter / n;
    egressMax = std::max(egressMax, L * inter);
    intraMaxUs = std::max(intraMaxUs, transferUs(intra, c.intra.allToAll.bwGBs));
  }
  t.nodeEgressBytes = egressMax;
  t.linkUs = std::max(intraMaxUs, transferUs(egressMax, c.inter.allToAll.bwGBs));
  t.latencyUs = (n - 1) * (N > 1 ? c.inter.allToAll.latencyUs : c.intra.allToAll.latencyUs);
  return t;
}

Traffic qwzAllGatherCost(const ClusterSpec& c, double count, int elemBytes, int bits, int blockSize) {
  const int n = c.nranks();
  const double pb = payloadBytes(count, bits, blockSize);
  Traffic t = ringAllGatherCost(c, n * pb);
  addKernels(c.kernel, 2, count * elemBytes + pb + n * pb + n * count * elemBytes, &t);
  return t;
}

Traffic hpzAllGatherCost(const ClusterSpec& c, double fullCount, int elemBytes, int hpzSize, std::string* note) {
  const double S = fullCount * elemBytes;
  const LayoutFacts f = layoutFacts(c, hpzSize);
  if (!f.hpzUsable) {
    if (note) *note = "uneven nodes: hpZ unavailable, flat ring all-gather (ZeRO-3's)";
    return ringAllGatherCost(c, S);
  }
  Traffic t;
  const int h = f.hpzSize;
  if (h <= 1) {
    if (note) *note = "hpZ group of 1 rank: its secondary shard is the whole tensor, nothing moves";
    return t;
  }
  t.intraBytes = (h - 1.0) / h * S;
  t.linkUs = transferUs(t.intraBytes, c.intra.allGather.bwGBs);
  t.latencyUs = (h - 1) * c.intra.allGather.latencyUs;
  return t;
}

Traffic qgzReduceScatterCost(const ClusterSpec& c, double k, int elemBytes, int bits, int blockSize,
                             std::string* note) {
  const int n = c.nranks(), N = c.nodes();
  const double pb = payloadBytes(k, bits, blockSize);
  const double input = n * k * elemBytes;
  if (!layoutFacts(c, 0).hierarchical) {
    if (note) {
      if (N <= 1)
        *note = "one node: qgZ runs one hop (intra-node all-to-all)";
      else if (!c.isEven())
        *note = "uneven nodes: qgZ falls back to one flat all-to-all";
      else
        *note = "one GPU per node: qgZ runs one hop (inter-node all-to-all)";
    }
    Traffic t = allToAllCost(c, pb);
    addKernels(c.kernel, 2, input + n * pb + n * pb + k * elemBytes, &t);
    return t;
  }
  const int L = c.gpusPerNode.front();
  Traffic t = intraAllToAll(c, L, N * pb);
  t += interAllToAll(c, N, L, pb);
  addKernels(c.kernel, 3, input + n * pb + (L + 1.0) * N * pb + N * pb + k * elemBytes, &t);
  return t;
}

double stepTimeUs(double computeUs, double commUs, double overlap) {
  return computeUs + commUs - overlap * std::min(computeUs, commUs);
}

PaperVolume paperCrossNodeVolume(const ZeroppOptions& z, bool zeropp) {
  PaperVolume v{1, 1, 1};
  if (!zeropp) return v;
  const double w = z.weightBits / 16.0;  // bf16 baseline
  v.forward = z.qwz ? w : 1;
  v.backward = z.hpz ? 0 : (z.qwz && z.qwzBackward ? w : 1);
  v.gradient = z.qgz ? z.gradBits / 16.0 : 1;
  return v;
}

std::string validate(const ClusterSpec& c, const StepConfig& s, const ZeroppOptions& z) {
  if (c.gpusPerNode.empty()) return "the layout has no node";
  for (int g : c.gpusPerNode)
    if (g < 1) return "every node needs at least one GPU";
  if (!(s.params > 0)) return "the model needs a positive parameter count";
  if (s.elemBytes != 2 && s.elemBytes != 4) return "element bytes must be 2 (bf16/fp16) or 4 (fp32)";
  if (s.bucketParams < 0) return "bucket size must be >= 0";
  if (s.computeMs < 0) return "compute time must be >= 0";
  if (!(s.overlap >= 0 && s.overlap <= 1)) return "overlap must be in [0, 1]";
  if (!isValidBits(z.weightBits) || !isValidBits(z.gradBits)) return "bits must be 4 or 8";
  if (!isValidBlockSize(z.blockSize)) return "block size must be a power of two from 32 to 8192";
  if (z.hpzSize < 0) return "hpZ size must be >= 0";
  for (int g : c.gpusPerNode)
    if (z.hpzSize > 0 && g % z.hpzSize != 0)
      return "hpZ size " + std::to_string(z.hpzSize) + " does not divide the " + std::to_string(g) + " GPUs of a node";
  for (const LinkParams* p : {&c.intra, &c.inter})
    for (const LinkCost* l : {&p->allGather, &p->reduceScatter, &p->allToAll})
      if (!(l->bwGBs > 0) || !(l->latencyUs >= 0)) return "link bandwidths must be > 0 and latencies >= 0";
  if (!(c.kernel.memBwGBs > 0) || !(c.kernel.launchUs >= 0)) return "kernel bandwidth must be > 0";
  return "";
}

namespace {

const char* dtypeName(int elemBytes) { return elemBytes == 4 ? "fp32" : "bf16"; }
std::string intName(int bits) { return "int" + std::to_string(bits); }

void addNote(std::vector<std::string>* notes, const std::string& what, const std::string& note) {
  if (notes == nullptr || note.empty()) return;
  const std::string line = what + ": " + note;
  if (std::find(notes->begin(), notes->end(), line) == notes->end()) notes->push_back(line);
}

}  // namespace

StepCost stepCost(const ClusterSpec& c, const StepConfig& s, const ZeroppOptions& z, bool zeropp,
                  std::vector<std::string>* notes) {
  StepCost r;
  const int n = c.nranks();
  const double calls = s.bucketParams > 0 ? std::ceil(s.params / s.bucketParams) : 1.0;
  const double shard = std::ceil(s.params / calls / n);  // elements per rank per call (ZeRO pads to n)
  const double full = shard * n;
  const int e = s.elemBytes;
  auto finish = [&](CollectiveCost* cc, const Traffic& one) {
    cc->calls = static_cast<int>(calls);
    cc->traffic = one.scaled(calls);
  };
  const std::string ring = std::string("ring all-gather ") + dtypeName(e);

  // Forward weight gather.
  if (zeropp && z.qwz) {
    r.forward.scheme = "qwZ all-gather " + intName(z.weightBits);
    finish(&r.forward, qwzAllGatherCost(c, shard, e, z.weightBits, z.blockSize));
  } else {
    r.forward.scheme = ring;
    finish(&r.forward, ringAllGatherCost(c, full * e));
  }
  // Backward weight gather.
  const bool quantBackward = zeropp && z.qwz && z.qwzBackward;
  if (zeropp && z.hpz && c.isEven()) {
    const LayoutFacts f = layoutFacts(c, z.hpzSize);
    r.backward.scheme = "hpZ all-gather " + std::string(dtypeName(e)) + ", groups of " + std::to_string(f.hpzSize);
    finish(&r.backward, hpzAllGatherCost(c, full, e, z.hpzSize, &r.backward.note));
  } else {
    if (zeropp && z.hpz) r.backward.note = "uneven nodes: hpZ unavailable, flat all-gather instead";
    if (quantBackward) {
      r.backward.scheme = "qwZ all-gather " + intName(z.weightBits);
      finish(&r.backward, qwzAllGatherCost(c, shard, e, z.weightBits, z.blockSize));
    } else {
      r.backward.scheme = ring;
      finish(&r.backward, ringAllGatherCost(c, full * e));
    }
  }
  // Gradient reduce-scatter.
  if (zeropp && z.qgz) {
    const bool twoHop = layoutFacts(c, 0).hierarchical;
    r.gradient.scheme = "qgZ " + intName(z.gradBits) + (twoHop ? ", two hops" : ", one hop");
    finish(&r.gradient, qgzReduceScatterCost(c, shard, e, z.gradBits, z.blockSize, &r.gradient.note));
  } else {
    r.gradient.scheme = std::string("ring reduce-scatter ") + dtypeName(e);
    finish(&r.gradient, ringReduceScatterCost(c, full * e));
  }
  addNote(notes, "backward gather", r.backward.note);
  addNote(notes, "gradient reduce-scatter", r.gradient.note);

  r.comm = r.forward.traffic;
  r.comm += r.backward.traffic;
  r.comm += r.gradient.traffic;
  r.computeUs = s.computeMs * 1e3;
  r.stepUs = stepTimeUs(r.computeUs, r.comm.timeUs(), s.overlap);
  r.crossNodeM = r.comm.nodeEgressBytes / (s.params * e);
  return r;
}

Comparison compareStep(const ClusterSpec& c, const StepConfig& s, const ZeroppOptions& z, std::string* error) {
  Comparison out;
  const std::string problem = validate(c, s, z);
  if (error) *error = problem;
  if (!problem.empty()) return out;
  out.modelBytes = s.params * s.elemBytes;
  out.zero3 = stepCost(c, s, z, false, nullptr);
  out.zeropp = stepCost(c, s, z, true, &out.notes);
  out.speedup = out.zeropp.stepUs > 0 ? out.zero3.stepUs / out.zeropp.stepUs : 0;
  out.paperZero3 = paperCrossNodeVolume(z, false);
  out.paperZeropp = paperCrossNodeVolume(z, true);
  // Say so when a ZeRO++ collective loses to ZeRO-3's on this layout (e.g. a flat one-hop all-to-all sends L
  // times more across nodes than a ring).
  const char* names[] = {"forward gather", "backward gather", "gradient reduce-scatter"};
  const CollectiveCost* z3[] = {&out.zero3.forward, &out.zero3.backward, &out.zero3.gradient};
  const CollectiveCost* zpp[] = {&out.zeropp.forward, &out.zeropp.backward, &out.zeropp.gradient};
  for (int k = 0; k < 3; ++k) {
    const double a = zpp[k]->traffic.timeUs(), b = z3[k]->traffic.timeUs();
    if (a > b * 1.0001) {
      char buf[96];
      std::snprintf(buf, sizeof(buf), " (%.3g ms against %.3g ms)", a / 1e3, b / 1e3);
      addNote(&out.notes, names[k], zpp[k]->scheme + " is slower than ZeRO-3's " + z3[k]->scheme + buf);
    }
  }
  if (z.hpz && c.isEven()) out.hpzSecondaryBytes = out.modelBytes / layoutFacts(c, z.hpzSize).hpzSize;
  return out;
}

// ---- JSON --------------------------------------------------------------------------------------------------

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
    for (const auto& m : v.members)
      if (m.second.type == Json::kArray) collectRows(m.second, rows);
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

// ---- calibration -------------------------------------------------------------------------------------------

RowKind classifyOp(const std::string& opIn) {
  std::string op = opIn;
  for (char& ch : op) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  auto has = [&](const char* w) { return op.find(w) != std::string::npos; };
  const bool gather = has("all_gather") || has("allgather");
  const bool scatter = has("reduce_scatter") || has("reducescatter");
  if (has("qwz") || (gather && has("quant"))) return RowKind::kQwz;
  if (has("hpz") || (gather && has("hier"))) return RowKind::kHpz;
  if (has("qgz") || (scatter && has("quant"))) return RowKind::kQgz;
  if (has("nccl") || op == "all_gather" || op == "reduce_scatter" || op == "all_to_all") {
    if (gather) return RowKind::kNcclAllGather;
    if (scatter) return RowKind::kNcclReduceScatter;
    if (has("all_to_all") || has("alltoall")) return RowKind::kNcclAllToAll;
  }
  if (has("dequantize")) return RowKind::kDequantize;
  if (has("quantize")) return RowKind::kQuantize;
  return RowKind::kUnknown;
}

const char* rowKindName(RowKind k) {
  switch (k) {
    case RowKind::kNcclAllGather:
      return "nccl all-gather";
    case RowKind::kNcclReduceScatter:
      return "nccl reduce-scatter";
    case RowKind::kNcclAllToAll:
      return "nccl all-to-all";
    case RowKind::kQwz:
      return "qwZ";
    case RowKind::kHpz:
      return "hpZ";
    case RowKind::kQgz:
      return "qgZ";
    case RowKind::kQuantize:
      return "quantize";
    case RowKind::kDequantize:
      return "dequantize";
    default:
      return "unknown";
  }
}

LinkFit fitLatencyBandwidth(const std::vector<FitPoint>& points) {
  LinkFit f;
  // Weighted normal equations of t = a*s + b*x (a: latency per step, b: us per MB), weights 1/scale^2.
  double ss = 0, sx = 0, xx = 0, st = 0, xt = 0, xMin = 1e300, xMax = -1e300;
  int used = 0;
  for (const FitPoint& p : points) {
    const double scale = p.scaleUs > 0 ? p.scaleUs : p.timeUs;
    if (!(scale > 0) || !(p.bytes > 0) || !std::isfinite(p.timeUs)) continue;
    const double w = 1.0 / (scale * scale), x = p.bytes * 1e-6;
    ss += w * p.steps * p.steps;
    sx += w * p.steps * x;
    xx += w * x * x;
    st += w * p.steps * p.timeUs;
    xt += w * x * p.timeUs;
    xMin = std::min(xMin, x);
    xMax = std::max(xMax, x);
    ++used;
  }
  if (used == 0) return f;
  double a = 0, b = 0;
  const double det = ss * xx - sx * sx;
  if (xMax > xMin * (1 + 1e-9) && det > 1e-12 * ss * xx) {
    a = (st * xx - sx * xt) / det;
    b = (ss * xt - sx * st) / det;
  }
  if (!(a > 0) || !(b > 0)) {  // one size, or a negative latency: bandwidth alone
    a = 0;
    b = xt / xx;
  }
  if (!(b > 0) || !std::isfinite(b)) return f;
  f.ok = true;
  f.points = used;
  f.cost.latencyUs = a;
  f.cost.bwGBs = 1e3 / b;  // b us per MB: 1e6 / b bytes per us, 1e3 / b GB/s
  double sum = 0;
  for (const FitPoint& p : points) {
    const double scale = p.scaleUs > 0 ? p.scaleUs : p.timeUs;
    if (!(scale > 0) || !(p.bytes > 0)) continue;
    const double err = (a * p.steps + b * p.bytes * 1e-6 - p.timeUs) / scale;
    sum += err * err;
  }
  f.rmsErrPct = 100 * std::sqrt(sum / used);
  return f;
}

namespace {

int elemBytesOfType(const std::string& type) {
  if (type == "float" || type == "float32" || type == "fp32" || type == "int32" || type == "uint32") return 4;
  if (type == "double" || type == "float64" || type == "int64" || type == "uint64") return 8;
  if (type == "int8" || type == "uint8" || type == "f8e4m3" || type == "f8e5m2") return 1;
  return 2;  // bfloat16, half, or not said: the perf binaries' default
}

// The layout a row ran on: ranks spread over its nodes, the first nodes taking any remainder.
bool rowCluster(const PerfRow& row, const LinkParams& link, const KernelParams& kernel, ClusterSpec* c) {
  if (row.ranks < 1) return false;
  const int nodes = std::min(std::max(row.nodes, 1), row.ranks);
  c->gpusPerNode.assign(nodes, row.ranks / nodes);
  for (int i = 0; i < row.ranks % nodes; ++i) c->gpusPerNode[i]++;
  c->intra = c->inter = link;
  c->kernel = kernel;
  return true;
}

// The model's cost of a row's call (kernel terms from `kernel`).
bool rowTraffic(const PerfRow& row, bool baseline, const LinkParams& link, const KernelParams& kernel, Traffic* t) {
  ClusterSpec c;
  if (!rowCluster(row, link, kernel, &c) || !(row.size > 0)) return false;
  const RowKind kind = classifyOp(row.op);
  const int n = c.nranks(), e = elemBytesOfType(row.type);
  const int block = row.block > 0 ? row.block : 256;
  const int bits = row.bits > 0 ? row.bits : (kind == RowKind::kQgz ? 4 : 8);
  if (!isValidBits(bits) || !isValidBlockSize(block)) return false;
  if (baseline) {
    if (kind == RowKind::kQwz || kind == RowKind::kHpz || kind == RowKind::kNcclAllGather)
      *t = ringAllGatherCost(c, row.size);
    else if (kind == RowKind::kQgz || kind == RowKind::kNcclReduceScatter)
      *t = ringReduceScatterCost(c, row.size);
    else if (kind == RowKind::kNcclAllToAll)
      *t = allToAllCost(c, row.size / n);
    else
      return false;
    return true;
  }
  switch (kind) {
    case RowKind::kNcclAllGather:
      *t = ringAllGatherCost(c, row.size);
      return true;
    case RowKind::kNcclReduceScatter:
      *t = ringReduceScatterCost(c, row.size);
      return true;
    case RowKind::kNcclAllToAll:
      *t = allToAllCost(c, row.size / n);
      return true;
    case RowKind::kQwz:
      *t = qwzAllGatherCost(c, row.size / e / n, e, bits, block);
      return true;
    case RowKind::kHpz:
      *t = hpzAllGatherCost(c, row.size / e, e, 0, nullptr);
      return true;
    case RowKind::kQgz:
      *t = qgzReduceScatterCost(c, row.size / e / n, e, bits, block, nullptr);
      return true;
    case RowKind::kQuantize:
    case RowKind::kDequantize: {
      const double count = row.size / e;
      *t = Traffic();
      addKernels(kernel, 1, row.size + payloadBytes(count, bits, block), t);
      return true;
    }
    default:
      return false;
  }
}

std::string regimeOf(const PerfRow& row) { return row.regime.empty() ? std::string("-") : row.regime; }

}  // namespace

double predictRowUs(const PerfRow& row, bool baseline, const LinkParams& link, const KernelParams& kernel) {
  Traffic t;
  return rowTraffic(row, baseline, link, kernel, &t) ? t.timeUs() : -1;
}

Calibration calibrate(const std::vector<PerfRow>& rows, const KernelParams& defaults) {
  Calibration cal;
  cal.kernel = defaults;
  // Step 1: each regime's links from NCCL's own times: t = (n-1) * alpha + size * (n-1)/n / bw.
  struct Points {
    std::vector<FitPoint> ag, rs, a2a;
  };
  std::map<std::string, Points> points;
  int unknown = 0, oneRank = 0;
  for (const PerfRow& row : rows) {
    const RowKind kind = classifyOp(row.op);
    if (kind == RowKind::kUnknown) {
      ++unknown;
      continue;
    }
    if (row.ranks < 2 || !(row.size > 0)) {
      oneRank += kind != RowKind::kQuantize && kind != RowKind::kDequantize;
      continue;
    }
    const double steps = row.ranks - 1, bytes = row.size * (row.ranks - 1.0) / row.ranks;
    Points& p = points[regimeOf(row)];
    if (row.timeUs > 0) {
      if (kind == RowKind::kNcclAllGather) p.ag.push_back({steps, bytes, row.timeUs});
      if (kind == RowKind::kNcclReduceScatter) p.rs.push_back({steps, bytes, row.timeUs});
      if (kind == RowKind::kNcclAllToAll) p.a2a.push_back({steps, bytes, row.timeUs});
    }
    if (row.ncclTimeUs > 0) {
      if (kind == RowKind::kQwz || kind == RowKind::kHpz) p.ag.push_back({steps, bytes, row.ncclTimeUs});
      if (kind == RowKind::kQgz) p.rs.push_back({steps, bytes, row.ncclTimeUs});
    }
  }
  if (unknown) cal.notes.push_back(std::to_string(unknown) + " row(s) of unknown ops skipped");
  if (oneRank) cal.notes.push_back(std::to_string(oneRank) + " collective row(s) without ranks >= 2 or a size skipped");
  for (auto& entry : points) {
    RegimeFit f;
    f.allGather = fitLatencyBandwidth(entry.second.ag);
    f.reduceScatter = fitLatencyBandwidth(entry.second.rs);
    f.allToAll = fitLatencyBandwidth(entry.second.a2a);
    const LinkFit* base = f.allGather.ok ? &f.allGather : f.reduceScatter.ok ? &f.reduceScatter : &f.allToAll;
    if (!base->ok) {
      cal.notes.push_back("regime " + entry.first + ": no NCCL rows to fit, its rows are not predicted");
      continue;
    }
    f.ok = true;
    f.link.allGather = f.allGather.ok ? f.allGather.cost : base->cost;
    f.link.reduceScatter = f.reduceScatter.ok ? f.reduceScatter.cost : base->cost;
    f.link.allToAll = f.allToAll.ok ? f.allToAll.cost : base->cost;
    const char* kinds[] = {"all-gather", "reduce-scatter", "all-to-all"};
    const LinkFit* fits[] = {&f.allGather, &f.reduceScatter, &f.allToAll};
    for (int k = 0; k < 3; ++k)
      if (!fits[k]->ok)
        cal.notes.push_back("regime " + entry.first + ": no NCCL " + kinds[k] + " rows, " + kinds[k] +
                            " borrows the fit of another collective");
    cal.regimes[entry.first] = f;
  }

  // Step 2: the kernels: quantize/dequantize rows directly, and what qwZ and qgZ rows took beyond their predicted
  // communication: t - comm = launches * launchUs + kernel bytes / memBw.
  std::vector<FitPoint> kernelPoints;
  for (const PerfRow& row : rows) {
    const RowKind kind = classifyOp(row.op);
    if (!(row.timeUs > 0)) continue;
    if (kind != RowKind::kQwz && kind != RowKind::kQgz && kind != RowKind::kQuantize && kind != RowKind::kDequantize)
      continue;
    LinkParams link = LinkParams::uniform(1, 0);
    auto it = cal.regimes.find(regimeOf(row));
    const bool local = kind == RowKind::kQuantize || kind == RowKind::kDequantize;
    if (!local) {
      if (it == cal.regimes.end()) continue;
      link = it->second.link;
    }
    PerfRow one = row;
    if (local && one.ranks < 1) one.ranks = 1;
    Traffic t;
    if (!rowTraffic(one, false, link, defaults, &t)) continue;
    kernelPoints.push_back({t.launches, t.kernelBytes, row.timeUs - t.linkUs - t.latencyUs, row.timeUs});
  }
  const LinkFit kf = fitLatencyBandwidth(kernelPoints);
  if (kf.ok) {
    cal.kernel.memBwGBs = kf.cost.bwGBs;
    cal.kernel.launchUs = kf.cost.latencyUs;
    cal.kernelFitted = true;
  } else {
    cal.notes.push_back(kernelPoints.empty() ? "no zpccl rows: kernel parameters left at their defaults"
                                             : "kernel fit failed (communication over-predicted?): defaults kept");
  }

  // Step 3: every row, predicted against measured.
  for (size_t i = 0; i < rows.size(); ++i) {
    const PerfRow& row = rows[i];
    const RowKind kind = classifyOp(row.op);
    const bool local = kind == RowKind::kQuantize || kind == RowKind::kDequantize;
    LinkParams link = LinkParams::uniform(1, 0);
    auto it = cal.regimes.find(regimeOf(row));
    if (!local && it == cal.regimes.end()) continue;
    if (!local) link = it->second.link;
    PerfRow one = row;
    if (local && one.ranks < 1) one.ranks = 1;
    for (int variant = 0; variant < 2; ++variant) {
      const bool baseline = variant == 1;
      const double measured = baseline ? row.ncclTimeUs : row.timeUs;
      if (!(measured > 0)) continue;
      if (baseline &&
          (kind == RowKind::kNcclAllGather || kind == RowKind::kNcclReduceScatter || kind == RowKind::kNcclAllToAll))
        continue;
      const double predicted = predictRowUs(one, baseline, link, cal.kernel);
      if (!(predicted > 0)) continue;
      RowCheck c;
      c.row = i;
      c.what = row.op + (baseline ? " (nccl baseline)" : "");
      c.regime = regimeOf(row);
      c.size = row.size;
      c.ranks = row.ranks;
      c.nodes = row.nodes;
      c.measuredUs = measured;
      c.predictedUs = predicted;
      c.errPct = 100 * (predicted - measured) / measured;
      c.flagged = row.size >= kCheckMinBytes && std::fabs(c.errPct) > kCheckMaxErrPct;
      cal.flagged += c.flagged;
      cal.checks.push_back(c);
    }
  }
  return cal;
}

}  // namespace zp
