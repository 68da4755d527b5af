// What epic-compile refuses in a kernel request, naming the field; a request of another version
// is refused naming both versions.
// RUN: split-file %s %t
// RUN: not epic-compile --request=%t/version.json --print-entry-ir 2>&1 | FileCheck %s --check-prefix=VERSION
// RUN: not epic-compile --request=%t/version.json -o %t/out 2>&1 | FileCheck %s --check-prefix=VERSION
// RUN: not epic-compile --request=%t/misspelled.json --print-entry-ir 2>&1 | FileCheck %s --check-prefix=FIELD
// RUN: not epic-compile --request=%t/type.json --print-entry-ir 2>&1 | FileCheck %s --check-prefix=TYPE
// RUN: not epic-compile --request=%t/section.json --print-entry-ir 2>&1 | FileCheck %s --check-prefix=SECTION
// RUN: not epic-compile --request=%t/config.json --print-entry-ir 2>&1 | FileCheck %s --check-prefix=CONFIG
// RUN: not epic-compile --request=%t/op.json --print-entry-ir 2>&1 | FileCheck %s --check-prefix=OP
// RUN: not epic-compile --request=%t/hybrid.json --print-entry-ir 2>&1 | FileCheck %s --check-prefix=HYBRID
// RUN: not epic-compile --request=%t/swiglu-width.json --print-entry-ir 2>&1 | FileCheck %s --check-prefix=SWIGLU-WIDTH
// RUN: not epic-compile --request=%t/swiglu-dtype.json --print-entry-ir 2>&1 | FileCheck %s --check-prefix=SWIGLU-DTYPE
// RUN: not epic-compile --print-entry-ir %t/op.json 2>&1 | FileCheck %s --check-prefix=IR
// RUN: not epic-compile 2>&1 | FileCheck %s --check-prefix=NONE

// VERSION: epic-compile: {{.*}}version.json: kernel request: version 6 is not supported: this compiler reads version 5
// FIELD: epic-compile: {{.*}}misspelled.json: kernel request: dispatch.zero_pading: is not a field here (weights, cached, zero_padding, topk_idx_bits, window_outputs, round_scale, use_ue8m0)
// TYPE: epic-compile: {{.*}}type.json: kernel request: spec.hidden: expected an integer in [0, 2^31), got "512"
// SECTION: epic-compile: {{.*}}section.json: kernel request: a grouped_gemm request has no "dispatch" section
// CONFIG: config.json: error: kernel request: spec: experts (15) must be divisible by ranks (2)
// HYBRID: hybrid.json: error: kernel request: spec: scaleup_ranks (3) must divide ranks (8)
// OP: op.json: error: 'ep.grouped_gemm' op needs the expanded layout
// SWIGLU-WIDTH: swiglu-width.json: error: kernel request: gemm: swiglu's intermediate size (n) must be a positive multiple of 128 and its gate/up rows (k) twice it, got n = 256, k = 256
// SWIGLU-DTYPE: swiglu-dtype.json: error: kernel request: gemm.in_dtype: "bf17" is not a type
// IR: epic-compile: --print-entry-ir prints what a --request builds
// NONE: epic-compile: give either an input .mlir or --request=<file>

//--- version.json
{"version":6,"kind":"dispatch","name":"ep_dispatch","spec":{"ranks":2}}
//--- misspelled.json
{"version":5,"kind":"dispatch","name":"ep_dispatch",
 "spec":{"ranks":2,"experts":16,"topk":4,"hidden":512,"dtype":"bf16","scale_packs":0,"expert_alignment":1,
         "expanded":true,"num_sms":0,"max_tokens_per_rank":0,"scaleup_ranks":0,"hybrid":false,"timeout_ms":0},
 "dispatch":{"weights":false,"cached":false,"zero_pading":true,"topk_idx_bits":64,"window_outputs":false,"round_scale":false,"use_ue8m0":false}}
//--- type.json
{"version":5,"kind":"combine","name":"ep_combine",
 "spec":{"ranks":2,"experts":16,"topk":4,"hidden":"512","dtype":"bf16","scale_packs":0,"expert_alignment":1,
         "expanded":true,"num_sms":0,"max_tokens_per_rank":0,"scaleup_ranks":0,"hybrid":false,"timeout_ms":0},
 "combine":{"weights":false,"biases":0,"window_outputs":false}}
//--- section.json
{"version":5,"kind":"grouped_gemm","name":"g",
 "spec":{"ranks":2,"experts":16,"topk":4,"hidden":512,"dtype":"bf16","scale_packs":0,"expert_alignment":1,
         "expanded":true,"num_sms":0,"max_tokens_per_rank":0,"scaleup_ranks":0,"hybrid":false,"timeout_ms":0},
 "dispatch":{"weights":false,"cached":false,"zero_padding":false,"topk_idx_bits":64,"window_outputs":false,"round_scale":false,"use_ue8m0":false},
 "gemm":{"n":256,"out_dtype":"bf16","k":0,"in_dtype":"bf16"}}
//--- config.json
{"version":5,"kind":"combine","name":"ep_combine",
 "spec":{"ranks":2,"experts":15,"topk":4,"hidden":512,"dtype":"bf16","scale_packs":0,"expert_alignment":1,
         "expanded":true,"num_sms":0,"max_tokens_per_rank":0,"scaleup_ranks":0,"hybrid":false,"timeout_ms":0},
 "combine":{"weights":false,"biases":0,"window_outputs":false}}
//--- op.json
{"version":5,"kind":"grouped_gemm","name":"g",
 "spec":{"ranks":2,"experts":16,"topk":4,"hidden":512,"dtype":"bf16","scale_packs":0,"expert_alignment":1,
         "expanded":false,"num_sms":0,"max_tokens_per_rank":0,"scaleup_ranks":0,"hybrid":false,"timeout_ms":0},
 "gemm":{"n":256,"out_dtype":"bf16","k":0,"in_dtype":"bf16"}}
//--- hybrid.json
{"version":5,"kind":"dispatch","name":"ep_dispatch",
 "spec":{"ranks":8,"experts":16,"topk":4,"hidden":512,"dtype":"bf16","scale_packs":0,"expert_alignment":1,
         "expanded":false,"num_sms":0,"max_tokens_per_rank":0,"scaleup_ranks":3,"hybrid":true,"timeout_ms":0},
 "dispatch":{"weights":false,"cached":false,"zero_padding":false,"topk_idx_bits":64,"window_outputs":false,"round_scale":false,"use_ue8m0":false}}
//--- swiglu-width.json
{"version":5,"kind":"swiglu","name":"ep_swiglu",
 "spec":{"ranks":2,"experts":16,"topk":4,"hidden":512,"dtype":"bf16","scale_packs":0,"expert_alignment":1,
         "expanded":true,"num_sms":0,"max_tokens_per_rank":0,"scaleup_ranks":0,"hybrid":false,"timeout_ms":0},
 "gemm":{"n":256,"out_dtype":"bf16","k":256,"in_dtype":"bf16"}}
//--- swiglu-dtype.json
{"version":5,"kind":"swiglu","name":"ep_swiglu",
 "spec":{"ranks":2,"experts":16,"topk":4,"hidden":512,"dtype":"bf16","scale_packs":0,"expert_alignment":1,
         "expanded":true,"num_sms":0,"max_tokens_per_rank":0,"scaleup_ranks":0,"hybrid":false,"timeout_ms":0},
 "gemm":{"n":256,"out_dtype":"bf16","k":512,"in_dtype":"bf17"}}
