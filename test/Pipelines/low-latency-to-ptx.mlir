// DeepEP V1's low-latency mode through the whole pipeline on both backends:
// ptxas accepts the four kernels; the dispatch casts to FP8 with
// cvt.rn.satfinite; the weighted sum multiplies and adds with .rn (never a
// fused fma, so the sum is bitwise the reference's); the phases in one kernel
// are cooperative. The receive's and the combine send's prefix sums lie in a
// 16-byte aligned shared array: LLVM merges a lane's consecutive scan stores
// into st.shared.v4, which faulted (misaligned address) while the array sat
// right after the 4-byte flag.
// RUN: epic-compile %s --backend=virtual -o %t
// RUN: FileCheck %s --check-prefix=PTX < %t.ptx
// RUN: FileCheck %s --check-prefix=META < %t.json
// RUN: epic-compile %s --backend=nccl -o %t.nccl
// RUN: FileCheck %s --check-prefix=PTX < %t.nccl.ptx
// RUN: FileCheck %s --check-prefix=META < %t.nccl.json

#fp8 = #ep.config<ranks = 8, experts = 256, topk = 8, hidden = 7168, dtype = f8E4M3FN,
                  scale_packs = 56>
#bf16 = #ep.config<ranks = 8, experts = 256, topk = 8, hidden = 7168, dtype = bf16>

// PTX-LABEL: .entry ll_dispatch_send(
// PTX: red.relaxed.gpu.add
// PTX: cvt.rn.satfinite.e4m3x2.f32
// PTX: st.release.sys
// PTX-LABEL: .entry ll_dispatch_recv(
// PTX: .shared .align 16 .b8 __wg_ll_dispatch_recv_1[1028];
// PTX: ld.acquire.sys
// PTX: st.shared.v4.b32
// PTX-LABEL: .entry ll_dispatch_fused(
// PTX: .shared .align 16 .b8 __wg_ll_dispatch_fused_1[1028];
// PTX-LABEL: .entry ll_combine_send(
// PTX: .shared .align 16 .b8 __wg_ll_combine_send_1[132];
// PTX: st.release.sys
// PTX-LABEL: .entry ll_combine_reduce(
// PTX-NOT: fma.rn.f32
// PTX: mul.rn.f32
// PTX: add.rn.f32
// PTX-LABEL: .entry ll_combine_fused(
// PTX: .shared .align 16 .b8 __wg_ll_combine_fused_1[132];
// META: "cooperative": 1,
// META-NEXT: "entry": "low_latency_dispatch",
// META: "cooperative": 1,
// META-NEXT: "entry": "low_latency_combine",
func.func @ll_dispatch(%x: tensor<?x7168xbf16>, %i: tensor<?x8xi64>)
    -> (tensor<32x?x7168xf8E4M3FN>, tensor<32x?x56xf32>) {
  %a, %b, %c, %d, %e, %f = ep.low_latency_dispatch %x, %i config #fp8
      : tensor<?x7168xbf16>, tensor<?x8xi64> -> tensor<32x?x7168xf8E4M3FN>,
        scales tensor<32x?x56xf32>, tensor<32xi32>, tensor<32x?xi32>, tensor<32x8xi64>,
        tensor<32x?xi32>
  return %a, %b : tensor<32x?x7168xf8E4M3FN>, tensor<32x?x56xf32>
}

func.func @ll_combine(%x: tensor<32x?x7168xbf16>, %r: tensor<32x8xi64>, %route: tensor<32x?xi32>,
                      %i: tensor<?x8xi64>, %w: tensor<?x8xf32>) -> tensor<?x7168xbf16> {
  %y = ep.low_latency_combine %x, %r, %route, %i, %w config #bf16
      : tensor<32x?x7168xbf16>, tensor<32x8xi64>, tensor<32x?xi32>, tensor<?x8xi64>,
        tensor<?x8xf32> -> tensor<?x7168xbf16>
  return %y : tensor<?x7168xbf16>
}
