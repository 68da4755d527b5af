//===-- EPTypes.td - ep dialect types -----------------------*- tablegen -*-===//

#ifndef EPIC_DIALECT_EP_IR_EPTYPES_TD
#define EPIC_DIALECT_EP_IR_EPTYPES_TD

include "epic/Dialect/EP/IR/EPAttrs.td"

def EP_HandleType : TypeDef<EP_Dialect, "Handle"> {
  let mnemonic = "handle";
  let summary = "routing and layout of one dispatch, for combine and cached dispatch";
  let description = [{
    The result of `ep.dispatch`: what `ep.combine` needs to send rows back and
    what a cached `ep.dispatch` needs to replay the same routing without a
    count exchange (DeepEP's `EPHandle`). It holds the source routing
    (`topk_idx`), the per-source-rank and per-expert prefix sums, the aligned
    per-local-expert counts, `recv_src_metadata` (source global id, master
    top-k slot and, in the expanded layout, the row of every top-k slot) and
    the slot of every (token, destination rank) pair.

    The type is parameterized by the configuration of the dispatch that made
    it, so the verifier can reject a combine or a cached dispatch with another
    configuration.

    ```mlir
    !ep.handle<#ep.config<ranks = 8, experts = 64, topk = 4, hidden = 2048,
                          dtype = bf16, max_tokens_per_rank = 512>>
    ```
  }];
  let parameters = (ins EP_ConfigAttr:$config);
  let assemblyFormat = "`<` $config `>`";
}

#endif // EPIC_DIALECT_EP_IR_EPTYPES_TD
