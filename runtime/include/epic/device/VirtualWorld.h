//===- VirtualWorld.h - device-side state of the virtual backend ---------===//
//
// The virtual backend runs R ranks on one GPU: one cooperative launch holds
// every rank's blocks (rank = blockIdx.x / (gridDim.x / R)). What NCCL's
// ncclDevComm and ncclWindow_t are for the nccl backend, these two structs are
// for the virtual one: the runtime fills them in device memory and passes
// pointers to them as the kernels' !comm.dev_comm and !comm.window arguments.
// Plain C so that the host runtime, the device shim and the lowering (which
// addresses the fields by index, see CommToNVVM.cpp) agree on the layout.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_DEVICE_VIRTUALWORLD_H
#define EPIC_DEVICE_VIRTUALWORLD_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/// !comm.dev_comm of the virtual backend. Every counter below starts at zero
/// and only grows (barriers) or is reset by its owner (signals, counters).
typedef struct EpicVirtualComm {
  int32_t num_ranks;    // R
  int32_t num_contexts; // network contexts per rank (signals belong to one)
  int32_t num_signals;  // signals per (rank, context)
  int32_t num_counters; // local completion counters per (rank, context)
  int32_t num_barriers; // barrier slots
  int32_t reserved;
  uint64_t *signals;  // [R][num_contexts][num_signals]
  uint64_t *counters; // [R][num_contexts][num_counters]
  uint64_t *barriers; // [num_barriers]: monotonic arrival counts
} EpicVirtualComm;

/// !comm.window of the virtual backend: one allocation of R equal slices.
typedef struct EpicVirtualWindow {
  char *base;        // rank 0's slice
  uint64_t stride;   // bytes between two ranks' slices
  int32_t num_ranks; // R, so a block finds its rank from the window alone
  int32_t reserved;
} EpicVirtualWindow;

/// Field indices the lowering uses (LLVM struct GEPs).
enum {
  EPIC_VCOMM_NUM_RANKS = 0,
  EPIC_VCOMM_NUM_CONTEXTS = 1,
  EPIC_VCOMM_NUM_SIGNALS = 2,
  EPIC_VCOMM_SIGNALS = 6,
  EPIC_VWIN_BASE = 0,
  EPIC_VWIN_STRIDE = 1,
  EPIC_VWIN_NUM_RANKS = 2,
};

#ifdef __cplusplus
} // extern "C"
static_assert(sizeof(EpicVirtualComm) == 48, "layout shared with the lowering");
static_assert(sizeof(EpicVirtualWindow) == 24, "layout shared with the lowering");
#endif

#endif // EPIC_DEVICE_VIRTUALWORLD_H
