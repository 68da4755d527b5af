// The FP8 MoE layer of fp8_moe_layer.mlir at decode size, written the same
// way (five ops on one handle), where nothing else reads the intermediate
// rows: with @main's ep.fusion = "always", epic-run's ep-fuse-moe-layer makes
// it one ep.moe_layer, one persistent kernel (dispatch, gate/up GEMM, SwiGLU
// with the FP8 re-quantization, down GEMM, combine; no launch or host step
// between). Without the attribute the pass's cost rule keeps the five ops:
// the persistent kernel is not yet faster than they are (docs/fusion.md).
// --check checks every step from the intermediate rows the kernel wrote, as
// it checks the five ops' steps: the dispatch and the combine exactly, the
// GEMMs against float64 products of their dequantized operands, the SwiGLU
// against a float64 activation and its block quantization.
//
//   build/bin/epic-run examples/run/fp8_moe_layer_fused.mlir --check
//
// The plan (one moe_layer step) and the pass's remark:
//   build/bin/epic-compile examples/run/fp8_moe_layer_fused.mlir --run-plan -o -
//   build/bin/epic-opt examples/run/fp8_moe_layer_fused.mlir --ep-fuse-moe-layer

#cfg = #ep.config<ranks = 4, experts = 16, topk = 4, hidden = 512, dtype = f8E4M3FN,
                  scale_packs = 4, expert_alignment = 128, layout = expanded,
                  max_tokens_per_rank = 64>

func.func @main() attributes {ep.fusion = "always"} {
  %t = run.tokens per_rank [64, 5, 0, 37]
  %x = run.random normal seed 51 rows %t : tensor<?x512xf8E4M3FN>
  %sf = run.random uniform scale 0.5 seed 52 rows %t : tensor<?x4xf32>
  %idx = run.routing experts 16 masked 0.1 seed 53 rows %t : tensor<?x4xi64>
  %w = run.random uniform seed 58 rows %t : tensor<?x4xf32>
  %c4 = arith.constant 4 : index
  %wgu = run.random normal seed 54 rows %c4 : tensor<?x512x512xf8E4M3FN>
  %gate_up_weights = tensor.cast %wgu : tensor<?x512x512xf8E4M3FN> to tensor<4x512x512xf8E4M3FN>
  %sgu = run.random uniform scale 0.3 seed 55 rows %c4 : tensor<?x4x4xf32>
  %gate_up_scales = tensor.cast %sgu : tensor<?x4x4xf32> to tensor<4x4x4xf32>
  %wd = run.random normal seed 56 rows %c4 : tensor<?x512x256xf8E4M3FN>
  %down_weights = tensor.cast %wd : tensor<?x512x256xf8E4M3FN> to tensor<4x512x256xf8E4M3FN>
  %sd = run.random uniform scale 0.3 seed 57 rows %c4 : tensor<?x4x2xf32>
  %down_scales = tensor.cast %sd : tensor<?x4x2xf32> to tensor<4x4x2xf32>

  %rx, %rsf, %rw, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) scales(%sf : tensor<?x4xf32>)
      weights(%w : tensor<?x4xf32>) config #cfg
      : tensor<?x512xf8E4M3FN> -> tensor<?x512xf8E4M3FN>, tensor<?x4xf32>, tensor<?xf32>,
        !ep.handle<#cfg>
  %gate_up = ep.grouped_gemm %rx, %gate_up_weights layout(%h : !ep.handle<#cfg>)
      scales(%rsf, %gate_up_scales : tensor<?x4xf32>, tensor<4x4x4xf32>)
      : tensor<?x512xf8E4M3FN>, tensor<4x512x512xf8E4M3FN> -> tensor<?x512xbf16>
  %act, %act_scales = ep.swiglu %gate_up layout(%h : !ep.handle<#cfg>)
      weights(%rw : tensor<?xf32>) : tensor<?x512xbf16> -> tensor<?x256xf8E4M3FN>, tensor<?x2xf32>
  %y = ep.grouped_gemm %act, %down_weights layout(%h : !ep.handle<#cfg>)
      scales(%act_scales, %down_scales : tensor<?x2xf32>, tensor<4x4x2xf32>)
      : tensor<?x256xf8E4M3FN>, tensor<4x512x256xf8E4M3FN> -> tensor<?x512xbf16>
  %out = ep.combine %y, %h : tensor<?x512xbf16>, !ep.handle<#cfg> -> tensor<?x512xbf16>
  run.print %out rows 1 : tensor<?x512xbf16>
  return
}
