//===- WaitReport.h - timeout reports of call-free waits ---------*- C++ -*-===//
//
// A bounded wait in a kernel that must not call functions (a wgmma pipeline:
// ptxas serializes wgmma around any call, printf included) cannot print its
// timeout report. It writes it here instead, into pinned host memory the
// runtime maps and points the module's `epic_wait_report` global at, then
// traps; the host reads the slots after the launch failed (host memory stays
// readable when the CUDA context does not). Shared by the device shims and
// the runtime: plain C layout.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_DEVICE_WAITREPORT_H
#define EPIC_DEVICE_WAITREPORT_H

#include <stdint.h>

namespace epic_device {

/// The name of the module global (a WaitReport *) the runtime sets.
#define EPIC_WAIT_REPORT_SYMBOL "epic_wait_report"

/// Slots: a block reports in slot blockIdx.x % kWaitReportSlots; the first
/// wait to time out there claims it (an atomic on a device-memory flag of the
/// module), so the waits that time out together never mix their fields, and
/// later ones in the same slot trap without writing.
constexpr int kWaitReportSlots = 256; // a block of its own in every grid of <= 256 blocks

/// WaitReport::predicate of a comm.agree report: `expected` is the rank's
/// value, `seen` the peer's, and nothing was waited for.
constexpr int32_t kDisagreed = 4;

/// WaitReport::predicate of the virtual world's check_lsa_peer: `rank` used
/// an NVLink (LSA) pointer to `peer`, of another node; `expected` is the
/// world's lsa_size (M), `seen` its num_ranks (R), and nothing was waited for.
constexpr int32_t kLsaViolation = 5;

/// WaitReport::predicate of a comm.wait_phase report: `flag` is the
/// mbarrier's shared-memory address, `expected` the parity of the phase that
/// did not complete, `seen` 0 (an mbarrier's state cannot be read: on Hopper
/// a load of its address returns what was stored there before its init).
constexpr int32_t kPhaseNotCompleted = 6;
/// What a phase that never completes says about the pipeline (the device's
/// printf and the runtime's report; a literal, for both compilers).
#define EPIC_PHASE_STALL_CAUSES                                                                    \
  "the pipeline's other side never got there (its producer and consumers disagree on its "         \
  "steps, one of them is held outside the pipeline, or a TMA load never arrived)"

struct WaitReport {
  uint64_t valid; ///< 1 once the other fields are written
  uint64_t flag;  ///< address of the flag waited on
  int64_t expected, seen, timeoutNs;
  int32_t predicate;  ///< 0 ==, 1 !=, 2 >=, 3 >; kDisagreed, kLsaViolation: no wait;
                      ///< kPhaseNotCompleted: an mbarrier phase
  int32_t rank, peer; ///< -1 if the wait did not name them
  int32_t block, thread;
  int32_t padding;
};
static_assert(sizeof(WaitReport) == 64, "one report per 64 bytes");

#if defined(__CUDACC__) || defined(__CUDA__)
#define EPIC_WAIT_REPORT_HOST_DEVICE __host__ __device__
#else
#define EPIC_WAIT_REPORT_HOST_DEVICE
#endif

/// How a report (and the printed one) writes WaitReport::predicate.
EPIC_WAIT_REPORT_HOST_DEVICE inline const char *waitPredicateName(int32_t predicate) {
  switch (predicate) {
  case 0:
    return "==";
  case 1:
    return "!=";
  case 2:
    return ">=";
  default:
    return ">";
  }
}

} // namespace epic_device

#endif // EPIC_DEVICE_WAITREPORT_H
