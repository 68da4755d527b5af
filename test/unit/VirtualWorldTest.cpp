//===- VirtualWorldTest.cpp - the virtual world's shape, without a GPU ----===//
//
// The descriptor's layout (VirtualWorld.def) and what VirtualElasticBuffer
// refuses before it touches the device: nodes that do not split the ranks.
//
//===----------------------------------------------------------------------===//

#include "epic/device/VirtualWorld.h"
#include "epic/runtime/KernelCache.h"
#include "epic/runtime/KernelProvider.h"
#include "epic/runtime/VirtualBuffer.h"

#include "Refusal.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <string>

using namespace epic::runtime;
using epic::test::refusal;

namespace {

TEST(VirtualWorld, TheDescriptorsFollowTheirFieldList) {
  // The lowering addresses fields by index: the indices are the .def's order,
  // the appended fields after the pointers the original ones.
  EXPECT_EQ(EPIC_VCOMM_NUM_RANKS, 0);
  EXPECT_EQ(EPIC_VCOMM_LSA_SIZE, 5);
  EXPECT_EQ(EPIC_VCOMM_SIGNALS, 6);
  EXPECT_EQ(EPIC_VCOMM_TRAFFIC, 9);
  EXPECT_EQ(EPIC_VCOMM_GIN_MODE, 11);
  EXPECT_EQ(offsetof(EpicVirtualComm, lsa_size), 20u);
  EXPECT_EQ(offsetof(EpicVirtualComm, signals), 24u);
  EXPECT_EQ(offsetof(EpicVirtualComm, traffic), 48u);
  EXPECT_EQ(offsetof(EpicVirtualComm, drop_network_from), 56u);
  EXPECT_EQ(offsetof(EpicVirtualComm, gin_mode), 60u);
  EXPECT_EQ(EPIC_VCOMM_DROP_SPARES_SIGNAL, 12);
  EXPECT_EQ(offsetof(EpicVirtualComm, drop_spares_signal), 64u);
  EXPECT_EQ(sizeof(EpicVirtualComm), 72u);
  EXPECT_EQ(offsetof(EpicVirtualWindow, num_ranks), 16u);
  EXPECT_EQ(EPIC_VWIN_NUM_RANKS, 2);
}

TEST(VirtualWorld, SignalsCoverTheMultiNodeProtocol) {
  // 8 + 2R signals per (rank, context), at least 64.
  EXPECT_EQ(VirtualElasticBuffer::signalsPerRank(1), 64);
  EXPECT_EQ(VirtualElasticBuffer::signalsPerRank(28), 64);
  EXPECT_EQ(VirtualElasticBuffer::signalsPerRank(29), 66);
  EXPECT_EQ(VirtualElasticBuffer::signalsPerRank(1024), 2056);
}

TEST(VirtualWorld, NodesMustSplitTheRanks) {
  KernelCache cache("/nonexistent/epic-virtual-world-test"); // never read: refused first
  KernelProvider provider(cache, {"virtual", "sm_90", ""});
  for (int gpus : {3, 0, -4, 16})
    EXPECT_EQ(refusal([&] { VirtualElasticBuffer world(8, 1 << 20, provider, 4, gpus); }),
              "gpus_per_node must be a positive divisor of num_ranks (8), got " +
                  std::to_string(gpus))
        << gpus;
  // The ranks are checked first, by the world itself.
  EXPECT_EQ(refusal([&] { VirtualElasticBuffer world(0, 1 << 20, provider, 4, 3); }),
            "num_ranks must be in [1, 1024], got 0");
}

} // namespace
