//===- NcclBuffer.cpp - the NCCL communicator and ElasticBuffer -----------===//

#include "epic/runtime/NcclBuffer.h"

#include "CudaCheck.h"
#include "epic/Dialect/EP/IR/EPWindow.h"

#include <nccl.h>
#include <nccl_device.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <cstring>
#include <sstream>
#include <stdexcept>

using namespace epic::runtime;
using detail::check;

namespace {
void check(ncclResult_t result, const char *what) {
  if (result != ncclSuccess)
    throw NcclError(std::string(what) + " failed: " + ncclGetErrorString(result) +
                    " (NCCL_DEBUG=WARN says more)");
}

/// The device communicator the ep kernels need. The one place where NCCL
/// versions differ: 2.28 takes a zeroed struct (GIN comes on with signals or
/// ginForceEnable); 2.29+ requires NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER and
/// selects GIN with ginConnectionType.
ncclDevCommRequirements requirements(int lsaBarriers, int ginSignals) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 29, 0)
  ncclDevCommRequirements reqs = NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER;
  if (ginSignals)
    reqs.ginConnectionType = NCCL_GIN_CONNECTION_FULL;
#else
  ncclDevCommRequirements reqs;
  std::memset(&reqs, 0, sizeof reqs);
#endif
  reqs.lsaBarrierCount = lsaBarriers;
  reqs.ginSignalCount = ginSignals;
  return reqs;
}
} // namespace

static const char *ginTypeName(int type) {
  switch (type) {
  case 0:
    return "none";
  case 2:
    return "proxy";
  case 3:
    return "GDAKI";
  case 4:
    return "GPI";
  case 5:
    return "EFA";
  default:
    return "unknown";
  }
}

std::string DeviceApiInfo::describe() const {
  std::ostringstream os;
  os << "NCCL " << ncclVersionName(version) << ", rank " << rank << " of " << worldSize
     << ", LSA team " << lsaRank << " of " << lsaSize << ", GIN ";
  if (!ginProbed)
    os << "not probed (NCCL 2.28 cannot query it without enabling GIN on the communicator)";
  else
    os << (gin ? std::string("available (") + ginTypeName(ginType) + ")"
               : std::string("not available"));
  return os.str();
}

static_assert(ncclInProgress == kNcclInProgress, "NcclChecks.h's ncclInProgress");

/// A communicator's state: ncclInProgress while a non-blocking call runs.
static int asyncState(ncclComm_t comm) {
  ncclResult_t state = ncclSuccess;
  ncclResult_t r = ncclCommGetAsyncError(comm, &state);
  return int(r != ncclSuccess ? r : state);
}

int Communicator::loadedVersion() {
  int version = 0;
  check(ncclGetVersion(&version), "ncclGetVersion");
  return version;
}

void Communicator::checkVersion() {
  if (NCCL_VERSION_CODE < NCCL_VERSION(2, 28, 9))
    throw NcclError("NCCL " + ncclVersionName(NCCL_VERSION_CODE) +
                    " has no usable device API: epic needs NCCL >= 2.28.9");
  checkVersionsEqual(NCCL_VERSION_CODE, loadedVersion());
}

std::string Communicator::newUniqueId() {
  ncclUniqueId id;
  check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  return std::string(id.internal, sizeof id.internal);
}

/// epic's communicators are blocking whatever NCCL_COMM_BLOCKING says: its
/// host calls then return finished (settle still covers ncclInProgress).
static ncclConfig_t blockingConfig() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 1;
  return config;
}

Communicator::Communicator(int worldSize, int rank, const std::string &uniqueId,
                           double timeoutSeconds)
    : timeout(timeoutSeconds) {
  checkVersion();
  if (worldSize < 1 || rank < 0 || rank >= worldSize)
    throw std::invalid_argument("rank " + std::to_string(rank) + " of " +
                                std::to_string(worldSize) + " is not a valid rank");
  ncclUniqueId id;
  if (uniqueId.size() != sizeof id.internal)
    throw std::invalid_argument("unique_id must be " + std::to_string(sizeof id.internal) +
                                " bytes, got " + std::to_string(uniqueId.size()));
  std::memcpy(id.internal, uniqueId.data(), sizeof id.internal);
  ncclConfig_t config = blockingConfig();
  check(ncclCommInitRankConfig(&comm, worldSize, id, rank, &config), "ncclCommInitRankConfig");
}

Communicator::Communicator(ncclComm_t comm, double timeoutSeconds)
    : comm(comm), timeout(timeoutSeconds) {}

std::unique_ptr<Communicator> Communicator::splitOf(ncclComm_t parent, double timeoutSeconds) {
  checkVersion(); // the parent is read by this library: same layout
  if (!parent)
    throw std::invalid_argument("comm: a null ncclComm_t");
  // A non-blocking parent may still be initializing, and its split returns
  // ncclInProgress: wait on the parent's state, bounded, naming the call.
  auto parentState = [parent] { return asyncState(parent); };
  check(ncclResult_t(waitWhileInProgress(parentState, "the parent communicator's initialization",
                                         timeoutSeconds)),
        "the parent communicator (ncclCommGetAsyncError)");
  int rank = 0;
  check(ncclCommUserRank(parent, &rank), "ncclCommUserRank(parent)");
  // NCCL stores the child when the split's job ends, possibly after a timeout
  // here: the slot is freed only once that cannot happen any more.
  auto slot = std::make_unique<ncclComm_t>(nullptr);
  ncclConfig_t config = blockingConfig();
  ncclResult_t r = ncclCommSplit(parent, /*color=*/0, /*key=*/rank, slot.get(), &config);
  if (r == ncclInProgress) {
    try {
      r = ncclResult_t(waitWhileInProgress(parentState, "ncclCommSplit", timeoutSeconds));
    } catch (const NcclError &) {
      slot.release(); // still NCCL's to write
      throw;
    }
  }
  check(r, "ncclCommSplit");
  ncclComm_t child = __atomic_load_n(slot.get(), __ATOMIC_ACQUIRE);
  if (!child)
    throw NcclError("ncclCommSplit returned no communicator (NCCL_DEBUG=WARN says why)");
  return std::unique_ptr<Communicator>(new Communicator(child, timeoutSeconds));
}

Communicator::~Communicator() {
  if (!comm)
    return;
  if (broken)
    ncclCommAbort(comm); // a collective never finished: destroy would wait for it
  else
    ncclCommDestroy(comm);
}

void Communicator::settle(int result, const std::string &what) {
  if (result == ncclInProgress) {
    auto state = [this] { return asyncState(comm); };
    try {
      result = waitWhileInProgress(state, what, timeout);
    } catch (const NcclError &) {
      broken = true;
      throw;
    }
  }
  check(ncclResult_t(result), what.c_str());
}

std::vector<char> Communicator::allGather(const void *mine, size_t bytes) {
  int n = worldSize();
  // Owned here so every exit frees them.
  struct Scratch {
    void *memory = nullptr;
    cudaStream_t stream = nullptr;
    ~Scratch() {
      if (stream)
        cudaStreamDestroy(stream);
      if (memory)
        cudaFree(memory);
    }
  } s;
  check(cudaMalloc(&s.memory, bytes * (n + 1)), "cudaMalloc(all-gather)");
  check(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking),
        "cudaStreamCreate(all-gather)");
  char *in = static_cast<char *>(s.memory), *out = in + bytes;
  check(cudaMemcpy(in, mine, bytes, cudaMemcpyHostToDevice), "cudaMemcpy(all-gather)");
  settle(ncclAllGather(in, out, bytes, ncclChar, comm, s.stream), "ncclAllGather");
  // Bounded: a rank that never calls it would otherwise hang this one silently.
  auto pending = [&] {
    cudaError_t e = cudaStreamQuery(s.stream);
    return e == cudaErrorNotReady ? kNcclInProgress : int(e);
  };
  int status;
  try {
    status = waitWhileInProgress(pending,
                                 "ncclAllGather of the ranks' buffer arguments (every "
                                 "rank constructs the buffer)",
                                 timeout);
  } catch (const NcclError &) {
    broken = true;
    throw;
  }
  check(cudaError_t(status), "ncclAllGather (stream)");
  std::vector<char> all(bytes * n);
  check(cudaMemcpy(all.data(), out, all.size(), cudaMemcpyDeviceToHost), "cudaMemcpy(all-gather)");
  return all;
}

const DeviceApiInfo &Communicator::deviceApi() {
  if (queried)
    return api;
  api.version = loadedVersion();
  api.worldSize = ncclTeamWorld(comm).nRanks;
  api.rank = ncclTeamWorld(comm).rank;
  api.lsaSize = ncclTeamLsa(comm).nRanks;
  api.lsaRank = ncclTeamLsa(comm).rank;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 29, 0)
  ncclCommProperties props = NCCL_COMM_PROPERTIES_INITIALIZER;
  check(ncclCommQueryProperties(comm, &props), "ncclCommQueryProperties");
  if (!props.deviceApiSupport)
    throw NcclError("this communicator does not support the NCCL device API (" + api.describe() +
                    ")");
  api.ginType = int(props.ginType);
  api.ginProbed = true;
#else
  // 2.28 has no query, and its only probe (a device communicator with a GIN
  // signal) leaves GIN enabled on the communicator: every later window
  // registration then needs a GIN network. A one-rank world needs no network.
  api.ginProbed = api.worldSize == 1;
#endif
  api.gin = api.ginType != 0;
  queried = true;
  return api;
}

int Communicator::worldSize() const {
  int n = 0;
  check(ncclCommCount(comm, &n), "ncclCommCount");
  return n;
}

int Communicator::rank() const {
  int r = 0;
  check(ncclCommUserRank(comm, &r), "ncclCommUserRank");
  return r;
}

NcclElasticBuffer::NcclElasticBuffer(Communicator &comm, int64_t windowBytes,
                                     KernelProvider &provider, int blocksPerRank, int64_t hostBytes)
    : KernelHost(provider, /*servedRanks=*/1, windowBytes, blocksPerRank, hostBytes), comm(comm) {
  if (provider.settings().backend != "nccl")
    throw std::invalid_argument("an NCCL buffer needs kernels compiled for backend=nccl, not " +
                                provider.settings().backend);
  try {
    acquire(blocksPerRank);
  } catch (...) {
    release(); // a failed constructor runs no destructor
    throw;
  }
}

void NcclElasticBuffer::acquire(int blocksPerRank) {
  ncclComm_t c = comm.get();
  apiInfo = comm.deviceApi();
  checkRanks(blocksPerRank); // the ranks agree on the LSA size, numbered node-major
  // The device communicator first: NCCL refuses it without symmetric memory
  // support, where ncclCommWindowRegister would return a local registration
  // (or nothing) in place of a symmetric window.
  auto *dev = new ncclDevComm;
  devCommHost = dev;
  // The ep kernels synchronize through the window; comm.barrier users get
  // one LSA barrier slot per block. On one node the kernels use LSA peers
  // only: no GIN. A world of several NVLink domains reaches the other nodes
  // through GIN with the signals of EPWindow.h (entry, counts, done flags).
  const int nodes = apiInfo.worldSize / std::max(1, apiInfo.lsaSize);
  const int signals = nodes > 1 ? int(epic::ep::window::ginSignals(apiInfo.worldSize)) : 0;
  ncclDevCommRequirements reqs = requirements(/*lsaBarriers=*/std::max(blocksPerRank, 64), signals);
  ginSignals = signals; // kernels needing more are refused at prepare(), by name
  ncclResult_t created = ncclDevCommCreate(c, &reqs, dev);
  if (created != ncclSuccess && nodes > 1)
    throw NcclError("this group spans " + std::to_string(nodes) +
                    " NVLink domains and needs NCCL GIN (an RDMA NIC, " + std::to_string(signals) +
                    " signals) to reach the other nodes: " + "ncclDevCommCreate said " +
                    ncclGetErrorString(created) + " (" + apiInfo.describe() + ")");
  if (created == ncclInvalidUsage)
    throw NcclError("ncclDevCommCreate failed: this communicator has no symmetric memory "
                    "support (NCCL needs CUDA P2P between all its GPUs, NCCL_WIN_ENABLE=1 and "
                    "cuMem, NCCL_CUMEM_ENABLE=1); the ep kernels need symmetric windows (" +
                    apiInfo.describe() + ")");
  check(created, "ncclDevCommCreate");
  devCommCreated = true;
  if (cpuBytesPerRank && apiInfo.worldSize > 1)
    throw NcclError("num_cpu_bytes (Engram's host segment) on an NCCL world of " +
                    std::to_string(apiInfo.worldSize) +
                    " ranks: a peer's host segment is reached by NCCL's GIN get or by host "
                    "memory in NCCL's NVLink mappings, neither of which epic uses yet; use one "
                    "rank or the virtual world (" +
                    apiInfo.describe() + ")");
  if (cpuBytesPerRank) {
    mixed = std::make_unique<MixedWindows>(1, bytesPerRank, cpuBytesPerRank);
    memory = mixed->base();
  } else {
    check(ncclMemAlloc(&memory, size_t(bytesPerRank)), "ncclMemAlloc(window)");
    check(cudaMemset(memory, 0, size_t(bytesPerRank)), "cudaMemset(window)");
  }
  ncclWindow_t w = nullptr;
  check(ncclCommWindowRegister(c, memory, size_t(windowStride()), &w, NCCL_WIN_COLL_SYMMETRIC),
        "ncclCommWindowRegister");
  if (!w)
    throw NcclError("ncclCommWindowRegister registered no window: symmetric registration is "
                    "not supported on this communicator (NCCL_WIN_ENABLE=0 or "
                    "NCCL_LOCAL_REGISTER=0?)");
  window = w;
  {
    // The LSA mapping kernels reach peers through (ncclGetLsaPointer's
    // arithmetic on the window's device descriptor): the copy engines of
    // AGRS write to the same addresses from the host's side.
    ncclWindow_vidmem descriptor{};
    check(cudaMemcpy(&descriptor, w, sizeof(descriptor), cudaMemcpyDeviceToHost),
          "reading the window's descriptor (cudaMemcpy)");
    lsaBase = descriptor.lsaFlatBase;
    lsaStride = uint64_t(descriptor.stride4G) << 32;
  }
  check(cudaMalloc(&commArgument, sizeof(ncclDevComm)), "cudaMalloc(device communicator)");
  check(cudaMemcpy(commArgument, dev, sizeof(ncclDevComm), cudaMemcpyHostToDevice),
        "cudaMemcpy(device communicator)");
  windowArgument = window;
  check(cudaMalloc(&barrierWord, sizeof(int)), "cudaMalloc(barrier word)");
  check(cudaMemset(barrierWord, 0, sizeof(int)), "cudaMemset(barrier word)");
}

void NcclElasticBuffer::checkRanks(int blocksPerRank) {
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  RankFacts mine;
  mine.numBytes = bytesPerRank;
  mine.blocksPerRank = blocksPerRank;
  mine.ncclVersion = Communicator::loadedVersion();
  int sms = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "SM count");
  mine.smCount = sms;
  mine.lsaSize = apiInfo.lsaSize;
  mine.lsaRank = apiInfo.lsaRank;
  check(cudaDeviceGetPCIBusId(mine.pciBusId, sizeof mine.pciBusId, device),
        "cudaDeviceGetPCIBusId");
  std::vector<char> bytes = comm.allGather(&mine, sizeof mine);
  std::vector<RankFacts> facts(bytes.size() / sizeof(RankFacts));
  std::memcpy(facts.data(), bytes.data(), bytes.size());
  checkRanksAgree(facts);

  // P2P atomics between the GPUs of each node (the entry barrier's LSA arrivals).
  auto visible = [](const std::string &busId) {
    int d = -1;
    if (cudaDeviceGetByPCIBusId(&d, busId.c_str()) != cudaSuccess) {
      cudaGetLastError(); // not visible here: not a sticky error
      return -1;
    }
    return d;
  };
  auto nativeAtomics = [](int a, int b) {
    int value = 0;
    check(cudaDeviceGetP2PAttribute(&value, cudaDevP2PAttrNativeAtomicSupported, a, b),
          "cudaDeviceGetP2PAttribute(native atomics)");
    return value != 0;
  };
  int64_t verdict = p2pAtomicsVerdict(facts, apiInfo.rank, visible, nativeAtomics);
  bytes = comm.allGather(&verdict, sizeof verdict);
  std::vector<int64_t> verdicts(facts.size());
  std::memcpy(verdicts.data(), bytes.data(), bytes.size());
  const char *assume = std::getenv("EPIC_ASSUME_P2P_ATOMICS");
  checkP2PVerdicts(facts, verdicts, assume && std::string(assume) == "1");
}

NcclElasticBuffer::~NcclElasticBuffer() { release(); }

void *NcclElasticBuffer::peerWindowMemory(int servedRank, int peer) const {
  windowMemory(servedRank); // checks the served rank
  // The LSA team is apiInfo.lsaSize consecutive world ranks (checkRanks).
  const int lsaIndex = apiInfo.lsaRank + (peer - apiInfo.rank);
  if (peer < 0 || peer >= apiInfo.worldSize || lsaIndex < 0 || lsaIndex >= apiInfo.lsaSize)
    throw std::out_of_range("rank " + std::to_string(peer) + " is not in rank " +
                            std::to_string(apiInfo.rank) + "'s NVLink (LSA) team of " +
                            std::to_string(apiInfo.lsaSize) + " ranks");
  if (peer == apiInfo.rank)
    return memory;
  return lsaBase + uint64_t(lsaIndex) * lsaStride;
}

void *NcclElasticBuffer::windowMemory(int servedRank) const {
  if (servedRank != 0)
    throw std::out_of_range("window of served rank " + std::to_string(servedRank) +
                            ": an NCCL buffer serves one rank (0)");
  return memory;
}

void NcclElasticBuffer::barrier(void *stream) {
  comm.settle(ncclAllReduce(barrierWord, barrierWord, 1, ncclInt32, ncclSum, comm.get(),
                            static_cast<cudaStream_t>(stream)),
              "ncclAllReduce(barrier)");
}

void NcclElasticBuffer::release() {
  cudaDeviceSynchronize();
  ncclComm_t c = comm.get();
  if (devCommHost) {
    if (devCommCreated)
      ncclDevCommDestroy(c, static_cast<ncclDevComm *>(devCommHost));
    delete static_cast<ncclDevComm *>(devCommHost);
  }
  if (commArgument)
    cudaFree(commArgument);
  if (barrierWord)
    cudaFree(barrierWord);
  barrierWord = nullptr;
  if (window)
    ncclCommWindowDeregister(c, static_cast<ncclWindow_t>(window));
  if (memory && !mixed)
    ncclMemFree(memory);
  mixed.reset();
  devCommHost = commArgument = window = memory = nullptr;
  devCommCreated = false;
}
