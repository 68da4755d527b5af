//===-- CommBase.td - comm dialect, enums, resources --------*- tablegen -*-===//
//
// The comm dialect states *how* bytes move between GPUs: one-sided
// communication over symmetric windows, one level above the NCCL device API
// and independent of it (the virtual backend runs it on one GPU).
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_DIALECT_COMM_IR_COMMBASE_TD
#define EPIC_DIALECT_COMM_IR_COMMBASE_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/EnumAttr.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

def Comm_Dialect : Dialect {
  let name = "comm";
  let cppNamespace = "::epic::comm";
  let summary = "device-level one-sided communication over symmetric windows";
  let description = [{
    The `comm` dialect is what `convert-ep-to-comm` produces for the communication part
    of dispatch and combine, and what `convert-comm-to-nvvm` lowers to the NCCL
    device API (`backend=nccl`) or to plain loads, stores and atomics on one
    GPU (`backend=virtual`). It can express everything the NCCL device API
    offers:

    * **Ranks and teams**: `comm.team` (world, LSA = the NVLink-connected
      ranks, rail = the same local rank on every node), `comm.team_rank`,
      `comm.team_size`, `comm.team_to_world`.
    * **Symmetric windows**: a window is a buffer that every rank allocated
      with the same size; `comm.local_ptr` and `comm.peer_ptr` give
      addresses into the own and an LSA peer's copy (NCCL's LSA pointers).
    * **One-sided network operations** (NCCL's GIN): `comm.put` (bytes from a
      local window region into a peer's, with an optional remote signal),
      `comm.put_value`, `comm.signal`, `comm.wait_signal` (bounded),
      `comm.read_signal`, `comm.reset_signal`, `comm.flush`.
    * **Synchronization**: `comm.barrier` over a team, `comm.fence` with a
      scope, and scoped acquire/release flag accesses on pointers:
      `comm.load`, `comm.store`, `comm.red`, `comm.atomic_rmw`,
      `comm.wait_flag` (bounded).

    Collective-style operations say which threads cooperate in them
    (`thread`, `warp` or `block`): every thread of that group must reach the
    op, converged, and the op then acts once for the group.

    Every wait has a bound (`timeout_ms`); when it expires the lowered code
    prints which rank waited for what and traps, so nothing hangs silently.
  }];
  let dependentDialects = ["::mlir::LLVM::LLVMDialect"];
  let useDefaultTypePrinterParser = 1;
  let useDefaultAttributePrinterParser = 1;
  let hasOperationAttrVerify = 1;
  let extraClassDeclaration = [{
    void registerTypes();
    void registerAttributes();
  }];
}

def Comm_TeamKind : I32EnumAttr<"TeamKind", "a team of ranks", [
    I32EnumAttrCase<"world", 0>,
    I32EnumAttrCase<"lsa", 1>,
    I32EnumAttrCase<"rail", 2>
  ]> {
  let cppNamespace = "::epic::comm";
}

def Comm_Coop : I32EnumAttr<"Coop", "threads that cooperate in one operation", [
    I32EnumAttrCase<"thread", 0>,
    I32EnumAttrCase<"warp", 1>,
    I32EnumAttrCase<"block", 2>
  ]> {
  let cppNamespace = "::epic::comm";
}

def Comm_Scope : I32EnumAttr<"Scope", "memory scope", [
    I32EnumAttrCase<"cta", 0>,
    I32EnumAttrCase<"cluster", 1>,
    I32EnumAttrCase<"gpu", 2>,
    I32EnumAttrCase<"sys", 3>
  ]> {
  let cppNamespace = "::epic::comm";
}

def Comm_Ordering : I32EnumAttr<"Ordering", "memory ordering", [
    I32EnumAttrCase<"relaxed", 0>,
    I32EnumAttrCase<"acquire", 1>,
    I32EnumAttrCase<"release", 2>,
    I32EnumAttrCase<"acq_rel", 3>,
    I32EnumAttrCase<"sc", 4>
  ]> {
  let cppNamespace = "::epic::comm";
}

def Comm_AtomicKind : I32EnumAttr<"AtomicKind", "read-modify-write operation", [
    I32EnumAttrCase<"add", 0>,
    I32EnumAttrCase<"max", 1>,
    I32EnumAttrCase<"min", 2>,
    I32EnumAttrCase<"bit_or", 3, "or">,
    I32EnumAttrCase<"bit_and", 4, "and">,
    I32EnumAttrCase<"bit_xor", 5, "xor">,
    I32EnumAttrCase<"exch", 6>
  ]> {
  let cppNamespace = "::epic::comm";
}

def Comm_Predicate : I32EnumAttr<"Predicate", "comparison a wait waits for", [
    I32EnumAttrCase<"eq", 0>,
    I32EnumAttrCase<"ne", 1>,
    I32EnumAttrCase<"ge", 2>,
    I32EnumAttrCase<"gt", 3>
  ]> {
  let cppNamespace = "::epic::comm";
}

// Side-effect resources. Window memory is every rank's copy of every
// symmetric window (a put writes a peer's copy); signal memory is the
// network signal slots, which only comm ops touch.
def Comm_WindowMemory : Resource<"::epic::comm::WindowMemoryResource">;
def Comm_SignalMemory : Resource<"::epic::comm::SignalMemoryResource">;

class Comm_Op<string mnemonic, list<Trait> traits = []>
    : Op<Comm_Dialect, mnemonic, traits>;

#endif // EPIC_DIALECT_COMM_IR_COMMBASE_TD
