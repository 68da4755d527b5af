//===- KernelHost.cpp - load, prepare and launch compiled kernels ---------===//

#include "epic/runtime/KernelHost.h"

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

namespace epic::runtime {
/// A TMA descriptor the kernels read from their records (metadata
/// `tensor_maps`): a 2-D row-major tensor whose address is record field
/// `field`, with `rows` rows (a constant, or the value of record field
/// `rowsField`) of `cols` elements, encoded at byte `offset` of each record.
struct TensorMapSpec {
  std::string field, rowsField;
  int64_t offset = 0, rows = 0, cols = 0, elemBytes = 2, boxRows = 64, boxCols = 64, swizzle = 128;
};

struct Loaded {
  CUmodule module = nullptr;
  std::vector<CUfunction> kernels;
  std::vector<std::string> kernelNames;
  std::vector<std::string> fields;
  EntryWindow window;
  /// Fused entries: their scratch, [scratchAt, window.fixed), must be zero
  /// when they start (-1: none). Their data region ends there.
  int64_t scratchAt = -1;
  int threads = 256;
  int maxBlocksPerRank = 0;
  int64_t paramStride = 0;
  /// Bytes of the by-value table the kernels declare (0: the driver cannot say).
  int64_t tableBytes = 0;
  bool cooperative = false; ///< the blocks wait for each other
  /// Blocks launched per requested block (per SM): one-warpgroup GEMM kernels
  /// run two per SM so that one's loads and epilogue overlap the other's MMAs.
  int ctasPerSm = 1;
  int dynamicSharedBytes = 0;          ///< above 48 KiB needs an opt-in per function
  unsigned clusterDims[3] = {1, 1, 1}; ///< thread block clusters (x of the 1-D grid)
  /// Programmatic dependent launch: a kernel may start while the previous
  /// one on the stream finishes (it waits with griddepcontrol.wait).
  bool programmatic = false;
  std::vector<TensorMapSpec> tensorMaps;
  /// Blocks of the least resident kernel the whole GPU holds at once.
  int64_t residentBlocks = 0;

  size_t fieldIndex(const std::string &name) const {
    return size_t(std::find(fields.begin(), fields.end(), name) - fields.begin());
  }
};
} // namespace epic::runtime

namespace {
constexpr int64_t kTensorMapBytes = 128; // sizeof(CUtensorMap), 64-byte aligned

/// Encodes `spec` for one rank's record (its words at `record`) into `out`.
void encodeTensorMap(const TensorMapSpec &spec, const Loaded &k, const uint64_t *record, int rank,
                     void *out) {
  auto field = [&](const std::string &name, bool mayBeZero = false) -> uint64_t {
    size_t i = k.fieldIndex(name);
    if (i == k.fields.size() || (!record[i] && !mayBeZero))
      throw std::invalid_argument("rank " + std::to_string(rank) + ": " + k.kernelNames[0] +
                                  " needs parameter \"" + name + "\" for a TMA descriptor");
    return record[i];
  };
  const int64_t rows =
      spec.rowsField.empty() ? spec.rows : int64_t(field(spec.rowsField, /*mayBeZero=*/true));
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
                                k.kernelNames[0]);
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
  config.blockDimX = unsigned(k.threads), config.blockDimY = 1, config.blockDimZ = 1;
  config.sharedMemBytes = unsigned(k.dynamicSharedBytes);
  config.hStream = static_cast<CUstream>(stream);
  config.attrs = attributes;
  if (k.cooperative) {
    attributes[config.numAttrs].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    attributes[config.numAttrs++].value.cooperative = 1;
  }
  if (k.clusterDims[0] > 1) {
    attributes[config.numAttrs].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attributes[config.numAttrs].value.clusterDim.x = k.clusterDims[0];
    attributes[config.numAttrs].value.clusterDim.y = 1;
    attributes[config.numAttrs++].value.clusterDim.z = 1;
  }
  if (k.programmatic) {
    attributes[config.numAttrs].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attributes[config.numAttrs++].value.programmaticStreamSerializationAllowed = 1;
  }
  return config;
}

} // namespace

KernelHost::KernelHost(KernelProvider &provider, int servedRanks, int64_t windowBytes,
                       int blocksPerRank)
    : provider(provider), servedRanks(servedRanks),
      bytesPerRank((windowBytes + 4095) / 4096 * 4096), blocksPerRank(blocksPerRank) {
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

EntryWindow EntryWindow::of(const Json &entry) {
  EntryWindow w;
  w.fixed = entry.at("window_bytes").integer();
  if (entry.object.count("window_bytes_per_token"))
    w.perToken = entry.at("window_bytes_per_token").integer();
  return w;
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
  const Json &entry = entries.array[0];
  auto loaded = std::make_unique<Loaded>();
  for (const Json &field : entry.at("param_fields").array)
    loaded->fields.push_back(field.string);
  for (const Json &name : entry.at("kernels").array)
    loaded->kernelNames.push_back(name.string);
  loaded->window = EntryWindow::of(entry);
  if (entry.object.count("window_scratch_at")) {
    loaded->scratchAt = entry.at("window_scratch_at").integer();
    if (loaded->scratchAt < epic::ep::window::kControlEnd ||
        loaded->scratchAt > loaded->window.fixed)
      throw std::runtime_error("kernels " + result.key + ": window_scratch_at " +
                               std::to_string(loaded->scratchAt) + " is outside the window");
  }
  loaded->threads = int(entry.at("threads").integer());
  loaded->maxBlocksPerRank = int(entry.at("max_blocks_per_rank").integer());
  loaded->paramStride = entry.at("param_stride").integer();
  // Optional launch attributes of the metadata.
  if (entry.object.count("cooperative"))
    loaded->cooperative = entry.at("cooperative").integer() != 0;
  if (entry.object.count("ctas_per_sm")) {
    loaded->ctasPerSm = int(entry.at("ctas_per_sm").integer());
    if (loaded->ctasPerSm < 1 || loaded->ctasPerSm > 32)
      throw std::runtime_error("kernels " + result.key + ": ctas_per_sm must be in [1, 32]");
  }
  if (entry.object.count("dynamic_shared_bytes"))
    loaded->dynamicSharedBytes = int(entry.at("dynamic_shared_bytes").integer());
  if (entry.object.count("cluster_dims")) {
    const auto &dims = entry.at("cluster_dims").array;
    if (dims.size() != 3 || dims[1].integer() != 1 || dims[2].integer() != 1 ||
        dims[0].integer() < 1 || dims[0].integer() > 16)
      throw std::runtime_error("kernels " + result.key +
                               ": cluster_dims must be [x, 1, 1] with x in [1, 16] (the grid "
                               "is one-dimensional)");
    loaded->clusterDims[0] = unsigned(dims[0].integer());
  }
  if (entry.object.count("programmatic_launch"))
    loaded->programmatic = entry.at("programmatic_launch").integer() != 0;
  if (entry.object.count("tensor_maps")) {
    for (const Json &map : entry.at("tensor_maps").array) {
      TensorMapSpec spec;
      spec.field = map.at("field").string;
      spec.offset = map.at("offset").integer();
      const Json &rows = map.at("rows");
      if (rows.kind == Json::Kind::string)
        spec.rowsField = rows.string;
      else
        spec.rows = rows.integer();
      spec.cols = map.at("cols").integer();
      spec.elemBytes = map.at("elem_bytes").integer();
      spec.boxRows = map.at("box_rows").integer();
      spec.boxCols = map.at("box_cols").integer();
      spec.swizzle = map.at("swizzle").integer();
      if (spec.offset % 64 || spec.offset < int64_t(8 * loaded->fields.size()) ||
          spec.offset + kTensorMapBytes > loaded->paramStride)
        throw std::runtime_error("kernels " + result.key + ": the TMA descriptor of " + spec.field +
                                 " at byte " + std::to_string(spec.offset) +
                                 " is not a 64-byte aligned place after the record's fields");
      loaded->tensorMaps.push_back(spec);
    }
  }
  // Records are 8-byte fields (and TMA descriptors) on 64-byte boundaries.
  if (loaded->paramStride % 64 || loaded->paramStride < int64_t(8 * loaded->fields.size()))
    throw std::runtime_error("kernels " + result.key + ": parameter records of " +
                             std::to_string(loaded->paramStride) + " bytes cannot hold " +
                             std::to_string(loaded->fields.size()) + " 8-byte fields");
  check(detail::driver().moduleLoadData(&loaded->module, result.module->cubin.data()),
        "cuModuleLoadData");
  try {
    detail::attachDeviceWaitReports(loaded->module);
    for (const std::string &name : loaded->kernelNames) {
      CUfunction f;
      check(detail::driver().moduleGetFunction(&f, loaded->module, name.c_str()),
            "cuModuleGetFunction(" + name + ")");
      if (loaded->dynamicSharedBytes > 48 * 1024)
        check(detail::driver().funcSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                loaded->dynamicSharedBytes),
              "allowing " + std::to_string(loaded->dynamicSharedBytes) +
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
      check(detail::driver().occupancy(&perSm, f, loaded->threads,
                                       size_t(loaded->dynamicSharedBytes)),
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
  blocks *= k.ctasPerSm; // per rank, as launched
  prepared.blocks = blocks;
  if (int(records.size()) != servedRanks)
    throw std::invalid_argument("expected one parameter record per rank (" +
                                std::to_string(servedRanks) + "), got " +
                                std::to_string(records.size()));
  const int64_t tableBytes = int64_t(servedRanks) * k.paramStride;
  if (k.tableBytes && k.tableBytes != tableBytes)
    throw std::runtime_error(k.kernelNames[0] + " takes a parameter table of " +
                             std::to_string(k.tableBytes) + " bytes, but this buffer serves " +
                             std::to_string(servedRanks) + " rank(s) of " +
                             std::to_string(k.paramStride) +
                             "-byte records: kernels compiled for another backend or world");
  int64_t tokens = 0; // the cap of kernels that take it at run time
  for (const ParamRecord &record : records)
    if (auto it = record.find("max_tokens_per_rank"); it != record.end())
      tokens = std::max<int64_t>(tokens, int64_t(it->second.value));
  const int64_t windowNeeded = k.window.bytes(tokens);
  prepared.dataEnd = k.scratchAt >= 0 ? k.scratchAt : windowNeeded;
  if (windowNeeded > bytesPerRank)
    throw std::invalid_argument(
        "the buffer has " + std::to_string(bytesPerRank) + " bytes per rank, these kernels need " +
        std::to_string(windowNeeded) +
        (k.window.perToken ? " for num_max_tokens_per_rank " + std::to_string(tokens) : "") +
        ": create it with at least get_buffer_size_hint() bytes");
  if (blocks > k.maxBlocksPerRank)
    throw std::invalid_argument("blocks per rank (" + std::to_string(blocks) +
                                ") exceeds the kernels' maximum " +
                                std::to_string(k.maxBlocksPerRank));
  if ((int64_t(servedRanks) * blocks) % k.clusterDims[0])
    throw std::invalid_argument(
        "the kernels run in clusters of " + std::to_string(k.clusterDims[0]) +
        " blocks: " + std::to_string(servedRanks) + " rank(s) x " + std::to_string(blocks) +
        " blocks per rank must be a multiple of it");
  // Every rank's blocks wait for each other: all must be resident at once.
  if (k.cooperative && k.residentBlocks < int64_t(servedRanks) * blocks)
    throw std::invalid_argument(
        "a launch of " + std::to_string(servedRanks) + " ranks x " + std::to_string(blocks) +
        " blocks does not fit on this GPU at once (it holds " + std::to_string(k.residentBlocks) +
        " blocks of " + k.kernelNames[0] + "): use fewer blocks per rank");
  if (envFlag("EPIC_DEBUG")) {
    std::string names;
    for (const std::string &name : k.kernelNames)
      names += (names.empty() ? "" : ", ") + name;
    std::fprintf(
        stderr,
        "epic: prepared %s: %d rank(s) x %d blocks x %d threads%s%s%s, window %lld of "
        "%lld bytes per rank, %lld-byte parameter table\n",
        names.c_str(), servedRanks, blocks, k.threads, k.cooperative ? ", cooperative" : "",
        k.clusterDims[0] > 1 ? (", clusters of " + std::to_string(k.clusterDims[0])).c_str() : "",
        k.programmatic ? ", programmatic dependent launch" : "", (long long)windowNeeded,
        (long long)bytesPerRank, (long long)tableBytes);
  }
  prepared.table.assign(size_t(tableBytes / 8), 0);
  for (int r = 0; r < servedRanks; ++r)
    for (const auto &[name, value] : records[r]) {
      size_t field = k.fieldIndex(name);
      if (field == k.fields.size())
        throw std::invalid_argument("rank " + std::to_string(r) + ": unknown parameter \"" + name +
                                    "\" for kernels " + k.kernelNames[0]);
      prepared.table[size_t(r) * k.paramStride / 8 + field] = value.value;
    }
  encodeTensorMaps(prepared);
  return prepared;
}

void KernelHost::encodeTensorMaps(Prepared &prepared) const {
  const Loaded &k = *prepared.kernels;
  for (int r = 0; r < servedRanks && !k.tensorMaps.empty(); ++r) {
    uint64_t *record = prepared.table.data() + size_t(r) * k.paramStride / 8;
    for (const TensorMapSpec &spec : k.tensorMaps)
      encodeTensorMap(spec, k, record, r, record + spec.offset / 8);
  }
}

void KernelHost::trackWindow(const Prepared &prepared, void *stream) {
  const Loaded &k = *prepared.kernels;
  const bool captured = capturing(stream);
  if (k.scratchAt >= 0) {
    const int64_t begin = k.scratchAt, end = k.window.fixed;
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

void KernelHost::launch(const Prepared &prepared, void *stream) {
  if (!prepared.kernels)
    throw std::invalid_argument("launch() of an empty prepared entry");
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
  for (size_t i = 0; i < k.kernels.size(); ++i) {
    check(detail::driver().launchKernelEx(&config, k.kernels[i], args, nullptr),
          "launching " + k.kernelNames[i]);
    if (timed) {
      void *after = timingEvent();
      timedKernels.push_back(TimedKernel{k.kernelNames[i], before, after});
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

void KernelHost::Plan::launch(const uint64_t *addresses, size_t count, void *stream) {
  bindings.bind(addresses, count, ready.table);
  if (!ready.kernels->tensorMaps.empty() && encodedFrom != ready.table) {
    host->encodeTensorMaps(ready);
    encodedFrom = ready.table;
  }
  host->launch(ready, stream);
}

KernelHost::Plan KernelHost::plan(const KernelRequest &request,
                                  const std::vector<ParamRecord> &records, int blocks, void *stream,
                                  std::vector<std::string> slotNames) {
  Plan p;
  p.host = this;
  p.ready = prepare(request, records, blocks, stream);
  const Loaded &k = *p.ready.kernels;
  p.bindings = AddressBindings(records, k.fields, k.paramStride, std::move(slotNames));
  if (!k.tensorMaps.empty())
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
