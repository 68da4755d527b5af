// DeepEP's V3 configuration (EP8, 256 experts, top-8, hidden 7168, FP8
// dispatch with 56 scale packs per row, BF16 combine) through convert-ep-to-comm and
// the whole PTX pipeline, both backends: 16-byte vector copies, release /
// acquire at system scope, and ptxas (sm_90a, -O3) accepts every kernel with
// no spills.
//
// RUN: epic-compile %s --backend=nccl -o %t.nccl
// RUN: FileCheck %s --check-prefix=PTX < %t.nccl.ptx
// RUN: FileCheck %s --check-prefix=JSON < %t.nccl.json
// RUN: epic-compile %s --backend=virtual -o %t.virtual
// RUN: FileCheck %s --check-prefix=VJSON < %t.virtual.json
// RUN: FileCheck %s --check-prefix=VIRTUAL < %t.virtual.ptx
// RUN: epic-compile %s --backend=virtual --staged -o %t.staged
// RUN: FileCheck %s --check-prefix=STAGED < %t.staged.ptx
// RUN: not epic-compile %s --backend=nccl --staged -o %t.bad 2>&1 \
// RUN:   | FileCheck %s --check-prefix=NCCL-STAGED

// The parameter table is a by-value kernel parameter (one 192-byte record on
// nccl; on the virtual backend one per rank, 8), its fields read with ld.param.
// The virtual backend dispatches in one pass (count, then scatter: no copy epilogue)
// and combines in one (gather: no send, no reduce).
// PTX-LABEL: .entry dispatch_send(
// PTX: .param .align 64 .b8 dispatch_send_param_2[192]
// PTX: ld.param.{{.*}}[dispatch_send_param_2+{{[0-9]+}}]
// VIRTUAL-LABEL: .entry dispatch_count(
// VIRTUAL: .param .align 64 .b8 dispatch_count_param_2[1536]
// VIRTUAL: ld.param.v2.b64 {{.*}}, [%rd{{[0-9]+}}{{(\+[0-9]+)?}}]
// VIRTUAL-LABEL: .entry dispatch_scatter(
// VIRTUAL-LABEL: .entry combine_gather(
// VIRTUAL: cvt.rn.bf16x2.f32
// VIRTUAL-NOT: st.release.sys
// `--staged`: the virtual backend's records (one per rank), but the kernels a
// world of processes runs, staging the rows in the window both ways.
// STAGED-LABEL: .entry dispatch_send(
// STAGED: .param .align 64 .b8 dispatch_send_param_2[1536]
// STAGED-LABEL: .entry dispatch_copy(
// STAGED-LABEL: .entry combine_send(
// STAGED-LABEL: .entry combine_reduce(
// STAGED-NOT: .entry dispatch_scatter(
// STAGED-NOT: .entry combine_gather(
// NCCL-STAGED: staged: only the virtual backend has a one-pass variant to replace
// PTX: match.any.sync.b32
// PTX: {{ld.global.v4.[bu]32|ld.global.nc.v4.[bu]32}}
// PTX: {{st.v4.[bu]32|st.global.v4.[bu]32}}
// PTX: st.release.sys
// PTX: ld.acquire.sys
// PTX-LABEL: .entry dispatch_copy(
// PTX: vote.sync.ballot.b32
// PTX-LABEL: .entry combine_send(
// PTX-LABEL: .entry combine_reduce(
// PTX: cvt.rn.bf16x2.f32

// JSON: "kernels": [
// JSON-COUNT-4: "spill_store_bytes": 0
// VJSON: "kernels": [
// VJSON-COUNT-3: "spill_store_bytes": 0
// VJSON-NOT: "spill_store_bytes"

#v3 = #ep.config<ranks = 8, experts = 256, topk = 8, hidden = 7168, dtype = f8E4M3FN,
                 scale_packs = 56, expert_alignment = 128, max_tokens_per_rank = 4096>

func.func @dispatch(%x: tensor<?x7168xf8E4M3FN>, %sf: tensor<?x56xf32>, %idx: tensor<?x8xi64>,
                    %w: tensor<?x8xf32>)
    -> (tensor<?x7168xf8E4M3FN>, tensor<?x56xf32>, tensor<?x8xi64>, tensor<?x8xf32>, !ep.handle<#v3>) {
  %rx, %rsf, %ri, %rw, %h = ep.dispatch %x topk(%idx : tensor<?x8xi64>) scales(%sf : tensor<?x56xf32>)
      weights(%w : tensor<?x8xf32>) config #v3
      : tensor<?x7168xf8E4M3FN> -> tensor<?x7168xf8E4M3FN>, tensor<?x56xf32>, tensor<?x8xi64>,
        tensor<?x8xf32>, !ep.handle<#v3>
  return %rx, %rsf, %ri, %rw, %h : tensor<?x7168xf8E4M3FN>, tensor<?x56xf32>, tensor<?x8xi64>,
      tensor<?x8xf32>, !ep.handle<#v3>
}

func.func @combine(%y: tensor<?x7168xbf16>, %h: !ep.handle<#v3>, %w: tensor<?x8xf32>)
    -> (tensor<?x7168xbf16>, tensor<?x8xf32>) {
  %out, %ow = ep.combine %y, %h weights(%w : tensor<?x8xf32>)
      : tensor<?x7168xbf16>, !ep.handle<#v3> -> tensor<?x7168xbf16>, tensor<?x8xf32>
  return %out, %ow : tensor<?x7168xbf16>, tensor<?x8xf32>
}
