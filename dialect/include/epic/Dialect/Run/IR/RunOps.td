//===-- RunOps.td - run dialect: host side of an epic-run program -*- tablegen -*-===//
//
// The few host-side operations an epic-run program needs around its ep ops:
// per-rank token counts, deterministic random inputs and routing, printing.
// They never reach a GPU kernel: epic-compile --run-plan translates a program
// into a run plan (JSON) that tools/epic-run executes with the runtime.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_DIALECT_RUN_IR_RUNOPS_TD
#define EPIC_DIALECT_RUN_IR_RUNOPS_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/EnumAttr.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

def Run_Dialect : Dialect {
  let name = "run";
  let cppNamespace = "::epic::run";
  let summary = "host side of an epic-run program (inputs, printing)";
  let description = [{
    An epic-run program is a `func.func @main()` that every rank of the EP
    world executes (SPMD, like the kernels): it makes its inputs with the ops
    of this dialect, calls `ep.dispatch` / `ep.combine` on them and prints
    what it wants to see. `tensor.dim` and `arith.constant` of `index` type
    may size inputs after data-dependent results (the rows a dispatch
    received).

    ```mlir
    #cfg = #ep.config<ranks = 4, experts = 16, topk = 4, hidden = 256,
                      dtype = bf16, max_tokens_per_rank = 64>
    func.func @main() {
      %t = run.tokens per_rank [64, 40, 0, 64]
      %x = run.random normal seed 1 rows %t : tensor<?x256xbf16>
      %idx = run.routing experts 16 masked 0.1 seed 2 rows %t : tensor<?x4xi64>
      %rx, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) config #cfg
          : tensor<?x256xbf16> -> tensor<?x256xbf16>, !ep.handle<#cfg>
      %y = ep.combine %rx, %h : tensor<?x256xbf16>, !ep.handle<#cfg>
          -> tensor<?x256xbf16>
      run.print %y : tensor<?x256xbf16>
      return
    }
    ```

    `epic-compile --run-plan` checks the program and writes its run plan;
    `epic-run program.mlir [--check]` runs it on a GPU (the virtual world of
    the program's ranks on one GPU, or NCCL for one rank) and, with
    `--check`, compares every ep op's results with DeepEP's semantics.
    Random values come from a counter-based generator seeded by
    (seed, rank), so a program's inputs are the same on every machine.
  }];
}

def Run_Distribution : I32EnumAttr<"Distribution", "distribution of random values", [
    I32EnumAttrCase<"normal", 0>,
    I32EnumAttrCase<"uniform", 1>
  ]> {
  let cppNamespace = "::epic::run";
}

class Run_Op<string mnemonic, list<Trait> traits = []>
    : Op<Run_Dialect, mnemonic, traits>;

def Run_TokensOp : Run_Op<"tokens", [Pure]> {
  let summary = "this rank's token count, one entry per rank";
  let description = [{
    The number of tokens the executing rank dispatches: entry `r` of
    `per_rank` on rank `r`. There must be one entry per rank of the EP world
    the program's ep ops use, none above its `max_tokens_per_rank`.

    ```mlir
    %t = run.tokens per_rank [128, 100, 0, 128]
    ```
  }];
  let arguments = (ins DenseI64ArrayAttr:$per_rank);
  let results = (outs Index:$result);
  let assemblyFormat = "`per_rank` $per_rank attr-dict";
  let hasVerifier = 1;
}

def Run_RandomOp : Run_Op<"random", [Pure]> {
  let summary = "a [rows, N] (or [rows, D1, D2]) tensor of deterministic random values";
  let description = [{
    `rows` rows of values, each row of the static shape of the result's
    other dimensions (N, or D1 x D2: a rank's expert weights are
    `rows %L : tensor<?xHxNxbf16>`):
    `normal` draws from N(0, scale^2), `uniform` from [0, scale). Values are
    rounded to the element type (FP8: saturated to its largest finite
    value). The generator is counter based: the values depend only on
    (seed, rank, position), never on the machine.

    ```mlir
    %x = run.random normal seed 1 rows %t : tensor<?x7168xbf16>
    %w = run.random uniform scale 1.0 seed 2 rows %t : tensor<?x8xf32>
    ```
  }];
  let arguments = (ins Run_Distribution:$distribution,
                       DefaultValuedAttr<F64Attr, "1.0">:$scale,
                       I64Attr:$seed, Index:$rows);
  let results = (outs TensorRankOf<[BF16, F16, F32, F8E4M3FN, F8E5M2], [2, 3]>:$result);
  let assemblyFormat = [{
    $distribution (`scale` $scale^)? `seed` $seed `rows` $rows attr-dict `:` type($result)
  }];
  let hasVerifier = 1;
}

def Run_RoutingOp : Run_Op<"routing", [Pure]> {
  let summary = "random top-k routing: K distinct experts per token, some masked";
  let description = [{
    A `[rows, K]` routing table (K the static second dimension): every row
    holds K distinct expert ids in `[0, experts)`, drawn uniformly; then each
    entry is replaced by -1 (masked) with probability `masked`. Deterministic
    in (seed, rank, row), like `run.random`. Element type i64, DeepEP's
    `topk_idx_t`.

    ```mlir
    %idx = run.routing experts 256 masked 0.05 seed 3 rows %t : tensor<?x8xi64>
    ```
  }];
  let arguments = (ins ConfinedAttr<I64Attr, [IntMinValue<1>]>:$experts,
                       DefaultValuedAttr<F64Attr, "0.0">:$masked,
                       I64Attr:$seed, Index:$rows);
  let results = (outs 2DTensorOf<[I64]>:$result);
  let assemblyFormat = [{
    `experts` $experts (`masked` $masked^)? `seed` $seed `rows` $rows attr-dict `:` type($result)
  }];
  let hasVerifier = 1;
}

def Run_PrintOp : Run_Op<"print"> {
  let summary = "print a value on every rank";
  let description = [{
    Prints the value of every rank: an index, or a tensor's shape, its
    first `rows` rows and a checksum of all its rows that does not depend on
    their order. The received rows of a dispatch (`recv_x` and its companions)
    are printed in canonical order (by source rank and token; the expanded
    layout per expert block, padding rows left out): the kernels place rows
    in arrival order, the printed output is deterministic all the same.

    ```mlir
    run.print %recv_x rows 2 : tensor<?x256xbf16>
    ```
  }];
  let arguments = (ins AnyType:$value, DefaultValuedAttr<I64Attr, "4">:$rows);
  let assemblyFormat = "$value (`rows` $rows^)? attr-dict `:` qualified(type($value))";
  let hasVerifier = 1;
}

#endif // EPIC_DIALECT_RUN_IR_RUNOPS_TD
