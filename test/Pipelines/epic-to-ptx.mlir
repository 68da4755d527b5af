// The whole pipeline, comm + upstream ops -> PTX -> ptxas, for both backends:
// the shim is linked and inlined (no calls left), the orderings and scopes
// reach the PTX, the data path uses 16-byte vector accesses, and ptxas
// accepts the result for sm_90a without spilling.
//
// RUN: epic-compile %s --backend=virtual -o %t.virtual
// RUN: FileCheck %s --check-prefixes=PTX,VIRTUAL < %t.virtual.ptx
// RUN: FileCheck %s --check-prefix=JSON < %t.virtual.json
// RUN: epic-compile %s --backend=nccl -o %t.nccl
// RUN: FileCheck %s --check-prefixes=PTX,NCCL < %t.nccl.ptx
// RUN: FileCheck %s --check-prefix=JSON < %t.nccl.json
// RUN: epic-opt %s --epic-to-ptx="backend=virtual" | FileCheck %s --check-prefix=BINARY

// PTX: .version 8.2
// PTX: .target sm_90a
// PTX-LABEL: .visible .entry ring_put(
// Every block of a rank copies its part of the rank's slice into the next
// rank's slice with 16-byte vector accesses...
// PTX: {{ld.global.v4.[bu]32}}
// PTX: {{st.global.v4.[bu]32}}
// ... publishes the arrival with a release reduction at system scope ...
// PTX: red.release.sys.add.u32
// ... and waits for its own flag with acquire loads (the bounded wait).
// PTX: ld.acquire.sys.b32
// PTX: %globaltimer
// The LSA barrier of the NCCL shim and the counter barrier of the virtual one;
// the NCCL one's wait is bounded too (NCCL's own spins forever).
// NCCL: st.release.sys
// NCCL: %globaltimer
// VIRTUAL: atom.add.u64
// PTX: bar.sync
// The shim was inlined: the only calls left are the timeout reports.
// PTX-NOT: call.uni {{.*}}__epic
// PTX: trap

// JSON: "name": "ring_put"
// JSON: "registers": {{[1-9][0-9]*}}
// JSON: "spill_load_bytes": 0
// JSON: "spill_store_bytes": 0
// JSON: "nccl_version": "{{[0-9]+\.[0-9]+\.[0-9]+}}"

// BINARY: gpu.binary @kernels
// BINARY-SAME: #nvvm.target<O = 3, chip = "sm_90a", features = "+ptx82", link = ["{{.*}}epic_shim_virtual.bc"]>

module attributes {gpu.container_module} {
  gpu.module @kernels {
    // %rows 16-byte vectors per rank; block b of a rank copies vector b.
    gpu.func @ring_put(%dc: !comm.dev_comm, %win: !comm.window, %flags: !comm.window,
                       %rows: i32) kernel {
      %lsa = comm.team lsa %dc
      %me = comm.team_rank %lsa
      %size = comm.team_size %lsa
      %c1 = arith.constant 1 : i32
      %c16 = arith.constant 16 : i64
      %c0 = arith.constant 0 : i64
      %next0 = arith.addi %me, %c1 : i32
      %next = arith.remui %next0, %size : i32
      %block = gpu.block_id x
      %block32 = arith.index_cast %block : index to i32
      %in = arith.cmpi ult, %block32, %rows : i32
      scf.if %in {
        %b64 = arith.extui %block32 : i32 to i64
        %off = arith.muli %b64, %c16 : i64
        %src = comm.local_ptr %win[%off] : !llvm.ptr<1>
        %dst = comm.peer_ptr %win[%off], %lsa, %next : !llvm.ptr<1>
        %v = llvm.load %src {alignment = 16 : i64} : !llvm.ptr<1> -> vector<4xi32>
        llvm.store %v, %dst {alignment = 16 : i64} : vector<4xi32>, !llvm.ptr<1>
      }
      // Count the arrivals at the next rank; wait until all blocks of the
      // previous rank arrived here.
      %flag_next = comm.peer_ptr %flags[%c0], %lsa, %next : !llvm.ptr<1>
      comm.red add release scope sys %c1, %flag_next : i32, !llvm.ptr<1>
      %flag = comm.local_ptr %flags[%c0] : !llvm.ptr<1>
      %blocks = gpu.grid_dim x
      %blocks32 = arith.index_cast %blocks : index to i32
      %seen = comm.wait_flag %flag ge %blocks32 scope sys timeout_ms 1000 : !llvm.ptr<1>, i32
      %i0 = arith.constant 0 : i32
      comm.barrier %lsa via %dc index %i0 coop block
      gpu.return
    }
  }
}
