//===- KernelHost.cpp - load, prepare and launch compiled kernels ---------===//

#include "epic/runtime/KernelHost.h"
#include "epic/runtime/HostSegment.h"

#include "epic/Dialect/EP/IR/EPWindow.h"

#include "epic/runtime/Json.h"
#include "epic/runtime/KernelProvider.h"

#include "CudaCheck.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

using namespace epic::runtime;
using detail::capturing;
using detail::check;
using epic::LaunchMetadata;
using epic::TensorMapSpec;

namespace epic::runtime {
struct Loaded {
  CUmodule module = nullptr;
  std::vector<CUfunction> kernels; ///< meta.kernels, loaded
  /// What the compiler said about the kernels (checked by readLaunchMetadata).
  LaunchMetadata meta;
  /// Bytes of the by-value table the kernels declare (0: the driver cannot say).
  int64_t tableBytes = 0;
  /// Blocks of the least resident kernel the whole GPU holds at once.
  int64_t residentBlocks = 0;

  size_t fieldIndex(const std::string &name) const {
    const std::vector<std::string> &fields = meta.paramFields;
    return size_t(std::find(fields.begin(), fields.end(), name) - fields.begin());
  }
};
} // namespace epic::runtime

namespace {
constexpr int64_t kTensorMapBytes = LaunchMetadata::kTensorMapBytes; // sizeof(CUtensorMap)

/// Encodes `spec` for one rank's record (its words at `record`) into `out`.
void encodeTensorMap(const TensorMapSpec &spec, const Loaded &k, const uint64_t *record, int rank,
                     void *out) {
  auto field = [&](const std::string &name, bool mayBeZero = false) -> uint64_t {
    size_t i = k.fieldIndex(name);
    if (i == k.meta.paramFields.size() || (!record[i] && !mayBeZero))
      throw std::invalid_argument("rank " + std::to_string(rank) + ": " + k.meta.kernels[0] +
                                  " needs parameter \"" + name + "\" for a TMA descriptor");
    return record[i];
  };
  const int64_t rows = spec.rows.field.empty()
                           ? spec.rows.value
                           : int64_t(field(spec.rows.field, /*mayBeZero=*/true));
  // A rank that received no rows has no tile to load (and its empty tensor
  // may have no address): its map is never used, so it stays zero.
  if (rows == 0) {
    std::memset(out, 0, kTensorMapBytes);
    return;
  }
  const uint64_t address = field(spec.field);
  if (address % 16)
    throw std::invalid_argument("rank " + std::to_string(rank) + ": " + spec.field +
                                " must be 16-byte aligned for the TMA loads of " +
                                k.meta.kernels[0]);
  if ((spec.cols * spec.elemBytes) % 16)
    throw std::invalid_argument(spec.field + ": rows of " +
                                std::to_string(spec.cols * spec.elemBytes) +
                                " bytes; TMA needs a multiple of 16");
  CUtensorMapDataType type = spec.elemBytes == 4   ? CU_TENSOR_MAP_DATA_TYPE_UINT32
                             : spec.elemBytes == 1 ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                                   : CU_TENSOR_MAP_DATA_TYPE_UINT16;
  CUtensorMapSwizzle swizzle = spec.swizzle == 128  ? CU_TENSOR_MAP_SWIZZLE_128B
                               : spec.swizzle == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                               : spec.swizzle == 32 ? CU_TENSOR_MAP_SWIZZLE_32B
                                                    : CU_TENSOR_MAP_SWIZZLE_NONE;
  cuuint64_t dims[2] = {cuuint64_t(spec.cols), cuuint64_t(rows)};
  cuuint64_t strides[1] = {cuuint64_t(spec.cols * spec.elemBytes)};
  cuuint32_t box[2] = {cuuint32_t(spec.boxCols), cuuint32_t(spec.boxRows)};
  cuuint32_t elementStrides[2] = {1, 1};
  check(detail::driver().tensorMapEncodeTiled(
            static_cast<CUtensorMap *>(out), type, 2, reinterpret_cast<void *>(address), dims,
            strides, box, elementStrides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
            CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
        "cuTensorMapEncodeTiled(" + spec.field + " of rank " + std::to_string(rank) + ", " +
            std::to_string(rows) + " x " + std::to_string(spec.cols) + ")");
}

/// The launch attributes of `k` (`attributes` holds at least three).
CUlaunchConfig launchConfig(const Loaded &k, unsigned grid, void *stream,
                            CUlaunchAttribute *attributes) {
  CUlaunchConfig config{};
  config.gridDimX = grid, config.gridDimY = 1, config.gridDimZ = 1;
  config.blockDimX = unsigned(k.meta.threads), config.blockDimY = 1, config.blockDimZ = 1;
  config.sharedMemBytes = unsigned(k.meta.dynamicSharedBytes);
  config.hStream = static_cast<CUstream>(stream);
  config.attrs = attributes;
  if (k.meta.cooperative) {
    attributes[config.numAttrs].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    attributes[config.numAttrs++].value.cooperative = 1;
  }
  if (k.meta.clusterDims[0] > 1) {
    attributes[config.numAttrs].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attributes[config.numAttrs].value.clusterDim.x = unsigned(k.meta.clusterDims[0]);
    attributes[config.numAttrs].value.clusterDim.y = 1;
    attributes[config.numAttrs++].value.clusterDim.z = 1;
  }
  if (k.meta.programmaticLaunch) {
    attributes[config.numAttrs].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attributes[config.numAttrs++].value.programmaticStreamSerializationAllowed = 1;
  }
  return config;
}

} // namespace

KernelHost::KernelHost(KernelProvider &provider, int servedRanks, int64_t windowBytes,
                       int blocksPerRank, int64_t hostBytes)
    : provider(provider), servedRanks(servedRanks),
      bytesPerRank(hostBytes > 0 ? (windowBytes + MixedWindows::kGranularity - 1) /
                                       MixedWindows::kGranularity * MixedWindows::kGranularity
                                 : (windowBytes + 4095) / 4096 * 4096),
      cpuBytesPerRank(hostBytes), blocksPerRank(blocksPerRank) {
  if (hostBytes < 0 || hostBytes % MixedWindows::kGranularity)
    throw std::invalid_argument("num_cpu_bytes must be a non-negative multiple of 2 MiB "
                                "(2097152), got " +
                                std::to_string(hostBytes));
  if (servedRanks < 1 || servedRanks > 1024)
    throw std::invalid_argument("num_ranks must be in [1, 1024], got " +
                                std::to_string(servedRanks));
  if (windowBytes <= 0)
    throw std::invalid_argument("num_bytes must be positive, got " + std::to_string(windowBytes));
  if (blocksPerRank < 1)
    throw std::invalid_argument("blocks per rank must be positive, got " +
                                std::to_string(blocksPerRank));
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&deviceSms, cudaDevAttrMultiProcessorCount, device),
        "cudaDeviceGetAttribute(multiprocessors)");
}

KernelHost::~KernelHost() {
  releaseTimedKernels();
  for (auto &[key, loaded] : modules) {
    if (loaded->module)
      detail::driver().moduleUnload(loaded->module);
    delete loaded;
  }
}

Loaded &KernelHost::load(const KernelInput &input, Run &run, bool mayLoad) {
  KernelProvider::Result result = provider.get(input);
  run.key = result.key;
  run.source = result.source;
  run.seconds = result.seconds;
  if (auto it = modules.find(result.key); it != modules.end())
    return *it->second;
  if (!mayLoad)
    throw std::runtime_error(
        "kernels " + result.key +
        " are not loaded yet, and loading a module cannot be captured in a CUDA graph: run "
        "the same call once before capturing (a warm-up), then capture");
  Json meta = Json::parse(result.module->metadataJson);
  const Json &entries = meta.at("entries");
  if (entries.array.size() != 1)
    throw std::runtime_error("kernels " + result.key + ": expected one entry function, found " +
                             std::to_string(entries.array.size()));
  auto loaded = std::make_unique<Loaded>();
  LaunchMetadata &md = loaded->meta;
  md = readLaunchMetadata(entries.array[0], result.key);
  check(detail::driver().moduleLoadData(&loaded->module, result.module->cubin.data()),
        "cuModuleLoadData");
  try {
    detail::attachDeviceWaitReports(loaded->module);
    for (const std::string &name : loaded->meta.kernels) {
      CUfunction f;
      check(detail::driver().moduleGetFunction(&f, loaded->module, name.c_str()),
            "cuModuleGetFunction(" + name + ")");
      if (loaded->meta.dynamicSharedBytes > 48 * 1024)
        check(detail::driver().funcSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                loaded->meta.dynamicSharedBytes),
              "allowing " + std::to_string(loaded->meta.dynamicSharedBytes) +
                  " bytes of dynamic shared memory for " + name);
      // The table every kernel takes by value (parameter 2): its size tells
      // how many records the kernels were compiled to serve.
      size_t offset = 0, size = 0;
      if (detail::driver().funcGetParamInfo) {
        check(detail::driver().funcGetParamInfo(f, 2, &offset, &size),
              "cuFuncGetParamInfo(" + name + ", the parameter table)");
        if (loaded->tableBytes && int64_t(size) != loaded->tableBytes)
          throw std::runtime_error("kernels " + result.key + " take parameter tables of " +
                                   std::to_string(loaded->tableBytes) + " and " +
                                   std::to_string(size) + " bytes");
        loaded->tableBytes = int64_t(size);
      }
      int perSm = 0;
      check(detail::driver().occupancy(&perSm, f, loaded->meta.threads,
                                       size_t(loaded->meta.dynamicSharedBytes)),
            "cuOccupancyMaxActiveBlocksPerMultiprocessor(" + name + ")");
      int64_t resident = int64_t(perSm) * deviceSms;
      loaded->residentBlocks =
          loaded->kernels.empty() ? resident : std::min(loaded->residentBlocks, resident);
      loaded->kernels.push_back(f);
    }
  } catch (...) {
    detail::driver().moduleUnload(loaded->module);
    throw;
  }
  Loaded *raw = loaded.release();
  modules[result.key] = raw;
  return *raw;
}

KernelHost::Prepared KernelHost::prepare(const KernelInput &input,
                                         const std::vector<ParamRecord> &records, int blocks,
                                         void *stream) {
  if (blocks < 0 || blocks > blocksPerRank)
    throw std::invalid_argument(
        "num_sms (" + std::to_string(blocks) + " blocks per rank) must be in [1, " +
        std::to_string(blocksPerRank) + "], the most this buffer was created for (0: all of them)");
  if (blocks == 0)
    blocks = blocksPerRank;
  Prepared prepared;
  Loaded &k = load(input, prepared.run, !capturing(stream));
  prepared.kernels = &k;
  blocks *= k.meta.ctasPerSm; // per rank, as launched
  prepared.blocks = blocks;
  if (int(records.size()) != servedRanks)
    throw std::invalid_argument("expected one parameter record per rank (" +
                                std::to_string(servedRanks) + "), got " +
                                std::to_string(records.size()));
  const int64_t tableBytes = int64_t(servedRanks) * k.meta.paramStride;
  if (k.tableBytes && k.tableBytes != tableBytes)
    throw std::runtime_error(k.meta.kernels[0] + " takes a parameter table of " +
                             std::to_string(k.tableBytes) + " bytes, but this buffer serves " +
                             std::to_string(servedRanks) + " rank(s) of " +
                             std::to_string(k.meta.paramStride) +
                             "-byte records: kernels compiled for another backend or world");
  int64_t tokens = 0; // the cap of kernels that take it at run time
  for (const ParamRecord &record : records)
    if (auto it = record.find("max_tokens_per_rank"); it != record.end())
      tokens = std::max<int64_t>(tokens, int64_t(it->second.value));
  const int64_t windowNeeded = k.meta.windowFor(tokens, blocks);
  prepared.dataEnd = k.meta.windowScratchAt >= 0 ? k.meta.windowScratchAt : windowNeeded;
  prepared.kernelsEnd = windowNeeded;
  if (windowNeeded > bytesPerRank)
    throw std::invalid_argument(
        "the buffer has " + std::to_string(bytesPerRank) + " bytes per rank, these kernels need " +
        std::to_string(windowNeeded) +
        (k.meta.windowBytesPerToken ? " for num_max_tokens_per_rank " + std::to_string(tokens)
                                    : "") +
        (k.meta.windowBytesPerWarp
             ? std::string(k.meta.windowBytesPerToken ? " and" : "") + " for " +
                   std::to_string(blocks) + " blocks per rank (staging for other nodes)"
             : "") +
        ": create it with at least get_buffer_size_hint() bytes");
  if (ginSignals >= 0 && k.meta.ginSignals > ginSignals)
    throw std::invalid_argument(
        k.meta.kernels[0] + " reaches ranks of other nodes through " +
        std::to_string(k.meta.ginSignals) +
        " GIN signals (a configuration of several NVLink domains), but this buffer's device "
        "communicator has " +
        (ginSignals ? std::to_string(ginSignals) + " signals" : std::string("no GIN")) +
        ": its ranks must be created as several nodes");
  if (blocks > k.meta.maxBlocksPerRank)
    throw std::invalid_argument("blocks per rank (" + std::to_string(blocks) +
                                ") exceeds the kernels' maximum " +
                                std::to_string(k.meta.maxBlocksPerRank));
  // A launch serving several ranks gives each rank a contiguous run of blocks
  // (rank = block / blocks): a cluster, whose blocks share work, must not
  // straddle two ranks.
  if (blocks % k.meta.clusterDims[0])
    throw std::invalid_argument("the kernels run in clusters of " +
                                std::to_string(k.meta.clusterDims[0]) +
                                " blocks: the blocks per rank (" + std::to_string(blocks) +
                                ") must be a multiple of it, so that no cluster spans two ranks");
  // Every rank's blocks wait for each other: all must be resident at once.
  if (k.meta.cooperative && k.residentBlocks < int64_t(servedRanks) * blocks)
    throw std::invalid_argument(
        "a launch of " + std::to_string(servedRanks) + " ranks x " + std::to_string(blocks) +
        " blocks does not fit on this GPU at once (it holds " + std::to_string(k.residentBlocks) +
        " blocks of " + k.meta.kernels[0] + "): use fewer blocks per rank");
  if (envFlag("EPIC_DEBUG")) {
    std::string names;
    for (const std::string &name : k.meta.kernels)
      names += (names.empty() ? "" : ", ") + name;
    std::fprintf(stderr,
                 "epic: prepared %s: %d rank(s) x %d blocks x %d threads%s%s%s, window %lld of "
                 "%lld bytes per rank, %lld-byte parameter table\n",
                 names.c_str(), servedRanks, blocks, k.meta.threads,
                 k.meta.cooperative ? ", cooperative" : "",
                 k.meta.clusterDims[0] > 1
                     ? (", clusters of " + std::to_string(k.meta.clusterDims[0])).c_str()
                     : "",
                 k.meta.programmaticLaunch ? ", programmatic dependent launch" : "",
                 (long long)windowNeeded, (long long)bytesPerRank, (long long)tableBytes);
  }
  std::vector<WindowRange> windows; // found at the first window-resident tensor
  for (int r = 0; r < servedRanks; ++r)
    for (const auto &[name, value] : records[r])
      if (value.inWindow && value.value) {
        if (windows.empty())
          windows = windowRanges(prepared);
        requireInWindow(servedRanks > 1 ? name + "[" + std::to_string(r) + "]" : name, value.value,
                        value.bytes, windows[r]);
      }
  prepared.table.assign(size_t(tableBytes / 8), 0);
  for (int r = 0; r < servedRanks; ++r)
    for (const auto &[name, value] : records[r]) {
      size_t field = k.fieldIndex(name);
      if (field == k.meta.paramFields.size())
        throw std::invalid_argument("rank " + std::to_string(r) + ": unknown parameter \"" + name +
                                    "\" for kernels " + k.meta.kernels[0]);
      prepared.table[size_t(r) * k.meta.paramStride / 8 + field] = value.value;
    }
  encodeTensorMaps(prepared);
  return prepared;
}

void KernelHost::encodeTensorMaps(Prepared &prepared) const {
  const Loaded &k = *prepared.kernels;
  for (int r = 0; r < servedRanks && !k.meta.tensorMaps.empty(); ++r) {
    uint64_t *record = prepared.table.data() + size_t(r) * k.meta.paramStride / 8;
    for (const TensorMapSpec &spec : k.meta.tensorMaps)
      encodeTensorMap(spec, k, record, r, record + spec.offset / 8);
  }
}

void KernelHost::trackWindow(const Prepared &prepared, void *stream) {
  const Loaded &k = *prepared.kernels;
  const bool captured = capturing(stream);
  if (k.meta.windowScratchAt >= 0) {
    const int64_t begin = k.meta.windowScratchAt, end = k.meta.windowBytes;
    // A graph's replays are not seen here: what ran between them is not
    // known, so a captured launch always zeroes its scratch first.
    if (captured || written.overlaps(begin, end) || writtenByGraphs.overlaps(begin, end)) {
      for (int r = 0; r < servedRanks; ++r)
        check(cudaMemsetAsync(static_cast<char *>(windowMemory(r)) + begin, 0, size_t(end - begin),
                              static_cast<cudaStream_t>(stream)),
              "zeroing the fused kernels' scratch (cudaMemsetAsync)");
      written.remove(begin, end);
    }
  }
  (captured ? writtenByGraphs : written).add(epic::ep::window::kControlEnd, prepared.dataEnd);
}

void KernelHost::requireOneNvlinkDomain(const std::string &what) const {
  if (gpusPerNode() != worldSize())
    throw std::invalid_argument(what +
                                " copies between the ranks of one NVLink domain; the "
                                "buffer's world is " +
                                std::to_string(worldSize() / gpusPerNode()) + " nodes of " +
                                std::to_string(gpusPerNode()) + " ranks");
}

void KernelHost::noteWindowData(int64_t begin, int64_t end, void *stream) {
  (capturing(stream) ? writtenByGraphs : written).add(begin, end);
}

void KernelHost::launch(const Prepared &prepared, void *stream, int first, int kernels) {
  if (!prepared.kernels)
    throw std::invalid_argument("launch() of an empty prepared entry");
  const int total = int(prepared.kernels->kernels.size());
  const int end = kernels < 0 ? total : first + kernels;
  if (first < 0 || first >= total || end > total || end <= first)
    throw std::invalid_argument("launch(): kernels [" + std::to_string(first) + ", " +
                                std::to_string(end) + ") of an entry of " + std::to_string(total));
  auto cudaStream = static_cast<cudaStream_t>(stream);
  const Loaded &k = *prepared.kernels;
  trackWindow(prepared, stream);
  void *comm = commArgument, *window = windowArgument;
  // The table travels by value: the driver copies its bytes into the launch.
  void *args[] = {&comm, &window, const_cast<uint64_t *>(prepared.table.data())};
  CUlaunchAttribute attributes[3];
  CUlaunchConfig config =
      launchConfig(k, unsigned(servedRanks * prepared.blocks), stream, attributes);
  bool timed = kernelTiming && !capturing(stream);
  auto timingEvent = [&]() -> void * {
    cudaEvent_t event;
    check(cudaEventCreate(&event), "cudaEventCreate (kernel timing)");
    timingEvents.push_back(event); // owned from here on, whatever fails next
    check(cudaEventRecord(event, cudaStream), "cudaEventRecord (kernel timing)");
    return event;
  };
  void *before = timed ? timingEvent() : nullptr;
  for (size_t i = size_t(first); i < size_t(end); ++i) {
    check(detail::driver().launchKernelEx(&config, k.kernels[i], args, nullptr),
          "launching " + k.meta.kernels[i]);
    if (timed) {
      void *after = timingEvent();
      timedKernels.push_back(TimedKernel{k.meta.kernels[i], before, after});
      before = after;
    }
  }
}

void *KernelHost::launch(const Prepared &prepared, void *stream, const LaunchOptions &options) {
  auto cudaStream = static_cast<cudaStream_t>(stream);
  if (options.previousEvent)
    check(cudaStreamWaitEvent(cudaStream, static_cast<cudaEvent_t>(options.previousEvent), 0),
          "waiting for previous_event");
  launch(prepared, stream);
  if (!options.recordEvent)
    return nullptr;
  cudaEvent_t done;
  check(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
  if (cudaError_t e = cudaEventRecord(done, cudaStream); e != cudaSuccess) {
    cudaEventDestroy(done);
    check(e, "cudaEventRecord");
  }
  return done;
}

void KernelHost::Plan::launch(void *stream) { host->launch(ready, stream); }

std::vector<WindowRange> KernelHost::windowRanges(const Prepared &prepared) const {
  std::vector<WindowRange> ranges;
  for (int r = 0; r < servedRanks; ++r) {
    const uint64_t base = reinterpret_cast<uint64_t>(windowMemory(r));
    ranges.push_back({base + uint64_t(prepared.kernelsEnd), base + uint64_t(bytesPerRank)});
  }
  return ranges;
}

void KernelHost::Plan::launch(const uint64_t *addresses, size_t count, void *stream, int first,
                              int kernels) {
  bindings.bind(addresses, count, ready.table, windows);
  if (!ready.kernels->meta.tensorMaps.empty() && encodedFrom != ready.table) {
    host->encodeTensorMaps(ready);
    encodedFrom = ready.table;
  }
  host->launch(ready, stream, first, kernels);
}

KernelHost::Plan KernelHost::plan(const KernelRequest &request,
                                  const std::vector<ParamRecord> &records, int blocks, void *stream,
                                  std::vector<std::string> slotNames) {
  Plan p;
  p.host = this;
  p.ready = prepare(request, records, blocks, stream);
  const Loaded &k = *p.ready.kernels;
  p.bindings =
      AddressBindings(records, k.meta.paramFields, k.meta.paramStride, std::move(slotNames));
  p.windows = windowRanges(p.ready);
  if (!k.meta.tensorMaps.empty())
    p.encodedFrom = p.ready.table;
  return p;
}

KernelHost::Run KernelHost::launchAndWait(const Prepared &prepared, void *stream) {
  launch(prepared, stream);
  check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
  return prepared.info();
}

KernelHost::Run KernelHost::run(const KernelInput &input, const std::vector<ParamRecord> &records,
                                void *stream) {
  return launchAndWait(prepare(input, records, 0, stream), stream);
}

void KernelHost::checkWorld(const EPSpec &spec, size_t calls) const {
  if (spec.ranks != worldSize())
    throw std::invalid_argument("num_ranks is " + std::to_string(spec.ranks) +
                                " but the buffer's world has " + std::to_string(worldSize()) +
                                " ranks");
  // Kernels compiled for another split of the world into nodes would reach
  // same-node peers over the network (or other nodes over NVLink).
  const int perNode = spec.ranksPerNode();
  if (perNode != gpusPerNode())
    throw std::invalid_argument("num_scaleup_ranks is " + std::to_string(perNode) +
                                " (ranks per node) but the buffer's " + "world is " +
                                std::to_string(worldSize() / gpusPerNode()) + " node(s) of " +
                                std::to_string(gpusPerNode()) + " ranks");
  if (int(calls) != servedRanks)
    throw std::invalid_argument("expected one call per rank this buffer serves (" +
                                std::to_string(servedRanks) + "), got " + std::to_string(calls));
}

void KernelHost::setKernelTiming(bool on) { kernelTiming = on; }

void KernelHost::releaseTimedKernels() {
  for (void *event : timingEvents)
    cudaEventDestroy(static_cast<cudaEvent_t>(event));
  timingEvents.clear();
  timedKernels.clear();
}

std::vector<std::pair<std::string, double>> KernelHost::takeKernelTimes() {
  std::vector<std::pair<std::string, double>> times;
  try {
    for (const TimedKernel &t : timedKernels) {
      check(cudaEventSynchronize(static_cast<cudaEvent_t>(t.stop)), "waiting for a timed kernel");
      float ms = 0;
      check(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(t.start),
                                 static_cast<cudaEvent_t>(t.stop)),
            "cudaEventElapsedTime");
      times.emplace_back(t.name, ms / 1e3);
    }
  } catch (...) {
    releaseTimedKernels();
    throw;
  }
  releaseTimedKernels();
  return times;
}
