//===- VirtualBuffer.cpp - R virtual ranks on one GPU ---------------------===//

#include "epic/runtime/VirtualBuffer.h"

#include "epic/device/VirtualWorld.h"
#include "epic/runtime/Json.h"
#include "epic/runtime/KernelProvider.h"

#include "CudaCheck.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

using namespace epic::runtime;

using detail::check;

namespace {
constexpr int kSignals = 64, kCounters = 64, kBarriers = 1024;
} // namespace

namespace epic::runtime {
/// A TMA descriptor the kernels read (metadata `tensor_maps`): a 2-D
/// row-major tensor whose address is record field `field`, with `rows` rows
/// (a constant, or the value of record field `rowsField`) of `cols` elements.
struct TensorMapSpec {
  std::string field, rowsField;
  int64_t rows = 0, cols = 0, elemBytes = 2, boxRows = 64, boxCols = 64, swizzle = 128;
};

struct Loaded {
  CUmodule module = nullptr;
  std::vector<CUfunction> kernels;
  std::vector<std::string> kernelNames;
  std::vector<std::string> fields;
  int64_t windowBytes = 0;
  int threads = 256;
  int maxBlocksPerRank = 0;
  int64_t paramStride = 0;
  bool cooperative = false;   ///< the blocks wait for each other
  /// Blocks launched per requested block (per SM): one-warpgroup GEMM kernels
  /// run two per SM so that one's loads and epilogue overlap the other's MMAs.
  int ctasPerSm = 1;
  int dynamicSharedBytes = 0; ///< above 48 KiB needs an opt-in per function
  unsigned clusterDims[3] = {1, 1, 1}; ///< thread block clusters (x of the 1-D grid)
  /// Programmatic dependent launch: a kernel may start while the previous
  /// one on the stream finishes (it waits with griddepcontrol.wait).
  bool programmatic = false;
  /// Encoded per call into the parameter memory; record field "tensor_maps"
  /// points at the rank's maps (128 bytes each, in this order).
  std::vector<TensorMapSpec> tensorMaps;
};
} // namespace epic::runtime

namespace {
constexpr int64_t kTensorMapBytes = 128; // sizeof(CUtensorMap), 64-byte aligned

/// Encodes `spec` for one rank's record into `out` (128 bytes).
void encodeTensorMap(const TensorMapSpec &spec, const ParamRecord &record, int rank,
                     const std::string &kernel, void *out) {
  auto field = [&](const std::string &name) -> uint64_t {
    auto it = record.find(name);
    if (it == record.end() || !it->second)
      throw std::invalid_argument("rank " + std::to_string(rank) + ": " + kernel +
                                  " needs parameter \"" + name + "\" for a TMA descriptor");
    return it->second;
  };
  const uint64_t address = field(spec.field);
  const int64_t rows = spec.rowsField.empty() ? spec.rows : int64_t(record.count(spec.rowsField)
                                                                         ? record.at(spec.rowsField)
                                                                         : 0);
  if (address % 16)
    throw std::invalid_argument("rank " + std::to_string(rank) + ": " + spec.field +
                                " must be 16-byte aligned for the TMA loads of " + kernel);
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
  // An empty tensor still needs a valid map (no tile reads it): one row.
  cuuint64_t dims[2] = {cuuint64_t(spec.cols), cuuint64_t(std::max<int64_t>(rows, 1))};
  cuuint64_t strides[1] = {cuuint64_t(spec.cols * spec.elemBytes)};
  cuuint32_t box[2] = {cuuint32_t(spec.boxCols), cuuint32_t(spec.boxRows)};
  cuuint32_t elementStrides[2] = {1, 1};
  detail::check(detail::driver().tensorMapEncodeTiled(
                    static_cast<CUtensorMap *>(out), type, 2,
                    reinterpret_cast<void *>(address), dims, strides, box, elementStrides,
                    CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                    CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
                ("cuTensorMapEncodeTiled(" + spec.field + " of rank " + std::to_string(rank) +
                 ", " + std::to_string(rows) + " x " + std::to_string(spec.cols) + ")")
                    .c_str());
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
}

KernelHost::~KernelHost() {
  releaseTimedKernels();
  for (auto &[key, loaded] : modules) {
    if (loaded->module)
      detail::driver().moduleUnload(loaded->module);
    delete loaded;
  }
}

VirtualElasticBuffer::VirtualElasticBuffer(int ranks, int64_t windowBytes,
                                           KernelProvider &provider, int blocksPerRank)
    : KernelHost(provider, ranks, windowBytes, blocksPerRank) {
  if (provider.settings().backend != "virtual")
    throw std::invalid_argument("a virtual world needs kernels compiled for backend=virtual, "
                                "not " + provider.settings().backend);
  check(cudaFree(nullptr), "cudaFree(0) (creating the CUDA context)");
  check(cudaMalloc(&window, size_t(ranks) * bytesPerRank), "cudaMalloc(window)");
  check(cudaMemset(window, 0, size_t(ranks) * bytesPerRank), "cudaMemset(window)");
  check(cudaMalloc(&signals, sizeof(uint64_t) * ranks * kSignals), "cudaMalloc(signals)");
  check(cudaMemset(signals, 0, sizeof(uint64_t) * ranks * kSignals), "cudaMemset(signals)");
  check(cudaMalloc(&counters, sizeof(uint64_t) * ranks * kCounters), "cudaMalloc(counters)");
  check(cudaMemset(counters, 0, sizeof(uint64_t) * ranks * kCounters), "cudaMemset(counters)");
  check(cudaMalloc(&barriers, sizeof(uint64_t) * kBarriers), "cudaMalloc(barriers)");
  check(cudaMemset(barriers, 0, sizeof(uint64_t) * kBarriers), "cudaMemset(barriers)");
  EpicVirtualComm comm{};
  comm.num_ranks = ranks;
  comm.num_contexts = 1;
  comm.num_signals = kSignals;
  comm.num_counters = kCounters;
  comm.num_barriers = kBarriers;
  comm.signals = static_cast<uint64_t *>(signals);
  comm.counters = static_cast<uint64_t *>(counters);
  comm.barriers = static_cast<uint64_t *>(barriers);
  EpicVirtualWindow desc{static_cast<char *>(window), uint64_t(bytesPerRank), ranks, 0};
  check(cudaMalloc(&commArgument, sizeof comm), "cudaMalloc(comm descriptor)");
  check(cudaMemcpy(commArgument, &comm, sizeof comm, cudaMemcpyHostToDevice), "cudaMemcpy");
  check(cudaMalloc(&windowArgument, sizeof desc), "cudaMalloc(window descriptor)");
  check(cudaMemcpy(windowArgument, &desc, sizeof desc, cudaMemcpyHostToDevice), "cudaMemcpy");
}

VirtualElasticBuffer::~VirtualElasticBuffer() {
  // Nothing may still run on the window when it goes.
  cudaDeviceSynchronize();
  for (void *p : {windowArgument, commArgument, barriers, counters, signals, window})
    if (p)
      cudaFree(p);
}

Loaded &KernelHost::load(const std::string &entryIR, Run &run) {
  KernelProvider::Result result = provider.get(entryIR);
  run.key = result.key;
  run.source = result.source;
  run.seconds = result.seconds;
  if (auto it = modules.find(result.key); it != modules.end())
    return *it->second;
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
  loaded->windowBytes = entry.at("window_bytes").integer();
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
      loaded->tensorMaps.push_back(spec);
    }
    if (std::find(loaded->fields.begin(), loaded->fields.end(), "tensor_maps") ==
        loaded->fields.end())
      throw std::runtime_error("kernels " + result.key +
                               ": tensor_maps metadata without a \"tensor_maps\" parameter");
  }
  // Records are 8-byte fields; fused entries have more of them than 128 bytes hold.
  if (loaded->paramStride % 8 || loaded->paramStride < int64_t(8 * loaded->fields.size()) ||
      loaded->paramStride > 4096)
    throw std::runtime_error("kernels " + result.key + ": parameter records of " +
                             std::to_string(loaded->paramStride) + " bytes cannot hold " +
                             std::to_string(loaded->fields.size()) + " 8-byte fields");
  check(detail::driver().moduleLoadData(&loaded->module, result.module->cubin.data()), "cuModuleLoadData");
  try {
    detail::attachDeviceWaitReports(loaded->module);
    for (const std::string &name : loaded->kernelNames) {
      CUfunction f;
      check(detail::driver().moduleGetFunction(&f, loaded->module, name.c_str()),
            ("cuModuleGetFunction(" + name + ")").c_str());
      if (loaded->dynamicSharedBytes > 48 * 1024)
        check(detail::driver().funcSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                 loaded->dynamicSharedBytes),
              ("allowing " + std::to_string(loaded->dynamicSharedBytes) +
               " bytes of dynamic shared memory for " + name)
                  .c_str());
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

KernelHost::Prepared::Prepared(Prepared &&other) noexcept
    : run(std::move(other.run)), kernels(other.kernels), params(other.params),
      blocks(other.blocks) {
  other.params = nullptr;
}

KernelHost::Prepared &
KernelHost::Prepared::operator=(Prepared &&other) noexcept {
  std::swap(run, other.run);
  std::swap(kernels, other.kernels);
  std::swap(params, other.params);
  std::swap(blocks, other.blocks);
  return *this;
}

KernelHost::Prepared::~Prepared() {
  if (params)
    cudaFree(params);
}

KernelHost::Prepared
KernelHost::prepare(const std::string &entryIR, const std::vector<ParamRecord> &records,
                    int blocks) {
  if (blocks < 0 || blocks > blocksPerRank)
    throw std::invalid_argument("num_sms (" + std::to_string(blocks) +
                                " blocks per rank) must be in [1, " +
                                std::to_string(blocksPerRank) +
                                "], the most this buffer was created for (0: all of them)");
  if (blocks == 0)
    blocks = blocksPerRank;
  Prepared prepared;
  Loaded &k = load(entryIR, prepared.run);
  prepared.kernels = &k;
  blocks *= k.ctasPerSm; // per rank, as launched
  prepared.blocks = blocks;
  if (int(records.size()) != servedRanks)
    throw std::invalid_argument("expected one parameter record per rank (" +
                                std::to_string(servedRanks) + "), got " +
                                std::to_string(records.size()));
  if (k.windowBytes > bytesPerRank)
    throw std::invalid_argument("the buffer has " + std::to_string(bytesPerRank) +
                                " bytes per rank, these kernels need " +
                                std::to_string(k.windowBytes) +
                                ": create it with at least get_buffer_size_hint() bytes");
  if (blocks > k.maxBlocksPerRank)
    throw std::invalid_argument("blocks per rank (" + std::to_string(blocks) +
                                ") exceeds the kernels' maximum " +
                                std::to_string(k.maxBlocksPerRank));
  if ((int64_t(servedRanks) * blocks) % k.clusterDims[0])
    throw std::invalid_argument("the kernels run in clusters of " +
                                std::to_string(k.clusterDims[0]) + " blocks: " +
                                std::to_string(servedRanks) + " rank(s) x " +
                                std::to_string(blocks) +
                                " blocks per rank must be a multiple of it");
  // Every rank's blocks wait for each other: all must be resident at once.
  int device = 0, sms = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
        "cudaDeviceGetAttribute");
  for (size_t i = 0; k.cooperative && i < k.kernels.size(); ++i) {
    int perSm = 0;
    check(detail::driver().occupancy(&perSm, k.kernels[i], k.threads,
                                                      size_t(k.dynamicSharedBytes)),
          "cuOccupancyMaxActiveBlocksPerMultiprocessor");
    if (int64_t(perSm) * sms < int64_t(servedRanks) * blocks)
      throw std::invalid_argument(
          "a launch of " + std::to_string(servedRanks) + " ranks x " +
          std::to_string(blocks) + " blocks does not fit on this GPU at once (" +
          k.kernelNames[i] + ": " + std::to_string(perSm) + " blocks per SM x " +
          std::to_string(sms) + " SMs): use fewer blocks per rank");
  }
  if (envFlag("EPIC_DEBUG")) {
    std::string names;
    for (const std::string &name : k.kernelNames)
      names += (names.empty() ? "" : ", ") + name;
    std::fprintf(stderr,
                 "epic: prepared %s: %d rank(s) x %d blocks x %d threads%s%s%s, window %lld of "
                 "%lld bytes per rank\n",
                 names.c_str(), servedRanks, blocks, k.threads,
                 k.cooperative ? ", cooperative" : "",
                 k.clusterDims[0] > 1 ? (", clusters of " + std::to_string(k.clusterDims[0])).c_str()
                                      : "",
                 k.programmatic ? ", programmatic dependent launch" : "", (long long)k.windowBytes,
                 (long long)bytesPerRank);
  }
  std::vector<uint64_t> table(size_t(servedRanks) * k.paramStride / 8, 0);
  for (int r = 0; r < servedRanks; ++r)
    for (const auto &[name, value] : records[r]) {
      auto it = std::find(k.fields.begin(), k.fields.end(), name);
      if (it == k.fields.end())
        throw std::invalid_argument("rank " + std::to_string(r) + ": unknown parameter \"" +
                                    name + "\" for kernels " + k.kernelNames[0]);
      table[size_t(r) * k.paramStride / 8 + size_t(it - k.fields.begin())] = value;
    }
  // TMA descriptors follow the records, one group of maps per rank.
  const size_t tableBytes = table.size() * 8;
  const size_t mapsOffset = (tableBytes + kTensorMapBytes - 1) / kTensorMapBytes * kTensorMapBytes;
  const size_t mapsPerRank = k.tensorMaps.size();
  const size_t totalBytes = mapsPerRank ? mapsOffset + servedRanks * mapsPerRank * kTensorMapBytes
                                        : tableBytes;
  check(cudaMalloc(&prepared.params, totalBytes), "cudaMalloc(parameter records)");
  std::vector<unsigned char> host(totalBytes, 0);
  if (mapsPerRank) {
    const size_t field = size_t(std::find(k.fields.begin(), k.fields.end(), "tensor_maps") -
                                k.fields.begin());
    for (int r = 0; r < servedRanks; ++r) {
      size_t at = mapsOffset + size_t(r) * mapsPerRank * kTensorMapBytes;
      table[size_t(r) * k.paramStride / 8 + field] =
          reinterpret_cast<uint64_t>(prepared.params) + at;
      for (const TensorMapSpec &spec : k.tensorMaps) {
        encodeTensorMap(spec, records[r], r, k.kernelNames[0], host.data() + at);
        at += kTensorMapBytes;
      }
    }
  }
  std::memcpy(host.data(), table.data(), tableBytes);
  check(cudaMemcpy(prepared.params, host.data(), totalBytes, cudaMemcpyHostToDevice),
        "cudaMemcpy(parameter records)");
  return prepared;
}

void KernelHost::launch(const Prepared &prepared, void *stream) {
  launch(prepared, stream, LaunchOptions{});
}

void *KernelHost::launch(const Prepared &prepared, void *stream, const LaunchOptions &options) {
  if (!prepared.kernels || !prepared.params)
    throw std::invalid_argument("launch() of an empty or moved-from prepared entry");
  auto cudaStream = static_cast<cudaStream_t>(stream);
  if (options.previousEvent)
    check(cudaStreamWaitEvent(cudaStream, static_cast<cudaEvent_t>(options.previousEvent), 0),
          "waiting for previous_event");
  const Loaded &k = *prepared.kernels;
  void *params = prepared.params;
  void *comm = commArgument, *window = windowArgument;
  void *args[] = {&comm, &window, &params};
  CUlaunchAttribute attributes[3];
  CUlaunchConfig config{};
  config.gridDimX = unsigned(servedRanks * prepared.blocks), config.gridDimY = 1, config.gridDimZ = 1;
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
  bool timed = false;
  if (kernelTiming) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    check(cudaStreamIsCapturing(cudaStream, &capture), "cudaStreamIsCapturing");
    timed = capture == cudaStreamCaptureStatusNone;
  }
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
          ("launching " + k.kernelNames[i]).c_str());
    if (timed) {
      void *after = timingEvent();
      timedKernels.push_back(TimedKernel{k.kernelNames[i], before, after});
      before = after;
    }
  }
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

void KernelHost::checkWorld(const EPSpec &spec, size_t calls) const {
  if (spec.ranks != worldSize())
    throw std::invalid_argument("num_ranks is " + std::to_string(spec.ranks) +
                                " but the buffer's world has " + std::to_string(worldSize()) +
                                " ranks");
  if (int(calls) != servedRanks)
    throw std::invalid_argument("expected one call per rank this buffer serves (" +
                                std::to_string(servedRanks) + "), got " + std::to_string(calls));
}

KernelHost::Prepared KernelHost::prepareDispatch(const EPSpec &spec,
                                                 const DispatchVariant &variant,
                                                 const std::vector<DispatchCall> &calls,
                                                 int blocks) {
  checkWorld(spec, calls.size());
  std::vector<ParamRecord> records;
  for (const DispatchCall &call : calls)
    records.push_back(dispatchRecord(spec, variant, call));
  return prepare(dispatchEntryIR(spec, variant, kDispatchEntryName), records, blocks);
}

KernelHost::Prepared KernelHost::prepareCombine(const EPSpec &spec, const CombineVariant &variant,
                                                const std::vector<CombineCall> &calls,
                                                int blocks) {
  checkWorld(spec, calls.size());
  std::vector<ParamRecord> records;
  for (const CombineCall &call : calls)
    records.push_back(combineRecord(spec, variant, call));
  return prepare(combineEntryIR(spec, variant, kCombineEntryName), records, blocks);
}

KernelHost::Prepared KernelHost::prepareGroupedGemm(const EPSpec &spec,
                                                    const std::vector<GroupedGemmCall> &calls,
                                                    int blocks) {
  checkWorld(spec, calls.size());
  std::vector<ParamRecord> records;
  for (const GroupedGemmCall &call : calls)
    records.push_back(groupedGemmRecord(spec, call));
  const GroupedGemmCall &first = calls.front();
  for (size_t r = 1; r < calls.size(); ++r)
    if (calls[r].weights.shape != first.weights.shape || calls[r].out.dtype != first.out.dtype)
      throw std::invalid_argument("grouped_gemm: rank " + std::to_string(r) +
                                  "'s weights or output type differ from rank 0's");
  return prepare(groupedGemmEntryIR(spec, first.weights.shape[2], first.out.dtype,
                                    kGroupedGemmEntryName),
                 records, blocks);
}

KernelHost::Prepared KernelHost::prepareDispatchGemm(const EPSpec &spec,
                                                     const DispatchVariant &variant,
                                                     const std::vector<DispatchGemmCall> &calls,
                                                     int blocks) {
  checkWorld(spec, calls.size());
  std::vector<ParamRecord> records;
  for (const DispatchGemmCall &call : calls)
    records.push_back(dispatchGemmRecord(spec, variant, call));
  const DispatchGemmCall &first = calls.front();
  for (size_t r = 1; r < calls.size(); ++r)
    if (calls[r].experts.shape != first.experts.shape ||
        calls[r].gemmOut.dtype != first.gemmOut.dtype)
      throw std::invalid_argument("dispatch_gemm: rank " + std::to_string(r) +
                                  "'s experts or output type differ from rank 0's");
  return prepare(dispatchGemmEntryIR(spec, variant, first.experts.shape[2], first.gemmOut.dtype,
                                     kDispatchGemmEntryName),
                 records, blocks);
}

KernelHost::Prepared KernelHost::prepareGemmCombine(const EPSpec &spec, int biases,
                                                    const std::vector<GemmCombineCall> &calls,
                                                    int blocks) {
  checkWorld(spec, calls.size());
  std::vector<ParamRecord> records;
  for (const GemmCombineCall &call : calls)
    records.push_back(gemmCombineRecord(spec, biases, call));
  return prepare(gemmCombineEntryIR(spec, biases, kGemmCombineEntryName), records, blocks);
}

KernelHost::Run KernelHost::groupedGemm(const EPSpec &spec,
                                        const std::vector<GroupedGemmCall> &calls, void *stream,
                                        int blocks) {
  return launchAndWait(prepareGroupedGemm(spec, calls, blocks), stream);
}

KernelHost::Run KernelHost::launchAndWait(const Prepared &prepared, void *stream) {
  launch(prepared, stream);
  // The records are freed with `prepared`: wait for the kernels that read them.
  check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
  return prepared.info();
}

KernelHost::Run KernelHost::dispatch(const EPSpec &spec, const DispatchVariant &variant,
                                     const std::vector<DispatchCall> &calls, void *stream,
                                     bool checkRouting, int blocks) {
  Prepared prepared = prepareDispatch(spec, variant, calls, blocks);
  auto cudaStream = static_cast<cudaStream_t>(stream);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(cudaStream, &capture), "cudaStreamIsCapturing");
  if (checkRouting && capture == cudaStreamCaptureStatusNone) {
    // Every rank's routing back in one synchronization.
    std::vector<std::vector<int64_t>> routing;
    for (const DispatchCall &call : calls) {
      const DeviceTensor &idx = call.handle.topkIdx;
      routing.emplace_back(size_t(idx.shape[0]) * spec.topk);
      check(cudaMemcpyAsync(routing.back().data(), reinterpret_cast<const void *>(idx.data),
                            routing.back().size() * sizeof(int64_t), cudaMemcpyDeviceToHost,
                            cudaStream),
            "reading topk_idx back");
    }
    check(cudaStreamSynchronize(cudaStream), "cudaStreamSynchronize");
    for (size_t i = 0; i < calls.size(); ++i)
      checkTopkIndices(spec, routing[i].data(), calls[i].handle.topkIdx.shape[0]);
  }
  return launchAndWait(prepared, stream);
}

KernelHost::Run KernelHost::combine(const EPSpec &spec, const CombineVariant &variant,
                                    const std::vector<CombineCall> &calls, void *stream,
                                    int blocks) {
  return launchAndWait(prepareCombine(spec, variant, calls, blocks), stream);
}

// All R ranks run inside the same launches, queued on one stream: whatever
// any rank queued before is finished before any rank's later work starts.
void VirtualElasticBuffer::barrier(void *) {}

void *VirtualElasticBuffer::windowMemory(int servedRank) const {
  if (servedRank < 0 || servedRank >= servedRanks)
    throw std::out_of_range("window of rank " + std::to_string(servedRank) + ": the world has " +
                            std::to_string(servedRanks) + " ranks");
  return static_cast<char *>(window) + int64_t(servedRank) * bytesPerRank;
}

KernelHost::Run KernelHost::run(const std::string &entryIR,
                                const std::vector<ParamRecord> &records, void *stream) {
  return launchAndWait(prepare(entryIR, records), stream);
}
