//===- NcclBuffer.cpp - the NCCL communicator and ElasticBuffer -----------===//

#include "epic/runtime/NcclBuffer.h"

#include "CudaCheck.h"

#include <nccl.h>
#include <nccl_device.h>

#include <algorithm>
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
  case 0: return "none";
  case 2: return "proxy";
  case 3: return "GDAKI";
  case 4: return "GPI";
  case 5: return "EFA";
  default: return "unknown";
  }
}

std::string DeviceApiInfo::describe() const {
  std::ostringstream os;
  os << "NCCL " << version / 10000 << "." << version / 100 % 100 << "." << version % 100
     << ", rank " << rank << " of " << worldSize << ", LSA team " << lsaRank << " of "
     << lsaSize << ", GIN "
     << (gin ? std::string("available (") + ginTypeName(ginType) + ")" : std::string("not available"));
  return os.str();
}

void Communicator::checkVersion() {
  int version = 0;
  check(ncclGetVersion(&version), "ncclGetVersion");
  if (version / 100 != NCCL_VERSION_CODE / 100)
    throw NcclError("the loaded NCCL is " + std::to_string(version) + " but epic was built for " +
                    std::to_string(NCCL_VERSION_CODE) +
                    ": the device communicator's layout differs; rebuild epic against it");
  if (NCCL_VERSION_CODE < NCCL_VERSION(2, 28, 9))
    throw NcclError("NCCL " + std::to_string(NCCL_VERSION_CODE) +
                    " has no usable device API: epic needs NCCL >= 2.28.9");
}

std::string Communicator::newUniqueId() {
  ncclUniqueId id;
  check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  return std::string(id.internal, sizeof id.internal);
}

Communicator::Communicator(int worldSize, int rank, const std::string &uniqueId) : owned(true) {
  checkVersion();
  if (worldSize < 1 || rank < 0 || rank >= worldSize)
    throw std::invalid_argument("rank " + std::to_string(rank) + " of " +
                                std::to_string(worldSize) + " is not a valid rank");
  ncclUniqueId id;
  if (uniqueId.size() != sizeof id.internal)
    throw std::invalid_argument("unique_id must be " + std::to_string(sizeof id.internal) +
                                " bytes, got " + std::to_string(uniqueId.size()));
  std::memcpy(id.internal, uniqueId.data(), sizeof id.internal);
  check(ncclCommInitRank(&comm, worldSize, id, rank), "ncclCommInitRank");
}

Communicator::Communicator(ncclComm_t comm) : comm(comm) {
  checkVersion();
  if (!comm)
    throw std::invalid_argument("comm: a null ncclComm_t");
}

Communicator::~Communicator() {
  if (owned && comm)
    ncclCommDestroy(comm);
}

const DeviceApiInfo &Communicator::deviceApi() {
  if (queried)
    return api;
  api.version = NCCL_VERSION_CODE;
  api.worldSize = ncclTeamWorld(comm).nRanks;
  api.rank = ncclTeamWorld(comm).rank;
  api.lsaSize = ncclTeamLsa(comm).nRanks;
  api.lsaRank = ncclTeamLsa(comm).rank;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 29, 0)
  ncclCommProperties props = NCCL_COMM_PROPERTIES_INITIALIZER;
  check(ncclCommQueryProperties(comm, &props), "ncclCommQueryProperties");
  if (!props.deviceApiSupport)
    throw NcclError("this communicator does not support the NCCL device API (" + api.describe() + ")");
  api.ginType = int(props.ginType);
#else
  // 2.28 has no query: ask for a device communicator with one GIN signal and
  // read the type NCCL chose (it fails, with a WARN, where there is no GIN).
  if (api.worldSize > 1) {
    ncclDevCommRequirements reqs = requirements(/*lsaBarriers=*/0, /*ginSignals=*/1);
    reqs.ginContextCount = 1;
    ncclDevComm probe;
    if (ncclDevCommCreate(comm, &reqs, &probe) == ncclSuccess) {
      api.ginType = probe.ginContextCount ? int(probe.ginTypes[0]) : 0;
      check(ncclDevCommDestroy(comm, &probe), "ncclDevCommDestroy(GIN probe)");
    }
  }
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
                                     KernelProvider &provider, int blocksPerRank)
    : KernelHost(provider, /*servedRanks=*/1, windowBytes, blocksPerRank), comm(comm) {
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
  if (apiInfo.lsaSize != apiInfo.worldSize)
    throw NcclError("the ep kernels reach every peer over NVLink (LSA), but only " +
                    std::to_string(apiInfo.lsaSize) + " of " + std::to_string(apiInfo.worldSize) +
                    " ranks are in this rank's LSA team (multi-node needs the hybrid mode)");
  check(ncclMemAlloc(&memory, size_t(bytesPerRank)), "ncclMemAlloc(window)");
  check(cudaMemset(memory, 0, size_t(bytesPerRank)), "cudaMemset(window)");
  ncclWindow_t w;
  check(ncclCommWindowRegister(c, memory, size_t(bytesPerRank), &w, NCCL_WIN_COLL_SYMMETRIC),
        "ncclCommWindowRegister");
  window = w;
  auto *dev = new ncclDevComm;
  devCommHost = dev;
  // The ep kernels synchronize through the window; comm.barrier users get
  // one LSA barrier slot per block. No GIN: the kernels use LSA peers only.
  ncclDevCommRequirements reqs = requirements(/*lsaBarriers=*/std::max(blocksPerRank, 64), 0);
  check(ncclDevCommCreate(c, &reqs, dev), "ncclDevCommCreate");
  devCommCreated = true;
  check(cudaMalloc(&commArgument, sizeof(ncclDevComm)), "cudaMalloc(device communicator)");
  check(cudaMemcpy(commArgument, dev, sizeof(ncclDevComm), cudaMemcpyHostToDevice),
        "cudaMemcpy(device communicator)");
  windowArgument = window;
  check(cudaMalloc(&barrierWord, sizeof(int)), "cudaMalloc(barrier word)");
  check(cudaMemset(barrierWord, 0, sizeof(int)), "cudaMemset(barrier word)");
}

NcclElasticBuffer::~NcclElasticBuffer() { release(); }

void *NcclElasticBuffer::windowMemory(int servedRank) const {
  if (servedRank != 0)
    throw std::out_of_range("window of served rank " + std::to_string(servedRank) +
                            ": an NCCL buffer serves one rank (0)");
  return memory;
}

void NcclElasticBuffer::barrier(void *stream) {
  check(ncclAllReduce(barrierWord, barrierWord, 1, ncclInt32, ncclSum, comm.get(),
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
  if (memory)
    ncclMemFree(memory);
  devCommHost = commArgument = window = memory = nullptr;
  devCommCreated = false;
}
