# cmake -DSOURCE_LIST=<file of paths, one per line> -DSALT=<text> -DOUTPUT=<header> -P HashSources.cmake
#
# Writes `#define EPIC_KERNEL_SOURCE_HASH "<sha256>"` over the contents of the
# listed files and SALT (the NCCL version): the part of every kernel cache
# key that says which compiler and device shims made the kernels. Run at
# build time, so an edit to the compiler invalidates cached kernels without a
# reconfigure. The header is rewritten only when the hash changes.
file(STRINGS "${SOURCE_LIST}" sources)
set(input "${SALT}")
foreach(source IN LISTS sources)
  file(SHA256 "${source}" source_hash)
  string(APPEND input "${source_hash}")
endforeach()
string(SHA256 hash "${input}")
set(text "#define EPIC_KERNEL_SOURCE_HASH \"${hash}\"\n")
if(EXISTS "${OUTPUT}")
  file(READ "${OUTPUT}" old)
  if(old STREQUAL text)
    return()
  endif()
endif()
file(WRITE "${OUTPUT}" "${text}")
