// convert-ep-to-comm's kernels on the real NCCL backend with one rank (comm_smoke
// ep-nccl): the window is registered with NCCL, peers are reached through
// ncclGetPeerPointer and the entry barriers are NCCL LSA barriers.
// RUN: epic-compile %s --backend=nccl -o %t && FileCheck %s < %t.json
// CHECK-DAG: "name": "dispatch_send"
// CHECK-DAG: "name": "combine_reduce"

#one = #ep.config<ranks = 1, experts = 8, topk = 4, hidden = 1024, dtype = bf16,
                  max_tokens_per_rank = 256>

func.func @dispatch(%x: tensor<?x1024xbf16>, %idx: tensor<?x4xi64>, %w: tensor<?x4xf32>)
    -> (tensor<?x1024xbf16>, tensor<?x4xi64>, tensor<?x4xf32>, !ep.handle<#one>) {
  %rx, %ri, %rw, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) weights(%w : tensor<?x4xf32>)
      config #one
      : tensor<?x1024xbf16> -> tensor<?x1024xbf16>, tensor<?x4xi64>, tensor<?x4xf32>, !ep.handle<#one>
  return %rx, %ri, %rw, %h : tensor<?x1024xbf16>, tensor<?x4xi64>, tensor<?x4xf32>, !ep.handle<#one>
}

func.func @combine(%y: tensor<?x1024xbf16>, %h: !ep.handle<#one>, %w: tensor<?x4xf32>)
    -> (tensor<?x1024xbf16>, tensor<?x4xf32>) {
  %out, %ow = ep.combine %y, %h weights(%w : tensor<?x4xf32>)
      : tensor<?x1024xbf16>, !ep.handle<#one> -> tensor<?x1024xbf16>, tensor<?x4xf32>
  return %out, %ow : tensor<?x1024xbf16>, tensor<?x4xf32>
}
