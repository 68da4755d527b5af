// What convert-ep-to-comm does not (yet) generate, and what it cannot lower, is an error:
// the entry form is checked before the conversion; an op whose pattern refuses it is then
// also reported by the conversion as not legalized.
// RUN: epic-opt %s --split-input-file --convert-ep-to-comm --verify-diagnostics

#cfg = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 256, dtype = bf16,
                  max_tokens_per_rank = 64>
func.func @not_alone(%x: tensor<?x256xbf16>, %idx: tensor<?x4xi64>) -> tensor<?x256xbf16> {
  %rx, %ri, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) config #cfg
      : tensor<?x256xbf16> -> tensor<?x256xbf16>, tensor<?x4xi64>, !ep.handle<#cfg>
  // expected-error@+1 {{convert-ep-to-comm: an ep op must be alone in its function (the entry form the runtime generates); found 'arith.addf'}}
  %y = arith.addf %rx, %rx : tensor<?x256xbf16>
  return %y : tensor<?x256xbf16>
}

// -----

#cfg = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 256, dtype = bf16,
                  max_tokens_per_rank = 64>
// expected-error@+1 {{convert-ep-to-comm: expected one ep.dispatch, ep.combine or ep.grouped_gemm per function, found a second one}}
func.func @two(%x: tensor<?x256xbf16>, %idx: tensor<?x4xi64>) {
  %rx, %ri, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) config #cfg
      : tensor<?x256xbf16> -> tensor<?x256xbf16>, tensor<?x4xi64>, !ep.handle<#cfg>
  %rx2, %ri2, %h2 = ep.dispatch %x topk(%idx : tensor<?x4xi64>) config #cfg
      : tensor<?x256xbf16> -> tensor<?x256xbf16>, tensor<?x4xi64>, !ep.handle<#cfg>
  return
}

// -----

#cfg = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 256, dtype = bf16,
                  max_tokens_per_rank = 64>
// expected-error@+1 {{convert-ep-to-comm: epic.timeout_ms must be an integer in [1, 2^31] (milliseconds), got 0 : i64}}
func.func @no_time(%x: tensor<?x256xbf16>, %idx: tensor<?x4xi64>)
    -> (tensor<?x256xbf16>, tensor<?x4xi64>, !ep.handle<#cfg>) attributes {epic.timeout_ms = 0 : i64} {
  %rx, %ri, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) config #cfg
      : tensor<?x256xbf16> -> tensor<?x256xbf16>, tensor<?x4xi64>, !ep.handle<#cfg>
  return %rx, %ri, %h : tensor<?x256xbf16>, tensor<?x4xi64>, !ep.handle<#cfg>
}

// -----

#cfg = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 1000, dtype = bf16,
                  layout = expanded, max_tokens_per_rank = 64>
func.func @gemm_k(%x: tensor<?x1000xbf16>, %w: tensor<8x1000x256xbf16>, %h: !ep.handle<#cfg>)
    -> tensor<?x256xbf16> {
  // expected-error@+2 {{convert-ep-to-comm: the grouped GEMM steps through K (1000) in tiles of 64: it must be a multiple}}
  // expected-error@+1 {{failed to legalize operation 'ep.grouped_gemm' that was explicitly marked illegal}}
  %y = ep.grouped_gemm %x, %w layout(%h : !ep.handle<#cfg>)
      : tensor<?x1000xbf16>, tensor<8x1000x256xbf16> -> tensor<?x256xbf16>
  return %y : tensor<?x256xbf16>
}

// -----

#cfg = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 1024, dtype = bf16,
                  layout = expanded, max_tokens_per_rank = 64>
func.func @gemm_n(%x: tensor<?x1024xbf16>, %w: tensor<8x1024x200xbf16>, %h: !ep.handle<#cfg>)
    -> tensor<?x200xbf16> {
  // expected-error@+2 {{convert-ep-to-comm: the grouped GEMM's output tiles are 128 columns wide: N (200) must be a multiple}}
  // expected-error@+1 {{failed to legalize operation 'ep.grouped_gemm' that was explicitly marked illegal}}
  %y = ep.grouped_gemm %x, %w layout(%h : !ep.handle<#cfg>)
      : tensor<?x1024xbf16>, tensor<8x1024x200xbf16> -> tensor<?x200xbf16>
  return %y : tensor<?x200xbf16>
}
