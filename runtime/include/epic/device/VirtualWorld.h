//===- VirtualWorld.h - device-side state of the virtual backend ---------===//
//
// The virtual backend runs R ranks on one GPU: one cooperative launch holds
// every rank's blocks (rank = blockIdx.x / (gridDim.x / R)). What NCCL's
// ncclDevComm and ncclWindow_t are for the nccl backend, these two structs are
// for the virtual one: the runtime fills them in device memory and passes
// pointers to them as the kernels' !comm.dev_comm and !comm.window arguments.
// The ranks form N nodes of M GPUs (lsa_size = M), numbered node-major: the
// teams, barriers and the check that NVLink (LSA) pointers stay in the node
// follow them. Plain C, from the field list VirtualWorld.def, so that the host
// runtime, the device shim and the lowering (which addresses the fields by
// index, see CommToNVVM.cpp) agree on the layout.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_DEVICE_VIRTUALWORLD_H
#define EPIC_DEVICE_VIRTUALWORLD_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define EPIC_VWORLD_I32 int32_t
#define EPIC_VWORLD_U64 uint64_t
#define EPIC_VWORLD_U64_PTR uint64_t *
#define EPIC_VWORLD_CHAR_PTR char *

/// !comm.dev_comm of the virtual backend. Every counter starts at zero and
/// only grows (barriers, traffic) or is reset by its owner (signals, counters).
typedef struct EpicVirtualComm {
#define EPIC_VCOMM_FIELD(INDEX, name, Type) EPIC_VWORLD_##Type name;
#include "epic/device/VirtualWorld.def"
} EpicVirtualComm;

/// !comm.window of the virtual backend: one allocation of R equal slices.
typedef struct EpicVirtualWindow {
#define EPIC_VWIN_FIELD(INDEX, name, Type) EPIC_VWORLD_##Type name;
#include "epic/device/VirtualWorld.def"
} EpicVirtualWindow;

#undef EPIC_VWORLD_I32
#undef EPIC_VWORLD_U64
#undef EPIC_VWORLD_U64_PTR
#undef EPIC_VWORLD_CHAR_PTR

/// Field indices the lowering uses (LLVM struct GEPs): EPIC_VCOMM_<INDEX>.
enum {
#define EPIC_VCOMM_FIELD(INDEX, name, Type) EPIC_VCOMM_##INDEX,
#include "epic/device/VirtualWorld.def"
  EPIC_VCOMM_NUM_FIELDS
};
enum {
#define EPIC_VWIN_FIELD(INDEX, name, Type) EPIC_VWIN_##INDEX,
#include "epic/device/VirtualWorld.def"
  EPIC_VWIN_NUM_FIELDS
};

/// EpicVirtualComm::traffic's last index.
enum { EPIC_TRAFFIC_PUT_BYTES = 0, EPIC_TRAFFIC_PUT_VALUE_BYTES = 1, EPIC_TRAFFIC_SIGNALS = 2 };
#define EPIC_TRAFFIC_KINDS 3

#ifdef __cplusplus
} // extern "C"
static_assert(sizeof(EpicVirtualComm) == 72, "layout shared with the lowering");
static_assert(sizeof(EpicVirtualWindow) == 24, "layout shared with the lowering");
static_assert(EPIC_VCOMM_NUM_FIELDS == 14 && EPIC_VWIN_NUM_FIELDS == 4,
              "field counts shared with the lowering");
#endif

#endif // EPIC_DEVICE_VIRTUALWORLD_H
