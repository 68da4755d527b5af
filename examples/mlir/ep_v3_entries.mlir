// DeepEP's V3 configuration as the runtime's entry functions: one ep op per
// function. Compile them to kernels, PTX, a cubin and launch metadata:
//
//   build/bin/epic-opt examples/mlir/ep_v3_entries.mlir --convert-ep-to-comm
//   build/bin/epic-compile examples/mlir/ep_v3_entries.mlir --backend=virtual -o /tmp/v3 -v

#v3 = #ep.config<ranks = 8, experts = 256, topk = 8, hidden = 7168, dtype = f8E4M3FN,
                 scale_packs = 56, expert_alignment = 128, max_tokens_per_rank = 4096>

func.func @dispatch(%x: tensor<?x7168xf8E4M3FN>, %sf: tensor<?x56xf32>, %idx: tensor<?x8xi64>,
                    %w: tensor<?x8xf32>)
    -> (tensor<?x7168xf8E4M3FN>, tensor<?x56xf32>, tensor<?x8xi64>, tensor<?x8xf32>, !ep.handle<#v3>) {
  %rx, %rsf, %ri, %rw, %h = ep.dispatch %x topk(%idx : tensor<?x8xi64>) scales(%sf : tensor<?x56xf32>)
      weights(%w : tensor<?x8xf32>) config #v3
      : tensor<?x7168xf8E4M3FN> -> tensor<?x7168xf8E4M3FN>, tensor<?x56xf32>, tensor<?x8xi64>,
        tensor<?x8xf32>, !ep.handle<#v3>
  return %rx, %rsf, %ri, %rw, %h : tensor<?x7168xf8E4M3FN>, tensor<?x56xf32>, tensor<?x8xi64>,
      tensor<?x8xf32>, !ep.handle<#v3>
}

func.func @combine(%y: tensor<?x7168xbf16>, %h: !ep.handle<#v3>, %w: tensor<?x8xf32>)
    -> (tensor<?x7168xbf16>, tensor<?x8xf32>) {
  %out, %ow = ep.combine %y, %h weights(%w : tensor<?x8xf32>)
      : tensor<?x7168xbf16>, !ep.handle<#v3> -> tensor<?x7168xbf16>, tensor<?x8xf32>
  return %out, %ow : tensor<?x7168xbf16>, tensor<?x8xf32>
}
