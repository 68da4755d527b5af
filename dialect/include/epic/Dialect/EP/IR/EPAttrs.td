//===-- EPAttrs.td - ep dialect attributes ------------------*- tablegen -*-===//

#ifndef EPIC_DIALECT_EP_IR_EPATTRS_TD
#define EPIC_DIALECT_EP_IR_EPATTRS_TD

include "epic/Dialect/EP/IR/EPBase.td"

def EP_LayoutParameter : EnumParameter<EP_Layout> {
  let defaultValue = "::epic::ep::Layout::plain";
}

def EP_ModeParameter : EnumParameter<EP_Mode> {
  let defaultValue = "::epic::ep::Mode::direct";
}

// A non-negative integer field: read as a signed 64-bit value, so that a
// negative or too large one is refused as written instead of wrapping.
class EP_CountParameter<string default = ""> : AttrParameter<"unsigned", "non-negative integer"> {
  let parser = [{ ::epic::ep::parseCount($_parser) }];
  let defaultValue = default;
}

def EP_ConfigAttr : AttrDef<EP_Dialect, "Config"> {
  let mnemonic = "config";
  let summary = "buffer and routing configuration of an expert-parallel layer";
  let description = [{
    Everything that the dispatch and combine kernels are specialized on. Two
    ops (or an op and a handle) work together only when their configurations
    are equal.

    | parameter             | meaning                                                   |
    |-----------------------|-----------------------------------------------------------|
    | `ranks`               | EP world size R (1..1024)                                 |
    | `experts`             | global expert count E, divisible by R, E/R <= 256, E <= 2048 |
    | `topk`                | experts per token K (1..32, K <= E)                       |
    | `hidden`              | hidden size H in elements; H * bytes(dtype) % 16 == 0     |
    | `dtype`               | element type of the dispatched rows (bf16, f16, f32, f8E4M3FN, f8E5M2) |
    | `scale_packs`         | P, 4-byte scale packs per row; required (> 0) for FP8 data and forbidden otherwise (default 0) |
    | `expert_alignment`    | A, per-local-expert receive counts are rounded up to a multiple of A (default 1) |
    | `layout`              | `plain` or `expanded` (default `plain`)                    |
    | `num_sms`             | SMs of the communication kernel; 0 = the analytic choice (default 0) |
    | `scaleup_ranks`       | M, ranks per NVLink (LSA) domain, a node; divides R; ranks are numbered node-major (node = rank / M). Omitted (0): R, one node |
    | `mode`                | `direct` or `hybrid` (default `direct`); hybrid needs more than one node (2..32 nodes of up to 64 ranks, like DeepEP) |
    | `max_tokens_per_rank` | Tmax, the most tokens any rank dispatches; sizes every buffer. Omitted (0): a run-time value, the `max_tokens_per_rank` field of the kernels' parameter record, so one set of kernels serves every cap that fits the window (the fused GEMM ops need it given) |

    Example (DeepEP's V3 configuration, FP8 dispatch with one float32 scale
    per 128 channels):

    ```mlir
    #ep.config<ranks = 8, experts = 256, topk = 8, hidden = 7168,
               dtype = f8E4M3FN, scale_packs = 56, expert_alignment = 128,
               layout = expanded, max_tokens_per_rank = 4096>
    ```
  }];
  let parameters = (ins
    EP_CountParameter<>:$ranks,
    EP_CountParameter<>:$experts,
    EP_CountParameter<>:$topk,
    EP_CountParameter<>:$hidden,
    "::mlir::Type":$dtype,
    EP_CountParameter<"0">:$scale_packs,
    EP_CountParameter<"1">:$expert_alignment,
    EP_LayoutParameter:$layout,
    EP_CountParameter<"0">:$num_sms,
    EP_CountParameter<"0">:$max_tokens_per_rank,
    EP_CountParameter<"0">:$scaleup_ranks,
    EP_ModeParameter:$mode
  );
  let assemblyFormat = "`<` struct(params) `>`";
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// E / R: experts that live on each rank.
    unsigned getNumLocalExperts() const { return getExperts() / getRanks(); }
    /// Bytes of one row of hidden data.
    uint64_t getHiddenBytes() const;
    bool isFP8() const;
    bool isExpanded() const { return getLayout() == Layout::expanded; }
    /// M: ranks per NVLink (LSA) domain (scaleup_ranks, or R when omitted).
    unsigned getRanksPerNode() const {
      return getScaleupRanks() ? getScaleupRanks() : getRanks();
    }
    /// N = R / M: NVLink domains (nodes) of the world.
    unsigned getNumNodes() const { return getRanks() / getRanksPerNode(); }
    /// Whether some peers are outside the caller's NVLink domain.
    bool isMultiNode() const { return getNumNodes() > 1; }
    bool isHybrid() const { return getMode() == Mode::hybrid; }
    /// Whether Tmax is part of the configuration (else the kernels read it
    /// at run time and only the window bounds it).
    bool hasStaticTokenCap() const { return getMaxTokensPerRank() != 0; }
    /// Tmax, or nothing when it is a run-time value.
    std::optional<uint64_t> getTokenCap() const;
    /// Rows of the plain receive layout in the worst case: R * Tmax.
    std::optional<uint64_t> getMaxRecvTokens() const;
    /// Rows of the expanded receive layout in the worst case:
    /// align(R * Tmax * min(K, E/R) + (A - 1) * E/R, A).
    std::optional<uint64_t> getMaxExpandedTokens() const;
    /// Rows of recv_x in the worst case for this configuration's layout
    /// (nothing when Tmax is a run-time value).
    std::optional<uint64_t> getMaxOutputRows() const {
      return isExpanded() ? getMaxExpandedTokens() : getMaxRecvTokens();
    }
  }];
}

#endif // EPIC_DIALECT_EP_IR_EPATTRS_TD
