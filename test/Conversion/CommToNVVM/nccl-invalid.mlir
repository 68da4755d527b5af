// convert-comm-to-nvvm, backend=nccl: what a process of the NCCL world cannot
// address is refused with a diagnostic, not a failed legalization.
// RUN: epic-opt %s --split-input-file --convert-comm-to-nvvm=backend=nccl --verify-diagnostics

gpu.module @peer_params {
  gpu.func @k(%dc: !comm.dev_comm, %table: !llvm.ptr<1>, %peer: i32) kernel {
    // expected-error@+1 {{comm.peer_params needs the virtual backend: a process of the nccl backend has only its own parameter record}}
    %theirs = comm.peer_params %table stride 128 peer %peer via %dc : !llvm.ptr<1>
    %v = llvm.load %theirs : !llvm.ptr<1> -> i32
    gpu.return
  }
}
