// Every network function of the nccl shim's ABI (runtime/include/epic/device/ShimABI.def: put,
// put_value, signal, wait_signal, flush and barrier at each cooperation level, every signal and
// counter mode, read and reset) through the whole pipeline and ptxas, against the NCCL epic
// builds against. The shim inlines away: the only calls left are the timeout reports and their
// printf. test/Pipelines/nccl-2.32.mlir compiles this file against NCCL 2.32 too.
//
// RUN: epic-compile %s --backend=nccl -o %t
// RUN: FileCheck %s --check-prefix=PTX < %t.ptx
// RUN: FileCheck %s --check-prefix=JSON -DVERSION=%nccl_version < %t.json
// The callees left, each once: exactly the four below.
// RUN: sed -nE 's/^[[:space:]]*call(\.uni)? (\(retval0\), )?([^ ,;]+).*/\3/p' %t.ptx \
// RUN:   | env LC_ALL=C sort -u > %t.calls
// RUN: FileCheck %s --check-prefix=CALLS < %t.calls
// RUN: count 4 < %t.calls
//
// Naming the default shim's version is the same as naming none.
// RUN: epic-compile %s --backend=nccl --nccl-shim=%nccl_version -o %t.named
// RUN: diff %t.ptx %t.named.ptx
//
// A version the build made no shim for, and a shim for the virtual backend, are refused.
// RUN: not epic-compile %s --backend=nccl --nccl-shim=9.9.9 -o %t.x 2>&1 \
// RUN:   | FileCheck %s --check-prefix=MISSING -DVERSION=%nccl_version
// RUN: not epic-compile %s --backend=virtual --nccl-shim=%nccl_version -o %t.x 2>&1 \
// RUN:   | FileCheck %s --check-prefix=VIRTUAL
//
// The PTX ISA the pipeline asks for rises to what the shim needs (its sidecar), never falls.
// RUN: epic-opt %s --epic-to-ptx="backend=nccl features=+ptx80" | FileCheck %s --check-prefix=RAISED
// RUN: epic-opt %s --epic-to-ptx="backend=nccl features=+ptx87" | FileCheck %s --check-prefix=KEPT

// PTX: .version 8.2
// PTX-LABEL: .visible .entry network(
// PTX: ret;
// PTX-LABEL: .visible .entry barriers(

// JSON-DAG: "features": "+ptx82"
// JSON-DAG: "nccl_version": "[[VERSION]]"

// CALLS: {{^}}_ZN11epic_device11timeoutTrap
// CALLS-NEXT: {{^}}_ZN11epic_device17signalTimeoutTrap
// CALLS-NEXT: {{^}}_ZN12_GLOBAL__N_118barrierTimeoutTrap
// CALLS-NEXT: {{^}}vprintf{{$}}
// CALLS-NOT: {{.}}

// MISSING: epic-compile: no device shim for NCCL 9.9.9 in {{.*}}epic-shims (there: {{.*}}[[VERSION]]{{.*}}); configure the build with -DEPIC_EXTRA_NCCL_ROOTS=<that NCCL's root>
// VIRTUAL: epic-compile: an NCCL shim ({{.*}}) is for the nccl backend, not virtual

// RAISED: features = "+ptx82"
// KEPT: features = "+ptx87"

module attributes {gpu.container_module} {
  gpu.module @kernels {
    gpu.func @network(%dc: !comm.dev_comm, %win: !comm.window, %a: i64, %n: i64, %p: i32,
                      %sig: i32, %ctx: i32, %out: !llvm.ptr) kernel {
      %world = comm.team world %dc
      %rail = comm.team rail %dc
      comm.put %n bytes from %win[%a] to %win[%a] of %world peer %p via %dc coop thread
      comm.put %n bytes from %win[%a] to %win[%a] of %world peer %p via %dc signal(%sig) coop warp
      comm.put %n bytes from %win[%a] to %win[%a] of %rail peer %p via %dc
          signal(%sig) add(%n) counter(%sig) context(%ctx) coop block
      comm.put_value %p to %win[%a] of %world peer %p via %dc signal(%sig) coop warp : i32
      comm.put_value %n to %win[%a] of %world peer %p via %dc signal(%sig) add(%n) coop thread : i64
      comm.put_value %n to %win[%a] of %world peer %p via %dc coop block : i64
      comm.signal %sig of %world peer %p via %dc coop thread
      comm.signal %sig of %rail peer %p via %dc add(%n) context(%ctx) coop warp
      comm.signal %sig of %world peer %p via %dc coop block
      %s0 = comm.wait_signal %sig reaches %n via %dc coop thread timeout_ms 5000
      %s1 = comm.wait_signal %sig reaches %n via %dc context(%ctx) coop warp
      %s2 = comm.wait_signal %sig reaches %n via %dc coop block
      %v = comm.read_signal %sig via %dc context(%ctx)
      comm.reset_signal %sig via %dc
      comm.flush via %dc coop thread
      comm.flush via %dc context(%ctx) coop warp
      comm.flush via %dc coop block
      %t0 = llvm.add %s0, %s1 : i64
      %t1 = llvm.add %s2, %v : i64
      %t = llvm.add %t0, %t1 : i64
      llvm.store %t, %out : i64, !llvm.ptr
      gpu.return
    }

    gpu.func @barriers(%dc: !comm.dev_comm, %idx: i32) kernel {
      %world = comm.team world %dc
      %lsa = comm.team lsa %dc
      %rail = comm.team rail %dc
      comm.barrier %world via %dc index %idx coop block
      comm.barrier %lsa via %dc index %idx coop warp
      comm.barrier %rail via %dc index %idx coop thread
      comm.barrier %lsa via %dc index %idx coop block
      comm.barrier %rail via %dc index %idx coop block
      gpu.return
    }
  }
}
