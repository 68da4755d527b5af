// ep.grouped_gemm through convert-ep-to-comm and the whole pipeline for sm_90a
// (DeepEP V3's hidden size, N = 2048 per expert): TMA tensor loads with
// mbarrier transactions, wgmma m64n128k16 on bf16 with B transposed, and ptxas
// accepts the kernel with no spills.
// RUN: epic-compile %s --backend=virtual -o %t
// RUN: FileCheck %s --check-prefix=PTX < %t.ptx
// RUN: FileCheck %s --check-prefix=FENCE < %t.ptx
// RUN: FileCheck %s --check-prefix=JSON < %t.json

// PTX: .target sm_90a
// The ring is dynamic shared memory, after the static mbarriers (not a one-byte static
// variable declared before them, which the first stage's TMA loads overwrote).
// PTX: .extern .shared .align 16 .b8 __dynamic_shmem__0[];
// PTX-LABEL: .entry ep_grouped_gemm_gemm(
// PTX: mbarrier.init.shared.b64
// PTX: prefetch.tensormap
// PTX: mbarrier.arrive.expect_tx.shared.b64
// PTX: cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes
// PTX: mbarrier.try_wait.parity.shared::cta.b64
// PTX: wgmma.fence.sync.aligned
// PTX-COUNT-4: wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16
// PTX: wgmma.commit_group.sync.aligned
// PTX: wgmma.wait_group.sync.aligned{{[[:space:]]+}}0;
// Generic shared-memory writes (the epilogue) are fenced before the next TMA writes.
// FENCE: fence.proxy.async.shared::cta
// JSON: "name": "ep_grouped_gemm_gemm"
// JSON: "spill_load_bytes": 0
// JSON: "spill_store_bytes": 0
// JSON: "chip": "sm_90a"

#cfg = #ep.config<ranks = 8, experts = 256, topk = 8, hidden = 7168, dtype = bf16,
                  expert_alignment = 128, layout = expanded, max_tokens_per_rank = 4096>
func.func @ep_grouped_gemm(%x: tensor<?x7168xbf16>, %w: tensor<32x7168x2048xbf16>,
                           %h: !ep.handle<#cfg>) -> tensor<?x2048xbf16> {
  %y = ep.grouped_gemm %x, %w layout(%h : !ep.handle<#cfg>)
      : tensor<?x7168xbf16>, tensor<32x7168x2048xbf16> -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}
