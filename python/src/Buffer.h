//===- Buffer.h - the extension's ElasticBuffer state ---------------------===//
//
// What the bindings of epic._C share: a backend's kernel cache and provider,
// and an ElasticBuffer of either kind with what it depends on (epic_ext.cpp
// binds its ops, CopyEngineBindings.cpp its AGRS sessions and PP channels).

#ifndef EPIC_PYTHON_BUFFER_H
#define EPIC_PYTHON_BUFFER_H

#include "epic/runtime/Agrs.h"
#include "epic/runtime/Pp.h"
#include "epic/runtime/KernelCache.h"
#include "epic/runtime/KernelProvider.h"
#include "epic/runtime/NcclBuffer.h"
#include "epic/runtime/VirtualBuffer.h"

#include <pybind11/pybind11.h>

#include <memory>
#include <stdexcept>
#include <string>

namespace epic::python {

/// The kernel cache and provider of one backend, shared by buffers.
struct Runtime {
  runtime::KernelCache cache;
  runtime::KernelProvider provider;
  Runtime(const std::string &backend, const std::string &cacheDir, const std::string &compiler,
          bool staged = false)
      : cache(cacheDir),
        provider(cache, runtime::CompileSettings{backend, "sm_90a", compiler, staged}) {}
};

/// An ElasticBuffer of either kind, with what it depends on kept alive.
struct Buffer {
  std::shared_ptr<Runtime> runtime;
  std::unique_ptr<runtime::Communicator> comm;
  std::unique_ptr<runtime::KernelHost> host;
  /// Its AGRS sessions, made on first use (before `host` is destroyed: declared after it).
  std::unique_ptr<runtime::AgrsSessions> agrs;
  /// Its PP channels, likewise.
  std::unique_ptr<runtime::PpChannels> pp;

  /// The virtual world, for what only it has; `what` names the caller.
  runtime::VirtualElasticBuffer &virtualWorld(const char *what) {
    auto *world = dynamic_cast<runtime::VirtualElasticBuffer *>(host.get());
    if (!world)
      throw std::invalid_argument(std::string(what) +
                                  ": only a virtual world has it, this buffer is on NCCL");
    return *world;
  }
  runtime::PpChannels &channels() {
    if (!pp)
      pp = std::make_unique<runtime::PpChannels>(*host);
    return *pp;
  }
  runtime::AgrsSessions &sessions() {
    if (!agrs)
      agrs = std::make_unique<runtime::AgrsSessions>(*host);
    return *agrs;
  }
};

/// The AGRS sessions' and PP channels' methods on epic._C.Buffer
/// (CopyEngineBindings.cpp).
void bindCopyEngineOps(pybind11::class_<Buffer> &buffer);
/// _C.predict_fusion, the fusion cost model (FusionBindings.cpp).
void bindFusionModel(pybind11::module_ &m);

} // namespace epic::python

#endif // EPIC_PYTHON_BUFFER_H
