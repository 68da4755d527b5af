// One case per verifier rule of the run dialect.
// RUN: epic-opt %s --split-input-file --verify-diagnostics

func.func @f() {
  // expected-error@+1 {{per_rank must have one entry per rank, got none}}
  %t = run.tokens per_rank []
  return
}

// -----

func.func @f() {
  // expected-error@+1 {{per_rank[1] = -3 is negative}}
  %t = run.tokens per_rank [4, -3]
  return
}

// -----

func.func @f(%t: index) {
  // expected-error@+1 {{result dimension 0 must be dynamic (it is the `rows` operand)}}
  %x = run.random normal seed 1 rows %t : tensor<4x64xbf16>
  return
}

// -----

func.func @f(%t: index) {
  // expected-error@+1 {{result dimension 1 (columns) must be static and positive}}
  %x = run.random normal seed 1 rows %t : tensor<?x?xbf16>
  return
}

// -----

// A row of a 3-D tensor (a rank's expert weights) has a static shape too.
func.func @f(%t: index) {
  // expected-error@+1 {{result dimension 2 (columns) must be static and positive}}
  %x = run.random normal seed 1 rows %t : tensor<?x64x?xbf16>
  return
}

// -----

func.func @f(%t: index) {
  // expected-error@+1 {{scale must be positive and finite, got -1}}
  %x = run.random uniform scale -1.0 seed 1 rows %t : tensor<?x8xf32>
  return
}

// -----

func.func @f(%t: index) {
  // expected-error@+1 {{must be 2D/3D tensor of bfloat16 type or 16-bit float or 32-bit float or f8E4M3FN type or f8E5M2 type values}}
  %x = run.random normal seed 1 rows %t : tensor<?x8xi32>
  return
}

// -----

func.func @f(%t: index) {
  // expected-error@+1 {{top-k (8) cannot exceed experts (4): the experts of a token are distinct}}
  %i = run.routing experts 4 seed 1 rows %t : tensor<?x8xi64>
  return
}

// -----

func.func @f(%t: index) {
  // expected-error@+1 {{masked must be a probability in [0, 1], got 1.5}}
  %i = run.routing experts 4 masked 1.5 seed 1 rows %t : tensor<?x2xi64>
  return
}

// -----

func.func @f(%t: index) {
  // expected-error@+1 {{must be 2D tensor of 64-bit signless integer values}}
  %i = run.routing experts 4 seed 1 rows %t : tensor<?x2xi32>
  return
}

// -----

func.func @f(%v: f32) {
  // expected-error@+1 {{prints an index, a ranked tensor or an !ep.handle, got 'f32'}}
  run.print %v : f32
  return
}

// -----

func.func @f(%t: index) {
  // expected-error@+1 {{rows must be non-negative, got -1}}
  run.print %t rows -1 : index
  return
}
