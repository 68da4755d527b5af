//===-- EPBase.td - ep dialect, enums and resources ---------*- tablegen -*-===//
//
// The ep dialect states *what* moves in Mixture-of-Experts expert parallelism:
// the routing layout, dispatch (tokens to the ranks that own their experts) and
// combine (expert outputs back to their source ranks, summed). How it moves is
// the business of the comm dialect that convert-ep-to-comm lowers to.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_DIALECT_EP_IR_EPBASE_TD
#define EPIC_DIALECT_EP_IR_EPBASE_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/EnumAttr.td"

def EP_Dialect : Dialect {
  let name = "ep";
  let cppNamespace = "::epic::ep";
  let summary = "Mixture-of-Experts expert-parallel communication (dispatch, combine)";
  let description = [{
    The `ep` dialect describes expert-parallel (EP) communication of a
    Mixture-of-Experts layer at the level of whole tensors, with the semantics
    of DeepEP V2's `ElasticBuffer` (direct mode):

    * `ep.dispatch_layout` counts, for one rank's routing table, how many
      tokens go to every rank and every expert.
    * `ep.dispatch` sends every token once to each rank that owns at least one
      of its top-k experts and returns the received rows, the routing
      translated to local expert ids, and an `!ep.handle` that records where
      every row came from.
    * `ep.combine` sends expert outputs back along the handle and sums them at
      the source in a fixed order (bitwise reproducible).

    The routing configuration (ranks, experts, top-k, hidden size, data type,
    scale packs, expert alignment, layout, SMs, maximum tokens per rank) is a
    single attribute, `#ep.config`, that every op carries and the handle type
    repeats, so that kernels can be specialized on it at compile time. Only
    token counts and pointers are run-time values.
  }];
  let useDefaultAttributePrinterParser = 1;
  let useDefaultTypePrinterParser = 1;
  // ep.fusion on a func.func (EPDialect.h).
  let hasOperationAttrVerify = 1;
  let hasCanonicalizer = 0;
  let extraClassDeclaration = [{
    void registerAttributes();
    void registerTypes();
  }];
}

def EP_Layout : I32EnumAttr<"Layout", "layout of the received rows", [
    I32EnumAttrCase<"plain", 0>,
    I32EnumAttrCase<"expanded", 1>
  ]> {
  let cppNamespace = "::epic::ep";
  let genSpecializedAttr = 0;
  let description = [{
    `plain`: one received row per (source token, destination rank), grouped by
    source rank. `expanded`: one row per (source token, local expert), grouped
    by local expert and padded to the expert alignment (the input layout of an
    M-grouped GEMM).
  }];
}

def EP_Mode : I32EnumAttr<"Mode", "how tokens reach ranks of other nodes", [
    I32EnumAttrCase<"direct", 0>,
    I32EnumAttrCase<"hybrid", 1>
  ]> {
  let cppNamespace = "::epic::ep";
  let genSpecializedAttr = 0;
  let description = [{
    `direct`: every source rank sends each token to every destination rank
    holding one of its experts, over NVLink inside its node and over the
    network (GIN) to other nodes. `hybrid`: a token crosses the network once
    per destination node, to the rank of the same local index there (its
    forwarder), which forwards it over NVLink; combine reduces per node at the
    forwarder before the hop back. Only meaningful with more than one node.
  }];
}

def EP_RingDirection : I32EnumAttr<"RingDirection", "a ring neighbour", [
    I32EnumAttrCase<"next", 0>,
    I32EnumAttrCase<"prev", 1>
  ]> {
  let cppNamespace = "::epic::ep";
  let description = [{
    `next`: rank `(r + 1) mod R`; `prev`: rank `(r - 1) mod R` (PP's ring).
  }];
}

// Every ep op is host-level: it becomes kernels and their launch
// (convert-ep-to-comm), which cannot happen inside a kernel (verified by the
// trait).
def EP_HostOp : NativeOpTrait<"HostOp"> { let cppNamespace = "::epic::ep"; }

#endif // EPIC_DIALECT_EP_IR_EPBASE_TD
