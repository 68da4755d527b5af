// Hybrid mode across two nodes of four ranks (scaleup_ranks = 4, mode = hybrid): the same entries
// as multinode-to-ptx.mlir (dispatch BF16 with weights, FP8, cached, expanded with zero padding;
// combine with weights and a bias, expanded) through convert-ep-to-comm and the whole PTX
// pipeline, both backends, ptxas included. Every op is three kernels (send, forward, copy or
// reduce); on nccl the GIN operations are the shim's, inlined: the only calls left are the
// timeout reports.
//
// RUN: epic-compile %s --backend=nccl -o %t.nccl
// RUN: FileCheck %s --check-prefixes=PTX,NCCL < %t.nccl.ptx
// RUN: FileCheck %s --check-prefix=JSON < %t.nccl.json
// RUN: sed -nE 's/^[[:space:]]*call(\.uni)? (\(retval0\), )?([^ ,;]+).*/\3/p' %t.nccl.ptx \
// RUN:   | env LC_ALL=C sort -u | FileCheck %s --check-prefix=CALLS
// RUN: epic-compile %s --backend=virtual -o %t.virtual
// RUN: FileCheck %s --check-prefix=PTX < %t.virtual.ptx
// RUN: FileCheck %s --check-prefix=JSON < %t.virtual.json

// PTX-LABEL: .entry dispatch_bf16_send(
// PTX-LABEL: .entry dispatch_bf16_forward(
// PTX-LABEL: .entry dispatch_bf16_copy(
// PTX-LABEL: .entry combine_bf16_send(
// PTX-LABEL: .entry combine_bf16_forward(
// PTX: cvt.rn.bf16x2.f32
// PTX-LABEL: .entry combine_bf16_reduce(
// PTX-LABEL: .entry dispatch_cached_send(
// PTX-LABEL: .entry dispatch_cached_forward(
// PTX-LABEL: .entry dispatch_cached_copy(
// NCCL-NOT: call{{.*}}__epic_nccl_

// The timeout reports (a signal's names the rank it waited for), nothing else.
// CALLS: {{^}}_ZN11epic_device15flagTimeoutTrap
// CALLS-NEXT: {{^}}_ZN11epic_device16disagreementTrap
// CALLS-NEXT: {{^}}_ZN11epic_device17signalTimeoutTrap
// CALLS-NEXT: {{^}}vprintf{{$}}
// CALLS-NOT: {{.}}

// The forwarders' handle fields follow the dispatch's and combine's.
// JSON: "gin_signals": 24,
// JSON-NEXT: "kernels": [
// JSON-NEXT: "dispatch_bf16_send",
// JSON-NEXT: "dispatch_bf16_forward",
// JSON-NEXT: "dispatch_bf16_copy"
// JSON: "name": "dispatch_bf16",
// JSON: "fwd_src_metadata",
// JSON-NEXT: "fwd_counts"
// JSON: "gin_signals": 24,
// JSON-NEXT: "kernels": [
// JSON-NEXT: "combine_bf16_send",
// JSON-NEXT: "combine_bf16_forward",
// JSON-NEXT: "combine_bf16_reduce"
// JSON: "name": "combine_bf16",
// JSON: "fwd_src_metadata",
// JSON-NEXT: "fwd_counts"

#bf16 = #ep.config<ranks = 8, experts = 64, topk = 6, hidden = 2048, dtype = bf16,
                   max_tokens_per_rank = 512, scaleup_ranks = 4, mode = hybrid>
#fp8 = #ep.config<ranks = 8, experts = 64, topk = 6, hidden = 2048, dtype = f8E4M3FN,
                  scale_packs = 16, max_tokens_per_rank = 512, scaleup_ranks = 4, mode = hybrid>
#exp = #ep.config<ranks = 8, experts = 64, topk = 6, hidden = 2048, dtype = bf16,
                  expert_alignment = 128, layout = expanded, max_tokens_per_rank = 512,
                  scaleup_ranks = 4, mode = hybrid>

func.func @dispatch_bf16(%x: tensor<?x2048xbf16>, %idx: tensor<?x6xi64>, %w: tensor<?x6xf32>)
    -> (tensor<?x2048xbf16>, tensor<?x6xi64>, tensor<?x6xf32>, !ep.handle<#bf16>) {
  %rx, %ri, %rw, %h = ep.dispatch %x topk(%idx : tensor<?x6xi64>) weights(%w : tensor<?x6xf32>)
      config #bf16
      : tensor<?x2048xbf16> -> tensor<?x2048xbf16>, tensor<?x6xi64>, tensor<?x6xf32>, !ep.handle<#bf16>
  return %rx, %ri, %rw, %h : tensor<?x2048xbf16>, tensor<?x6xi64>, tensor<?x6xf32>, !ep.handle<#bf16>
}

func.func @combine_bf16(%y: tensor<?x2048xbf16>, %h: !ep.handle<#bf16>, %w: tensor<?x6xf32>,
                        %b0: tensor<?x2048xbf16>) -> (tensor<?x2048xbf16>, tensor<?x6xf32>) {
  %out, %ow = ep.combine %y, %h weights(%w : tensor<?x6xf32>) bias(%b0 : tensor<?x2048xbf16>)
      : tensor<?x2048xbf16>, !ep.handle<#bf16> -> tensor<?x2048xbf16>, tensor<?x6xf32>
  return %out, %ow : tensor<?x2048xbf16>, tensor<?x6xf32>
}

func.func @dispatch_cached(%x: tensor<?x2048xbf16>, %h: !ep.handle<#bf16>)
    -> (tensor<?x2048xbf16>, tensor<?x6xi64>, !ep.handle<#bf16>) {
  %rx, %ri, %h2 = ep.dispatch %x cached(%h : !ep.handle<#bf16>) config #bf16
      : tensor<?x2048xbf16> -> tensor<?x2048xbf16>, tensor<?x6xi64>, !ep.handle<#bf16>
  return %rx, %ri, %h2 : tensor<?x2048xbf16>, tensor<?x6xi64>, !ep.handle<#bf16>
}

func.func @dispatch_fp8(%x: tensor<?x2048xf8E4M3FN>, %sf: tensor<?x16xf32>,
                        %idx: tensor<?x6xi64>, %w: tensor<?x6xf32>)
    -> (tensor<?x2048xf8E4M3FN>, tensor<?x16xf32>, tensor<?x6xi64>, tensor<?x6xf32>, !ep.handle<#fp8>) {
  %rx, %rsf, %ri, %rw, %h = ep.dispatch %x topk(%idx : tensor<?x6xi64>) scales(%sf : tensor<?x16xf32>)
      weights(%w : tensor<?x6xf32>) config #fp8
      : tensor<?x2048xf8E4M3FN> -> tensor<?x2048xf8E4M3FN>, tensor<?x16xf32>, tensor<?x6xi64>,
        tensor<?x6xf32>, !ep.handle<#fp8>
  return %rx, %rsf, %ri, %rw, %h : tensor<?x2048xf8E4M3FN>, tensor<?x16xf32>, tensor<?x6xi64>,
      tensor<?x6xf32>, !ep.handle<#fp8>
}

func.func @dispatch_exp(%x: tensor<?x2048xbf16>, %idx: tensor<?x6xi64>, %w: tensor<?x6xf32>)
    -> (tensor<?x2048xbf16>, tensor<?xf32>, !ep.handle<#exp>) {
  %rx, %rw, %h = ep.dispatch %x topk(%idx : tensor<?x6xi64>) weights(%w : tensor<?x6xf32>)
      zero_padding config #exp
      : tensor<?x2048xbf16> -> tensor<?x2048xbf16>, tensor<?xf32>, !ep.handle<#exp>
  return %rx, %rw, %h : tensor<?x2048xbf16>, tensor<?xf32>, !ep.handle<#exp>
}

func.func @combine_exp(%y: tensor<?x2048xbf16>, %h: !ep.handle<#exp>, %w: tensor<?xf32>)
    -> (tensor<?x2048xbf16>, tensor<?x6xf32>) {
  %out, %ow = ep.combine %y, %h weights(%w : tensor<?xf32>)
      : tensor<?x2048xbf16>, !ep.handle<#exp> -> tensor<?x2048xbf16>, tensor<?x6xf32>
  return %out, %ow : tensor<?x2048xbf16>, tensor<?x6xf32>
}
