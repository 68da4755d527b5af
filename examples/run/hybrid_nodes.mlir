// An epic-run program across nodes: 2 nodes of 2 ranks (a virtual world on one GPU) in hybrid
// mode. Each token crosses to the other node once, to its forwarder there (the rank with the
// same local index), which forwards it over NVLink; the combine sums each node's rows at the
// forwarder before the one hop back. Every rank runs @main.
//
//   build/bin/epic-run examples/run/hybrid_nodes.mlir --check
//
// checks each ep op against DeepEP's hybrid semantics: rows grouped per forwarder index,
// metadata column 1 (item x K + master slot), counts, and the combine's three fixed-order
// roundings bitwise.

#cfg = #ep.config<ranks = 4, experts = 16, topk = 4, hidden = 256, dtype = bf16,
                  max_tokens_per_rank = 64, scaleup_ranks = 2, mode = hybrid>

func.func @main() {
  %t = run.tokens per_rank [64, 37, 0, 50]
  %x = run.random normal seed 11 rows %t : tensor<?x256xbf16>
  %idx = run.routing experts 16 masked 0.1 seed 12 rows %t : tensor<?x4xi64>
  %w = run.random uniform seed 13 rows %t : tensor<?x4xf32>
  %b0 = run.random normal scale 0.5 seed 14 rows %t : tensor<?x256xbf16>

  %rx, %ri, %rw, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) weights(%w : tensor<?x4xf32>)
      config #cfg
      : tensor<?x256xbf16> -> tensor<?x256xbf16>, tensor<?x4xi64>, tensor<?x4xf32>, !ep.handle<#cfg>
  run.print %h : !ep.handle<#cfg>

  // The "experts" are the identity: each node's copies are summed at its forwarder, then the
  // nodes' sums at the origin.
  %y, %yw = ep.combine %rx, %h weights(%rw : tensor<?x4xf32>) bias(%b0 : tensor<?x256xbf16>)
      : tensor<?x256xbf16>, !ep.handle<#cfg> -> tensor<?x256xbf16>, tensor<?x4xf32>
  run.print %y rows 2 : tensor<?x256xbf16>
  return
}
