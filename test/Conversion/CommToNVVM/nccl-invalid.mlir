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

// -----

// comm ops are device code: in a host function they are refused by name, not
// lowered into special-register reads on the host.
func.func @host(%dc: !comm.dev_comm) -> i32 {
  // expected-error@+1 {{'comm.team' op is device code: it must be in a gpu.func of a gpu.module, not in host function @host}}
  %lsa = comm.team lsa %dc
  %me = comm.team_rank %lsa
  return %me : i32
}
