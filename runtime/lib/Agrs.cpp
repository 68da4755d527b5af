//===- Agrs.cpp - all-gather sessions by copy engines ---------------------===//
//
// See Agrs.h. Every operation here is stream-ordered host work: copies by
// the copy engines, flag writes and waits by stream memory operations. No
// kernel runs, so an all-gather takes no SM from the compute it overlaps.

#include "epic/runtime/Agrs.h"

#include "epic/Dialect/EP/IR/EPWindow.h"

#include "CudaCheck.h"
#include "StreamMemOps.h"
#include "StreamWaits.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

using namespace epic::runtime;
using detail::check;
namespace window = epic::ep::window;

namespace {

constexpr int kMaxOpsPerSession = 32; // DeepEP's bound

using detail::byteAt;
using detail::streamMemOps;
using detail::writeFlagOp;

} // namespace

AgrsSessions::AgrsSessions(KernelHost &host) : host(host) {}

AgrsSessions::~AgrsSessions() {
  if (event)
    cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

void AgrsSessions::setConfig(int64_t maxSessionBytes, int maxOps) {
  if (open)
    throw std::invalid_argument("agrs_set_config: an AGRS session is open; destroy it first");
  if (maxOps < 1 || maxOps > kMaxOpsPerSession)
    throw std::invalid_argument("num_max_all_gathers_per_session: must be in [1, " +
                                std::to_string(kMaxOpsPerSession) + "], got " +
                                std::to_string(maxOps));
  host.requireOneNvlinkDomain("agrs_set_config: AGRS");
  if (maxSessionBytes < 1)
    throw std::invalid_argument("num_max_session_bytes: must be positive, got " +
                                std::to_string(maxSessionBytes));
  // Blocks start on 32-byte boundaries, which DeepEP's session formula
  // (get_agrs_num_max_session_bytes) includes.
  const int64_t needed = window::kControlEnd + maxSessionBytes;
  if (needed > host.windowBytes())
    throw std::invalid_argument("num_max_session_bytes: " + std::to_string(maxSessionBytes) +
                                " bytes (after the "
                                "window's control region of " +
                                std::to_string(window::kControlEnd) + " bytes) need a window of " +
                                std::to_string(needed) + " bytes; the buffer's has " +
                                std::to_string(host.windowBytes()) +
                                ": create it with get_agrs_buffer_size_hint's size");
  maxBytes = maxSessionBytes;
  maxOpsPerSession = maxOps;
}

void AgrsSessions::requireOpen(const char *what) const {
  if (!configured())
    throw std::invalid_argument(std::string(what) + ": call agrs_set_config first");
  if (!open)
    throw std::invalid_argument(std::string(what) +
                                ": no AGRS session is open (create_agrs_session, or the "
                                "agrs_new_session context manager)");
}

void AgrsSessions::create() {
  if (!configured())
    throw std::invalid_argument("create_agrs_session: call agrs_set_config first");
  if (open)
    throw std::invalid_argument("create_agrs_session: a session is already open (sessions do "
                                "not nest; destroy it first)");
  open = true;
  ++session;
  cursor = 0;
  ops = 0;
  inplace.clear();
  // The first copies of the session wait for every peer to end the previous
  // one (there is none before session 1).
  releaseWaitPending = session > 1;
}

void AgrsSessions::destroy(void *stream) {
  requireOpen("destroy_agrs_session");
  // Tell every peer of every served rank: this rank is done with session
  // `session`, so its copies of the next session may overwrite our memory.
  std::vector<CUstreamBatchMemOpParams> writes;
  const int R = host.worldSize();
  for (int s = 0; s < host.servedRankCount(); ++s) {
    const int me = host.worldRankOf(s);
    for (int peer = 0; peer < R; ++peer)
      writes.push_back(writeFlagOp(
          byteAt(host.peerWindowMemory(s, peer), window::kAgrsReleased + 4 * int64_t(me)),
          session));
  }
  streamMemOps(writes, stream, "destroy_agrs_session: the release flags (cuStreamBatchMemOp)");
  open = false;
  inplace.clear();
}

std::vector<AgrsBlock> AgrsSessions::place(const std::vector<int64_t> &slotBytes,
                                           const char *what) {
  if (slotBytes.empty())
    throw std::invalid_argument(std::string(what) + ": no tensors");
  if (ops + 1 > maxOpsPerSession)
    throw std::invalid_argument(std::string(what) + ": the session already holds " +
                                std::to_string(ops) + " all-gathers, num_max_all_gathers_per_" +
                                "session is " + std::to_string(maxOpsPerSession));
  for (size_t i = 0; i < slotBytes.size(); ++i)
    if (slotBytes[i] < 1)
      throw std::invalid_argument(std::string(what) + ": tensor " + std::to_string(i) +
                                  " has no bytes");
  int64_t at = 0;
  std::vector<AgrsBlock> blocks = layout(slotBytes, at);
  if (at > maxBytes)
    throw std::invalid_argument(
        std::string(what) + ": the session would hold " + std::to_string(at) +
        " bytes (every rank's slots, 32-byte aligned), num_max_session_bytes is " +
        std::to_string(maxBytes) + " (get_agrs_num_max_session_bytes sizes a session)");
  cursor = at;
  ++ops;
  return blocks;
}

std::vector<AgrsBlock> AgrsSessions::layout(const std::vector<int64_t> &slotBytes,
                                            int64_t &end) const {
  std::vector<AgrsBlock> blocks;
  end = cursor;
  for (int64_t slot : slotBytes) {
    end = window::align(end, 32);
    blocks.push_back({window::kControlEnd + end, slot});
    end += int64_t(host.worldSize()) * slot;
  }
  return blocks;
}

bool AgrsSessions::fits(const std::vector<int64_t> &slotBytes) const {
  int64_t end = 0;
  layout(slotBytes, end);
  return open && ops < maxOpsPerSession && end <= maxBytes;
}

std::vector<AgrsBlock> AgrsSessions::reserveInplace(const std::vector<int64_t> &bytes) {
  requireOpen("agrs_get_inplace_tensor");
  if (!inplace.empty())
    throw std::invalid_argument("agrs_get_inplace_tensor: the tensors it gave last are not "
                                "all-gathered yet (all_gather them first)");
  inplace = place(bytes, "agrs_get_inplace_tensor");
  return inplace;
}

AgrsSessions::Issued AgrsSessions::allGather(const std::vector<std::vector<uint64_t>> &inputs,
                                             const std::vector<int64_t> &bytes, void *stream,
                                             void *commStream) {
  return issue(inputs, bytes, /*scatter=*/false, stream, commStream);
}

AgrsSessions::Issued AgrsSessions::scatterBlocks(const std::vector<std::vector<uint64_t>> &inputs,
                                                 const std::vector<int64_t> &bytes, void *stream,
                                                 void *commStream) {
  return issue(inputs, bytes, /*scatter=*/true, stream, commStream);
}

AgrsSessions::Issued AgrsSessions::issue(const std::vector<std::vector<uint64_t>> &inputs,
                                         const std::vector<int64_t> &bytes, bool scatter,
                                         void *stream, void *commStream) {
  const char *what = scatter ? "reduce_scatter" : "all_gather";
  requireOpen(what);
  const int served = host.servedRankCount();
  const int64_t R = host.worldSize();
  if (int(inputs.size()) != served)
    throw std::invalid_argument(std::string(what) + ": " + std::to_string(inputs.size()) +
                                " ranks' tensors for " + std::to_string(served) +
                                " served rank(s)");
  for (int s = 0; s < served; ++s)
    if (inputs[s].size() != bytes.size())
      throw std::invalid_argument(
          std::string(what) + ": rank " + std::to_string(host.worldRankOf(s)) + " gives " +
          std::to_string(inputs[s].size()) + " tensors, expected " + std::to_string(bytes.size()));
  std::vector<int64_t> slotBytes = bytes;
  if (scatter)
    for (size_t i = 0; i < bytes.size(); ++i) {
      if (bytes[i] % R)
        throw std::invalid_argument(std::string(what) + ": tensor " + std::to_string(i) + " has " +
                                    std::to_string(bytes[i]) + " bytes, not a multiple of the " +
                                    std::to_string(R) + " ranks' blocks");
      slotBytes[i] = bytes[i] / R;
    }

  // In place: the inputs are the slots agrs_get_inplace_tensor gave.
  std::vector<AgrsBlock> blocks;
  bool inPlace = false;
  if (!scatter && !inplace.empty() && inplace.size() == bytes.size()) {
    inPlace = true;
    for (size_t i = 0; i < bytes.size() && inPlace; ++i) {
      inPlace = inplace[i].slotBytes == bytes[i];
      for (int s = 0; s < served && inPlace; ++s)
        inPlace = inputs[s][i] ==
                  reinterpret_cast<uint64_t>(byteAt(
                      host.windowMemory(s), inplace[i].offset + host.worldRankOf(s) * bytes[i]));
    }
  }
  if (inPlace) {
    blocks = inplace;
  } else {
    blocks = place(slotBytes, what);
  }
  inplace.clear();

  // The copies start after the caller's work on `stream` (the inputs).
  auto comm = static_cast<cudaStream_t>(commStream);
  if (commStream != stream) {
    if (!event)
      check(
          cudaEventCreateWithFlags(reinterpret_cast<cudaEvent_t *>(&event), cudaEventDisableTiming),
          "cudaEventCreate");
    check(cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)),
          "cudaEventRecord");
    check(cudaStreamWaitEvent(comm, static_cast<cudaEvent_t>(event), 0), "cudaStreamWaitEvent");
  }
  if (releaseWaitPending) {
    // Every peer has ended the previous session before we write into it.
    std::vector<detail::FlagWait> waits;
    for (int s = 0; s < served; ++s)
      for (int peer = 0; peer < R; ++peer)
        waits.push_back({byteAt(host.windowMemory(s), window::kAgrsReleased + 4 * int64_t(peer)),
                         session - 1,
                         "rank " + std::to_string(peer) + "'s end of AGRS session " +
                             std::to_string(session - 1) + " (seen by rank " +
                             std::to_string(host.worldRankOf(s)) + ")"});
    detail::waitFlags(std::move(waits), commStream,
                      "an all-gather of AGRS session " + std::to_string(session) +
                          " waiting for the peers' release",
                      host.streamWaitTimeout());
    releaseWaitPending = false;
  }

  std::vector<void *> dsts;
  std::vector<const void *> srcs;
  std::vector<size_t> sizes;
  for (int s = 0; s < served; ++s) {
    const int64_t me = host.worldRankOf(s);
    for (int64_t peer = 0; peer < R; ++peer) {
      char *peerWindow = static_cast<char *>(host.peerWindowMemory(s, int(peer)));
      for (size_t i = 0; i < bytes.size(); ++i) {
        if (inPlace && peer == me)
          continue; // already in its slot
        const int64_t n = blocks[i].slotBytes;
        dsts.push_back(peerWindow + blocks[i].offset + me * n);
        srcs.push_back(reinterpret_cast<const char *>(inputs[s][i]) + (scatter ? peer * n : 0));
        sizes.push_back(size_t(n));
      }
    }
  }
  if (!dsts.empty() && !commStream) {
    // The legacy default stream takes no batch: one copy each.
    for (size_t i = 0; i < dsts.size(); ++i)
      check(cudaMemcpyAsync(dsts[i], srcs[i], sizes[i], cudaMemcpyDefault, comm),
            std::string(what) + ": a copy (cudaMemcpyAsync)");
  } else if (!dsts.empty()) {
    cudaMemcpyAttributes attributes{};
    attributes.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attributes.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    size_t attributeIndex = 0;
    check(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), dsts.size(), &attributes,
                               &attributeIndex, 1, comm),
          std::string(what) + ": the copies (cudaMemcpyBatchAsync)");
  }
  Issued issued{blocks, ++sequence};
  std::vector<CUstreamBatchMemOpParams> writes;
  for (int s = 0; s < served; ++s) {
    const int64_t me = host.worldRankOf(s);
    for (int peer = 0; peer < R; ++peer)
      writes.push_back(writeFlagOp(
          byteAt(host.peerWindowMemory(s, peer), window::kAgrsArrived + 4 * me), issued.sequence));
  }
  streamMemOps(writes, commStream, std::string(what) + ": the arrival flags (cuStreamBatchMemOp)");
  for (const AgrsBlock &b : blocks)
    host.noteWindowData(b.offset, b.offset + R * b.slotBytes, commStream);
  return issued;
}

void AgrsSessions::wait(uint32_t seq, void *stream) {
  std::vector<detail::FlagWait> waits;
  const int R = host.worldSize();
  for (int s = 0; s < host.servedRankCount(); ++s)
    for (int source = 0; source < R; ++source)
      waits.push_back({byteAt(host.windowMemory(s), window::kAgrsArrived + 4 * int64_t(source)),
                       seq,
                       "rank " + std::to_string(source) + "'s arrival flag of all-gather " +
                           std::to_string(seq) + " (in rank " +
                           std::to_string(host.worldRankOf(s)) + "'s window)"});
  detail::waitFlags(std::move(waits), stream, "the handle of all-gather " + std::to_string(seq),
                    host.streamWaitTimeout());
}
