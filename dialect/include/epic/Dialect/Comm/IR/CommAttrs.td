//===-- CommAttrs.td - comm dialect attributes --------------*- tablegen -*-===//

#ifndef EPIC_DIALECT_COMM_IR_COMMATTRS_TD
#define EPIC_DIALECT_COMM_IR_COMMATTRS_TD

include "epic/Dialect/Comm/IR/CommBase.td"

def Comm_ParamTableAttr : AttrDef<Comm_Dialect, "ParamTable"> {
  let mnemonic = "param_table";
  let summary = "the kernel argument that holds the launch's per-rank parameter records";
  let description = [{
    Attached to a kernel as `comm.param_table`: argument `arg` (an `!llvm.ptr`)
    is the table of fixed-size parameter records that `comm.rank_params` and
    `comm.peer_params` index, `stride` bytes per record, one record per rank a
    launch serves: one for the nccl backend (one rank per process), `ranks`
    for the virtual backend (every rank of the world in one launch).

    The table travels by value, as a kernel parameter: `comm-param-tables-by-value`
    gives the argument `llvm.byval` of the table's size, 64-byte alignment and
    `nvvm.grid_constant`, so a launch is one driver call with no upload of its
    records and a CUDA graph captures the records with the kernel node. The
    kernels read fields with `ld.param`; a record's address may also be taken
    (a TMA descriptor inside the record is used where it lies). The table is
    limited by CUDA's kernel-parameter space (32 KB), so `ranks x stride` is.

    ```mlir
    gpu.func @k(%dc: !comm.dev_comm, %win: !comm.window, %table: !llvm.ptr) kernel
        attributes {comm.param_table = #comm.param_table<arg = 2, stride = 128, ranks = 8>}
    ```
  }];
  let parameters = (ins "unsigned":$arg, "unsigned":$stride, "unsigned":$ranks);
  let assemblyFormat = "`<` struct(params) `>`";
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// The discardable attribute's name on a kernel: "comm.param_table".
    static constexpr ::llvm::StringLiteral getAttrName() { return "comm.param_table"; }
  }];
}

#endif // EPIC_DIALECT_COMM_IR_COMMATTRS_TD
