//===- StreamWaits.h - bounded reporting of stream waits on flags ---------===//
//
// AGRS and PP hold a stream with stream memory operations until a peer's
// flag arrives (StreamMemOps.h). The hardware wait has no bound: a peer that
// never sends holds the stream forever. So that such a wait never hangs
// without saying why, each one is watched from the host: an event recorded
// after the wait tells when it is over, and a wait still pending after its
// bound is reported once (stderr, and streamWaitReports()) with every flag it
// waits for, the value it needs and the value it holds. The stream itself
// keeps waiting (a wait cannot be cancelled): the report names the peer.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_RUNTIME_STREAMWAITS_H
#define EPIC_RUNTIME_STREAMWAITS_H

#include <cstdint>
#include <string>
#include <vector>

namespace epic::runtime::detail {

/// One flag a stream waits for: `(int32_t)(*flag - value) >= 0`.
struct FlagWait {
  const void *flag;
  uint32_t value;
  std::string what; ///< e.g. "rank 3's arrival flag"
};

/// Holds `stream` until every flag of `waits` has its value (stream memory
/// operations) and watches the wait (nothing while the stream is being
/// captured: a graph's waits run at replay). `what` names the operation.
void waitFlags(std::vector<FlagWait> waits, void *stream, const std::string &what,
               double timeoutSecs);

} // namespace epic::runtime::detail

#endif // EPIC_RUNTIME_STREAMWAITS_H
