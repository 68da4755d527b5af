//===- WaitReports.cpp - timeout reports of call-free device waits --------===//
//
// Kernels with a wgmma pipeline cannot printf a timed-out wait's report (a
// call serializes wgmma), so they write it into pinned host memory mapped
// for the device and trap. The slots are the process's, allocated when the
// first module that wants them is loaded; the host reads them when a CUDA
// call fails (host memory stays readable when the context does not).
//
//===----------------------------------------------------------------------===//

#include "CudaCheck.h"

#include "epic/device/WaitReport.h"

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace epic::runtime::detail {
namespace {

using epic_device::kWaitReportSlots;
using epic_device::WaitReport;

// The host view; never freed (the process's). Atomic: check() reads it from
// any thread, without the allocation lock (whose holder may call check()).
std::atomic<WaitReport *> slots{nullptr};
std::mutex allocation;

WaitReport *mappedSlots() {
  cudaError_t error = cudaSuccess;
  {
    std::lock_guard<std::mutex> lock(allocation);
    if (!slots.load()) {
      void *host = nullptr;
      error = cudaHostAlloc(&host, sizeof(WaitReport) * kWaitReportSlots,
                            cudaHostAllocMapped | cudaHostAllocPortable);
      if (error == cudaSuccess) {
        std::memset(host, 0, sizeof(WaitReport) * kWaitReportSlots);
        slots.store(static_cast<WaitReport *>(host));
      }
    }
  }
  check(error, "cudaHostAlloc(device wait reports)");
  return slots.load();
}

} // namespace

void attachDeviceWaitReports(CUmodule module) {
  CUdeviceptr global = 0;
  size_t bytes = 0;
  if (driver().moduleGetGlobal(&global, &bytes, module, EPIC_WAIT_REPORT_SYMBOL) != CUDA_SUCCESS ||
      bytes != sizeof(void *))
    return; // no call-free waits in this module
  WaitReport *host = mappedSlots();
  void *device = nullptr;
  check(cudaHostGetDevicePointer(&device, host, 0), "cudaHostGetDevicePointer(wait reports)");
  check(
      cudaMemcpy(reinterpret_cast<void *>(global), &device, sizeof(device), cudaMemcpyHostToDevice),
      "setting " EPIC_WAIT_REPORT_SYMBOL);
}

} // namespace epic::runtime::detail

namespace {

/// The timed-out waits of one rank on one flag, seen at one value.
struct TimedOut {
  int64_t ms;
  int rank;
  std::string wait; ///< " thread T waited for peer P: the flag at ..."
  std::vector<int> blocks;
};

/// "3", "8-15", "0, 2, 4-6" of sorted block indices.
std::string blockRanges(const std::vector<int> &blocks) {
  std::string out;
  for (size_t i = 0; i < blocks.size();) {
    size_t j = i;
    while (j + 1 < blocks.size() && blocks[j + 1] == blocks[j] + 1)
      ++j;
    out += (out.empty() ? "" : ", ") + std::to_string(blocks[i]);
    if (j > i)
      out += "-" + std::to_string(blocks[j]);
    i = j + 1;
  }
  return out;
}

} // namespace

std::string
epic::runtime::formatDeviceWaitReports(const std::vector<epic_device::WaitReport> &reports) {
  std::string text;
  std::vector<TimedOut> timedOut;
  for (const epic_device::WaitReport &r : reports) {
    if (r.valid != 1)
      continue;
    char line[320];
    if (r.predicate == epic_device::kDisagreed)
      std::snprintf(line, sizeof(line),
                    "; rank %d and rank %d disagree (block %d thread %d): signature %" PRIx64
                    " here, %" PRIx64 " there: every rank must make the same call at the same "
                    "time (the same op, configuration, variant, num_sms and token cap)",
                    int(r.rank), int(r.peer), int(r.block), int(r.thread), uint64_t(r.expected),
                    uint64_t(r.seen));
    else if (r.predicate == epic_device::kLsaViolation)
      std::snprintf(line, sizeof(line),
                    "; rank %d used an NVLink (LSA) pointer to rank %d of another node (block %d "
                    "thread %d; a virtual world of %d nodes of %d GPUs): only the network "
                    "(comm.put, put_value, signal) reaches another node",
                    int(r.rank), int(r.peer), int(r.block), int(r.thread),
                    r.expected > 0 ? int(r.seen / r.expected) : 0, int(r.expected));
    else {
      // The blocks of a rank that waited for the same flag (or barrier phase) and saw the same
      // value: one line (a stalled grid has a rank's blocks in a few waits).
      if (r.predicate == epic_device::kPhaseNotCompleted)
        std::snprintf(line, sizeof(line),
                      " thread %d waited for the mbarrier at shared 0x%" PRIx64
                      " to complete its phase of parity %" PRId64 ": " EPIC_PHASE_STALL_CAUSES,
                      int(r.thread), uint64_t(r.flag), int64_t(r.expected));
      else
        std::snprintf(line, sizeof(line),
                      " thread %d waited for peer %d: the flag at 0x%" PRIx64 " %s %" PRId64
                      " (seen %" PRId64 ")",
                      int(r.thread), int(r.peer), uint64_t(r.flag),
                      epic_device::waitPredicateName(r.predicate), int64_t(r.expected),
                      int64_t(r.seen));
      TimedOut key{int64_t(r.timeoutNs) / 1000000, int(r.rank), line, {}};
      auto same = std::find_if(timedOut.begin(), timedOut.end(), [&](const TimedOut &t) {
        return t.ms == key.ms && t.rank == key.rank && t.wait == key.wait;
      });
      if (same == timedOut.end())
        same = timedOut.insert(timedOut.end(), std::move(key));
      same->blocks.push_back(int(r.block));
      continue;
    }
    text += line;
  }
  for (TimedOut &t : timedOut) {
    std::sort(t.blocks.begin(), t.blocks.end());
    text += "; device wait timed out after " + std::to_string(t.ms) + " ms: rank " +
            std::to_string(t.rank) + (t.blocks.size() > 1 ? " blocks " : " block ") +
            blockRanges(t.blocks) + t.wait;
  }
  return text;
}

std::string epic::runtime::takeDeviceWaitReports() {
  using namespace detail;
  std::vector<epic_device::WaitReport> taken;
  epic_device::WaitReport *reports = slots.load();
  for (int i = 0; reports && i < kWaitReportSlots; ++i) {
    volatile epic_device::WaitReport &r = reports[i];
    if (r.valid != 1)
      continue;
    epic_device::WaitReport copy;
    copy.valid = r.valid, copy.flag = r.flag, copy.expected = r.expected, copy.seen = r.seen;
    copy.timeoutNs = r.timeoutNs, copy.predicate = r.predicate, copy.rank = r.rank;
    copy.peer = r.peer, copy.block = r.block, copy.thread = r.thread, copy.padding = 0;
    taken.push_back(copy);
    r.valid = 0;
  }
  return formatDeviceWaitReports(taken);
}
