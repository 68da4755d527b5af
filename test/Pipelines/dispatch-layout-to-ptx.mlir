// ep.dispatch_layout through the whole pipeline on both backends: ptxas
// accepts the two kernels, the counts are atomic reductions, and the launch
// metadata names the entry.
// RUN: epic-compile %s --backend=virtual -o %t
// RUN: FileCheck %s --check-prefix=PTX < %t.ptx
// RUN: FileCheck %s --check-prefix=META < %t.json
// RUN: epic-compile %s --backend=nccl -o %t.nccl
// RUN: FileCheck %s --check-prefix=PTX < %t.nccl.ptx

#cfg = #ep.config<ranks = 8, experts = 256, topk = 8, hidden = 7168, dtype = bf16,
                  max_tokens_per_rank = 4096>

// PTX-LABEL: .entry layout_zero(
// PTX-LABEL: .entry layout_count(
// PTX: red.relaxed.gpu.add.u32
// PTX: red.relaxed.gpu.add.u32
// META: "entry": "dispatch_layout"
// META: "kernels": [
// META-NEXT: "layout_zero",
// META-NEXT: "layout_count"
func.func @layout(%idx: tensor<?x8xi64>) -> (tensor<8xi32>, tensor<256xi32>, tensor<?x8xi1>) {
  %r, %e, %in = ep.dispatch_layout %idx config #cfg
      : tensor<?x8xi64> -> tensor<8xi32>, tensor<256xi32>, tensor<?x8xi1>
  return %r, %e, %in : tensor<8xi32>, tensor<256xi32>, tensor<?x8xi1>
}
