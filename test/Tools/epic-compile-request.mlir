// The entry IR the compiler builds for kernel requests (the JSON the runtime asks for kernels
// with, runtime/include/epic/runtime/KernelRequest.def), one request of every kind and variant:
// FP8 with scale packs, weights, cached, zero padding, 0/1/2 biases, i16/i32/i64 top-k ids, the
// GPU timeout, other entry names, and the static token cap only where the fused GEMM entries
// keep it. The expected lines are what the entry IR text the runtime used to print (before
// kernel requests) parsed and printed to, so the kernels are the ones it compiled to
// (tools/kernel_snapshot.sh compares their PTX).

// RUN: epic-compile --request=%S/Inputs/requests/combine-expanded-1-bias.json --print-entry-ir \
// RUN:   | FileCheck %s --match-full-lines --check-prefix=COMBINE-EXPANDED-1-BIAS
// RUN: epic-compile --request=%S/Inputs/requests/combine-plain.json --print-entry-ir \
// RUN:   | FileCheck %s --match-full-lines --check-prefix=COMBINE-PLAIN
// RUN: epic-compile --request=%S/Inputs/requests/combine-weights-2-biases.json --print-entry-ir \
// RUN:   | FileCheck %s --match-full-lines --check-prefix=COMBINE-WEIGHTS-2-BIASES
// RUN: epic-compile --request=%S/Inputs/requests/dispatch-cached.json --print-entry-ir \
// RUN:   | FileCheck %s --match-full-lines --check-prefix=DISPATCH-CACHED
// RUN: epic-compile --request=%S/Inputs/requests/dispatch-expanded-zero-padding-i32.json --print-entry-ir \
// RUN:   | FileCheck %s --match-full-lines --check-prefix=DISPATCH-EXPANDED-ZERO-PADDING-I32
// RUN: epic-compile --request=%S/Inputs/requests/dispatch-f32-i16.json --print-entry-ir \
// RUN:   | FileCheck %s --match-full-lines --check-prefix=DISPATCH-F32-I16
// RUN: epic-compile --request=%S/Inputs/requests/dispatch-fp8-expanded-cached.json --print-entry-ir \
// RUN:   | FileCheck %s --match-full-lines --check-prefix=DISPATCH-FP8-EXPANDED-CACHED
// RUN: epic-compile --request=%S/Inputs/requests/dispatch-fp8-weights.json --print-entry-ir \
// RUN:   | FileCheck %s --match-full-lines --check-prefix=DISPATCH-FP8-WEIGHTS
// RUN: epic-compile --request=%S/Inputs/requests/dispatch-gemm-i32.json --print-entry-ir \
// RUN:   | FileCheck %s --match-full-lines --check-prefix=DISPATCH-GEMM-I32
// RUN: epic-compile --request=%S/Inputs/requests/dispatch-gemm-weights.json --print-entry-ir \
// RUN:   | FileCheck %s --match-full-lines --check-prefix=DISPATCH-GEMM-WEIGHTS
// RUN: epic-compile --request=%S/Inputs/requests/gemm-combine-1-bias.json --print-entry-ir \
// RUN:   | FileCheck %s --match-full-lines --check-prefix=GEMM-COMBINE-1-BIAS
// RUN: epic-compile --request=%S/Inputs/requests/gemm-combine-2-biases-f16.json --print-entry-ir \
// RUN:   | FileCheck %s --match-full-lines --check-prefix=GEMM-COMBINE-2-BIASES-F16
// RUN: epic-compile --request=%S/Inputs/requests/gemm-combine.json --print-entry-ir \
// RUN:   | FileCheck %s --match-full-lines --check-prefix=GEMM-COMBINE
// RUN: epic-compile --request=%S/Inputs/requests/dispatch-layout-i32.json --print-entry-ir \
// RUN:   | FileCheck %s --match-full-lines --check-prefix=DISPATCH-LAYOUT-I32
// RUN: epic-compile --request=%S/Inputs/requests/moe-layer.json --print-entry-ir \
// RUN:   | FileCheck %s --match-full-lines --check-prefix=MOE-LAYER
// RUN: epic-compile --request=%S/Inputs/requests/low-latency-dispatch-ue8m0-i32.json --print-entry-ir \
// RUN:   | FileCheck %s --match-full-lines --check-prefix=LL-DISPATCH
// RUN: epic-compile --request=%S/Inputs/requests/low-latency-combine.json --print-entry-ir \
// RUN:   | FileCheck %s --match-full-lines --check-prefix=LL-COMBINE
// RUN: epic-compile --request=%S/Inputs/requests/grouped-gemm-f16.json --print-entry-ir \
// RUN:   | FileCheck %s --match-full-lines --check-prefix=GROUPED-GEMM-F16
// RUN: epic-compile --request=%S/Inputs/requests/grouped-gemm-f32.json --print-entry-ir \
// RUN:   | FileCheck %s --match-full-lines --check-prefix=GROUPED-GEMM-F32
// RUN: epic-compile --request=%S/Inputs/requests/swiglu-fp8.json --print-entry-ir \
// RUN:   | FileCheck %s --match-full-lines --check-prefix=SWIGLU-FP8

// COMBINE-EXPANDED-1-BIAS:      #ep_config = #ep.config<ranks = 4, experts = 32, topk = 6, hidden = 512, dtype = bf16, expert_alignment = 4, layout = expanded>
// COMBINE-EXPANDED-1-BIAS-NEXT: module {
// COMBINE-EXPANDED-1-BIAS-NEXT:   func.func @ep_combine(%arg0: tensor<?x512xbf16>, %arg1: !ep.handle<#ep_config>, %arg2: tensor<?xf32>, %arg3: tensor<?x512xbf16>) -> (tensor<?x512xbf16>, tensor<?x6xf32>) {
// COMBINE-EXPANDED-1-BIAS-NEXT:     %combined_x, %combined_topk_weights = ep.combine %arg0, %arg1 weights(%arg2 : tensor<?xf32>) bias(%arg3 : tensor<?x512xbf16>) : tensor<?x512xbf16>, !ep.handle<#ep_config> -> tensor<?x512xbf16>, tensor<?x6xf32>
// COMBINE-EXPANDED-1-BIAS-NEXT:     return %combined_x, %combined_topk_weights : tensor<?x512xbf16>, tensor<?x6xf32>
// COMBINE-EXPANDED-1-BIAS-NEXT:   }
// COMBINE-EXPANDED-1-BIAS-NEXT: }

// COMBINE-PLAIN:      #ep_config = #ep.config<ranks = 2, experts = 16, topk = 4, hidden = 512, dtype = bf16, num_sms = 16>
// COMBINE-PLAIN-NEXT: module {
// COMBINE-PLAIN-NEXT:   func.func @moe_combine(%arg0: tensor<?x512xbf16>, %arg1: !ep.handle<#ep_config>) -> tensor<?x512xbf16> attributes {epic.timeout_ms = 250 : i64} {
// COMBINE-PLAIN-NEXT:     %combined_x = ep.combine %arg0, %arg1 : tensor<?x512xbf16>, !ep.handle<#ep_config> -> tensor<?x512xbf16>
// COMBINE-PLAIN-NEXT:     return %combined_x : tensor<?x512xbf16>
// COMBINE-PLAIN-NEXT:   }
// COMBINE-PLAIN-NEXT: }

// COMBINE-WEIGHTS-2-BIASES:      #ep_config = #ep.config<ranks = 8, experts = 256, topk = 8, hidden = 7168, dtype = f8E4M3FN, scale_packs = 56, expert_alignment = 128>
// COMBINE-WEIGHTS-2-BIASES-NEXT: module {
// COMBINE-WEIGHTS-2-BIASES-NEXT:   func.func @ep_combine(%arg0: tensor<?x7168xbf16>, %arg1: !ep.handle<#ep_config>, %arg2: tensor<?x8xf32>, %arg3: tensor<?x7168xbf16>, %arg4: tensor<?x7168xbf16>) -> (tensor<?x7168xbf16>, tensor<?x8xf32>) {
// COMBINE-WEIGHTS-2-BIASES-NEXT:     %combined_x, %combined_topk_weights = ep.combine %arg0, %arg1 weights(%arg2 : tensor<?x8xf32>) bias(%arg3, %arg4 : tensor<?x7168xbf16>, tensor<?x7168xbf16>) : tensor<?x7168xbf16>, !ep.handle<#ep_config> -> tensor<?x7168xbf16>, tensor<?x8xf32>
// COMBINE-WEIGHTS-2-BIASES-NEXT:     return %combined_x, %combined_topk_weights : tensor<?x7168xbf16>, tensor<?x8xf32>
// COMBINE-WEIGHTS-2-BIASES-NEXT:   }
// COMBINE-WEIGHTS-2-BIASES-NEXT: }

// DISPATCH-CACHED:      #ep_config = #ep.config<ranks = 2, experts = 16, topk = 4, hidden = 512, dtype = bf16>
// DISPATCH-CACHED-NEXT: module {
// DISPATCH-CACHED-NEXT:   func.func @ep_dispatch(%arg0: tensor<?x512xbf16>, %arg1: !ep.handle<#ep_config>) -> (tensor<?x512xbf16>, tensor<?x4xi64>, !ep.handle<#ep_config>) {
// DISPATCH-CACHED-NEXT:     %recv_x, %recv_topk_idx, %handle = ep.dispatch %arg0 cached(%arg1 : !ep.handle<#ep_config>) config #ep_config : tensor<?x512xbf16> -> tensor<?x512xbf16>, tensor<?x4xi64>, !ep.handle<#ep_config>
// DISPATCH-CACHED-NEXT:     return %recv_x, %recv_topk_idx, %handle : tensor<?x512xbf16>, tensor<?x4xi64>, !ep.handle<#ep_config>
// DISPATCH-CACHED-NEXT:   }
// DISPATCH-CACHED-NEXT: }

// DISPATCH-EXPANDED-ZERO-PADDING-I32:      #ep_config = #ep.config<ranks = 4, experts = 32, topk = 6, hidden = 512, dtype = bf16, expert_alignment = 4, layout = expanded>
// DISPATCH-EXPANDED-ZERO-PADDING-I32-NEXT: module {
// DISPATCH-EXPANDED-ZERO-PADDING-I32-NEXT:   func.func @ep_dispatch(%arg0: tensor<?x512xbf16>, %arg1: tensor<?x6xi32>, %arg2: tensor<?x6xf32>) -> (tensor<?x512xbf16>, tensor<?xf32>, !ep.handle<#ep_config>) {
// DISPATCH-EXPANDED-ZERO-PADDING-I32-NEXT:     %recv_x, %recv_topk_weights, %handle = ep.dispatch %arg0 topk(%arg1 : tensor<?x6xi32>) weights(%arg2 : tensor<?x6xf32>) zero_padding config #ep_config : tensor<?x512xbf16> -> tensor<?x512xbf16>, tensor<?xf32>, !ep.handle<#ep_config>
// DISPATCH-EXPANDED-ZERO-PADDING-I32-NEXT:     return %recv_x, %recv_topk_weights, %handle : tensor<?x512xbf16>, tensor<?xf32>, !ep.handle<#ep_config>
// DISPATCH-EXPANDED-ZERO-PADDING-I32-NEXT:   }
// DISPATCH-EXPANDED-ZERO-PADDING-I32-NEXT: }

// DISPATCH-F32-I16:      #ep_config = #ep.config<ranks = 2, experts = 16, topk = 4, hidden = 256, dtype = f32>
// DISPATCH-F32-I16-NEXT: module {
// DISPATCH-F32-I16-NEXT:   func.func @moe_dispatch(%arg0: tensor<?x256xf32>, %arg1: tensor<?x4xi16>) -> (tensor<?x256xf32>, tensor<?x4xi16>, !ep.handle<#ep_config>) {
// DISPATCH-F32-I16-NEXT:     %recv_x, %recv_topk_idx, %handle = ep.dispatch %arg0 topk(%arg1 : tensor<?x4xi16>) config #ep_config : tensor<?x256xf32> -> tensor<?x256xf32>, tensor<?x4xi16>, !ep.handle<#ep_config>
// DISPATCH-F32-I16-NEXT:     return %recv_x, %recv_topk_idx, %handle : tensor<?x256xf32>, tensor<?x4xi16>, !ep.handle<#ep_config>
// DISPATCH-F32-I16-NEXT:   }
// DISPATCH-F32-I16-NEXT: }

// DISPATCH-FP8-EXPANDED-CACHED:      #ep_config = #ep.config<ranks = 8, experts = 256, topk = 8, hidden = 7168, dtype = f8E5M2, scale_packs = 56, expert_alignment = 128, layout = expanded, num_sms = 24>
// DISPATCH-FP8-EXPANDED-CACHED-NEXT: module {
// DISPATCH-FP8-EXPANDED-CACHED-NEXT:   func.func @ep_dispatch(%arg0: tensor<?x7168xf8E5M2>, %arg1: tensor<?x56xf32>, %arg2: !ep.handle<#ep_config>) -> (tensor<?x7168xf8E5M2>, tensor<?x56xf32>, !ep.handle<#ep_config>) attributes {epic.timeout_ms = 5000 : i64} {
// DISPATCH-FP8-EXPANDED-CACHED-NEXT:     %recv_x, %recv_scale_packs, %handle = ep.dispatch %arg0 scales(%arg1 : tensor<?x56xf32>) cached(%arg2 : !ep.handle<#ep_config>) config #ep_config : tensor<?x7168xf8E5M2> -> tensor<?x7168xf8E5M2>, tensor<?x56xf32>, !ep.handle<#ep_config>
// DISPATCH-FP8-EXPANDED-CACHED-NEXT:     return %recv_x, %recv_scale_packs, %handle : tensor<?x7168xf8E5M2>, tensor<?x56xf32>, !ep.handle<#ep_config>
// DISPATCH-FP8-EXPANDED-CACHED-NEXT:   }
// DISPATCH-FP8-EXPANDED-CACHED-NEXT: }

// DISPATCH-FP8-WEIGHTS:      #ep_config = #ep.config<ranks = 8, experts = 256, topk = 8, hidden = 7168, dtype = f8E4M3FN, scale_packs = 56, expert_alignment = 128>
// DISPATCH-FP8-WEIGHTS-NEXT: module {
// DISPATCH-FP8-WEIGHTS-NEXT:   func.func @ep_dispatch(%arg0: tensor<?x7168xf8E4M3FN>, %arg1: tensor<?x8xi64>, %arg2: tensor<?x56xf32>, %arg3: tensor<?x8xf32>) -> (tensor<?x7168xf8E4M3FN>, tensor<?x56xf32>, tensor<?x8xi64>, tensor<?x8xf32>, !ep.handle<#ep_config>) {
// DISPATCH-FP8-WEIGHTS-NEXT:     %recv_x, %recv_scale_packs, %recv_topk_idx, %recv_topk_weights, %handle = ep.dispatch %arg0 topk(%arg1 : tensor<?x8xi64>) scales(%arg2 : tensor<?x56xf32>) weights(%arg3 : tensor<?x8xf32>) config #ep_config : tensor<?x7168xf8E4M3FN> -> tensor<?x7168xf8E4M3FN>, tensor<?x56xf32>, tensor<?x8xi64>, tensor<?x8xf32>, !ep.handle<#ep_config>
// DISPATCH-FP8-WEIGHTS-NEXT:     return %recv_x, %recv_scale_packs, %recv_topk_idx, %recv_topk_weights, %handle : tensor<?x7168xf8E4M3FN>, tensor<?x56xf32>, tensor<?x8xi64>, tensor<?x8xf32>, !ep.handle<#ep_config>
// DISPATCH-FP8-WEIGHTS-NEXT:   }
// DISPATCH-FP8-WEIGHTS-NEXT: }

// DISPATCH-GEMM-I32:      #ep_config = #ep.config<ranks = 2, experts = 16, topk = 4, hidden = 512, dtype = bf16, expert_alignment = 64, layout = expanded, max_tokens_per_rank = 128>
// DISPATCH-GEMM-I32-NEXT: module {
// DISPATCH-GEMM-I32-NEXT:   func.func @moe(%arg0: tensor<?x512xbf16>, %arg1: tensor<?x4xi32>, %arg2: tensor<8x512x256xbf16>) -> (tensor<?x512xbf16>, tensor<?x256xf32>, !ep.handle<#ep_config>) {
// DISPATCH-GEMM-I32-NEXT:     %recv_x, %handle = ep.dispatch %arg0 topk(%arg1 : tensor<?x4xi32>) config #ep_config : tensor<?x512xbf16> -> tensor<?x512xbf16>, !ep.handle<#ep_config>
// DISPATCH-GEMM-I32-NEXT:     %0 = ep.grouped_gemm %recv_x, %arg2 layout(%handle : !ep.handle<#ep_config>) : tensor<?x512xbf16>, tensor<8x512x256xbf16> -> tensor<?x256xf32>
// DISPATCH-GEMM-I32-NEXT:     return %recv_x, %0, %handle : tensor<?x512xbf16>, tensor<?x256xf32>, !ep.handle<#ep_config>
// DISPATCH-GEMM-I32-NEXT:   }
// DISPATCH-GEMM-I32-NEXT: }

// DISPATCH-GEMM-WEIGHTS:      #ep_config = #ep.config<ranks = 8, experts = 256, topk = 8, hidden = 7168, dtype = bf16, expert_alignment = 128, layout = expanded, max_tokens_per_rank = 4096>
// DISPATCH-GEMM-WEIGHTS-NEXT: module {
// DISPATCH-GEMM-WEIGHTS-NEXT:   func.func @ep_dispatch_gemm(%arg0: tensor<?x7168xbf16>, %arg1: tensor<?x8xi64>, %arg2: tensor<?x8xf32>, %arg3: tensor<32x7168x2048xbf16>) -> (tensor<?x7168xbf16>, tensor<?xf32>, tensor<?x2048xbf16>, !ep.handle<#ep_config>) {
// DISPATCH-GEMM-WEIGHTS-NEXT:     %recv_x, %recv_topk_weights, %handle = ep.dispatch %arg0 topk(%arg1 : tensor<?x8xi64>) weights(%arg2 : tensor<?x8xf32>) zero_padding config #ep_config : tensor<?x7168xbf16> -> tensor<?x7168xbf16>, tensor<?xf32>, !ep.handle<#ep_config>
// DISPATCH-GEMM-WEIGHTS-NEXT:     %0 = ep.grouped_gemm %recv_x, %arg3 layout(%handle : !ep.handle<#ep_config>) : tensor<?x7168xbf16>, tensor<32x7168x2048xbf16> -> tensor<?x2048xbf16>
// DISPATCH-GEMM-WEIGHTS-NEXT:     return %recv_x, %recv_topk_weights, %0, %handle : tensor<?x7168xbf16>, tensor<?xf32>, tensor<?x2048xbf16>, !ep.handle<#ep_config>
// DISPATCH-GEMM-WEIGHTS-NEXT:   }
// DISPATCH-GEMM-WEIGHTS-NEXT: }

// GEMM-COMBINE-1-BIAS:      #ep_config = #ep.config<ranks = 2, experts = 16, topk = 4, hidden = 512, dtype = bf16, expert_alignment = 64, layout = expanded, max_tokens_per_rank = 128>
// GEMM-COMBINE-1-BIAS-NEXT: module {
// GEMM-COMBINE-1-BIAS-NEXT:   func.func @ep_gemm_combine(%arg0: tensor<?x512xbf16>, %arg1: tensor<8x512x512xbf16>, %arg2: !ep.handle<#ep_config>, %arg3: tensor<?x512xbf16>) -> (tensor<?x512xbf16>, tensor<?x512xbf16>) {
// GEMM-COMBINE-1-BIAS-NEXT:     %0 = ep.grouped_gemm %arg0, %arg1 layout(%arg2 : !ep.handle<#ep_config>) : tensor<?x512xbf16>, tensor<8x512x512xbf16> -> tensor<?x512xbf16>
// GEMM-COMBINE-1-BIAS-NEXT:     %combined_x = ep.combine %0, %arg2 bias(%arg3 : tensor<?x512xbf16>) : tensor<?x512xbf16>, !ep.handle<#ep_config> -> tensor<?x512xbf16>
// GEMM-COMBINE-1-BIAS-NEXT:     return %0, %combined_x : tensor<?x512xbf16>, tensor<?x512xbf16>
// GEMM-COMBINE-1-BIAS-NEXT:   }
// GEMM-COMBINE-1-BIAS-NEXT: }

// GEMM-COMBINE-2-BIASES-F16:      #ep_config = #ep.config<ranks = 2, experts = 16, topk = 4, hidden = 512, dtype = f16, expert_alignment = 64, layout = expanded, num_sms = 8, max_tokens_per_rank = 256>
// GEMM-COMBINE-2-BIASES-F16-NEXT: module {
// GEMM-COMBINE-2-BIASES-F16-NEXT:   func.func @moe(%arg0: tensor<?x512xf16>, %arg1: tensor<8x512x512xf16>, %arg2: !ep.handle<#ep_config>, %arg3: tensor<?x512xbf16>, %arg4: tensor<?x512xbf16>) -> (tensor<?x512xbf16>, tensor<?x512xbf16>) attributes {epic.timeout_ms = 1000 : i64} {
// GEMM-COMBINE-2-BIASES-F16-NEXT:     %0 = ep.grouped_gemm %arg0, %arg1 layout(%arg2 : !ep.handle<#ep_config>) : tensor<?x512xf16>, tensor<8x512x512xf16> -> tensor<?x512xbf16>
// GEMM-COMBINE-2-BIASES-F16-NEXT:     %combined_x = ep.combine %0, %arg2 bias(%arg3, %arg4 : tensor<?x512xbf16>, tensor<?x512xbf16>) : tensor<?x512xbf16>, !ep.handle<#ep_config> -> tensor<?x512xbf16>
// GEMM-COMBINE-2-BIASES-F16-NEXT:     return %0, %combined_x : tensor<?x512xbf16>, tensor<?x512xbf16>
// GEMM-COMBINE-2-BIASES-F16-NEXT:   }
// GEMM-COMBINE-2-BIASES-F16-NEXT: }

// GEMM-COMBINE:      #ep_config = #ep.config<ranks = 8, experts = 256, topk = 8, hidden = 7168, dtype = bf16, expert_alignment = 128, layout = expanded, max_tokens_per_rank = 4096>
// GEMM-COMBINE-NEXT: module {
// GEMM-COMBINE-NEXT:   func.func @ep_gemm_combine(%arg0: tensor<?x7168xbf16>, %arg1: tensor<32x7168x7168xbf16>, %arg2: !ep.handle<#ep_config>) -> (tensor<?x7168xbf16>, tensor<?x7168xbf16>) {
// GEMM-COMBINE-NEXT:     %0 = ep.grouped_gemm %arg0, %arg1 layout(%arg2 : !ep.handle<#ep_config>) : tensor<?x7168xbf16>, tensor<32x7168x7168xbf16> -> tensor<?x7168xbf16>
// GEMM-COMBINE-NEXT:     %combined_x = ep.combine %0, %arg2 : tensor<?x7168xbf16>, !ep.handle<#ep_config> -> tensor<?x7168xbf16>
// GEMM-COMBINE-NEXT:     return %0, %combined_x : tensor<?x7168xbf16>, tensor<?x7168xbf16>
// GEMM-COMBINE-NEXT:   }
// GEMM-COMBINE-NEXT: }

// GROUPED-GEMM-F16:      #ep_config = #ep.config<ranks = 2, experts = 16, topk = 4, hidden = 512, dtype = f16, expert_alignment = 64, layout = expanded>
// GROUPED-GEMM-F16-NEXT: module {
// GROUPED-GEMM-F16-NEXT:   func.func @ep_grouped_gemm(%arg0: tensor<?x512xf16>, %arg1: tensor<8x512x256xf16>, %arg2: !ep.handle<#ep_config>) -> tensor<?x256xf16> {
// GROUPED-GEMM-F16-NEXT:     %0 = ep.grouped_gemm %arg0, %arg1 layout(%arg2 : !ep.handle<#ep_config>) : tensor<?x512xf16>, tensor<8x512x256xf16> -> tensor<?x256xf16>
// GROUPED-GEMM-F16-NEXT:     return %0 : tensor<?x256xf16>
// GROUPED-GEMM-F16-NEXT:   }
// GROUPED-GEMM-F16-NEXT: }

// The dispatch layout counts a routing table: of the dispatch section only its index width.
// DISPATCH-LAYOUT-I32:      #ep_config = #ep.config<ranks = 8, experts = 64, topk = 6, hidden = 512, dtype = bf16>
// DISPATCH-LAYOUT-I32-NEXT: module {
// DISPATCH-LAYOUT-I32-NEXT:   func.func @ep_dispatch_layout(%arg0: tensor<?x6xi32>) -> (tensor<8xi32>, tensor<64xi32>, tensor<?x8xi1>) {
// DISPATCH-LAYOUT-I32-NEXT:     %num_tokens_per_rank, %num_tokens_per_expert, %is_token_in_rank = ep.dispatch_layout %arg0 config #ep_config : tensor<?x6xi32> -> tensor<8xi32>, tensor<64xi32>, tensor<?x8xi1>
// DISPATCH-LAYOUT-I32-NEXT:     return %num_tokens_per_rank, %num_tokens_per_expert, %is_token_in_rank : tensor<8xi32>, tensor<64xi32>, tensor<?x8xi1>
// DISPATCH-LAYOUT-I32-NEXT:   }
// DISPATCH-LAYOUT-I32-NEXT: }

// GROUPED-GEMM-F32:      #ep_config = #ep.config<ranks = 8, experts = 256, topk = 8, hidden = 7168, dtype = bf16, expert_alignment = 128, layout = expanded>
// GROUPED-GEMM-F32-NEXT: module {
// GROUPED-GEMM-F32-NEXT:   func.func @ep_grouped_gemm(%arg0: tensor<?x7168xbf16>, %arg1: tensor<32x7168x2048xbf16>, %arg2: !ep.handle<#ep_config>) -> tensor<?x2048xf32> {
// GROUPED-GEMM-F32-NEXT:     %0 = ep.grouped_gemm %arg0, %arg1 layout(%arg2 : !ep.handle<#ep_config>) : tensor<?x7168xbf16>, tensor<32x7168x2048xbf16> -> tensor<?x2048xf32>
// GROUPED-GEMM-F32-NEXT:     return %0 : tensor<?x2048xf32>
// GROUPED-GEMM-F32-NEXT:   }
// GROUPED-GEMM-F32-NEXT: }

// The expert MLP's activation: gemm.n is the intermediate size, gemm.in_dtype the gate/up
// rows'; an FP8 result comes with its scales.
// SWIGLU-FP8:      #ep_config = #ep.config<ranks = 8, experts = 256, topk = 8, hidden = 7168, dtype = f8E4M3FN, scale_packs = 56, expert_alignment = 128, layout = expanded>
// SWIGLU-FP8-NEXT: module {
// SWIGLU-FP8-NEXT:   func.func @ep_swiglu(%arg0: tensor<?x4096xbf16>, %arg1: !ep.handle<#ep_config>) -> (tensor<?x2048xf8E4M3FN>, tensor<?x16xf32>) {
// SWIGLU-FP8-NEXT:     %result, %scales = ep.swiglu %arg0 layout(%arg1 : !ep.handle<#ep_config>) : tensor<?x4096xbf16> -> tensor<?x2048xf8E4M3FN>, tensor<?x16xf32>
// SWIGLU-FP8-NEXT:     return %result, %scales : tensor<?x2048xf8E4M3FN>, tensor<?x16xf32>
// SWIGLU-FP8-NEXT:   }
// SWIGLU-FP8-NEXT: }

// The whole FP8 layer as one op (gemm.n: the experts' intermediate size I); the token cap
// stays (the persistent kernel sizes its rows by it).
// MOE-LAYER:      #ep_config = #ep.config<ranks = 8, experts = 256, topk = 8, hidden = 7168, dtype = f8E4M3FN, scale_packs = 56, expert_alignment = 128, layout = expanded, max_tokens_per_rank = 128>
// MOE-LAYER-NEXT: module {
// MOE-LAYER-NEXT:   func.func @ep_moe_layer(%arg0: tensor<?x7168xf8E4M3FN>, %arg1: tensor<?x8xi64>, %arg2: tensor<?x56xf32>, %arg3: tensor<?x8xf32>, %arg4: tensor<32x4096x7168xf8E4M3FN>, %arg5: tensor<32x32x56xf32>, %arg6: tensor<32x7168x2048xf8E4M3FN>, %arg7: tensor<32x56x16xf32>) -> tensor<?x7168xbf16> {
// MOE-LAYER-NEXT:     %0 = ep.moe_layer %arg0 topk(%arg1 : tensor<?x8xi64>) scales(%arg2 : tensor<?x56xf32>) weights(%arg3 : tensor<?x8xf32>) gate_up(%arg4, %arg5 : tensor<32x4096x7168xf8E4M3FN>, tensor<32x32x56xf32>) down(%arg6, %arg7 : tensor<32x7168x2048xf8E4M3FN>, tensor<32x56x16xf32>) config #ep_config : tensor<?x7168xf8E4M3FN> -> tensor<?x7168xbf16>
// MOE-LAYER-NEXT:     return %0 : tensor<?x7168xbf16>
// MOE-LAYER-NEXT:   }
// MOE-LAYER-NEXT: }

// DeepEP V1's low-latency mode: per local expert [L, R x Tmax, ...] results, Tmax a run-time
// value; UE8M0 scales as i32 packs of four groups.
// LL-DISPATCH:      #ep_config = #ep.config<ranks = 2, experts = 16, topk = 4, hidden = 512, dtype = f8E4M3FN, scale_packs = 4>
// LL-DISPATCH-NEXT: module {
// LL-DISPATCH-NEXT:   func.func @ep_low_latency_dispatch(%arg0: tensor<?x512xbf16>, %arg1: tensor<?x4xi32>) -> (tensor<8x?x512xf8E4M3FN>, tensor<8x?x1xi32>, tensor<8xi32>, tensor<8x?xi32>, tensor<8x2xi64>, tensor<8x?xi32>) {
// LL-DISPATCH-NEXT:     %recv_x, %recv_scales, %recv_count, %src_info, %layout_range, %route = ep.low_latency_dispatch %arg0, %arg1 round_scale ue8m0 config #ep_config : tensor<?x512xbf16>, tensor<?x4xi32> -> tensor<8x?x512xf8E4M3FN>, scales tensor<8x?x1xi32>, tensor<8xi32>, tensor<8x?xi32>, tensor<8x2xi64>, tensor<8x?xi32>
// LL-COMBINE:      #ep_config = #ep.config<ranks = 2, experts = 16, topk = 4, hidden = 512, dtype = bf16>
// LL-COMBINE-NEXT: module {
// LL-COMBINE-NEXT:   func.func @ep_low_latency_combine(%arg0: tensor<8x?x512xbf16>, %arg1: tensor<8x2xi64>, %arg2: tensor<8x?xi32>, %arg3: tensor<?x4xi64>, %arg4: tensor<?x4xf32>) -> tensor<?x512xbf16> {
// LL-COMBINE-NEXT:     %0 = ep.low_latency_combine %arg0, %arg1, %arg2, %arg3, %arg4 config #ep_config : tensor<8x?x512xbf16>, tensor<8x2xi64>, tensor<8x?xi32>, tensor<?x4xi64>, tensor<?x4xf32> -> tensor<?x512xbf16>
