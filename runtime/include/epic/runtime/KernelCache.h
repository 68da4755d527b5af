//===- KernelCache.h - compiled kernels in memory and on disk --*- C++ -*-===//
//
// Every kernel module the runtime launches comes from here: from memory, else
// from the disk cache (EPIC_CACHE_DIR, default ~/.cache/epic), else from the
// compiler, after which it is stored. Entries are keyed by everything that
// changes the code (the kernel request or IR, the pipeline options, the NCCL
// version, the hash of the compiler and device shim sources, the GPU
// architecture) and written atomically
// (a temporary directory renamed into place), so many ranks can share one
// file system and a deployment can ship a filled cache (epic-compile) to
// machines without LLVM. No MLIR, LLVM or CUDA in here.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_RUNTIME_KERNELCACHE_H
#define EPIC_RUNTIME_KERNELCACHE_H

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>

namespace epic::runtime {

/// What the compiler makes of one module.
struct CompiledModule {
  std::string cubin;
  std::string ptx;
  std::string metadataJson;
};

/// What feeds the key: anything that changes the compiled code.
struct KernelKeyParts {
  std::string input;       ///< a kernel request's canonical JSON, or an MLIR module
  std::string options;     ///< pipeline options, e.g. "backend=virtual chip=sm_90 O=3"
  std::string ncclVersion; ///< e.g. "2.28.9"
  std::string shimHash;    ///< hash of the device shim bitcode linked in
  std::string arch;        ///< e.g. "sm_90"
};

/// 32 hex digits (two independent 64-bit FNV-1a hashes) of the parts, each
/// length-prefixed so that moving bytes between parts changes the key.
std::string kernelKey(const KernelKeyParts &parts);

/// 32 hex digits of arbitrary bytes (file contents, e.g. the shim bitcode).
std::string hashBytes(const std::string &bytes);

/// A cache entry on disk that cannot be used (truncated, foreign, wrong key).
struct CacheError : public std::runtime_error {
  using std::runtime_error::runtime_error;
};

class KernelCache {
public:
  /// `directory` empty: $EPIC_CACHE_DIR, else $HOME/.cache/epic.
  explicit KernelCache(std::string directory = "");

  static std::string defaultDirectory();
  const std::string &directory() const { return root; }

  enum class Source { memory, disk, compiled };

  /// The module for `key`: from memory, else disk, else `compile()` (stored
  /// on disk and in memory). `source`, if given, says where it came from.
  /// Thread-safe; the reference stays valid for the cache's lifetime.
  const CompiledModule &get(const std::string &key, const std::function<CompiledModule()> &compile,
                            Source *source = nullptr);

  /// The entry on disk, if any. Throws CacheError for an unusable entry.
  std::optional<CompiledModule> load(const std::string &key) const;

  /// Writes the entry atomically: into a private temporary directory, then
  /// renamed into place. If another writer got there first, its entry stays
  /// (entries for one key are interchangeable) and ours is discarded.
  void store(const std::string &key, const CompiledModule &module) const;

  /// Small text artifacts kept beside the kernels (run plans):
  /// <root>/<kind>/<key>.json, written atomically like the kernels.
  std::optional<std::string> loadText(const std::string &kind, const std::string &key) const;
  void storeText(const std::string &kind, const std::string &key, const std::string &text) const;

  /// The entry's directory (whether or not it exists).
  std::string entryDirectory(const std::string &key) const;

private:
  std::string root;
  std::mutex mutex;
  std::unordered_map<std::string, std::unique_ptr<CompiledModule>> memory;
};

} // namespace epic::runtime

#endif // EPIC_RUNTIME_KERNELCACHE_H
