// The fused dispatch + GEMM and GEMM + combine through epic-compile (fusion,
// convert-ep-to-comm, the whole pipeline, ptxas) on both backends. Their kernels wait
// on flags inside a wgmma pipeline: the waits must be the call-free ones
// (a call, even the cold printf of a timeout report, makes ptxas serialize
// every wgmma of the kernel: C7510, measured 1.45x slower on the H200).
// RUN: epic-compile %s --backend=virtual -v -o %t 2>&1 | FileCheck %s --check-prefix=PTXAS
// RUN: FileCheck %s --check-prefix=PTX < %t.ptx
// RUN: epic-compile %s --backend=nccl -v -o %t.nccl 2>&1 | FileCheck %s --check-prefix=PTXAS

// PTXAS-NOT: Potential Performance Loss
// PTXAS: Compiling entry function 'layer_gemm_combine_gemm_send'
// PTXAS-NOT: Potential Performance Loss
// PTXAS: Compiling entry function 'layer_dispatch_gemm_copy_gemm'
// PTXAS-NOT: Potential Performance Loss
// PTXAS: Compiling entry function 'layer_dispatch_gemm_send'

// The GEMM kernels load the report slots' address and call nothing.
// PTX: .visible .global .align 8 .u64 epic_wait_report;
// PTX-LABEL: .entry layer_dispatch_gemm_copy_gemm(
// PTX-NOT: call.uni
// PTX: wgmma.mma_async
// PTX-NOT: call.uni
// PTX: ld.global.b64 {{.*}}[epic_wait_report]
// PTX-NOT: call.uni
// PTX: trap;
// PTX-NOT: call.uni
// PTX-LABEL: .entry layer_gemm_combine_gemm_send(
// PTX-NOT: call.uni
// PTX: wgmma.mma_async
// PTX-NOT: call.uni
// PTX: {{^}}}

#cfg = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 1024, dtype = bf16,
                  expert_alignment = 128, layout = expanded, max_tokens_per_rank = 256>

func.func @layer_dispatch_gemm(%x: tensor<?x1024xbf16>, %idx: tensor<?x4xi64>,
                               %experts: tensor<8x1024x1024xbf16>)
    -> (tensor<?x1024xbf16>, !ep.handle<#cfg>) {
  %rx, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) config #cfg
      : tensor<?x1024xbf16> -> tensor<?x1024xbf16>, !ep.handle<#cfg>
  %y = ep.grouped_gemm %rx, %experts layout(%h : !ep.handle<#cfg>)
      : tensor<?x1024xbf16>, tensor<8x1024x1024xbf16> -> tensor<?x1024xbf16>
  return %y, %h : tensor<?x1024xbf16>, !ep.handle<#cfg>
}

func.func @layer_gemm_combine(%rx: tensor<?x1024xbf16>, %w: tensor<8x1024x1024xbf16>,
                              %h: !ep.handle<#cfg>) -> tensor<?x1024xbf16> {
  %y = ep.grouped_gemm %rx, %w layout(%h : !ep.handle<#cfg>)
      : tensor<?x1024xbf16>, tensor<8x1024x1024xbf16> -> tensor<?x1024xbf16>
  %out = ep.combine %y, %h : tensor<?x1024xbf16>, !ep.handle<#cfg> -> tensor<?x1024xbf16>
  return %out : tensor<?x1024xbf16>
}
