//===-- CommTypes.td - comm dialect types -------------------*- tablegen -*-===//

#ifndef EPIC_DIALECT_COMM_IR_COMMTYPES_TD
#define EPIC_DIALECT_COMM_IR_COMMTYPES_TD

include "epic/Dialect/Comm/IR/CommBase.td"

class Comm_Type<string name, string typeMnemonic> : TypeDef<Comm_Dialect, name> {
  let mnemonic = typeMnemonic;
}

def Comm_DevCommType : Comm_Type<"DevComm", "dev_comm"> {
  let summary = "the device communicator";
  let description = [{
    What a kernel needs to reach its peers: NCCL's `ncclDevComm` (ranks, LSA
    team, barriers, GIN contexts and signals), passed to the kernel by
    pointer; in the virtual backend, the rank count and the workspace of the
    virtual world.
  }];
}

def Comm_WindowType : Comm_Type<"Window", "window"> {
  let summary = "a symmetric memory window";
  let description = [{
    A buffer that every rank registered with the same size (NCCL's
    `ncclWindow_t`). Offsets into a window are byte offsets and mean the same
    place on every rank.
  }];
}

def Comm_TeamType : Comm_Type<"Team", "team"> {
  let summary = "a team of ranks (world, LSA or rail)";
  let description = [{
    A subset of the world with its own rank numbering (NCCL's `ncclTeam`:
    size, own rank, stride).
  }];
}

#endif // EPIC_DIALECT_COMM_IR_COMMTYPES_TD
