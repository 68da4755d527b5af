//===- NcclChecksTest.cpp - the NCCL backend's refusals, without a GPU ----===//
//
// What ranks and libraries must agree on (NcclChecks.h) with made-up ranks,
// and the communicator's contract that needs no device: an exact version
// match, no way to adopt a foreign communicator unsplit.
//
//===----------------------------------------------------------------------===//

#include "epic/runtime/NcclBuffer.h"
#include "epic/runtime/NcclChecks.h"

#include <gtest/gtest.h>
#include <nccl.h>

#include <cstring>
#include <type_traits>

using namespace epic::runtime;

namespace {

/// The message of what `body` throws as T ("" if it throws nothing).
template <typename T, typename F> std::string thrown(F body) {
  try {
    body();
  } catch (const T &e) {
    return e.what();
  }
  return "";
}

RankFacts facts(int64_t bytes, int64_t blocks, int64_t version, int64_t sms, const char *bus) {
  RankFacts f;
  f.numBytes = bytes;
  f.blocksPerRank = blocks;
  f.ncclVersion = version;
  f.smCount = sms;
  std::strncpy(f.pciBusId, bus, sizeof f.pciBusId - 1);
  return f;
}

/// Four ranks on `nodes` nodes, numbered node-major.
std::vector<RankFacts> fourRanks(int nodes = 1) {
  std::vector<RankFacts> f = {facts(1 << 21, 64, 22809, 132, "0000:18:00.0"),
                              facts(1 << 21, 64, 22809, 132, "0000:2a:00.0"),
                              facts(1 << 21, 64, 22809, 132, "0000:3a:00.0"),
                              facts(1 << 21, 64, 22809, 132, "0000:5d:00.0")};
  for (size_t r = 0; r < f.size(); ++r) {
    f[r].lsaSize = 4 / nodes;
    f[r].lsaRank = int64_t(r) % f[r].lsaSize;
  }
  return f;
}

TEST(NcclVersion, NamesBothEncodings) {
  EXPECT_EQ(ncclVersionName(22809), "2.28.9");
  EXPECT_EQ(ncclVersionName(23007), "2.30.7");
  EXPECT_EQ(ncclVersionName(2708), "2.7.8"); // NCCL_VERSION below 2.9
}

TEST(NcclVersion, PatchReleasesMustBeEqual) {
  EXPECT_NO_THROW(checkVersionsEqual(22809, 22809));
  // Same major.minor, another patch: ncclDevComm differs between 2.28 patches.
  std::string message = thrown<NcclError>([] { checkVersionsEqual(22809, 22807); });
  EXPECT_NE(message.find("loaded NCCL library is 2.28.7"), std::string::npos) << message;
  EXPECT_NE(message.find("compiled against NCCL 2.28.9"), std::string::npos) << message;
  EXPECT_NE(thrown<NcclError>([] { checkVersionsEqual(22809, 22900); }), "");
}

TEST(NcclVersion, TheLoadedLibraryIsTheCompiledOne) {
  // This build's own pairing (no GPU needed): what epic's constructors check first.
  EXPECT_EQ(Communicator::loadedVersion(), NCCL_VERSION_CODE);
  EXPECT_NO_THROW(Communicator::checkVersion());
}

TEST(RanksAgree, EqualFactsPass) { EXPECT_NO_THROW(checkRanksAgree(fourRanks())); }

TEST(RanksAgree, EachFieldIsNamedWithTheRanksValues) {
  auto f = fourRanks();
  f[1].numBytes = 1 << 22;
  std::string m = thrown<NcclError>([&] { checkRanksAgree(f); });
  EXPECT_NE(m.find("disagree on num_bytes: 2097152 on ranks 0, 2, 3; 4194304 on rank 1"),
            std::string::npos)
      << m;

  f = fourRanks();
  f[3].blocksPerRank = 24;
  m = thrown<NcclError>([&] { checkRanksAgree(f); });
  EXPECT_NE(m.find("blocks per rank (num_sms): 64 on ranks 0, 1, 2; 24 on rank 3"),
            std::string::npos)
      << m;

  f = fourRanks();
  f[0].ncclVersion = 22807;
  m = thrown<NcclError>([&] { checkRanksAgree(f); });
  EXPECT_NE(m.find("NCCL version: 2.28.7 on rank 0; 2.28.9 on ranks 1, 2, 3"), std::string::npos)
      << m;

  f = fourRanks();
  f[2].smCount = f[3].smCount = 114;
  m = thrown<NcclError>([&] { checkRanksAgree(f); });
  EXPECT_NE(m.find("SM count: 132 on ranks 0, 1; 114 on ranks 2, 3"), std::string::npos) << m;
}

TEST(RanksAgree, NodesAreEqualAndNodeMajor) {
  EXPECT_NO_THROW(checkRanksAgree(fourRanks(2)));
  auto f = fourRanks(2);
  f[3].lsaSize = 4;
  std::string m = thrown<NcclError>([&] { checkRanksAgree(f); });
  EXPECT_NE(m.find("disagree on GPUs per node (NCCL's LSA team size): 2 on ranks 0, 1, 2; 4 on "
                   "rank 3"),
            std::string::npos)
      << m;
  f = fourRanks(2);
  std::swap(f[1].lsaRank, f[2].lsaRank); // LSA ranks 0 0 1 1: numbered node-minor
  m = thrown<NcclError>([&] { checkRanksAgree(f); });
  EXPECT_NE(m.find("rank 1 is rank 0 of its NVLink (LSA) domain, not 1: ranks must be numbered "
                   "node-major"),
            std::string::npos)
      << m;
  f = fourRanks();
  for (auto &r : f)
    r.lsaSize = 3, r.lsaRank = 0;
  m = thrown<NcclError>([&] { checkRanksAgree(f); });
  EXPECT_NE(m.find("has 3 ranks, which does not divide the 4 ranks"), std::string::npos) << m;
}

TEST(RanksAgree, TheFirstDisagreementIsReported) {
  auto f = fourRanks();
  f[1].smCount = 78;
  f[2].numBytes = 1 << 23;
  std::string m = thrown<NcclError>([&] { checkRanksAgree(f); });
  EXPECT_NE(m.find("num_bytes"), std::string::npos) << m;
}

// Devices 0..3 are the four ranks' GPUs; `noAtomics` is the one pair without them.
int64_t verdict(const std::vector<RankFacts> &f, std::pair<int, int> noAtomics,
                const std::vector<std::string> &visibleBus, int64_t me = 0) {
  auto visible = [&](const std::string &bus) {
    for (size_t d = 0; d < visibleBus.size(); ++d)
      if (visibleBus[d] == bus)
        return int(d);
    return -1;
  };
  auto atomics = [&](int a, int b) {
    return !(std::min(a, b) == noAtomics.first && std::max(a, b) == noAtomics.second);
  };
  return p2pAtomicsVerdict(f, me, visible, atomics);
}

std::vector<std::string> buses(const std::vector<RankFacts> &f) {
  std::vector<std::string> out;
  for (const RankFacts &r : f)
    out.push_back(r.pciBusId);
  return out;
}

TEST(P2PAtomics, AllPairsWithAtomicsPass) {
  auto f = fourRanks();
  EXPECT_EQ(verdict(f, {-1, -1}, buses(f)), 0);
  EXPECT_NO_THROW(checkP2PVerdicts(f, {0, 0, 0, 0}, false));
}

TEST(P2PAtomics, APairWithoutThemIsRefusedByName) {
  auto f = fourRanks();
  int64_t v = verdict(f, {1, 3}, buses(f));
  EXPECT_GT(v, 0);
  std::string m = thrown<NcclError>([&] { checkP2PVerdicts(f, {v, v, v, v}, false); });
  EXPECT_NE(m.find("no native P2P atomics between GPU 0000:2a:00.0 (rank 1) and GPU "
                   "0000:5d:00.0 (rank 3)"),
            std::string::npos)
      << m;
  // Also when one rank alone could see it, and even where unchecked pairs are assumed fine.
  EXPECT_NE(thrown<NcclError>([&] { checkP2PVerdicts(f, {0, v, -2, 0}, true); }), "");
}

TEST(P2PAtomics, OnlyPairsOfOneNodeAreChecked) {
  // Two nodes of two: a rank checks its own node's pair; pairs across nodes talk over the
  // network, so (1, 3) lacking P2P atomics is fine.
  auto f = fourRanks(2);
  std::vector<std::string> node0 = {f[0].pciBusId, f[1].pciBusId};
  std::vector<std::string> node1 = {f[2].pciBusId, f[3].pciBusId};
  EXPECT_EQ(verdict(f, {1, 3}, buses(f)), 0);
  EXPECT_EQ(verdict(f, {-1, -1}, node0, /*me=*/1), 0);
  EXPECT_EQ(verdict(f, {-1, -1}, node1, /*me=*/2), 0);
  EXPECT_GT(verdict(f, {0, 1}, node1, /*me=*/3), 0); // devices 0, 1 of that process
  EXPECT_NO_THROW(checkP2PVerdicts(f, {0, 0, 0, 0}, false));
  // Node 1's ranks see only their own GPU each: its pair is unchecked, even though node 0's
  // ranks checked theirs.
  std::vector<int64_t> verdicts = {0, 0, verdict(f, {-1, -1}, {f[2].pciBusId}, 2),
                                   verdict(f, {-1, -1}, {f[3].pciBusId}, 3)};
  std::string m = thrown<NcclError>([&] { checkP2PVerdicts(f, verdicts, false); });
  EXPECT_NE(m.find("cannot check native P2P atomics between GPU 0000:3a:00.0 (rank 2) and GPU "
                   "0000:5d:00.0 (rank 3)"),
            std::string::npos)
      << m;
}

TEST(P2PAtomics, RanksSharingAGpuNeedNone) {
  auto f = fourRanks();
  std::strcpy(f[3].pciBusId, f[1].pciBusId);
  EXPECT_EQ(verdict(f, {1, 3}, buses(f)), 0);
}

TEST(P2PAtomics, PairsNoRankCanSeeAreRefusedUnlessAssumed) {
  auto f = fourRanks();
  // Each process sees its own GPU only (CUDA_VISIBLE_DEVICES per rank).
  std::vector<int64_t> verdicts;
  for (int r = 0; r < 4; ++r)
    verdicts.push_back(verdict(f, {-1, -1}, {f[r].pciBusId}, r));
  for (int64_t v : verdicts)
    EXPECT_LT(v, 0);
  std::string m = thrown<NcclError>([&] { checkP2PVerdicts(f, verdicts, false); });
  EXPECT_NE(m.find("cannot check native P2P atomics between GPU 0000:18:00.0 (rank 0) and GPU "
                   "0000:2a:00.0 (rank 1)"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("EPIC_ASSUME_P2P_ATOMICS=1"), std::string::npos) << m;
  EXPECT_NO_THROW(checkP2PVerdicts(f, verdicts, true));
  // One rank that saw (and checked) every pair is enough.
  verdicts[2] = 0;
  EXPECT_NO_THROW(checkP2PVerdicts(f, verdicts, false));
}

TEST(NonBlocking, InProgressIsWaitedForThenReturned) {
  int polls = 0;
  int result =
      waitWhileInProgress([&] { return ++polls < 4 ? kNcclInProgress : 0; }, "ncclCommSplit", 10);
  EXPECT_EQ(result, 0);
  EXPECT_EQ(polls, 4);
  EXPECT_EQ(waitWhileInProgress([] { return 5; }, "x", 10), 5); // an error is passed on
}

TEST(NonBlocking, AWaitThatNeverEndsNamesTheCall) {
  std::string m = thrown<NcclError>(
      [] { waitWhileInProgress([] { return kNcclInProgress; }, "ncclCommSplit", 0.05); });
  EXPECT_EQ(m.rfind("ncclCommSplit still in progress after", 0), 0u) << m;
}

// PyTorch's communicator cannot be adopted as it is: epic's barrier and release
// would then run on it. Only a split (Communicator::splitOf) or a new one.
static_assert(!std::is_constructible_v<Communicator, ncclComm_t>,
              "Communicator must not adopt a foreign ncclComm_t");

TEST(DeviceApi, GinThatWasNotProbedIsNotReportedAbsent) {
  // NCCL 2.28 multi-rank: no probe (it would enable GIN on the communicator).
  DeviceApiInfo info;
  info.version = 22809;
  info.worldSize = info.lsaSize = 8;
  std::string text = info.describe();
  EXPECT_NE(text.find("NCCL 2.28.9, rank 0 of 8"), std::string::npos) << text;
  EXPECT_NE(text.find("GIN not probed"), std::string::npos) << text;
  info.ginProbed = true;
  EXPECT_NE(info.describe().find("GIN not available"), std::string::npos);
  info.ginType = 3;
  info.gin = true;
  EXPECT_NE(info.describe().find("GIN available (GDAKI)"), std::string::npos);
}

TEST(Communicator, SplitOfNullIsRefusedByName) {
  std::string m = thrown<std::invalid_argument>([] { Communicator::splitOf(nullptr); });
  EXPECT_NE(m.find("null ncclComm_t"), std::string::npos) << m;
}

} // namespace
