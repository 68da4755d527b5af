// ep.engram_fetch through the whole pipeline on both backends: ptxas accepts
// the fetch kernel (16-byte loads from the owner's table, stores to the
// output), nothing is cooperative, and the launch metadata names the entry
// and its record.
// RUN: epic-compile %s --backend=virtual -o %t
// RUN: FileCheck %s --check-prefix=PTX < %t.ptx
// RUN: FileCheck %s --check-prefix=META < %t.json
// RUN: epic-compile %s --backend=nccl -o %t.nccl
// RUN: FileCheck %s --check-prefix=PTX < %t.nccl.ptx
// RUN: FileCheck %s --check-prefix=META < %t.nccl.json

#cfg = #ep.config<ranks = 8, experts = 8, topk = 1, hidden = 128, dtype = bf16>

// PTX-LABEL: .entry fetch_fetch(
// PTX-DAG: ld.global.v4.b32
// PTX-DAG: st.global.v4.b32
// META: "cooperative": 0,
// META-NEXT: "entry": "engram_fetch",
// META: "kernels": [
// META-NEXT: "fetch_fetch"
// META: "param_fields": [
// META-NEXT: "indices",
// META-NEXT: "num_rows",
// META-NEXT: "entries_per_rank",
// META-NEXT: "table_offset",
// META-NEXT: "own_table",
// META-NEXT: "out"
func.func @fetch(%ids: tensor<?x24xi32>) -> tensor<?x3072xbf16> {
  %rows = ep.engram_fetch %ids config #cfg : tensor<?x24xi32> -> tensor<?x3072xbf16>
  return %rows : tensor<?x3072xbf16>
}
