//===- NcclChecks.cpp - what ranks and libraries must agree on ------------===//

#include "epic/runtime/NcclChecks.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <sstream>
#include <thread>

using namespace epic::runtime;

std::string epic::runtime::ncclVersionName(int code) {
  // NCCL_VERSION(X,Y,Z): X*1000 + Y*100 + Z up to 2.8, X*10000 + Y*100 + Z after.
  int major = code >= 10000 ? code / 10000 : code / 1000;
  int minor = code >= 10000 ? code / 100 % 100 : code / 100 % 10;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(code % 100);
}

void epic::runtime::checkVersionsEqual(int compiledCode, int loadedCode) {
  if (compiledCode != loadedCode)
    throw NcclError("the loaded NCCL library is " + ncclVersionName(loadedCode) +
                    " but epic was compiled against NCCL " + ncclVersionName(compiledCode) +
                    "'s headers: the device communicator, its requirements and the window "
                    "struct differ between releases (also patch releases); load NCCL " +
                    ncclVersionName(compiledCode) +
                    " (LD_LIBRARY_PATH) or rebuild epic "
                    "against " +
                    ncclVersionName(loadedCode) + " (NCCL_ROOT)");
}

namespace {
/// "A on ranks 0, 2; B on rank 1": each value once, with the ranks that have it.
std::string valuesByRank(const std::vector<std::string> &values) {
  std::map<std::string, std::vector<size_t>> ranks;
  std::vector<std::string> order;
  for (size_t r = 0; r < values.size(); ++r) {
    if (!ranks.count(values[r]))
      order.push_back(values[r]);
    ranks[values[r]].push_back(r);
  }
  std::ostringstream os;
  for (size_t v = 0; v < order.size(); ++v) {
    const auto &rs = ranks[order[v]];
    os << (v ? "; " : "") << order[v] << (rs.size() > 1 ? " on ranks " : " on rank ");
    for (size_t i = 0; i < rs.size(); ++i)
      os << (i ? ", " : "") << rs[i];
  }
  return os.str();
}

std::string gpuName(const std::vector<RankFacts> &facts, size_t rank) {
  return "GPU " + std::string(facts[rank].pciBusId) + " (rank " + std::to_string(rank) + ")";
}
} // namespace

void epic::runtime::checkRanksAgree(const std::vector<RankFacts> &facts) {
  struct Field {
    const char *name, *why;
    int64_t RankFacts::*member;
  };
  static const Field fields[] = {
      {"num_bytes", "every rank's window has the same layout", &RankFacts::numBytes},
      {"blocks per rank (num_sms)", "the entry barrier pairs block b of every rank",
       &RankFacts::blocksPerRank},
      {"the loaded NCCL version", "the device communicator's layout is the library's",
       &RankFacts::ncclVersion},
      {"the device's SM count", "calls size their grids from it", &RankFacts::smCount},
      {"GPUs per node (NCCL's LSA team size)", "the kernels place every rank by its node",
       &RankFacts::lsaSize},
  };
  for (const Field &field : fields) {
    std::vector<std::string> values;
    for (const RankFacts &f : facts)
      values.push_back(field.member == &RankFacts::ncclVersion
                           ? ncclVersionName(int(f.*field.member))
                           : std::to_string(f.*field.member));
    for (const std::string &v : values)
      if (v != values.front())
        throw NcclError(std::string("the ranks of this ElasticBuffer disagree on ") + field.name +
                        ": " + valuesByRank(values) + " (they must be equal: " + field.why +
                        "); construct the buffer with the same arguments on the same kind of "
                        "GPU and NCCL on every rank");
  }
  const int64_t R = int64_t(facts.size()), perNode = facts.empty() ? 1 : facts[0].lsaSize;
  if (perNode < 1 || R % perNode)
    throw NcclError("NCCL's LSA team (the NVLink domain) has " + std::to_string(perNode) +
                    " ranks, which does not divide the " + std::to_string(R) +
                    " ranks: every node needs as many ranks");
  for (int64_t r = 0; r < R; ++r)
    if (facts[size_t(r)].lsaRank != r % perNode)
      throw NcclError("rank " + std::to_string(r) + " is rank " +
                      std::to_string(facts[size_t(r)].lsaRank) +
                      " of its NVLink (LSA) domain, not " + std::to_string(r % perNode) +
                      ": ranks must be numbered node-major (rank = node x " +
                      std::to_string(perNode) + " + GPU), as torchrun numbers them");
}

int64_t epic::runtime::p2pAtomicsVerdict(const std::vector<RankFacts> &facts, int64_t me,
                                         const std::function<int(const std::string &)> &visible,
                                         const std::function<bool(int, int)> &nativeAtomics) {
  const int64_t R = int64_t(facts.size());
  // The pairs of this rank's node: other nodes talk over the network, not P2P, and their own
  // ranks check their pairs.
  const int64_t perNode = std::max<int64_t>(1, facts[size_t(me)].lsaSize);
  const int64_t first = me / perNode * perNode, end = std::min(R, first + perNode);
  int64_t unchecked = 0;
  for (int64_t i = first; i < end; ++i)
    for (int64_t j = i + 1; j < end; ++j) {
      std::string a = facts[i].pciBusId, b = facts[j].pciBusId;
      if (a == b)
        continue; // ranks sharing a GPU need no P2P
      int da = visible(a), db = visible(b);
      if (da < 0 || db < 0) {
        if (!unchecked)
          unchecked = -(1 + i * R + j);
        continue;
      }
      if (!nativeAtomics(da, db) || !nativeAtomics(db, da))
        return 1 + i * R + j;
    }
  return unchecked;
}

void epic::runtime::checkP2PVerdicts(const std::vector<RankFacts> &facts,
                                     const std::vector<int64_t> &verdicts, bool assumeUnchecked) {
  const int64_t R = int64_t(facts.size());
  auto pair = [&](int64_t code) {
    int64_t k = (code < 0 ? -code : code) - 1;
    return gpuName(facts, size_t(k / R)) + " and " + gpuName(facts, size_t(k % R));
  };
  for (size_t r = 0; r < verdicts.size(); ++r)
    if (verdicts[r] > 0)
      throw NcclError("no native P2P atomics between " + pair(verdicts[r]) + " (found by rank " +
                      std::to_string(r) +
                      "): the ep kernels' entry barrier makes system-scope "
                      "atomics on peer GPUs (LSA means same node, not NVLink); connect the GPUs "
                      "by NVLink or run one rank per node");
  // Conservative: unless some rank of each node could check every pair of its node, the pairs
  // are not known to be fine.
  if (assumeUnchecked || verdicts.empty())
    return;
  const int64_t perNode = std::max<int64_t>(1, facts.front().lsaSize);
  for (int64_t first = 0; first < int64_t(verdicts.size()); first += perNode) {
    const int64_t end = std::min<int64_t>(int64_t(verdicts.size()), first + perNode);
    bool checked = false;
    for (int64_t r = first; r < end; ++r)
      checked = checked || verdicts[size_t(r)] >= 0;
    if (!checked)
      throw NcclError("cannot check native P2P atomics between " + pair(verdicts[size_t(first)]) +
                      ": no rank's process sees both GPUs (CUDA_VISIBLE_DEVICES); make every "
                      "local GPU visible to every rank, or set EPIC_ASSUME_P2P_ATOMICS=1 where "
                      "the GPUs are connected by NVLink");
  }
}

int epic::runtime::waitWhileInProgress(const std::function<int()> &status, const std::string &what,
                                       double timeoutSeconds) {
  auto start = std::chrono::steady_clock::now();
  auto pause = std::chrono::microseconds(50);
  for (;;) {
    int result = status();
    if (result != kNcclInProgress)
      return result;
    double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waited >= timeoutSeconds)
      throw NcclError(what + " still in progress after " + std::to_string(int(waited)) +
                      " s (a non-blocking communicator; the bound is num_cpu_timeout_secs): a rank "
                      "that did not make the same call, or a network that does not answer");
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(10000));
  }
}
