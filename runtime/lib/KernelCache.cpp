//===- KernelCache.cpp - compiled kernels in memory and on disk -----------===//

#include "epic/runtime/KernelCache.h"

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <sys/stat.h>
#include <unistd.h>

using namespace epic::runtime;
namespace fs = std::filesystem;

namespace {

uint64_t fnv1a(uint64_t hash, const void *data, size_t size) {
  const auto *bytes = static_cast<const unsigned char *>(data);
  for (size_t i = 0; i < size; ++i) {
    hash ^= bytes[i];
    hash *= 0x100000001b3ull;
  }
  return hash;
}

/// Two FNV-1a streams from different offsets: 128 bits, as 32 hex digits.
struct Hasher {
  uint64_t a = 0xcbf29ce484222325ull, b = 0x84222325cbf29ce4ull;
  void add(const std::string &part) {
    uint64_t size = part.size(); // length prefix: parts cannot run into each other
    a = fnv1a(a, &size, sizeof size);
    b = fnv1a(b, &size, sizeof size);
    a = fnv1a(a, part.data(), part.size());
    b = fnv1a(b ^ 0x9e3779b97f4a7c15ull, part.data(), part.size());
  }
  std::string hex() const {
    char text[33];
    std::snprintf(text, sizeof text, "%016llx%016llx", (unsigned long long)a,
                  (unsigned long long)b);
    return text;
  }
};

const char *const kFiles[] = {"kernels.cubin", "kernels.ptx", "kernels.json", "key"};

std::string readFile(const fs::path &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw CacheError("cannot read " + path.string());
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

/// Writes and fsyncs, so a renamed entry is complete even after a crash.
void writeFile(const fs::path &path, const std::string &data) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0)
    throw std::runtime_error("cannot create " + path.string() + ": " + std::strerror(errno));
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      int error = errno;
      ::close(fd);
      throw std::runtime_error("cannot write " + path.string() + ": " + std::strerror(error));
    }
    done += size_t(n);
  }
  ::fsync(fd);
  ::close(fd);
}

bool keyLooksValid(const std::string &key) {
  if (key.size() != 32)
    return false;
  for (char c : key)
    if (!std::isxdigit(static_cast<unsigned char>(c)))
      return false;
  return true;
}

void requireKey(const std::string &key) {
  if (!keyLooksValid(key))
    throw std::invalid_argument("kernel cache key must be 32 hex digits, got \"" + key + "\"");
}
} // namespace

std::string epic::runtime::kernelKey(const KernelKeyParts &parts) {
  Hasher h;
  h.add("epic-kernel-v1");
  for (const std::string *part :
       {&parts.input, &parts.options, &parts.ncclVersion, &parts.shimHash, &parts.arch})
    h.add(*part);
  return h.hex();
}

std::string epic::runtime::hashBytes(const std::string &bytes) {
  Hasher h;
  h.add(bytes);
  return h.hex();
}

std::string KernelCache::defaultDirectory() {
  if (const char *dir = std::getenv("EPIC_CACHE_DIR"); dir && *dir)
    return dir;
  const char *home = std::getenv("HOME");
  return std::string(home && *home ? home : "/tmp") + "/.cache/epic";
}

KernelCache::KernelCache(std::string directory)
    : root(directory.empty() ? defaultDirectory() : std::move(directory)) {}

std::string KernelCache::entryDirectory(const std::string &key) const {
  return root + "/kernels/" + key;
}

std::optional<CompiledModule> KernelCache::load(const std::string &key) const {
  requireKey(key);
  fs::path dir = entryDirectory(key);
  std::error_code error;
  if (!fs::is_directory(dir, error))
    return std::nullopt;
  for (const char *file : kFiles)
    if (!fs::exists(dir / file, error))
      throw CacheError("corrupted kernel cache entry " + dir.string() + ": " + file +
                       " is missing (remove the directory to recompile)");
  if (readFile(dir / "key") != key)
    throw CacheError("corrupted kernel cache entry " + dir.string() +
                     ": it was written for another key (remove the directory to recompile)");
  CompiledModule module{readFile(dir / "kernels.cubin"), readFile(dir / "kernels.ptx"),
                        readFile(dir / "kernels.json")};
  if (module.cubin.empty())
    throw CacheError("corrupted kernel cache entry " + dir.string() + ": empty cubin");
  return module;
}

void KernelCache::store(const std::string &key, const CompiledModule &module) const {
  requireKey(key);
  fs::path kernels = fs::path(root) / "kernels";
  fs::path tmp = fs::path(root) / "tmp";
  std::error_code error;
  fs::create_directories(kernels, error);
  fs::create_directories(tmp, error);
  if (!fs::is_directory(kernels) || !fs::is_directory(tmp))
    throw std::runtime_error("cannot create the kernel cache under " + root + ": " +
                             error.message());
  std::random_device random;
  fs::path staging =
      tmp / (key + "." + std::to_string(::getpid()) + "." + std::to_string(random()));
  fs::create_directory(staging);
  writeFile(staging / "kernels.cubin", module.cubin);
  writeFile(staging / "kernels.ptx", module.ptx);
  writeFile(staging / "kernels.json", module.metadataJson);
  writeFile(staging / "key", key);
  // rename(2) of a directory is atomic; it fails if the target exists and
  // is not empty: another writer won, and its entry is as good as ours.
  if (std::rename(staging.c_str(), entryDirectory(key).c_str()) != 0) {
    int why = errno;
    fs::remove_all(staging, error);
    if (why != EEXIST && why != ENOTEMPTY)
      throw std::runtime_error("cannot move the kernel cache entry into " + entryDirectory(key) +
                               ": " + std::strerror(why));
  }
}

std::optional<std::string> KernelCache::loadText(const std::string &kind,
                                                 const std::string &key) const {
  requireKey(key);
  fs::path path = fs::path(root) / kind / (key + ".json");
  std::error_code error;
  if (!fs::exists(path, error))
    return std::nullopt;
  return readFile(path);
}

void KernelCache::storeText(const std::string &kind, const std::string &key,
                            const std::string &text) const {
  requireKey(key);
  fs::path dir = fs::path(root) / kind, tmp = fs::path(root) / "tmp";
  std::error_code error;
  fs::create_directories(dir, error);
  fs::create_directories(tmp, error);
  if (!fs::is_directory(dir) || !fs::is_directory(tmp))
    throw std::runtime_error("cannot create " + dir.string() + ": " + error.message());
  std::random_device random;
  fs::path staging =
      tmp / (key + "." + std::to_string(::getpid()) + "." + std::to_string(random()) + ".json");
  writeFile(staging, text);
  // rename(2) of a file replaces the target atomically: readers see the old
  // complete file or the new one (both are the same artifact).
  if (std::rename(staging.c_str(), (dir / (key + ".json")).c_str()) != 0) {
    int why = errno;
    fs::remove(staging, error);
    throw std::runtime_error("cannot move " + staging.string() + " into " + dir.string() + ": " +
                             std::strerror(why));
  }
}

const CompiledModule &KernelCache::get(const std::string &key,
                                       const std::function<CompiledModule()> &compile,
                                       Source *source) {
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = memory.find(key); it != memory.end()) {
    if (source)
      *source = Source::memory;
    return *it->second;
  }
  std::optional<CompiledModule> module = load(key);
  if (source)
    *source = module ? Source::disk : Source::compiled;
  if (!module) {
    module = compile();
    store(key, *module);
  }
  auto &slot = memory[key];
  slot = std::make_unique<CompiledModule>(std::move(*module));
  return *slot;
}
