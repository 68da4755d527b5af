//===- Pp.h - pipeline send/recv between ring neighbours (DeepEP's PP) ----===//
//
// DeepEP V2's PP on a KernelHost's windows, with no SM: each rank has, in
// its window's data region, `inflight` slots for tensors from its previous
// ring neighbour and as many from its next. A send waits (stream memory
// operation) until the receiver has freed the slot it will use, copies the
// tensor into it with the copy engines and writes the number of tensors sent
// so far into the receiver's arrival flag; a receive waits for that number,
// copies the slot out and writes how many it has received into the sender's
// release flag. Everything is ordered on the caller's stream. The counts are
// kept per direction for the buffer's life (EPWindow.h: kPpArrived,
// kPpReleased), so a slot is sent-count mod inflight on both sides.
//
// One NVLink domain (the copy engines write through NVLink); DeepEP sends
// through the NIC even to NVLink peers, which epic does not (no GIN here).
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_RUNTIME_PP_H
#define EPIC_RUNTIME_PP_H

#include "epic/runtime/KernelHost.h"

#include <array>
#include <cstdint>
#include <vector>

namespace epic::runtime {

class PpChannels {
public:
  explicit PpChannels(KernelHost &host);

  /// DeepEP's pp_set_config: tensors of at most `maxTensorBytes`, at most
  /// `maxInflight` sent to a neighbour and not yet received. The caller
  /// makes every rank's earlier sends received first (DeepEP: a barrier).
  void setConfig(int64_t maxTensorBytes, int maxInflight);
  bool configured() const { return slotBytes > 0; }
  /// Window bytes the slots need for these settings (after the control region).
  static int64_t regionBytes(int64_t maxTensorBytes, int maxInflight);

  /// pp_send of the `servedRank`-th served rank: `bytes` at `src` to `dst`
  /// (its previous or next ring neighbour), ordered on `stream`.
  void send(int servedRank, uint64_t src, int64_t bytes, int dst, void *stream);
  /// pp_recv: the next tensor from `src` (previous or next neighbour) into
  /// `bytes` at `dst`, ordered on `stream`.
  void recv(int servedRank, uint64_t dst, int64_t bytes, int src, void *stream);

  /// Host counts, for the virtual world's refusals: tensors the served rank
  /// has sent to / received from direction d (0: next / from previous, 1:
  /// previous / from next).
  uint32_t sentCount(int servedRank, int d) const { return sent.at(servedRank)[d]; }
  uint32_t receivedCount(int servedRank, int d) const { return received.at(servedRank)[d]; }
  int inflight() const { return maxInflight; }

private:
  int neighbour(int servedRank, int peer, const char *what, const char *name) const;
  /// Window offset of the slot of the `count`-th tensor into `region`.
  int64_t slotOffset(int region, uint32_t count) const;

  KernelHost &host;
  int64_t slotBytes = 0, maxBytes = 0;
  int maxInflight = 0;
  std::vector<std::array<uint32_t, 2>> sent, received; ///< per served rank, per direction
};

} // namespace epic::runtime

#endif // EPIC_RUNTIME_PP_H
