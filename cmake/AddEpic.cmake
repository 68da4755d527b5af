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

# epic_add_dialect_tablegen(<Prefix> <dialect>): generates the dialect, op, enum, attribute and type
# declarations and definitions from <Prefix>Ops.td (files <Prefix>Ops.h.inc, <Prefix>Enums.h.inc,
# ...), the target Epic<Prefix>IncGen, and the markdown documentation (target mlir-doc).
function(epic_add_dialect_tablegen prefix dialect)
  set(LLVM_TARGET_DEFINITIONS ${prefix}Ops.td)
  mlir_tablegen(${prefix}OpsDialect.h.inc -gen-dialect-decls -dialect=${dialect})
  mlir_tablegen(${prefix}OpsDialect.cpp.inc -gen-dialect-defs -dialect=${dialect})
  mlir_tablegen(${prefix}Ops.h.inc -gen-op-decls)
  mlir_tablegen(${prefix}Ops.cpp.inc -gen-op-defs)
  mlir_tablegen(${prefix}Enums.h.inc -gen-enum-decls)
  mlir_tablegen(${prefix}Enums.cpp.inc -gen-enum-defs)
  mlir_tablegen(${prefix}Attrs.h.inc -gen-attrdef-decls -attrdefs-dialect=${dialect})
  mlir_tablegen(${prefix}Attrs.cpp.inc -gen-attrdef-defs -attrdefs-dialect=${dialect})
  mlir_tablegen(${prefix}Types.h.inc -gen-typedef-decls -typedefs-dialect=${dialect})
  mlir_tablegen(${prefix}Types.cpp.inc -gen-typedef-defs -typedefs-dialect=${dialect})
  mlir_tablegen(${prefix}Interfaces.h.inc -gen-op-interface-decls)
  mlir_tablegen(${prefix}Interfaces.cpp.inc -gen-op-interface-defs)
  add_public_tablegen_target(Epic${prefix}IncGen)
  add_mlir_doc(${prefix}Ops ${prefix}Ops Dialects/ -gen-dialect-doc -dialect=${dialect})
endfunction()
