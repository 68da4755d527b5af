//===- comm_smoke_nodes.cu - virtual worlds of several nodes on a GPU -----===//
//
// The comm smoke test's modes for a virtual world of N nodes of M GPUs (the
// kernels of comm_kernels.mlir, virtual backend; see comm_smoke.cu):
//
//   virtual-2x4                  teams, the next LSA rank's word over NVLink,
//                                a put and a put_value to the rail peer with
//                                signals, LSA/rail/world barrier rounds, and
//                                the traffic: nonzero on rail pairs only, exact
//   virtual-lsa-violation        rank 3 takes an NVLink pointer to rank 5 (node
//                                1): the kernel must trap, the device's report
//                                naming both (run.sh checks the text)
//   virtual-lsa-violation-report the same in a kernel that must not call: the
//                                report in its mapped slot
//   virtual-drop                 rank 1's network dropped: rank 5's wait for
//                                its put must time out naming rank 1
//
// The trapping modes end the process: a trap loses the CUDA context.
//
//===----------------------------------------------------------------------===//

#include "CommSmoke.h"

using namespace comm_smoke;

namespace {

constexpr int kNodes = 2, kGpus = 4, kRanks = kNodes * kGpus, kBlocks = 4, kThreads = 256;

int runNodes(const char *cubin) {
  std::printf("virtual backend: %d nodes x %d GPUs, %d blocks x %d threads per rank\n", kNodes,
              kGpus, kBlocks, kThreads);
  CUmodule module = loadModule(cubin);
  VirtualWorld world(kRanks, 1 << 20, kGpus);
  const int64_t bytes = 48 * 1024 + 16;
  const size_t words = world.stride / 4;
  std::vector<int32_t> host(kRanks * words, 0);
  for (int r = 0; r < kRanks; ++r)
    for (int i = 0; i < bytes / 4; ++i)
      host[r * words + 1024 + i] = pattern(r, i); // the put's source, at byte 4096
  int32_t *board = nullptr;
  const size_t boardWords = 3 * kRanks * kBlocks;
  CHECK_CUDA(cudaMalloc(&board, boardWords * 4));
  for (int launchIndex = 0; launchIndex < 2; ++launchIndex) {
    world.reset();
    CHECK_CUDA(cudaMemcpy(world.data, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemset(board, 0, boardWords * 4));
    int32_t rounds = 500;
    launch(kernel(module, "nodes"), kRanks * kBlocks, kThreads,
           {&world.commDev, &world.window, const_cast<int64_t *>(&bytes), &rounds, &board});
    std::vector<int32_t> out(host.size());
    CHECK_CUDA(cudaMemcpy(out.data(), world.data, out.size() * 4, cudaMemcpyDeviceToHost));
    std::printf(" launch %d (barrier counters from where the last one left them)\n", launchIndex);

    bool teams = true, lsaWord = true, put = true, putValue = true;
    for (int w = 0; w < kRanks; ++w) {
      const int32_t *slice = &out[w * words];
      int node = w / kGpus, gpu = w % kGpus;
      int next = ((node + 1) % kNodes) * kGpus + gpu,
          prev = ((node + kNodes - 1) % kNodes) * kGpus + gpu;
      const int32_t want[8] = {w, kRanks, gpu, kGpus, node, kNodes, next, prev};
      teams &= std::memcmp(slice, want, sizeof want) == 0;
      // Word 8: the world rank of the previous LSA rank of the node.
      lsaWord &= slice[8] == node * kGpus + (gpu + kGpus - 1) % kGpus;
      for (int i = 0; i < bytes / 4 && put; ++i)
        put = slice[1024 + bytes / 4 + i] == pattern(prev, i);
      int64_t value = 0;
      std::memcpy(&value, slice + 16, 8);
      putValue &= value == prev;
    }
    expect(teams, "teams: world {8, w}, LSA {4, w % 4}, rail {2, w / 4} and its members");
    expect(lsaWord, "NVLink (LSA) pointers reach the next GPU of the own node");
    expect(put, "put to the rail peer landed before its signal was seen");
    expect(putValue, "put_value to the rail peer landed before its signal was seen");

    std::vector<int32_t> arrivals(boardWords);
    CHECK_CUDA(cudaMemcpy(arrivals.data(), board, boardWords * 4, cudaMemcpyDeviceToHost));
    bool counted = true;
    for (int32_t a : arrivals)
      counted &= a == rounds;
    int errors = 0;
    for (int w = 0; w < kRanks; ++w)
      for (int b = 0; b < kBlocks; ++b)
        errors += out[w * words + 64 + b];
    char what[128];
    std::snprintf(what, sizeof what, "LSA, rail and world barriers: %d rounds, %d early reads",
                  rounds, errors);
    expect(counted && errors == 0, what);

    // Only the rail pairs carry network traffic: bytes, 8-byte put_value, two signals.
    std::vector<uint64_t> traffic = world.traffic();
    bool exact = true;
    for (int from = 0; from < kRanks; ++from)
      for (int to = 0; to < kRanks; ++to) {
        const uint64_t *t = &traffic[(size_t(from) * kRanks + to) * EPIC_TRAFFIC_KINDS];
        bool rail = to % kGpus == from % kGpus && to != from;
        exact &= t[EPIC_TRAFFIC_PUT_BYTES] == (rail ? uint64_t(bytes) : 0) &&
                 t[EPIC_TRAFFIC_PUT_VALUE_BYTES] == (rail ? 8u : 0u) &&
                 t[EPIC_TRAFFIC_SIGNALS] == (rail ? 2u : 0u);
        if (rail && from == 0)
          std::printf("  traffic 0 -> %d: %llu put bytes, %llu put_value bytes, %llu signals\n", to,
                      (unsigned long long)t[0], (unsigned long long)t[1], (unsigned long long)t[2]);
      }
    expect(exact, "traffic: on rail pairs only, bytes and signals exact");
  }
  return failures;
}

/// Rank 3 (node 0) takes an NVLink pointer to rank 5 (node 1): a trap.
int runLsaViolation(const char *cubin, bool report) {
  std::printf("virtual backend, %d nodes x %d GPUs: rank 3 takes an NVLink pointer to rank 5%s\n",
              kNodes, kGpus, report ? " (a kernel that must not call)" : "");
  CUmodule module = loadModule(cubin);
  VirtualWorld world(kRanks, 1 << 16, kGpus);
  epic_device::WaitReport *reports = report ? mapWaitReports(module) : nullptr;
  int32_t from = 3, to = 5;
  CUresult r =
      launchFailing(kernel(module, report ? "lsa_violation_inline" : "lsa_violation"),
                    kRanks * kBlocks, kThreads, {&world.commDev, &world.window, &from, &to});
  expect(r != CUDA_SUCCESS, "the kernel trapped");
  if (report) {
    const unsigned slot = (from * kBlocks) % epic_device::kWaitReportSlots; // rank 3's block 0
    const volatile epic_device::WaitReport &s = reports[slot];
    std::printf("  report of slot %u: valid %llu, predicate %d, rank %d, peer %d, M %lld, R %lld\n",
                slot, (unsigned long long)s.valid, int(s.predicate), int(s.rank), int(s.peer),
                (long long)s.expected, (long long)s.seen);
    expect(s.valid == 1 && s.predicate == epic_device::kLsaViolation && s.rank == from &&
               s.peer == to && s.expected == kGpus && s.seen == kRanks,
           "the report names both ranks and the world's shape");
  }
  return failures;
}

/// Rank 1's network is dropped: its put never lands, so rank 5, its rail
/// peer, must time out waiting for its signal, naming rank 1.
int runDrop(const char *cubin) {
  std::printf("virtual backend, %d nodes x %d GPUs: rank 1's network dropped\n", kNodes, kGpus);
  CUmodule module = loadModule(cubin);
  VirtualWorld world(kRanks, 1 << 16, kGpus, /*dropNetworkFrom=*/1);
  CUresult r = launchFailing(kernel(module, "dropped_put"), kRanks * kBlocks, kThreads,
                             {&world.commDev, &world.window});
  expect(r != CUDA_SUCCESS, "the wait for rank 1's signal timed out and trapped");
  return failures;
}

} // namespace

int runVirtualNodes(const std::string &mode, const char *cubin) {
  if (mode == "virtual-2x4")
    return runNodes(cubin);
  if (mode == "virtual-lsa-violation")
    return runLsaViolation(cubin, false);
  if (mode == "virtual-lsa-violation-report")
    return runLsaViolation(cubin, true);
  if (mode == "virtual-drop")
    return runDrop(cubin);
  std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
  return 2;
}
