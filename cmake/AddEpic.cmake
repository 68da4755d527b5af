# Helpers for epic's own targets.
#
# All compiler-side targets link the single shared libMLIR.so (which pulls in libLLVM.so) instead
# of hundreds of static archives: links take seconds on 2 cores, and MLIR's global registries
# exist exactly once per process.

# epic_add_mlir_library(<name> <sources>... [DEPENDS <targets>...])
function(epic_add_mlir_library name)
  cmake_parse_arguments(ARG "" "" "DEPENDS" ${ARGN})
  add_library(${name} STATIC ${ARG_UNPARSED_ARGUMENTS})
  if(ARG_DEPENDS)
    add_dependencies(${name} ${ARG_DEPENDS})
  endif()
  target_link_libraries(${name} PUBLIC MLIR LLVM)
  set_target_properties(${name} PROPERTIES POSITION_INDEPENDENT_CODE ON)
endfunction()
