//===- Agrs.h - all-gather sessions by copy engines (DeepEP's AGRS) -------===//
//
// DeepEP V2's AGRS on a KernelHost's windows, with no SM: each rank's tensors
// are copied into every peer's window by the copy engines (one batched
// cudaMemcpyBatchAsync), then a stream memory operation writes the
// all-gather's number into the peer's arrival flag for this source (with a
// fence: the data lands first); a wait handle makes a stream wait until
// every source's number has arrived. Reduce-scatter moves blocks the same
// way (block r of every rank's input into rank r's window), and the caller
// sums them. A session's tensors are laid out one after another from the
// window's data region; ending a session tells every peer this rank is done
// reading, and the next session's copies into a peer wait for that.
//
// Flags (EPWindow.h: kAgrsArrived, kAgrsReleased) are never reset: every
// rank numbers its all-gathers and sessions the same way (the calls are
// collective), so a wait for ">= n" (with wrap-around) is exact.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_RUNTIME_AGRS_H
#define EPIC_RUNTIME_AGRS_H

#include "epic/runtime/KernelHost.h"

#include <cstdint>
#include <vector>

namespace epic::runtime {

/// One tensor's place in a session: [ranks][slotBytes] at `offset` of every
/// rank's window (rank r's contribution at offset + r * slotBytes).
struct AgrsBlock {
  int64_t offset = 0, slotBytes = 0;
};

class AgrsSessions {
public:
  explicit AgrsSessions(KernelHost &host);
  ~AgrsSessions();
  AgrsSessions(const AgrsSessions &) = delete;
  AgrsSessions &operator=(const AgrsSessions &) = delete;

  /// DeepEP's agrs_set_config: a session holds at most `maxSessionBytes` of
  /// gathered tensors (every rank's slots) and `maxOpsPerSession` (1..32)
  /// all-gathers. Refused while a session is open or when the bytes do not
  /// fit the window's data region.
  void setConfig(int64_t maxSessionBytes, int maxOpsPerSession);
  bool configured() const { return maxBytes > 0; }
  bool isOpen() const { return open; }
  /// Whether the open session still holds an all-gather (or scatter) of
  /// slots of `slotBytes` each (per tensor; a scatter's are bytes / ranks).
  bool fits(const std::vector<int64_t> &slotBytes) const;

  /// create_agrs_session: opens a session; its first copies into a peer
  /// (on the copies' stream) wait until that peer has ended the previous one.
  void create();
  /// destroy_agrs_session: on `stream` (after the caller's reads of the
  /// session's tensors), tells every peer this rank is done with them.
  void destroy(void *stream);

  /// agrs_get_inplace_tensor: reserves the next all-gather's blocks, one per
  /// entry of `bytes`; this rank's slot of block i is at offset + rank *
  /// bytes[i]. An all-gather of exactly those slots copies nothing locally.
  std::vector<AgrsBlock> reserveInplace(const std::vector<int64_t> &bytes);

  struct Issued {
    std::vector<AgrsBlock> blocks;
    uint32_t sequence = 0; ///< what wait() waits for
  };
  /// all_gather: `inputs[s][i]` is the device address of served rank s's
  /// tensor i, of `bytes[i]`. The copies run on `commStream` after the work
  /// queued on `stream`; the result is [ranks][bytes[i]] in every rank's
  /// window at blocks[i].offset, valid after wait() until the session ends.
  Issued allGather(const std::vector<std::vector<uint64_t>> &inputs,
                   const std::vector<int64_t> &bytes, void *stream, void *commStream);
  /// reduce_scatter's transport: served rank s's tensor i is `ranks` blocks
  /// of bytes[i] / ranks; block r goes to rank r's window, slot s.
  Issued scatterBlocks(const std::vector<std::vector<uint64_t>> &inputs,
                       const std::vector<int64_t> &bytes, void *stream, void *commStream);
  /// The wait handle: `stream` waits until every source's data of
  /// `sequence` is in each served rank's window.
  void wait(uint32_t sequence, void *stream);

private:
  Issued issue(const std::vector<std::vector<uint64_t>> &inputs, const std::vector<int64_t> &bytes,
               bool scatter, void *stream, void *commStream);
  std::vector<AgrsBlock> place(const std::vector<int64_t> &slotBytes, const char *what);
  /// Where the blocks of `slotBytes` start (32-byte aligned, from the
  /// session's cursor), and where the last one ends.
  std::vector<AgrsBlock> layout(const std::vector<int64_t> &slotBytes, int64_t &end) const;
  void requireOpen(const char *what) const;

  KernelHost &host;
  int64_t maxBytes = 0;
  int maxOpsPerSession = 0;
  bool open = false;
  uint32_t session = 0;  ///< sessions opened so far (the open one's number)
  uint32_t sequence = 0; ///< all-gathers and scatters issued so far
  int64_t cursor = 0;    ///< bytes of the open session placed so far
  int ops = 0;           ///< its all-gathers so far
  bool releaseWaitPending = false;
  std::vector<AgrsBlock> inplace; ///< reserved by reserveInplace, not yet gathered
  void *event = nullptr;          ///< cudaEvent_t: commStream waits for stream
};

} // namespace epic::runtime

#endif // EPIC_RUNTIME_AGRS_H
