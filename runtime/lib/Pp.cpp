//===- Pp.cpp - pipeline send/recv by copy engines ------------------------===//
//
// See Pp.h. Direction indices: a rank sends to its next neighbour (0) or its
// previous one (1); a rank receives from its previous neighbour (region 0)
// or its next one (region 1). A send to the next lands in the next rank's
// region 0 ("from previous"), and that rank frees it in our release flag 0.

#include "epic/runtime/Pp.h"

#include "epic/Dialect/EP/IR/EPWindow.h"

#include "CudaCheck.h"
#include "StreamMemOps.h"
#include "StreamWaits.h"

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

using namespace epic::runtime;
using detail::check;
namespace window = epic::ep::window;

namespace {

void writeFlag(void *flag, uint32_t value, void *stream, const std::string &what) {
  detail::streamMemOps({detail::writeFlagOp(flag, value)}, stream, what);
}

/// The wait, watched (StreamWaits.h): `flagName` names the flag in a report.
void waitFlag(void *flag, uint32_t value, void *stream, const std::string &what,
              const std::string &flagName, double timeoutSecs) {
  detail::waitFlags({{flag, value, flagName}}, stream, what, timeoutSecs);
}

} // namespace

PpChannels::PpChannels(KernelHost &host)
    : host(host), sent(size_t(host.servedRankCount())), received(size_t(host.servedRankCount())) {}

int64_t PpChannels::regionBytes(int64_t maxTensorBytes, int maxInflight) {
  return 2 * int64_t(maxInflight) * window::align(maxTensorBytes, 32);
}

void PpChannels::setConfig(int64_t maxTensorBytes, int inflight) {
  host.requireOneNvlinkDomain("pp_set_config: epic's PP");
  if (maxTensorBytes < 1)
    throw std::invalid_argument("num_max_tensor_bytes: must be positive, got " +
                                std::to_string(maxTensorBytes));
  if (inflight < 1 || inflight > 1024)
    throw std::invalid_argument("num_max_inflight_tensors: must be in [1, 1024], got " +
                                std::to_string(inflight));
  const int64_t needed = window::kControlEnd + regionBytes(maxTensorBytes, inflight);
  if (needed > host.windowBytes())
    throw std::invalid_argument(
        "pp_set_config: " + std::to_string(inflight) + " tensors of " +
        std::to_string(maxTensorBytes) + " bytes from each neighbour need a window of " +
        std::to_string(needed) + " bytes; the buffer's has " + std::to_string(host.windowBytes()) +
        ": create it with get_pp_buffer_size_hint's size");
  // Slots move with the settings; the counts (and so the flags) go on.
  maxBytes = maxTensorBytes;
  slotBytes = window::align(maxTensorBytes, 32);
  maxInflight = inflight;
}

int PpChannels::neighbour(int servedRank, int peer, const char *what, const char *name) const {
  const int R = host.worldSize(), me = host.worldRankOf(servedRank);
  const int next = (me + 1) % R, prev = (me + R - 1) % R;
  if (peer == next)
    return 0;
  if (peer == prev)
    return 1;
  throw std::invalid_argument(std::string(what) + ": " + name + " is " + std::to_string(peer) +
                              ", not a ring neighbour of rank " + std::to_string(me) + " (" +
                              std::to_string(prev) + " or " + std::to_string(next) + ")");
}

int64_t PpChannels::slotOffset(int region, uint32_t count) const {
  const int64_t index = int64_t(region) * maxInflight + int64_t(count % uint32_t(maxInflight));
  return window::kControlEnd + index * slotBytes;
}

void PpChannels::send(int servedRank, uint64_t src, int64_t bytes, int dst, void *stream) {
  if (!configured())
    throw std::invalid_argument("pp_send: call pp_set_config first");
  if (bytes < 1 || bytes > maxBytes)
    throw std::invalid_argument("pp_send: the tensor has " + std::to_string(bytes) +
                                " bytes; num_max_tensor_bytes is " + std::to_string(maxBytes));
  const int dir = neighbour(servedRank, dst, "pp_send", "dst_rank_idx");
  const uint32_t n = sent[servedRank][dir];
  // Our tensor lands in the receiver's region for us: 0 if we are its
  // previous rank (we send to our next), 1 otherwise.
  const int region = dir;
  if (n >= uint32_t(maxInflight)) // the slot's last tensor must have been received
    waitFlag(detail::byteAt(host.windowMemory(servedRank), window::kPpReleased + 4 * dir),
             n - uint32_t(maxInflight) + 1, stream,
             "pp_send of rank " + std::to_string(host.worldRankOf(servedRank)) + " to rank " +
                 std::to_string(dst),
             "rank " + std::to_string(dst) + "'s release count (it has not received tensor " +
                 std::to_string(n - uint32_t(maxInflight) + 1) + " of this direction)",
             host.streamWaitTimeout());
  char *peer = static_cast<char *>(host.peerWindowMemory(servedRank, dst));
  check(cudaMemcpyAsync(peer + slotOffset(region, n), reinterpret_cast<const void *>(src),
                        size_t(bytes), cudaMemcpyDefault, static_cast<cudaStream_t>(stream)),
        "pp_send: the copy (cudaMemcpyAsync)");
  writeFlag(peer + window::kPpArrived + 4 * region, n + 1, stream,
            "pp_send: the arrival flag (cuStreamBatchMemOp)");
  sent[servedRank][dir] = n + 1;
}

void PpChannels::recv(int servedRank, uint64_t dst, int64_t bytes, int src, void *stream) {
  if (!configured())
    throw std::invalid_argument("pp_recv: call pp_set_config first");
  if (bytes < 1 || bytes > maxBytes)
    throw std::invalid_argument("pp_recv: the tensor has " + std::to_string(bytes) +
                                " bytes; num_max_tensor_bytes is " + std::to_string(maxBytes));
  // From our previous rank (which sent to its next) into region 0; from our
  // next into region 1. A world of two: previous and next are one rank, and
  // its sends go to its next: region 0.
  const int R = host.worldSize(), me = host.worldRankOf(servedRank);
  int region = 0;
  if (src != (me + R - 1) % R) {
    neighbour(servedRank, src, "pp_recv", "src_rank_idx"); // refuses a rank that is neither
    region = 1;
  }
  const uint32_t n = received[servedRank][region];
  char *mine = static_cast<char *>(host.windowMemory(servedRank));
  waitFlag(mine + window::kPpArrived + 4 * region, n + 1, stream,
           "pp_recv of rank " + std::to_string(me) + " from rank " + std::to_string(src),
           "rank " + std::to_string(src) + "'s arrival count (it has not sent tensor " +
               std::to_string(n + 1) + " of this direction)",
           host.streamWaitTimeout());
  check(cudaMemcpyAsync(reinterpret_cast<void *>(dst), mine + slotOffset(region, n), size_t(bytes),
                        cudaMemcpyDefault, static_cast<cudaStream_t>(stream)),
        "pp_recv: the copy (cudaMemcpyAsync)");
  // Free the slot in the sender's release flag for its direction to us:
  // region 0 came from its sends to its next (0), region 1 from its sends to
  // its previous (1).
  writeFlag(
      detail::byteAt(host.peerWindowMemory(servedRank, src), window::kPpReleased + 4 * region),
      n + 1, stream, "pp_recv: the release flag (cuStreamBatchMemOp)");
  received[servedRank][region] = n + 1;
}
