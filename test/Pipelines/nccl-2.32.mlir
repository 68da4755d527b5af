// The nccl backend against NCCL 2.32 as well as the NCCL epic builds against (2.28.9): the build
// compiles the same shim, runtime/device/NcclShim.cu, over the headers of the nvidia-nccl-cu13
// 2.32 wheel (install.sh fetches them; CMake's EPIC_EXTRA_NCCL_ROOTS), and epic-compile links it
// for --nccl-shim. Compiled through ptxas: every function of the shim's ABI (nccl-shim-abi.mlir),
// the GPU tests' comm kernels, the ep entries (dispatch and combine, test/gpu) and the multi-node
// ones (direct and hybrid mode over GIN, multinode-to-ptx.mlir, hybrid-to-ptx.mlir). 2.32's device
// API needs PTX ISA 8.4, which the pipeline takes from the shim's sidecar over the 8.2 asked for;
// the shim inlines away as with 2.28.9: the only calls left are the timeout reports.
//
// REQUIRES: nccl-2.32
// RUN: epic-compile %S/nccl-shim-abi.mlir --backend=nccl --nccl-shim=%nccl_2_32 -o %t.abi
// RUN: FileCheck %s --check-prefixes=PTX,ABI < %t.abi.ptx
// RUN: FileCheck %s --check-prefix=JSON -DVERSION=%nccl_2_32 < %t.abi.json
// RUN: epic-compile %S/../gpu/comm_kernels.mlir --backend=nccl --nccl-shim=%nccl_2_32 -o %t.comm
// RUN: FileCheck %s --check-prefixes=PTX,COMM < %t.comm.ptx
// RUN: FileCheck %s --check-prefix=JSON -DVERSION=%nccl_2_32 < %t.comm.json
// RUN: epic-compile %S/../gpu/ep_nccl.mlir --backend=nccl --nccl-shim=%nccl_2_32 -o %t.ep
// RUN: FileCheck %s --check-prefixes=PTX,EP < %t.ep.ptx
// RUN: FileCheck %s --check-prefix=JSON -DVERSION=%nccl_2_32 < %t.ep.json
// RUN: epic-compile %S/multinode-to-ptx.mlir --backend=nccl --nccl-shim=%nccl_2_32 -o %t.mn
// RUN: FileCheck %s --check-prefixes=PTX,MN < %t.mn.ptx
// RUN: FileCheck %s --check-prefix=JSON -DVERSION=%nccl_2_32 < %t.mn.json
// RUN: epic-compile %S/hybrid-to-ptx.mlir --backend=nccl --nccl-shim=%nccl_2_32 -o %t.hy
// RUN: FileCheck %s --check-prefixes=PTX,HY < %t.hy.ptx
// The callees left, each once: exactly the six below.
// RUN: sed -nE 's/^[[:space:]]*call(\.uni)? (\(retval0\), )?([^ ,;]+).*/\3/p' %t.abi.ptx \
// RUN:   %t.comm.ptx %t.ep.ptx %t.mn.ptx %t.hy.ptx | env LC_ALL=C sort -u > %t.calls
// RUN: FileCheck %s --check-prefix=CALLS < %t.calls
// RUN: count 6 < %t.calls
// RUN: epic-opt %S/nccl-shim-abi.mlir --epic-to-ptx="backend=nccl nccl-shim=%nccl_2_32" \
// RUN:   | FileCheck %s --check-prefix=TARGET

// PTX: .version 8.4
// PTX: .target sm_90a
// ABI-LABEL: .visible .entry network(
// ABI-LABEL: .visible .entry barriers(
// COMM-LABEL: .visible .entry lsa_ring(
// COMM-LABEL: .visible .entry put_signal(
// EP: .visible .entry dispatch_send(
// EP: .visible .entry combine_reduce(
// MN: .visible .entry dispatch_bf16_send(
// MN: .visible .entry combine_exp_send(
// HY: .visible .entry dispatch_bf16_forward(
// HY: .visible .entry combine_exp_forward(

// JSON-DAG: "features": "+ptx84"
// JSON-DAG: "nccl_version": "[[VERSION]]"

// CALLS: {{^}}_ZN11epic_device11timeoutTrap
// CALLS-NEXT: {{^}}_ZN11epic_device15flagTimeoutTrap
// CALLS-NEXT: {{^}}_ZN11epic_device16disagreementTrap
// CALLS-NEXT: {{^}}_ZN11epic_device17signalTimeoutTrap
// CALLS-NEXT: {{^}}_ZN12_GLOBAL__N_118barrierTimeoutTrap
// CALLS-NEXT: {{^}}vprintf{{$}}
// CALLS-NOT: {{.}}

// TARGET: #nvvm.target<O = 3, chip = "sm_90a", features = "+ptx84", link = ["{{.*}}epic_shim_nccl-{{[0-9.]+}}.bc"]>
