# Copies NCCL's headers (nccl.h, nccl_device.h, nccl_device/) from SRC to DST with the fixes clang
# needs to compile the device API in CUDA mode (NCCL 2.28.x; harmless on later versions):
#  - clang defines __CUDACC__ as empty, so `#if __CUDACC__` must become `#if defined(__CUDACC__)`;
#  - utility.h names a dependent type without `typename`, which nvcc accepts and clang rejects.
file(GLOB headers RELATIVE "${SRC}" "${SRC}/nccl*.h")
file(GLOB_RECURSE device_headers RELATIVE "${SRC}" "${SRC}/nccl_device/*")
list(APPEND headers ${device_headers})
foreach(header IN LISTS headers)
  file(READ "${SRC}/${header}" text)
  string(REPLACE "#if __CUDACC__" "#if defined(__CUDACC__)" text "${text}")
  string(REPLACE "Optional(args, IntSeqUpTo<sizeof...(Arg), 0>::Type())"
                 "Optional(args, typename IntSeqUpTo<sizeof...(Arg), 0>::Type())" text "${text}")
  file(WRITE "${DST}/${header}" "${text}")
endforeach()
