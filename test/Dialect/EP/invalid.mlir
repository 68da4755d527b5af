// One case per verifier rule of the ep dialect.
// RUN: epic-opt %s --split-input-file --verify-diagnostics

//===----------------------------------------------------------------------===//
// #ep.config
//===----------------------------------------------------------------------===//

// expected-error@+1 {{ranks must be in [1, 1024], got 0}}
#c = #ep.config<ranks = 0, experts = 8, topk = 2, hidden = 64, dtype = bf16, max_tokens_per_rank = 8>
func.func private @f() attributes {cfg = #c}

// -----

// expected-error@+1 {{ranks must be in [1, 1024], got 2048}}
#c = #ep.config<ranks = 2048, experts = 2048, topk = 2, hidden = 64, dtype = bf16, max_tokens_per_rank = 8>
func.func private @f() attributes {cfg = #c}

// -----

// expected-error@+1 {{experts must be in [1, 2048], got 4096}}
#c = #ep.config<ranks = 16, experts = 4096, topk = 2, hidden = 64, dtype = bf16, max_tokens_per_rank = 8>
func.func private @f() attributes {cfg = #c}

// -----

// expected-error@+1 {{experts (100) must be divisible by ranks (8)}}
#c = #ep.config<ranks = 8, experts = 100, topk = 2, hidden = 64, dtype = bf16, max_tokens_per_rank = 8>
func.func private @f() attributes {cfg = #c}

// -----

// expected-error@+1 {{scaleup_ranks (3) must divide ranks (8): every node has the same number of ranks}}
#c = #ep.config<ranks = 8, experts = 64, topk = 2, hidden = 64, dtype = bf16, scaleup_ranks = 3>
func.func private @f() attributes {cfg = #c}

// -----

// expected-error@+1 {{scaleup_ranks (16) must divide ranks (8)}}
#c = #ep.config<ranks = 8, experts = 64, topk = 2, hidden = 64, dtype = bf16, scaleup_ranks = 16>
func.func private @f() attributes {cfg = #c}

// -----

// expected-error@+1 {{scaleup_ranks must be in [0, 1024], got 2048}}
#c = #ep.config<ranks = 8, experts = 64, topk = 2, hidden = 64, dtype = bf16, scaleup_ranks = 2048>
func.func private @f() attributes {cfg = #c}

// -----

// expected-error@+1 {{mode = hybrid needs more than one node, but scaleup_ranks (8) puts all 8 ranks in one: use mode = direct}}
#c = #ep.config<ranks = 8, experts = 64, topk = 2, hidden = 64, dtype = bf16, mode = hybrid>
func.func private @f() attributes {cfg = #c}

// -----

// expected-error@+1 {{nodes (ranks / scaleup_ranks) in hybrid mode must be in [2, 32], got 64}}
#c = #ep.config<ranks = 64, experts = 64, topk = 2, hidden = 64, dtype = bf16, scaleup_ranks = 1, mode = hybrid>
func.func private @f() attributes {cfg = #c}

// -----

// expected-error@+1 {{scaleup_ranks in hybrid mode must be in [1, 64], got 128}}
#c = #ep.config<ranks = 256, experts = 256, topk = 2, hidden = 64, dtype = bf16, scaleup_ranks = 128, mode = hybrid>
func.func private @f() attributes {cfg = #c}

// -----

// expected-error@+2 {{expected ::epic::ep::Mode to be one of: direct, hybrid}}
// expected-error@+1 {{failed to parse EP_ConfigAttr parameter 'mode'}}
#c = #ep.config<ranks = 8, experts = 64, topk = 2, hidden = 64, dtype = bf16, mode = relay>
func.func private @f() attributes {cfg = #c}

// -----

// expected-error@+1 {{experts per rank must be at most 256, got 512}}
#c = #ep.config<ranks = 1, experts = 512, topk = 2, hidden = 64, dtype = bf16, max_tokens_per_rank = 8>
func.func private @f() attributes {cfg = #c}

// -----

// expected-error@+1 {{topk must be in [1, 32], got 33}}
#c = #ep.config<ranks = 8, experts = 256, topk = 33, hidden = 64, dtype = bf16, max_tokens_per_rank = 8>
func.func private @f() attributes {cfg = #c}

// -----

// expected-error@+1 {{topk must be in [1, 32], got 0}}
#c = #ep.config<ranks = 8, experts = 256, topk = 0, hidden = 64, dtype = bf16, max_tokens_per_rank = 8>
func.func private @f() attributes {cfg = #c}

// -----

// expected-error@+1 {{topk (8) exceeds experts (4)}}
#c = #ep.config<ranks = 4, experts = 4, topk = 8, hidden = 64, dtype = bf16, max_tokens_per_rank = 8>
func.func private @f() attributes {cfg = #c}

// -----

// expected-error@+1 {{dtype must be bf16, f16, f32, f8E4M3FN or f8E5M2, got 'i32'}}
#c = #ep.config<ranks = 8, experts = 64, topk = 2, hidden = 64, dtype = i32, max_tokens_per_rank = 8>
func.func private @f() attributes {cfg = #c}

// -----

// expected-error@+1 {{hidden must be in [1, 1048576], got 0}}
#c = #ep.config<ranks = 8, experts = 64, topk = 2, hidden = 0, dtype = bf16, max_tokens_per_rank = 8>
func.func private @f() attributes {cfg = #c}

// -----

// expected-error@+1 {{hidden bytes (100 x 'bf16' = 200 bytes) must be a multiple of 16 for vector copies}}
#c = #ep.config<ranks = 8, experts = 64, topk = 2, hidden = 100, dtype = bf16, max_tokens_per_rank = 8>
func.func private @f() attributes {cfg = #c}

// -----

// expected-error@+1 {{FP8 data ('f8E4M3FN') needs scale packs: scale_packs must be positive}}
#c = #ep.config<ranks = 8, experts = 64, topk = 2, hidden = 128, dtype = f8E4M3FN, max_tokens_per_rank = 8>
func.func private @f() attributes {cfg = #c}

// -----

// expected-error@+1 {{scale_packs (4) are only allowed with FP8 data, not 'bf16'}}
#c = #ep.config<ranks = 8, experts = 64, topk = 2, hidden = 128, dtype = bf16, scale_packs = 4, max_tokens_per_rank = 8>
func.func private @f() attributes {cfg = #c}

// -----

// expected-error@+1 {{expert_alignment must be in [1, 1024], got 0}}
#c = #ep.config<ranks = 8, experts = 64, topk = 2, hidden = 128, dtype = bf16, expert_alignment = 0, max_tokens_per_rank = 8>
func.func private @f() attributes {cfg = #c}

// -----

// The kernels' 32-bit row and element indices: R x Tmax rows of K + 2 ints.
// expected-error@+1 {{hidden must be in [1, 1048576], got 2097152}}
#c = #ep.config<ranks = 8, experts = 64, topk = 2, hidden = 2097152, dtype = bf16, max_tokens_per_rank = 8>
func.func private @f() attributes {cfg = #c}

// -----

// expected-error@+1 {{max_tokens_per_rank 4194304 needs 4294967296 rows of up to 4 elements (ids and metadata, scale packs): more than the kernels' 32-bit element indices address (2147482623)}}
#c = #ep.config<ranks = 1024, experts = 2048, topk = 2, hidden = 128, dtype = bf16, max_tokens_per_rank = 4194304>
func.func private @f() attributes {cfg = #c}

// -----

// Scale packs per row count too: 4096 tokens x 8 ranks x 2^16 packs.
// expected-error@+1 {{max_tokens_per_rank 4096 needs 32768 rows of up to 65536 elements}}
#c = #ep.config<ranks = 8, experts = 64, topk = 2, hidden = 128, dtype = f8E4M3FN, scale_packs = 65536, max_tokens_per_rank = 4096>
func.func private @f() attributes {cfg = #c}

// -----

// expected-error@+1 {{scale_packs must be in [0, 65536], got 1048576}}
#c = #ep.config<ranks = 8, experts = 64, topk = 2, hidden = 128, dtype = f8E4M3FN, scale_packs = 1048576, max_tokens_per_rank = 4096>
func.func private @f() attributes {cfg = #c}

// -----

// The expanded layout's rows: align(R x Tmax x min(K, L) + (A - 1) x L, A).
// expected-error@+1 {{max_tokens_per_rank 33554432 needs 1073742848 rows of up to 6 elements}}
#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, expert_alignment = 128, layout = expanded, max_tokens_per_rank = 33554432>
func.func private @f() attributes {cfg = #c}

// -----

// expected-error@+1 {{expert_alignment must be in [1, 1024], got 2147483648}}
#c = #ep.config<ranks = 8, experts = 64, topk = 2, hidden = 128, dtype = bf16, expert_alignment = 2147483648, max_tokens_per_rank = 8>
func.func private @f() attributes {cfg = #c}

// -----

// expected-error@+2 {{expected a non-negative integer below 2^32, got 1099511627776}}
// expected-error@+1 {{failed to parse EP_ConfigAttr parameter 'hidden'}}
#c = #ep.config<ranks = 8, experts = 64, topk = 2, hidden = 1099511627776, dtype = bf16, max_tokens_per_rank = 8>
func.func private @f() attributes {cfg = #c}

// -----

// A negative field is refused as written, not read as 2^32 - 1.
// expected-error@+2 {{expected a non-negative integer below 2^32, got -1}}
// expected-error@+1 {{failed to parse EP_ConfigAttr parameter 'num_sms'}}
#c = #ep.config<ranks = 8, experts = 64, topk = 2, hidden = 128, dtype = bf16, num_sms = -1, max_tokens_per_rank = 8>
func.func private @f() attributes {cfg = #c}

// -----

// expected-error@+2 {{expected a non-negative integer below 2^32, got -1}}
// expected-error@+1 {{failed to parse EP_ConfigAttr parameter 'expert_alignment'}}
#c = #ep.config<ranks = 8, experts = 64, topk = 2, hidden = 128, dtype = bf16, expert_alignment = -1, max_tokens_per_rank = 8>
func.func private @f() attributes {cfg = #c}

// -----

// expected-error@+1 {{num_sms must be in [0, 1024], got 5000}}
#c = #ep.config<ranks = 8, experts = 64, topk = 2, hidden = 128, dtype = bf16, num_sms = 5000, max_tokens_per_rank = 8>
func.func private @f() attributes {cfg = #c}

// -----

// expected-error@+2 {{expected ::epic::ep::Layout to be one of: plain, expanded}}
// expected-error@+1 {{failed to parse EP_ConfigAttr parameter 'layout'}}
#c = #ep.config<ranks = 8, experts = 64, topk = 2, hidden = 128, dtype = bf16, layout = sorted, max_tokens_per_rank = 8>
func.func private @f() attributes {cfg = #c}


//===----------------------------------------------------------------------===//
// ep.dispatch_layout
//===----------------------------------------------------------------------===//

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 64>
func.func @f(%idx: tensor<?x2xi64>) {
  // expected-error@+1 {{topk_idx dimension 1 (top-k) must be 4, got 2}}
  %r, %e, %in = ep.dispatch_layout %idx config #c
      : tensor<?x2xi64> -> tensor<8xi32>, tensor<64xi32>, tensor<?x8xi1>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 64>
func.func @f(%idx: tensor<65x4xi64>) {
  // expected-error@+1 {{topk_idx dimension 0 (tokens) is 65, more than the maximum 64}}
  %r, %e, %in = ep.dispatch_layout %idx config #c
      : tensor<65x4xi64> -> tensor<8xi32>, tensor<64xi32>, tensor<65x8xi1>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 64>
func.func @f(%idx: tensor<?x4xi64>) {
  // expected-error@+1 {{num_tokens_per_rank dimension 0 (ranks) must be 8, got 4}}
  %r, %e, %in = ep.dispatch_layout %idx config #c
      : tensor<?x4xi64> -> tensor<4xi32>, tensor<64xi32>, tensor<?x8xi1>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 64>
func.func @f(%idx: tensor<?x4xi64>) {
  // expected-error@+1 {{num_tokens_per_expert dimension 0 (experts) must be static}}
  %r, %e, %in = ep.dispatch_layout %idx config #c
      : tensor<?x4xi64> -> tensor<8xi32>, tensor<?xi32>, tensor<?x8xi1>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 64>
func.func @f(%idx: tensor<?x4xi64>) {
  // expected-error@+1 {{is_token_in_rank dimension 1 (ranks) must be 8, got 7}}
  %r, %e, %in = ep.dispatch_layout %idx config #c
      : tensor<?x4xi64> -> tensor<8xi32>, tensor<64xi32>, tensor<?x7xi1>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 64>
func.func @f(%idx: tensor<16x4xi64>) {
  // expected-error@+1 {{topk_idx and is_token_in_rank disagree on the token count: 16 vs 15}}
  %r, %e, %in = ep.dispatch_layout %idx config #c
      : tensor<16x4xi64> -> tensor<8xi32>, tensor<64xi32>, tensor<15x8xi1>
  return
}

//===----------------------------------------------------------------------===//
// ep.dispatch
//===----------------------------------------------------------------------===//

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 64>
func.func @f(%x: tensor<?x128xf16>, %idx: tensor<?x4xi64>) {
  // expected-error@+1 {{x element type must be 'bf16', got 'f16'}}
  %rx, %ri, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) config #c
      : tensor<?x128xf16> -> tensor<?x128xbf16>, tensor<?x4xi64>, !ep.handle<#c>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 64>
func.func @f(%x: tensor<?x256xbf16>, %idx: tensor<?x4xi64>) {
  // expected-error@+1 {{x dimension 1 (hidden) must be 128, got 256}}
  %rx, %ri, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) config #c
      : tensor<?x256xbf16> -> tensor<?x128xbf16>, tensor<?x4xi64>, !ep.handle<#c>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 64>
func.func @f(%x: tensor<?x?xbf16>, %idx: tensor<?x4xi64>) {
  // expected-error@+1 {{x dimension 1 (hidden) must be static}}
  %rx, %ri, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) config #c
      : tensor<?x?xbf16> -> tensor<?x128xbf16>, tensor<?x4xi64>, !ep.handle<#c>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 64>
func.func @f(%x: tensor<100x128xbf16>, %idx: tensor<100x4xi64>) {
  // expected-error@+1 {{x dimension 0 (tokens) is 100, more than the maximum 64}}
  %rx, %ri, %h = ep.dispatch %x topk(%idx : tensor<100x4xi64>) config #c
      : tensor<100x128xbf16> -> tensor<?x128xbf16>, tensor<?x4xi64>, !ep.handle<#c>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 64>
func.func @f(%x: tensor<?x128xbf16>, %idx: tensor<?x4xi64>, %h: !ep.handle<#c>) {
  // expected-error@+1 {{takes either topk(...) or cached(...), not both}}
  %rx, %ri, %h2 = ep.dispatch %x topk(%idx : tensor<?x4xi64>) cached(%h : !ep.handle<#c>) config #c
      : tensor<?x128xbf16> -> tensor<?x128xbf16>, tensor<?x4xi64>, !ep.handle<#c>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 64>
func.func @f(%x: tensor<?x128xbf16>) {
  // expected-error@+1 {{needs topk(...) routing or a cached(...) handle}}
  %rx, %ri, %h = ep.dispatch %x config #c
      : tensor<?x128xbf16> -> tensor<?x128xbf16>, tensor<?x4xi64>, !ep.handle<#c>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 64>
func.func @f(%x: tensor<?x128xbf16>, %idx: tensor<?x8xi64>) {
  // expected-error@+1 {{topk_idx dimension 1 (top-k) must be 4, got 8}}
  %rx, %ri, %h = ep.dispatch %x topk(%idx : tensor<?x8xi64>) config #c
      : tensor<?x128xbf16> -> tensor<?x128xbf16>, tensor<?x4xi64>, !ep.handle<#c>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 64>
func.func @f(%x: tensor<16x128xbf16>, %idx: tensor<32x4xi64>) {
  // expected-error@+1 {{x and topk_idx disagree on the token count: 16 vs 32}}
  %rx, %ri, %h = ep.dispatch %x topk(%idx : tensor<32x4xi64>) config #c
      : tensor<16x128xbf16> -> tensor<?x128xbf16>, tensor<?x4xi64>, !ep.handle<#c>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 64>
#d = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 128>
func.func @f(%x: tensor<?x128xbf16>, %h: !ep.handle<#d>) {
  // expected-error@+1 {{cached handle was made by a dispatch with another configuration}}
  %rx, %ri, %h2 = ep.dispatch %x cached(%h : !ep.handle<#d>) config #c
      : tensor<?x128xbf16> -> tensor<?x128xbf16>, tensor<?x4xi64>, !ep.handle<#c>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 64>
func.func @f(%x: tensor<?x128xbf16>, %w: tensor<?x4xf32>, %h: !ep.handle<#c>) {
  // expected-error@+1 {{takes no weights(...) with cached(...): a cached dispatch moves rows along the handle's routing}}
  %rx, %ri, %rw, %h2 = ep.dispatch %x weights(%w : tensor<?x4xf32>) cached(%h : !ep.handle<#c>) config #c
      : tensor<?x128xbf16> -> tensor<?x128xbf16>, tensor<?x4xi64>, tensor<?x4xf32>, !ep.handle<#c>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = f8E4M3FN, scale_packs = 1, max_tokens_per_rank = 64>
func.func @f(%x: tensor<?x128xf8E4M3FN>, %idx: tensor<?x4xi64>) {
  // expected-error@+1 {{FP8 data ('f8E4M3FN') needs scales(...) scale packs}}
  %rx, %ri, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) config #c
      : tensor<?x128xf8E4M3FN> -> tensor<?x128xf8E4M3FN>, tensor<?x4xi64>, !ep.handle<#c>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 64>
func.func @f(%x: tensor<?x128xbf16>, %sf: tensor<?x1xf32>, %idx: tensor<?x4xi64>) {
  // expected-error@+1 {{scale packs are only allowed with FP8 data, not 'bf16'}}
  %rx, %rsf, %ri, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) scales(%sf : tensor<?x1xf32>) config #c
      : tensor<?x128xbf16> -> tensor<?x128xbf16>, tensor<?x1xf32>, tensor<?x4xi64>, !ep.handle<#c>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 256, dtype = f8E4M3FN, scale_packs = 2, max_tokens_per_rank = 64>
func.func @f(%x: tensor<?x256xf8E4M3FN>, %sf: tensor<?x8xf32>, %idx: tensor<?x4xi64>) {
  // expected-error@+1 {{scale_packs dimension 1 (packs per row) must be 2, got 8}}
  %rx, %rsf, %ri, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) scales(%sf : tensor<?x8xf32>) config #c
      : tensor<?x256xf8E4M3FN> -> tensor<?x256xf8E4M3FN>, tensor<?x8xf32>, tensor<?x4xi64>, !ep.handle<#c>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 256, dtype = f8E4M3FN, scale_packs = 2, max_tokens_per_rank = 64>
func.func @f(%x: tensor<?x256xf8E4M3FN>, %sf: tensor<?x2xf16>, %idx: tensor<?x4xi64>) {
  // expected-error@+1 {{operand #2 must be 2D tensor of 32-bit float or 32-bit signless integer values}}
  %rx, %rsf, %ri, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) scales(%sf : tensor<?x2xf16>) config #c
      : tensor<?x256xf8E4M3FN> -> tensor<?x256xf8E4M3FN>, tensor<?x2xf16>, tensor<?x4xi64>, !ep.handle<#c>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 64>
func.func @f(%x: tensor<?x128xbf16>, %idx: tensor<?x4xi64>, %w: tensor<?x3xf32>) {
  // expected-error@+1 {{topk_weights dimension 1 (top-k) must be 4, got 3}}
  %rx, %ri, %rw, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) weights(%w : tensor<?x3xf32>) config #c
      : tensor<?x128xbf16> -> tensor<?x128xbf16>, tensor<?x4xi64>, tensor<?x4xf32>, !ep.handle<#c>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 64>
func.func @f(%x: tensor<?x128xbf16>, %idx: tensor<?x4xi64>) {
  // expected-error@+1 {{recv_x dimension 0 (received rows) is 1000, more than the maximum 512}}
  %rx, %ri, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) config #c
      : tensor<?x128xbf16> -> tensor<1000x128xbf16>, tensor<?x4xi64>, !ep.handle<#c>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 64>
func.func @f(%x: tensor<?x128xbf16>, %idx: tensor<?x4xi64>) {
  // expected-error@+1 {{recv_topk_idx element type must be 'i64', got 'i32'}}
  %rx, %ri, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) config #c
      : tensor<?x128xbf16> -> tensor<?x128xbf16>, tensor<?x4xi32>, !ep.handle<#c>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 64>
func.func @f(%x: tensor<?x128xbf16>, %idx: tensor<?x4xi64>) {
  // expected-error@+1 {{recv_x and recv_topk_idx disagree on the received row count: 8 vs 9}}
  %rx, %ri, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) config #c
      : tensor<?x128xbf16> -> tensor<8x128xbf16>, tensor<9x4xi64>, !ep.handle<#c>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, layout = expanded, max_tokens_per_rank = 64>
func.func @f(%x: tensor<?x128xbf16>, %idx: tensor<?x4xi64>, %w: tensor<?x4xf32>) {
  // expected-error@+1 {{recv_topk_weights must have rank 1, got 'tensor<?x4xf32>'}}
  %rx, %rw, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) weights(%w : tensor<?x4xf32>) config #c
      : tensor<?x128xbf16> -> tensor<?x128xbf16>, tensor<?x4xf32>, !ep.handle<#c>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 64>
#d = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 128>
func.func @f(%x: tensor<?x128xbf16>, %idx: tensor<?x4xi64>) {
  // expected-error@+1 {{result handle type must carry the op's configuration}}
  %rx, %ri, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) config #c
      : tensor<?x128xbf16> -> tensor<?x128xbf16>, tensor<?x4xi64>, !ep.handle<#d>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 64>
func.func @f(%x: tensor<?x128xbf16>, %idx: tensor<?x4xi64>) {
  // expected-error@+1 {{zero_padding needs the expanded layout: the plain layout has no padding rows}}
  %rx, %ri, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) zero_padding config #c
      : tensor<?x128xbf16> -> tensor<?x128xbf16>, tensor<?x4xi64>, !ep.handle<#c>
  return
}

// -----

// The result list is decided by the layout; the generic form can still get it wrong.
#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 64>
func.func @f(%x: tensor<?x128xbf16>, %idx: tensor<?x4xi64>) {
  // expected-error@+1 {{with the plain layout needs a recv_topk_idx result}}
  %rx, %h = "ep.dispatch"(%x, %idx) <{config = #c, operandSegmentSizes = array<i32: 1, 1, 0, 0, 0>, resultSegmentSizes = array<i32: 1, 0, 0, 0, 1>}>
      : (tensor<?x128xbf16>, tensor<?x4xi64>) -> (tensor<?x128xbf16>, !ep.handle<#c>)
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, layout = expanded, max_tokens_per_rank = 64>
func.func @f(%x: tensor<?x128xbf16>, %idx: tensor<?x4xi64>) {
  // expected-error@+1 {{with the expanded layout has no recv_topk_idx result}}
  %rx, %ri, %h = "ep.dispatch"(%x, %idx) <{config = #c, operandSegmentSizes = array<i32: 1, 1, 0, 0, 0>, resultSegmentSizes = array<i32: 1, 0, 1, 0, 1>}>
      : (tensor<?x128xbf16>, tensor<?x4xi64>) -> (tensor<?x128xbf16>, tensor<?x4xi64>, !ep.handle<#c>)
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 64>
func.func @f(%x: tensor<?x128xbf16>, %idx: tensor<?x4xi64>) {
  // expected-error@+1 {{has a recv_topk_weights result iff it has weights}}
  %rx, %ri, %rw, %h = "ep.dispatch"(%x, %idx) <{config = #c, operandSegmentSizes = array<i32: 1, 1, 0, 0, 0>, resultSegmentSizes = array<i32: 1, 0, 1, 1, 1>}>
      : (tensor<?x128xbf16>, tensor<?x4xi64>) -> (tensor<?x128xbf16>, tensor<?x4xi64>, tensor<?x4xf32>, !ep.handle<#c>)
  return
}

//===----------------------------------------------------------------------===//
// ep.combine
//===----------------------------------------------------------------------===//

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 64>
func.func @f(%y: tensor<?x128xf32>, %h: !ep.handle<#c>) {
  // expected-error@+1 {{operand #0 must be 2D tensor of bfloat16 type values, but got 'tensor<?x128xf32>'}}
  %out = "ep.combine"(%y, %h) <{operandSegmentSizes = array<i32: 1, 1, 0, 0>}>
      : (tensor<?x128xf32>, !ep.handle<#c>) -> tensor<?x128xbf16>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 64>
func.func @f(%y: tensor<?x64xbf16>, %h: !ep.handle<#c>) {
  // expected-error@+1 {{x dimension 1 (hidden) must be 128, got 64}}
  %out = ep.combine %y, %h : tensor<?x64xbf16>, !ep.handle<#c> -> tensor<?x128xbf16>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 64>
func.func @f(%y: tensor<600x128xbf16>, %h: !ep.handle<#c>) {
  // expected-error@+1 {{x dimension 0 (rows) is 600, more than the maximum 512}}
  %out = ep.combine %y, %h : tensor<600x128xbf16>, !ep.handle<#c> -> tensor<?x128xbf16>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 64>
func.func @f(%y: tensor<?x128xbf16>, %h: !ep.handle<#c>, %w: tensor<?x2xf32>) {
  // expected-error@+1 {{topk_weights dimension 1 (top-k) must be 4, got 2}}
  %out, %ow = ep.combine %y, %h weights(%w : tensor<?x2xf32>)
      : tensor<?x128xbf16>, !ep.handle<#c> -> tensor<?x128xbf16>, tensor<?x4xf32>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, layout = expanded, max_tokens_per_rank = 64>
func.func @f(%y: tensor<?x128xbf16>, %h: !ep.handle<#c>, %w: tensor<?x4xf32>) {
  // expected-error@+1 {{topk_weights must have rank 1, got 'tensor<?x4xf32>'}}
  %out, %ow = ep.combine %y, %h weights(%w : tensor<?x4xf32>)
      : tensor<?x128xbf16>, !ep.handle<#c> -> tensor<?x128xbf16>, tensor<?x4xf32>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 64>
func.func @f(%y: tensor<?x128xbf16>, %h: !ep.handle<#c>, %b: tensor<?x128xbf16>) {
  // expected-error@+1 {{takes at most two biases, got 3}}
  %out = ep.combine %y, %h bias(%b, %b, %b : tensor<?x128xbf16>, tensor<?x128xbf16>, tensor<?x128xbf16>)
      : tensor<?x128xbf16>, !ep.handle<#c> -> tensor<?x128xbf16>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 64>
func.func @f(%y: tensor<?x128xbf16>, %h: !ep.handle<#c>, %b: tensor<?x256xbf16>) {
  // expected-error@+1 {{bias #0 dimension 1 (hidden) must be 128, got 256}}
  %out = ep.combine %y, %h bias(%b : tensor<?x256xbf16>)
      : tensor<?x128xbf16>, !ep.handle<#c> -> tensor<?x128xbf16>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 64>
func.func @f(%y: tensor<?x128xbf16>, %h: !ep.handle<#c>, %b: tensor<16x128xbf16>) {
  // expected-error@+1 {{combined_x and bias #0 disagree on the token count: 32 vs 16}}
  %out = ep.combine %y, %h bias(%b : tensor<16x128xbf16>)
      : tensor<?x128xbf16>, !ep.handle<#c> -> tensor<32x128xbf16>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 64>
func.func @f(%y: tensor<?x128xbf16>, %h: !ep.handle<#c>) {
  // expected-error@+1 {{combined_x dimension 0 (tokens) is 65, more than the maximum 64}}
  %out = ep.combine %y, %h : tensor<?x128xbf16>, !ep.handle<#c> -> tensor<65x128xbf16>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 64>
func.func @f(%y: tensor<?x128xbf16>, %h: !ep.handle<#c>, %w: tensor<?x4xf32>) {
  // expected-error@+1 {{combined_topk_weights dimension 1 (top-k) must be 4, got 5}}
  %out, %ow = ep.combine %y, %h weights(%w : tensor<?x4xf32>)
      : tensor<?x128xbf16>, !ep.handle<#c> -> tensor<?x128xbf16>, tensor<?x5xf32>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 64>
func.func @f(%y: tensor<?x128xbf16>, %h: !ep.handle<#c>) {
  // expected-error@+1 {{has a combined_topk_weights result iff it has weights}}
  %out, %ow = "ep.combine"(%y, %h) <{operandSegmentSizes = array<i32: 1, 1, 0, 0>}>
      : (tensor<?x128xbf16>, !ep.handle<#c>) -> (tensor<?x128xbf16>, tensor<?x4xf32>)
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 64>
func.func @f(%x: tensor<?x128xbf16>, %w: tensor<8x128x256xbf16>, %h: !ep.handle<#c>) {
  // expected-error@+1 {{needs the expanded layout (one row per (token, local expert) pair, grouped by expert); the handle's configuration is plain}}
  %y = ep.grouped_gemm %x, %w layout(%h : !ep.handle<#c>) : tensor<?x128xbf16>, tensor<8x128x256xbf16> -> tensor<?x256xbf16>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, layout = expanded, max_tokens_per_rank = 64>
func.func @f(%x: tensor<?x128xbf16>, %w: tensor<4x128x256xbf16>, %h: !ep.handle<#c>) {
  // expected-error@+1 {{rhs dimension 0 (local experts) must be 8, got 4}}
  %y = ep.grouped_gemm %x, %w layout(%h : !ep.handle<#c>) : tensor<?x128xbf16>, tensor<4x128x256xbf16> -> tensor<?x256xbf16>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, layout = expanded, max_tokens_per_rank = 64>
func.func @f(%x: tensor<?x128xbf16>, %w: tensor<8x64x256xbf16>, %h: !ep.handle<#c>) {
  // expected-error@+1 {{rhs dimension 1 (K) must be 128, got 64}}
  %y = ep.grouped_gemm %x, %w layout(%h : !ep.handle<#c>) : tensor<?x128xbf16>, tensor<8x64x256xbf16> -> tensor<?x256xbf16>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, layout = expanded, max_tokens_per_rank = 64>
func.func @f(%x: tensor<?x128xbf16>, %w: tensor<8x128x256xbf16>, %h: !ep.handle<#c>) {
  // expected-error@+1 {{result dimension 1 (N) must be 256, got 128}}
  %y = ep.grouped_gemm %x, %w layout(%h : !ep.handle<#c>) : tensor<?x128xbf16>, tensor<8x128x256xbf16> -> tensor<?x128xbf16>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, layout = expanded, max_tokens_per_rank = 64>
func.func @f(%x: tensor<?x128xbf16>, %w: tensor<8x128x256xf16>, %h: !ep.handle<#c>) {
  // expected-error@+1 {{rhs element type must be 'bf16', got 'f16'}}
  %y = ep.grouped_gemm %x, %w layout(%h : !ep.handle<#c>) : tensor<?x128xbf16>, tensor<8x128x256xf16> -> tensor<?x256xbf16>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = f8E4M3FN, scale_packs = 1, layout = expanded, max_tokens_per_rank = 64>
func.func @f(%x: tensor<?x128xbf16>, %w: tensor<8x128x256xbf16>, %h: !ep.handle<#c>) {
  // expected-error@+1 {{lhs element type 'bf16' differs from the dispatch's 'f8E4M3FN'}}
  %y = ep.grouped_gemm %x, %w layout(%h : !ep.handle<#c>) : tensor<?x128xbf16>, tensor<8x128x256xbf16> -> tensor<?x256xbf16>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 256, dtype = f8E4M3FN, scale_packs = 2, layout = expanded, max_tokens_per_rank = 64>
func.func @f(%x: tensor<?x256xf8E4M3FN>, %w: tensor<8x128x256xf8E4M3FN>, %h: !ep.handle<#c>) {
  // expected-error@+1 {{FP8 rows need their block scales: scales(lhs_scales, rhs_scales)}}
  %y = ep.grouped_gemm %x, %w layout(%h : !ep.handle<#c>) : tensor<?x256xf8E4M3FN>, tensor<8x128x256xf8E4M3FN> -> tensor<?x128xbf16>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, layout = expanded, max_tokens_per_rank = 64>
func.func @f(%x: tensor<?x128xbf16>, %w: tensor<8x128x256xbf16>, %h: !ep.handle<#c>, %sx: tensor<?x1xf32>, %sw: tensor<8x2x1xf32>) {
  // expected-error@+1 {{scales apply to FP8 rows only; lhs is 'bf16'}}
  %y = ep.grouped_gemm %x, %w layout(%h : !ep.handle<#c>) scales(%sx, %sw : tensor<?x1xf32>, tensor<8x2x1xf32>) : tensor<?x128xbf16>, tensor<8x128x256xbf16> -> tensor<?x256xbf16>
  return
}

// -----

// FP8 weights are [L, N, hidden]: K contiguous.
#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 256, dtype = f8E4M3FN, scale_packs = 2, layout = expanded, max_tokens_per_rank = 64>
func.func @f(%x: tensor<?x256xf8E4M3FN>, %w: tensor<8x256x128xf8E4M3FN>, %h: !ep.handle<#c>, %sx: tensor<?x2xf32>, %sw: tensor<8x1x2xf32>) {
  // expected-error@+1 {{rhs dimension 2 (K) must be 256, got 128}}
  %y = ep.grouped_gemm %x, %w layout(%h : !ep.handle<#c>) scales(%sx, %sw : tensor<?x2xf32>, tensor<8x1x2xf32>) : tensor<?x256xf8E4M3FN>, tensor<8x256x128xf8E4M3FN> -> tensor<?x256xbf16>
  return
}

// -----

// One UE8M0-packed int32 per row instead of one f32 per 128 channels.
#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 256, dtype = f8E4M3FN, scale_packs = 1, layout = expanded, max_tokens_per_rank = 64>
func.func @f(%x: tensor<?x256xf8E4M3FN>, %w: tensor<8x128x256xf8E4M3FN>, %h: !ep.handle<#c>, %sx: tensor<?x1xf32>, %sw: tensor<8x1x2xf32>) {
  // expected-error@+1 {{lhs_scales dimension 1 (K / 128) must be 2, got 1: the dispatch's scale packs, UE8M0-packed scales are not multiplied yet}}
  %y = ep.grouped_gemm %x, %w layout(%h : !ep.handle<#c>) scales(%sx, %sw : tensor<?x1xf32>, tensor<8x1x2xf32>) : tensor<?x256xf8E4M3FN>, tensor<8x128x256xf8E4M3FN> -> tensor<?x128xbf16>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 256, dtype = f8E4M3FN, scale_packs = 2, layout = expanded, max_tokens_per_rank = 64>
func.func @f(%x: tensor<?x256xf8E4M3FN>, %w: tensor<8x128x256xf8E4M3FN>, %h: !ep.handle<#c>, %sx: tensor<?x2xf32>, %sw: tensor<8x2x2xf32>) {
  // expected-error@+1 {{rhs_scales dimension 1 (N / 128) must be 1, got 2}}
  %y = ep.grouped_gemm %x, %w layout(%h : !ep.handle<#c>) scales(%sx, %sw : tensor<?x2xf32>, tensor<8x2x2xf32>) : tensor<?x256xf8E4M3FN>, tensor<8x128x256xf8E4M3FN> -> tensor<?x128xbf16>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 320, dtype = f8E4M3FN, scale_packs = 2, layout = expanded, max_tokens_per_rank = 64>
func.func @f(%x: tensor<?x320xf8E4M3FN>, %w: tensor<8x128x320xf8E4M3FN>, %h: !ep.handle<#c>, %sx: tensor<?x2xf32>, %sw: tensor<8x1x2xf32>) {
  // expected-error@+1 {{FP8 block scales cover 128 channels: K (320) and N (128) must be multiples of 128}}
  %y = ep.grouped_gemm %x, %w layout(%h : !ep.handle<#c>) scales(%sx, %sw : tensor<?x2xf32>, tensor<8x1x2xf32>) : tensor<?x320xf8E4M3FN>, tensor<8x128x320xf8E4M3FN> -> tensor<?x128xbf16>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, layout = expanded, max_tokens_per_rank = 64>
func.func @f(%x: tensor<10x128xbf16>, %w: tensor<8x128x256xbf16>, %h: !ep.handle<#c>) {
  // expected-error@+1 {{lhs and result disagree on the row count: 10 vs 12}}
  %y = ep.grouped_gemm %x, %w layout(%h : !ep.handle<#c>) : tensor<10x128xbf16>, tensor<8x128x256xbf16> -> tensor<12x256xbf16>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 64>
func.func @f(%x: tensor<?x128xbf16>, %idx: tensor<?x4xi64>, %e: tensor<8x128x256xbf16>) {
  // expected-error@+1 {{fuses an expanded dispatch: the configuration's layout is plain}}
  %rx, %y, %h = ep.dispatch_gemm %x topk(%idx : tensor<?x4xi64>) experts(%e : tensor<8x128x256xbf16>) config #c
      : tensor<?x128xbf16> -> tensor<?x128xbf16>, tensor<?x256xbf16>, !ep.handle<#c>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, layout = expanded, max_tokens_per_rank = 64>
func.func @f(%x: tensor<?x128xbf16>, %idx: tensor<?x4xi64>, %e: tensor<8x128x256xbf16>) {
  // expected-error@+1 {{result dimension 1 (N) must be 256, got 128}}
  %rx, %y, %h = ep.dispatch_gemm %x topk(%idx : tensor<?x4xi64>) experts(%e : tensor<8x128x256xbf16>) config #c
      : tensor<?x128xbf16> -> tensor<?x128xbf16>, tensor<?x128xbf16>, !ep.handle<#c>
  return
}

// -----

// The fused kernels size their scratch by Tmax: it must be part of the configuration.
#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, layout = expanded>
func.func @f(%x: tensor<?x128xbf16>, %idx: tensor<?x4xi64>, %e: tensor<8x128x256xbf16>) {
  // expected-error@+1 {{needs max_tokens_per_rank in its configuration: the fused kernel sizes its tile counters by it}}
  %rx, %y, %h = ep.dispatch_gemm %x topk(%idx : tensor<?x4xi64>) experts(%e : tensor<8x128x256xbf16>) config #c
      : tensor<?x128xbf16> -> tensor<?x128xbf16>, tensor<?x256xbf16>, !ep.handle<#c>
  return
}

// -----

// The fused kernels store into NVLink peers: one node only.
#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, layout = expanded, max_tokens_per_rank = 64, scaleup_ranks = 4>
func.func @f(%x: tensor<?x128xbf16>, %idx: tensor<?x4xi64>, %e: tensor<8x128x256xbf16>) {
  // expected-error@+1 {{needs one NVLink domain: the configuration spans 2 nodes of 4 ranks}}
  %rx, %y, %h = ep.dispatch_gemm %x topk(%idx : tensor<?x4xi64>) experts(%e : tensor<8x128x256xbf16>) config #c
      : tensor<?x128xbf16> -> tensor<?x128xbf16>, tensor<?x256xbf16>, !ep.handle<#c>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, layout = expanded, max_tokens_per_rank = 64, scaleup_ranks = 2, mode = hybrid>
func.func @f(%rx: tensor<?x128xbf16>, %w: tensor<8x128x128xbf16>, %h: !ep.handle<#c>) {
  // expected-error@+1 {{needs one NVLink domain: the configuration spans 4 nodes of 2 ranks}}
  %y, %out = ep.gemm_combine %rx, %w layout(%h : !ep.handle<#c>) : tensor<?x128xbf16>, tensor<8x128x128xbf16> -> tensor<?x128xbf16>, tensor<?x128xbf16>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, layout = expanded>
func.func @f(%rx: tensor<?x128xbf16>, %w: tensor<8x128x128xbf16>, %h: !ep.handle<#c>) {
  // expected-error@+1 {{needs max_tokens_per_rank in its configuration: the fused kernel sizes its scratch by it}}
  %y, %out = ep.gemm_combine %rx, %w layout(%h : !ep.handle<#c>) : tensor<?x128xbf16>, tensor<8x128x128xbf16> -> tensor<?x128xbf16>, tensor<?x128xbf16>
  return
}

// -----

// ep ops become kernels and their launch: never inside a kernel.
#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 8>
gpu.module @kernels {
  gpu.func @k(%idx: tensor<?x4xi64>) kernel {
    // expected-error@+1 {{'ep.dispatch_layout' op is a host-level op (it becomes kernels and their launch): it cannot be inside gpu.func}}
    %r, %e, %in = ep.dispatch_layout %idx config #c
        : tensor<?x4xi64> -> tensor<8xi32>, tensor<64xi32>, tensor<?x8xi1>
    gpu.return
  }
}

// -----

// Window-resident outputs are reached by NVLink pointers: one NVLink domain.
#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, scaleup_ranks = 4>
func.func @f(%x: tensor<?x128xbf16>, %idx: tensor<?x4xi64>) {
  // expected-error@+1 {{window_outputs needs one NVLink domain: peers' windows are reached by their NVLink pointers, and the configuration spans 2 nodes of 4 ranks}}
  %rx, %ri, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) window_outputs config #c
      : tensor<?x128xbf16> -> tensor<?x128xbf16>, tensor<?x4xi64>, !ep.handle<#c>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, scaleup_ranks = 4>
func.func @f(%y: tensor<?x128xbf16>, %h: !ep.handle<#c>) {
  // expected-error@+1 {{window_outputs needs one NVLink domain}}
  %out = ep.combine %y, %h window_outputs : tensor<?x128xbf16>, !ep.handle<#c> -> tensor<?x128xbf16>
  return
}

//===----------------------------------------------------------------------===//
// ep.all_gather, ep.reduce_scatter
//===----------------------------------------------------------------------===//

// -----

func.func @f(%x: tensor<4xf32>) {
  // expected-error@+1 {{result 0 must be 'tensor<8x4xf32>' (ranks x input 0), got 'tensor<4x4xf32>'}}
  %g = ep.all_gather %x ranks 8 : tensor<4xf32> -> tensor<4x4xf32>
  return
}

// -----

func.func @f(%x: tensor<4xf32>) {
  // expected-error@+1 {{has 1 inputs but 2 results}}
  %g:2 = ep.all_gather %x ranks 2 : tensor<4xf32> -> tensor<2x4xf32>, tensor<2x4xf32>
  return
}

// -----

func.func @f() {
  // expected-error@+1 {{needs at least one input}}
  "ep.all_gather"() {ranks = 2 : i64} : () -> ()
  return
}

// -----

func.func @f(%x: tensor<4xf32>) {
  // expected-error@+1 {{attribute 'ranks' failed to satisfy constraint}}
  %g = ep.all_gather %x ranks 0 : tensor<4xf32> -> tensor<0x4xf32>
  return
}

// -----

func.func @f(%x: tensor<6x8xbf16>) {
  // expected-error@+1 {{input dimension 0 (6) must be a multiple of ranks (4)}}
  %y = ep.reduce_scatter %x ranks 4 : tensor<6x8xbf16> -> tensor<1x8xbf16>
  return
}

// -----

func.func @f(%x: tensor<8x8xbf16>) {
  // expected-error@+1 {{result dimension 0 (the input's rows / ranks) must be 2, got 8}}
  %y = ep.reduce_scatter %x ranks 4 : tensor<8x8xbf16> -> tensor<8x8xbf16>
  return
}

// -----

func.func @f(%x: tensor<8x8xbf16>) {
  // expected-error@+1 {{result element type must be the input's ('bf16'), got 'f32'}}
  %y = ep.reduce_scatter %x ranks 4 : tensor<8x8xbf16> -> tensor<2x8xf32>
  return
}

// -----

func.func @f(%x: tensor<8x8xi32>) {
  // expected-error@+1 {{operand #0 must be tensor of bfloat16 type or 16-bit float or 32-bit float values}}
  %y = ep.reduce_scatter %x ranks 4 : tensor<8x8xi32> -> tensor<2x8xi32>
  return
}

// -----

#two_nodes = #ep.config<ranks = 8, experts = 8, topk = 1, hidden = 128, dtype = bf16,
                        scaleup_ranks = 4>
func.func @f(%ids: tensor<?x4xi32>) {
  // expected-error@+1 {{reads the owners' tables through NVLink: every rank must be in one NVLink domain (scaleup_ranks 4 of 8 ranks; across nodes a fetch needs GIN get)}}
  %rows = ep.engram_fetch %ids config #two_nodes : tensor<?x4xi32> -> tensor<?x512xbf16>
  return
}

// -----

#engram = #ep.config<ranks = 4, experts = 4, topk = 1, hidden = 128, dtype = bf16>
func.func @f(%ids: tensor<?x4xi32>) {
  // expected-error@+1 {{rows dimension 1 (entries per token x hidden) must be 512, got 256}}
  %rows = ep.engram_fetch %ids config #engram : tensor<?x4xi32> -> tensor<?x256xbf16>
  return
}

// -----

#engram = #ep.config<ranks = 4, experts = 4, topk = 1, hidden = 128, dtype = bf16>
func.func @f(%ids: tensor<?x?xi32>) {
  // expected-error@+1 {{rows dimension 1 (200) must be a multiple of hidden (128): M entries side by side}}
  %rows = ep.engram_fetch %ids config #engram : tensor<?x?xi32> -> tensor<?x200xbf16>
  return
}

// -----

#engram = #ep.config<ranks = 4, experts = 4, topk = 1, hidden = 128, dtype = bf16>
func.func @f(%ids: tensor<3x4xi32>) {
  // expected-error@+1 {{rows element type must be 'bf16', got 'f16'}}
  %rows = ep.engram_fetch %ids config #engram : tensor<3x4xi32> -> tensor<3x512xf16>
  return
}

// -----

#engram = #ep.config<ranks = 4, experts = 4, topk = 1, hidden = 128, dtype = bf16>
func.func @f(%ids: tensor<3x4xi32>) {
  // expected-error@+1 {{indices and rows disagree on the token count: 3 vs 5}}
  %rows = ep.engram_fetch %ids config #engram : tensor<3x4xi32> -> tensor<5x512xbf16>
  return
}

// -----

#engram = #ep.config<ranks = 4, experts = 4, topk = 1, hidden = 128, dtype = bf16>
func.func @f(%ids: tensor<3x4xi64>) {
  // expected-error@+1 {{operand #0 must be 2D tensor of 32-bit signless integer values}}
  %rows = ep.engram_fetch %ids config #engram : tensor<3x4xi64> -> tensor<3x512xbf16>
  return
}

// -----

func.func @f(%x: tensor<?x96xbf16>) {
  // expected-error@+1 {{result must have the input's type 'tensor<?x96xbf16>' (every rank sends and receives a tensor alike), got 'tensor<?x96xf16>'}}
  %y = ep.pp_send_recv %x ranks 4 to next : tensor<?x96xbf16> -> tensor<?x96xf16>
  return
}

// -----

func.func @f(%x: tensor<?x96xbf16>) {
  // expected-error@+1 {{expected string or keyword containing one of the following enum values for attribute 'to' [next, prev]}}
  %y = ep.pp_send_recv %x ranks 4 to left : tensor<?x96xbf16> -> tensor<?x96xbf16>
  return
}

// -----

func.func @f(%x: tensor<?x96xbf16>) {
  // expected-error@+1 {{attribute 'ranks' failed to satisfy constraint}}
  %y = ep.pp_send_recv %x ranks 0 to next : tensor<?x96xbf16> -> tensor<?x96xbf16>
  return
}

// -----

//===----------------------------------------------------------------------===//
// ep.low_latency_dispatch / ep.low_latency_combine
//===----------------------------------------------------------------------===//

#ll = #ep.config<ranks = 2, experts = 8, topk = 4, hidden = 256, dtype = f8E4M3FN, scale_packs = 2>
func.func @f(%x: tensor<?x256xbf16>, %i: tensor<?x4xi64>) {
  // expected-error@+1 {{ue8m0 scales need round_scale}}
  %a, %b, %c, %d, %e, %f = ep.low_latency_dispatch %x, %i ue8m0 config #ll
      : tensor<?x256xbf16>, tensor<?x4xi64> -> tensor<4x?x256xf8E4M3FN>, scales tensor<4x?x1xi32>,
        tensor<4xi32>, tensor<4x?xi32>, tensor<4x2xi64>, tensor<4x?xi32>
  return
}

// -----

#ll = #ep.config<ranks = 2, experts = 8, topk = 4, hidden = 256, dtype = f8E4M3FN, scale_packs = 2>
func.func @f(%x: tensor<?x256xbf16>, %i: tensor<?x4xi64>) {
  // expected-error@+1 {{an FP8 dispatch returns its scales}}
  %a, %c, %d, %e, %f = ep.low_latency_dispatch %x, %i config #ll
      : tensor<?x256xbf16>, tensor<?x4xi64> -> tensor<4x?x256xf8E4M3FN>,
        tensor<4xi32>, tensor<4x?xi32>, tensor<4x2xi64>, tensor<4x?xi32>
  return
}

// -----

#ll = #ep.config<ranks = 2, experts = 8, topk = 4, hidden = 256, dtype = f8E4M3FN, scale_packs = 2>
func.func @f(%x: tensor<?x256xbf16>, %i: tensor<?x4xi64>) {
  // expected-error@+1 {{scales dimension 2 (scale groups) must be 2, got 3}}
  %a, %b, %c, %d, %e, %f = ep.low_latency_dispatch %x, %i config #ll
      : tensor<?x256xbf16>, tensor<?x4xi64> -> tensor<4x?x256xf8E4M3FN>, scales tensor<4x?x3xf32>,
        tensor<4xi32>, tensor<4x?xi32>, tensor<4x2xi64>, tensor<4x?xi32>
  return
}

// -----

#ll = #ep.config<ranks = 2, experts = 8, topk = 4, hidden = 256, dtype = bf16>
func.func @f(%x: tensor<?x256xbf16>, %i: tensor<?x4xi64>) {
  // expected-error@+1 {{a bf16 dispatch has no scales}}
  %a, %c, %d, %e, %f = ep.low_latency_dispatch %x, %i round_scale config #ll
      : tensor<?x256xbf16>, tensor<?x4xi64> -> tensor<4x?x256xbf16>,
        tensor<4xi32>, tensor<4x?xi32>, tensor<4x2xi64>, tensor<4x?xi32>
  return
}

// -----

#ll = #ep.config<ranks = 2, experts = 8, topk = 4, hidden = 256, dtype = f16>
func.func @f(%x: tensor<?x256xbf16>, %i: tensor<?x4xi64>) {
  // expected-error@+1 {{dtype must be bf16 or f8E4M3FN (the received rows), got 'f16'}}
  %a, %c, %d, %e, %f = ep.low_latency_dispatch %x, %i config #ll
      : tensor<?x256xbf16>, tensor<?x4xi64> -> tensor<4x?x256xbf16>,
        tensor<4xi32>, tensor<4x?xi32>, tensor<4x2xi64>, tensor<4x?xi32>
  return
}

// -----

#ll = #ep.config<ranks = 2, experts = 8, topk = 4, hidden = 200, dtype = bf16>
func.func @f(%x: tensor<?x200xbf16>, %i: tensor<?x4xi64>) {
  // expected-error@+1 {{hidden (200) must be a multiple of 128}}
  %a, %c, %d, %e, %f = ep.low_latency_dispatch %x, %i config #ll
      : tensor<?x200xbf16>, tensor<?x4xi64> -> tensor<4x?x200xbf16>,
        tensor<4xi32>, tensor<4x?xi32>, tensor<4x2xi64>, tensor<4x?xi32>
  return
}

// -----

#ll = #ep.config<ranks = 4, experts = 8, topk = 4, hidden = 256, dtype = bf16, scaleup_ranks = 2>
func.func @f(%x: tensor<?x256xbf16>, %i: tensor<?x4xi64>) {
  // expected-error@+1 {{every rank must be in one NVLink domain}}
  %a, %c, %d, %e, %f = ep.low_latency_dispatch %x, %i config #ll
      : tensor<?x256xbf16>, tensor<?x4xi64> -> tensor<2x?x256xbf16>,
        tensor<2xi32>, tensor<2x?xi32>, tensor<2x4xi64>, tensor<2x?xi32>
  return
}

// -----

#ll = #ep.config<ranks = 2, experts = 8, topk = 4, hidden = 256, dtype = bf16>
func.func @f(%x: tensor<4x?x256xbf16>, %r: tensor<4x3xi64>, %route: tensor<4x?xi32>,
             %i: tensor<?x4xi64>, %w: tensor<?x4xf32>) {
  // expected-error@+1 {{layout_range dimension 1 (ranks) must be 2, got 3}}
  %y = ep.low_latency_combine %x, %r, %route, %i, %w config #ll
      : tensor<4x?x256xbf16>, tensor<4x3xi64>, tensor<4x?xi32>, tensor<?x4xi64>,
        tensor<?x4xf32> -> tensor<?x256xbf16>
  return
}

// -----

#ll = #ep.config<ranks = 2, experts = 8, topk = 4, hidden = 256, dtype = bf16>
func.func @f(%x: tensor<4x?x256xbf16>, %r: tensor<4x2xi64>, %route: tensor<4x?xi32>,
             %i: tensor<5x4xi64>, %w: tensor<6x4xf32>) {
  // expected-error@+1 {{topk_idx and topk_weights disagree on the token count: 5 vs 6}}
  %y = ep.low_latency_combine %x, %r, %route, %i, %w config #ll
      : tensor<4x?x256xbf16>, tensor<4x2xi64>, tensor<4x?xi32>, tensor<5x4xi64>,
        tensor<6x4xf32> -> tensor<?x256xbf16>
  return
}

// -----

// expected-error@+1 {{'ep.fusion' must be "auto", "always" or "never", got "sometimes"}}
func.func @fusion_mode() attributes {ep.fusion = "sometimes"} {
  return
}

// -----

func.func @fusion_on_an_op() {
  // expected-error@+1 {{'ep.fusion' belongs on a function, not on 'arith.constant'}}
  %c = arith.constant {ep.fusion = "always"} 0 : i32
  return
}

// -----

// expected-error@+1 {{unknown ep dialect attribute 'ep.fuse' (the ep dialect's only discardable attribute is 'ep.fusion')}}
func.func @unknown_attribute() attributes {ep.fuse = "always"} {
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 64>
func.func @f(%x: tensor<?x512xbf16>, %h: !ep.handle<#c>) {
  // expected-error@+1 {{needs the expanded layout (one row per (token, local expert) pair, grouped by expert); the handle's configuration is plain}}
  %y = ep.swiglu %x layout(%h : !ep.handle<#c>) : tensor<?x512xbf16> -> tensor<?x256xbf16>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, layout = expanded, max_tokens_per_rank = 64>
func.func @f(%x: tensor<?x384xbf16>, %h: !ep.handle<#c>) {
  // expected-error@+1 {{gate_up holds the gate then the up columns of 128-channel blocks: its 384 columns must be a multiple of 256}}
  %y = ep.swiglu %x layout(%h : !ep.handle<#c>) : tensor<?x384xbf16> -> tensor<?x192xbf16>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, layout = expanded, max_tokens_per_rank = 64>
func.func @f(%x: tensor<?x512xbf16>, %h: !ep.handle<#c>) {
  // expected-error@+1 {{result dimension 1 (the intermediate size) must be 256, got 512}}
  %y = ep.swiglu %x layout(%h : !ep.handle<#c>) : tensor<?x512xbf16> -> tensor<?x512xbf16>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, layout = expanded, max_tokens_per_rank = 64>
func.func @f(%x: tensor<?x512xbf16>, %h: !ep.handle<#c>) {
  // expected-error@+1 {{an FP8 result comes with its block scales: add a second result, f32 [rows, 2]}}
  %y = ep.swiglu %x layout(%h : !ep.handle<#c>) : tensor<?x512xbf16> -> tensor<?x256xf8E4M3FN>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, layout = expanded, max_tokens_per_rank = 64>
func.func @f(%x: tensor<?x512xbf16>, %h: !ep.handle<#c>) {
  // expected-error@+1 {{block scales come with FP8 results only; the result is 'bf16'}}
  %y, %s = ep.swiglu %x layout(%h : !ep.handle<#c>) : tensor<?x512xbf16> -> tensor<?x256xbf16>, tensor<?x2xf32>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, layout = expanded, max_tokens_per_rank = 64>
func.func @f(%x: tensor<?x512xbf16>, %h: !ep.handle<#c>) {
  // expected-error@+1 {{scales dimension 1 (I / 128) must be 2, got 4}}
  %y, %s = ep.swiglu %x layout(%h : !ep.handle<#c>) : tensor<?x512xbf16> -> tensor<?x256xf8E4M3FN>, tensor<?x4xf32>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, layout = expanded, max_tokens_per_rank = 64>
func.func @f(%x: tensor<16x512xbf16>, %h: !ep.handle<#c>) {
  // expected-error@+1 {{gate_up and result disagree on the row count: 16 vs 8}}
  %y = ep.swiglu %x layout(%h : !ep.handle<#c>) : tensor<16x512xbf16> -> tensor<8x256xbf16>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, layout = expanded, max_tokens_per_rank = 64>
func.func @f(%x: tensor<?x?xbf16>, %h: !ep.handle<#c>) {
  // expected-error@+1 {{gate_up dimension 1 (2 x the intermediate size) must be static}}
  %y = ep.swiglu %x layout(%h : !ep.handle<#c>) : tensor<?x?xbf16> -> tensor<?x256xbf16>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, layout = expanded, max_tokens_per_rank = 64>
func.func @f(%x: tensor<16x512xbf16>, %w: tensor<8xf32>, %h: !ep.handle<#c>) {
  // expected-error@+1 {{weights has 8 rows, gate_up 16: one weight per row}}
  %y = ep.swiglu %x layout(%h : !ep.handle<#c>) weights(%w : tensor<8xf32>) : tensor<16x512xbf16> -> tensor<16x256xbf16>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 256, dtype = f8E4M3FN, scale_packs = 2, layout = plain, expert_alignment = 128, max_tokens_per_rank = 64>
func.func @f(%x: tensor<?x256xf8E4M3FN>, %idx: tensor<?x4xi64>, %sf: tensor<?x2xf32>, %w: tensor<?x4xf32>,
             %w13: tensor<8x256x256xf8E4M3FN>, %s13: tensor<8x2x2xf32>, %w2: tensor<8x256x128xf8E4M3FN>,
             %s2: tensor<8x2x1xf32>) {
  // expected-error@+1 {{'ep.moe_layer' op runs an expanded dispatch's rows: the configuration's layout is plain}}
  %o = ep.moe_layer %x topk(%idx : tensor<?x4xi64>) scales(%sf : tensor<?x2xf32>) weights(%w : tensor<?x4xf32>)
      gate_up(%w13, %s13 : tensor<8x256x256xf8E4M3FN>, tensor<8x2x2xf32>)
      down(%w2, %s2 : tensor<8x256x128xf8E4M3FN>, tensor<8x2x1xf32>)
      config #c : tensor<?x256xf8E4M3FN> -> tensor<?x256xbf16>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 256, dtype = f8E4M3FN, scale_packs = 1, layout = expanded, expert_alignment = 128, max_tokens_per_rank = 64>
func.func @f(%x: tensor<?x256xf8E4M3FN>, %idx: tensor<?x4xi64>, %sf: tensor<?x2xf32>, %w: tensor<?x4xf32>,
             %w13: tensor<8x256x256xf8E4M3FN>, %s13: tensor<8x2x2xf32>, %w2: tensor<8x256x128xf8E4M3FN>,
             %s2: tensor<8x2x1xf32>) {
  // expected-error@+1 {{'ep.moe_layer' op needs one f32 scale per 128 channels: scale_packs must be hidden / 128 = 2 (hidden 256 a multiple of 128), got 1}}
  %o = ep.moe_layer %x topk(%idx : tensor<?x4xi64>) scales(%sf : tensor<?x2xf32>) weights(%w : tensor<?x4xf32>)
      gate_up(%w13, %s13 : tensor<8x256x256xf8E4M3FN>, tensor<8x2x2xf32>)
      down(%w2, %s2 : tensor<8x256x128xf8E4M3FN>, tensor<8x2x1xf32>)
      config #c : tensor<?x256xf8E4M3FN> -> tensor<?x256xbf16>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 256, dtype = f8E4M3FN, scale_packs = 2, layout = expanded, expert_alignment = 128, max_tokens_per_rank = 0>
func.func @f(%x: tensor<?x256xf8E4M3FN>, %idx: tensor<?x4xi64>, %sf: tensor<?x2xf32>, %w: tensor<?x4xf32>,
             %w13: tensor<8x256x256xf8E4M3FN>, %s13: tensor<8x2x2xf32>, %w2: tensor<8x256x128xf8E4M3FN>,
             %s2: tensor<8x2x1xf32>) {
  // expected-error@+1 {{'ep.moe_layer' op needs max_tokens_per_rank in its configuration: the kernel's intermediate rows are sized by it}}
  %o = ep.moe_layer %x topk(%idx : tensor<?x4xi64>) scales(%sf : tensor<?x2xf32>) weights(%w : tensor<?x4xf32>)
      gate_up(%w13, %s13 : tensor<8x256x256xf8E4M3FN>, tensor<8x2x2xf32>)
      down(%w2, %s2 : tensor<8x256x128xf8E4M3FN>, tensor<8x2x1xf32>)
      config #c : tensor<?x256xf8E4M3FN> -> tensor<?x256xbf16>
  return
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 256, dtype = f8E4M3FN, scale_packs = 2, layout = expanded, expert_alignment = 128, max_tokens_per_rank = 64>
func.func @f(%x: tensor<?x256xf8E4M3FN>, %idx: tensor<?x4xi64>, %sf: tensor<?x2xf32>, %w: tensor<?x4xf32>,
             %w13: tensor<8x384x256xf8E4M3FN>, %s13: tensor<8x2x2xf32>, %w2: tensor<8x256x128xf8E4M3FN>,
             %s2: tensor<8x2x1xf32>) {
  // expected-error@+1 {{'ep.moe_layer' op gate_up_weights dimension 1 (2 I) must be 256, got 384}}
  %o = ep.moe_layer %x topk(%idx : tensor<?x4xi64>) scales(%sf : tensor<?x2xf32>) weights(%w : tensor<?x4xf32>)
      gate_up(%w13, %s13 : tensor<8x384x256xf8E4M3FN>, tensor<8x2x2xf32>)
      down(%w2, %s2 : tensor<8x256x128xf8E4M3FN>, tensor<8x2x1xf32>)
      config #c : tensor<?x256xf8E4M3FN> -> tensor<?x256xbf16>
  return
}
