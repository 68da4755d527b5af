// Kernel requests of a configuration of two nodes of four ranks (spec.scaleup_ranks 4 of 8,
// direct mode), as the runtime asks for them: the entry IR carries the topology, and the kernels
// compile through ptxas on both backends, with the launch metadata the runtime sizes the window
// and the device communicator's GIN signals by (run-time token cap: the ring after the data
// region; FP8 with 16 scale packs: 2176-byte dispatch records, 4128-byte combine records, two
// slots of the larger per warp; 8 + 2 x 8 signals). Hybrid mode adds the forward kernels and
// the forwarders' regions, and compiles through ptxas on both backends too.
// RUN: epic-compile --request=%S/Inputs/requests/dispatch-multinode-2x4.json --print-entry-ir \
// RUN:   | FileCheck %s --check-prefix=ENTRY
// RUN: epic-compile --request=%S/Inputs/requests/dispatch-multinode-2x4.json --backend=virtual \
// RUN:   -o %t.dv && FileCheck %s --check-prefixes=JSON,DISPATCH < %t.dv.json
// RUN: epic-compile --request=%S/Inputs/requests/dispatch-multinode-2x4.json --backend=nccl \
// RUN:   -o %t.dn && FileCheck %s --check-prefixes=JSON,DISPATCH < %t.dn.json
// RUN: epic-compile --request=%S/Inputs/requests/combine-multinode-2x4.json --backend=virtual \
// RUN:   -o %t.cv && FileCheck %s --check-prefixes=JSON,COMBINE < %t.cv.json
// RUN: epic-compile --request=%S/Inputs/requests/combine-multinode-2x4.json --backend=nccl \
// RUN:   -o %t.cn && FileCheck %s --check-prefixes=JSON,COMBINE < %t.cn.json
// RUN: sed 's/"hybrid":false/"hybrid":true/' %S/Inputs/requests/dispatch-multinode-2x4.json \
// RUN:   > %t.hybrid.json
// RUN: epic-compile --request=%t.hybrid.json --backend=nccl -o %t.hn \
// RUN:   && FileCheck %s --check-prefix=HYBRID < %t.hn.json
// RUN: epic-compile --request=%t.hybrid.json --backend=virtual -o %t.hv \
// RUN:   && FileCheck %s --check-prefix=HYBRID < %t.hv.json
// RUN: sed 's/"hybrid":false/"hybrid":true/' %S/Inputs/requests/combine-multinode-2x4.json \
// RUN:   > %t.hybrid-combine.json
// RUN: epic-compile --request=%t.hybrid-combine.json --backend=nccl -o %t.hc \
// RUN:   && FileCheck %s --check-prefix=HYBRID-COMBINE < %t.hc.json

// ENTRY: #ep.config<ranks = 8, experts = 64, topk = 6, hidden = 2048, dtype = f8E4M3FN, scale_packs = 16, scaleup_ranks = 4>

// JSON: "gin_signals": 24
// DISPATCH: "kernels": [
// DISPATCH-NEXT: "ep_dispatch_send",
// DISPATCH-NEXT: "ep_dispatch_copy"
// COMBINE: "kernels": [
// COMBINE-NEXT: "ep_combine_send",
// COMBINE-NEXT: "ep_combine_reduce"
// JSON: "window_bytes": 77824,
// DISPATCH-NEXT: "window_bytes_per_token": 24768,
// DISPATCH-NEXT: "window_bytes_per_warp": 8256
// COMBINE-NEXT: "window_bytes_per_token": 33280,
// COMBINE-NEXT: "window_bytes_per_warp": 8320
// JSON: "name": "ep_{{dispatch|combine}}_send",

// HYBRID: "gin_signals": 24
// HYBRID: "kernels": [
// HYBRID-NEXT: "ep_dispatch_send",
// HYBRID-NEXT: "ep_dispatch_forward",
// HYBRID-NEXT: "ep_dispatch_copy"
// HYBRID: "fwd_src_metadata",
// HYBRID-NEXT: "fwd_counts"
// (8 + 2) x 2176-byte dispatch records or 6 x (2 + 1) x 4128-byte combine records per token.
// HYBRID: "window_bytes_per_token": 74304,
// HYBRID-NEXT: "window_bytes_per_warp": 8256
// HYBRID-COMBINE: "kernels": [
// HYBRID-COMBINE-NEXT: "ep_combine_send",
// HYBRID-COMBINE-NEXT: "ep_combine_forward",
// HYBRID-COMBINE-NEXT: "ep_combine_reduce"
