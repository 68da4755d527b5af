// The FP8 ep.grouped_gemm through the whole pipeline for sm_90a at DeepEP V3's shape
// (hidden 7168, 56 f32 scales a row, N = 2048 per expert): TMA loads of two 128 x 128
// one-byte boxes, wgmma m64n128k32 on e4m3 with B K-major, 64 fused multiply-adds of the
// promotion per step, the register file split between the warpgroups (setmaxnreg), and
// ptxas accepts the kernel with nothing spilled in the K loop (partial and total sums of a
// consumer warpgroup's 64 rows: 128 registers a thread; a block of 288 threads spilled).
// The bounded stage waits (comm.wait_phase) take the K loop's last free register: the
// tile count, read once per tile, goes to local memory (12 bytes stored, 36 loaded).
// RUN: epic-compile %s --backend=virtual -o %t
// RUN: FileCheck %s --check-prefix=PTX < %t.ptx
// RUN: FileCheck %s --check-prefix=FMA < %t.ptx
// RUN: FileCheck %s --check-prefix=JSON < %t.json

// PTX: .target sm_90a
// The ring is dynamic shared memory, after the static mbarriers (not a one-byte static
// variable declared before them, which the first stage's TMA loads overwrote).
// PTX: .extern .shared .align 16 .b8 __dynamic_shmem__0[];
// The pipeline's waits are bounded without a call (a call would serialize the wgmma):
// the clock is read only once a stage was not ready, a timeout writes its report.
// PTX-NOT: call
// PTX-LABEL: .entry ep_grouped_gemm_gemm(
// PTX: .maxntid 384, 1, 1
// PTX: setmaxnreg.inc.sync.aligned.u32 224;
// PTX: mbarrier.try_wait.parity.shared::cta.b64
// PTX-COUNT-4: wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3
// PTX-NOT: wgmma.mma_async
// PTX: wgmma.wait_group.sync.aligned{{[[:space:]]+}}0;
// PTX: setmaxnreg.dec.sync.aligned.u32 56;
// PTX: mbarrier.try_wait.parity.shared::cta.b64
// PTX: mbarrier.arrive.expect_tx.shared.b64
// PTX: cp.async.bulk.tensor.2d.shared::cluster.global{{.*}}.mbarrier::complete_tx::bytes
// The promotion (LLVM places it where it likes in the loop: after the wait, in its own block).
// FMA-COUNT-64: fma.rn.f32
// FMA-NOT: fma.rn.f32
// JSON: "dynamic_shared_bytes": 197632
// JSON: "elem_bytes": 1
// JSON: "name": "ep_grouped_gemm_gemm"
// JSON: "spill_load_bytes": {{[0-9]|[1-3][0-9]|4[0-8]}},
// JSON: "spill_store_bytes": {{[0-9]|1[0-6]}},

#cfg = #ep.config<ranks = 8, experts = 256, topk = 8, hidden = 7168, dtype = f8E4M3FN,
                  scale_packs = 56, expert_alignment = 128, layout = expanded,
                  max_tokens_per_rank = 4096>
func.func @ep_grouped_gemm(%x: tensor<?x7168xf8E4M3FN>, %w: tensor<32x2048x7168xf8E4M3FN>,
                           %h: !ep.handle<#cfg>, %sx: tensor<?x56xf32>,
                           %sw: tensor<32x16x56xf32>) -> tensor<?x2048xbf16> {
  %y = ep.grouped_gemm %x, %w layout(%h : !ep.handle<#cfg>)
      scales(%sx, %sw : tensor<?x56xf32>, tensor<32x16x56xf32>)
      : tensor<?x7168xf8E4M3FN>, tensor<32x2048x7168xf8E4M3FN> -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}
