// One case per verifier rule of the comm dialect.
// RUN: epic-opt %s --split-input-file --verify-diagnostics

func.func @f(%dc: !comm.dev_comm, %win: !comm.window, %a: i64, %n: i64, %peer: i32) {
  %world = comm.team world %dc
  // expected-error@+1 {{add(...) needs a signal(...) to add to}}
  comm.put %n bytes from %win[%a] to %win[%a] of %world peer %peer via %dc add(%n) coop thread
  return
}

// -----

func.func @f(%dc: !comm.dev_comm, %win: !comm.window, %a: i64, %n: i64, %peer: i32) {
  %world = comm.team world %dc
  // expected-error@+1 {{add(...) needs a signal(...) to add to}}
  comm.put_value %n to %win[%a] of %world peer %peer via %dc add(%n) coop thread : i64
  return
}

// -----

func.func @f(%dc: !comm.dev_comm, %win: !comm.window, %a: i64, %peer: i32, %v: f32) {
  %world = comm.team world %dc
  // expected-error@+1 {{operand #0 must be 32-bit signless integer or 64-bit signless integer, but got 'f32'}}
  "comm.put_value"(%v, %win, %a, %world, %peer, %dc) <{coop = 0 : i32, operandSegmentSizes = array<i32: 1, 1, 1, 1, 1, 1, 0, 0, 0>}>
      : (f32, !comm.window, i64, !comm.team, i32, !comm.dev_comm) -> ()
  return
}

// -----

func.func @f(%dc: !comm.dev_comm, %win: !comm.window, %a: i64, %n: i32, %peer: i32) {
  %world = comm.team world %dc
  // expected-error@+1 {{operand #0 must be 64-bit signless integer, but got 'i32'}}
  "comm.put"(%n, %win, %a, %win, %a, %world, %peer, %dc) <{coop = 0 : i32, operandSegmentSizes = array<i32: 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0>}>
      : (i32, !comm.window, i64, !comm.window, i64, !comm.team, i32, !comm.dev_comm) -> ()
  return
}

// -----

func.func @f(%dc: !comm.dev_comm) {
  // expected-error@+1 {{expected string or keyword containing one of the following enum values for attribute 'kind' [world, lsa, rail]}}
  %t = comm.team node %dc
  return
}

// -----

func.func @f(%dc: !comm.dev_comm) {
  // expected-error@+1 {{expected string or keyword containing one of the following enum values for attribute 'coop' [thread, warp, block]}}
  comm.flush via %dc coop grid
  return
}

// -----

func.func @f(%dc: !comm.dev_comm, %sig: i32, %n: i64) {
  // expected-error@+1 {{'comm.wait_signal' op attribute 'timeout_ms' failed to satisfy constraint: 64-bit signless integer attribute whose value is positive}}
  %s = comm.wait_signal %sig reaches %n via %dc coop block timeout_ms 0
  return
}

// -----

func.func @f(%dc: !comm.dev_comm, %sig: i32, %n: i64) {
  %none = arith.constant -1 : i32
  // expected-error@+1 {{'comm.wait_signal' op peer: the world rank the signal is waited from, >= 0; got -1 (leave peer out if no one rank raises it)}}
  %s = comm.wait_signal %sig reaches %n peer %none via %dc coop block
  return
}

// -----

func.func @f(%dc: !comm.dev_comm, %idx: i32) {
  %lsa = comm.team lsa %dc
  // expected-error@+1 {{'comm.barrier' op attribute 'timeout_ms' failed to satisfy constraint: 64-bit signless integer attribute whose value is positive}}
  comm.barrier %lsa via %dc index %idx coop block timeout_ms -5
  return
}

// -----

func.func @f(%p: !llvm.ptr, %v: i32) {
  // expected-error@+1 {{'comm.wait_flag' op attribute 'timeout_ms' failed to satisfy constraint: 64-bit signless integer attribute whose value is positive}}
  %s = comm.wait_flag %p ge %v scope sys timeout_ms 0 : !llvm.ptr, i32
  return
}

// -----

func.func @f(%bar: i32, %parity: i1) {
  // expected-error@+1 {{'comm.wait_phase' op attribute 'timeout_ms' failed to satisfy constraint: 64-bit signless integer attribute whose value is positive}}
  comm.wait_phase %bar parity %parity timeout_ms 0
  return
}

// -----

func.func @f(%bar: i64, %parity: i1) {
  // The barrier is a shared-memory address: 32 bits.
  // expected-error@+1 {{'comm.wait_phase' op operand #0 must be 32-bit signless integer, but got 'i64'}}
  "comm.wait_phase"(%bar, %parity) : (i64, i1) -> ()
  return
}

// -----

// A bound the lowering's nanoseconds (64-bit) could not hold: at most 2^31 ms.
func.func @f(%p: !llvm.ptr, %v: i32) {
  // expected-error@+1 {{'comm.wait_flag' op attribute 'timeout_ms' failed to satisfy constraint: 64-bit signless integer attribute whose value is positive whose maximum value is 2147483648}}
  %s = comm.wait_flag %p ge %v scope sys timeout_ms 9300000000000 : !llvm.ptr, i32
  return
}

// -----

func.func @f(%dc: !comm.dev_comm, %i: i32) {
  %lsa = comm.team lsa %dc
  // expected-error@+1 {{'comm.barrier' op attribute 'timeout_ms' failed to satisfy constraint: 64-bit signless integer attribute whose value is positive whose maximum value is 2147483648}}
  comm.barrier %lsa via %dc index %i coop block timeout_ms 2147483649
  return
}

// -----

func.func @f() {
  // expected-error@+1 {{a relaxed fence orders nothing; use acquire, release, acq_rel or sc}}
  comm.fence relaxed scope gpu
  return
}

// -----

func.func @f(%p: !llvm.ptr) {
  // expected-error@+1 {{ordering must be relaxed or acquire, got release}}
  %v = comm.load release scope sys %p : !llvm.ptr -> i32
  return
}

// -----

func.func @f(%p: !llvm.ptr) {
  // expected-error@+1 {{result #0 must be 32-bit signless integer or 64-bit signless integer, but got 'f32'}}
  %v = comm.load acquire scope sys %p : !llvm.ptr -> f32
  return
}

// -----

func.func @f(%p: !llvm.ptr, %v: i32) {
  // expected-error@+1 {{ordering must be relaxed or release, got acquire}}
  comm.store acquire scope sys %v, %p : i32, !llvm.ptr
  return
}

// -----

func.func @f(%p: !llvm.ptr, %v: i32) {
  // expected-error@+1 {{exch is not a reduction; use comm.atomic_rmw}}
  comm.red exch relaxed scope gpu %v, %p : i32, !llvm.ptr
  return
}

// -----

func.func @f(%p: !llvm.ptr, %v: i32) {
  // expected-error@+1 {{ordering must be relaxed or release, got acq_rel}}
  comm.red add acq_rel scope gpu %v, %p : i32, !llvm.ptr
  return
}

// -----

func.func @f(%p: !llvm.ptr, %v: i32) {
  // expected-error@+1 {{failed to verify that all of {value, old} have same type}}
  %old = "comm.atomic_rmw"(%v, %p) <{kind = 0 : i32, ordering = 0 : i32, scope = 2 : i32}> : (i32, !llvm.ptr) -> i64
  return
}

// -----

func.func @f(%p: !llvm.ptr, %v: i32, %w: i64) {
  // expected-error@+1 {{failed to verify that all of {compare, value, old} have same type}}
  %old = "comm.atomic_cas"(%p, %v, %w) <{ordering = 0 : i32, scope = 2 : i32}> : (!llvm.ptr, i32, i64) -> i32
  return
}

// -----

func.func @f(%p: !llvm.ptr, %v: i32) {
  // expected-error@+1 {{failed to verify that all of {value, seen} have same type}}
  %s = "comm.wait_flag"(%p, %v) <{operandSegmentSizes = array<i32: 1, 1, 0, 0>, predicate = 2 : i32, scope = 3 : i32, timeout_ms = 10 : i64}> : (!llvm.ptr, i32) -> i64
  return
}

// -----

func.func @f(%win: !comm.window, %off: i64) {
  // expected-error@+1 {{result #0 must be LLVM pointer type, but got 'i64'}}
  %p = "comm.local_ptr"(%win, %off) : (!comm.window, i64) -> i64
  return
}

// -----

func.func @f(%dc: !comm.dev_comm, %win: !comm.window, %off: i64, %peer: i64) {
  %lsa = comm.team lsa %dc
  // expected-error@+1 {{operand #3 must be 32-bit signless integer, but got 'i64'}}
  %p = "comm.peer_ptr"(%win, %off, %lsa, %peer) : (!comm.window, i64, !comm.team, i64) -> !llvm.ptr
  return
}

// -----

// expected-error@+1 {{unknown  type `socket` in dialect `comm`}}
func.func private @f(!comm.socket)

// -----

func.func @f(%dc: !comm.dev_comm, %p: !llvm.ptr) {
  // expected-error@+1 {{attribute 'stride' failed to satisfy constraint: 64-bit signless integer attribute whose value is positive}}
  %q = comm.rank_params %p stride 0 via %dc : !llvm.ptr
  return
}

// -----

func.func @f(%dc: !comm.dev_comm, %p: !llvm.ptr<1>, %r: i32) {
  // expected-error@+1 {{attribute 'stride' failed to satisfy constraint: 64-bit signless integer attribute whose value is positive}}
  %q = comm.peer_params %p stride -8 peer %r via %dc : !llvm.ptr<1>
  return
}

// -----

// comm.param_table names the by-value parameter table of a kernel.
// expected-error@+1 {{param_table stride must be a positive multiple of 64 bytes, got 100}}
gpu.module @m { gpu.func @k(%t: !llvm.ptr) kernel attributes {comm.param_table = #comm.param_table<arg = 0, stride = 100, ranks = 8>} { gpu.return } }

// -----

// expected-error@+1 {{'comm.param_table' names argument 1 of a function with 1}}
gpu.module @m { gpu.func @k(%t: !llvm.ptr) kernel attributes {comm.param_table = #comm.param_table<arg = 1, stride = 128, ranks = 8>} { gpu.return } }

// -----

// expected-error@+1 {{'comm.param_table' argument 0 must be a generic !llvm.ptr (the table travels by value), got '!llvm.ptr<1>'}}
gpu.module @m { gpu.func @k(%t: !llvm.ptr<1>) kernel attributes {comm.param_table = #comm.param_table<arg = 0, stride = 128, ranks = 8>} { gpu.return } }

// -----

// expected-error@+1 {{unknown comm attribute 'comm.param_tables'}}
func.func private @f() attributes {comm.param_tables = 1 : i64}
