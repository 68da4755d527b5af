//===- comm_smoke.cu - run the comm lowering's kernels on a GPU -----------===//
//
// Until the runtime provides the launcher, this small driver loads the cubins
// that epic-compile made from comm_kernels.mlir and checks what they did:
//
//   comm_smoke virtual <cubin>          8 virtual ranks on one GPU
//   comm_smoke nccl <cubin>             the NCCL backend with nranks = 1
//   comm_smoke virtual-timeout <cubin>  a wait nobody satisfies must trap
//   comm_smoke virtual-timeout-report <cubin>  ... a call-free one, its report in mapped memory
//   comm_smoke virtual-phase-timeout-report <cubin>  an mbarrier phase (a GEMM pipeline)
//                                        that never completes: its call-free report
//   comm_smoke ep-nccl <cubin> <json>   convert-ep-to-comm's dispatch + combine, NCCL, nranks = 1
//
// and, in comm_smoke_nodes.cu, virtual worlds of several nodes:
//
//   comm_smoke virtual-2x4 <cubin>       2 nodes of 4: teams, LSA/rail/world barriers, puts
//                                        to the rail peer, the traffic they count
//   comm_smoke virtual-lsa-violation <cubin>         an NVLink pointer to another node traps
//   comm_smoke virtual-lsa-violation-report <cubin>  ... in a call-free kernel: its report
//   comm_smoke virtual-drop <cubin>      a rank whose network is dropped: its rail peer's
//                                        wait times out naming it
//
// Every CUDA/NCCL call is checked; any mismatch prints what differed and
// exits non-zero.
//
//===----------------------------------------------------------------------===//

#include "CommSmoke.h"

#include <nccl.h>
#include <nccl_device.h>

#include <algorithm>

#define CHECK_NCCL(call)                                                                           \
  do {                                                                                             \
    ncclResult_t r_ = (call);                                                                      \
    if (r_ != ncclSuccess) {                                                                       \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call,                    \
                   ncclGetErrorString(r_));                                                        \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

using namespace comm_smoke;

int runVirtualNodes(const std::string &mode, const char *cubin); // comm_smoke_nodes.cu

namespace {

int runVirtual(const char *cubin) {
  const int R = 8, blocksPerRank = 4, threads = 256, vectors = 4096;
  std::printf("virtual backend: %d ranks x %d blocks x %d threads\n", R, blocksPerRank, threads);
  CUmodule module = loadModule(cubin);
  VirtualWorld world(R, 1 << 20);

  // lsa_ring: rank r's first `vectors` 16-byte vectors land after the data of rank r+1.
  std::vector<int32_t> host(R * (world.stride / 4));
  int words = vectors * 4;
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < words; ++i)
      host[r * (world.stride / 4) + i] = pattern(r, i);
  CHECK_CUDA(cudaMemcpy(world.data, host.data(), R * world.stride, cudaMemcpyHostToDevice));
  int32_t n = vectors;
  launch(kernel(module, "lsa_ring"), R * blocksPerRank, threads,
         {&world.commDev, &world.window, &world.flags, &n});
  std::vector<int32_t> out(host.size());
  CHECK_CUDA(cudaMemcpy(out.data(), world.data, R * world.stride, cudaMemcpyDeviceToHost));
  bool ok = true;
  for (int r = 0; r < R && ok; ++r)
    for (int i = 0; i < words && ok; ++i)
      ok = out[r * (world.stride / 4) + words + i] == pattern((r + R - 1) % R, i);
  expect(ok, "lsa_ring: every rank received its predecessor's rows");
  std::vector<int32_t> flagsOut(R * 1024);
  CHECK_CUDA(cudaMemcpy(flagsOut.data(), world.flagData, R * 4096, cudaMemcpyDeviceToHost));
  ok = true;
  for (int r = 0; r < R; ++r)
    ok &= flagsOut[r * 1024] == blocksPerRank;
  expect(ok, "lsa_ring: each rank's arrival flag counted every block");

  // put_signal: a one-sided put of 48 KiB (+ a ragged 16-byte tail) with a signal.
  world.reset();
  CHECK_CUDA(cudaMemcpy(world.data, host.data(), R * world.stride, cudaMemcpyHostToDevice));
  int64_t bytes = 48 * 1024 + 16;
  launch(kernel(module, "put_signal"), R * blocksPerRank, threads,
         {&world.commDev, &world.window, &bytes});
  CHECK_CUDA(cudaMemcpy(out.data(), world.data, R * world.stride, cudaMemcpyDeviceToHost));
  ok = true;
  for (int r = 0; r < R && ok; ++r)
    for (int i = 0; i < bytes / 4 && ok; ++i)
      ok = out[r * (world.stride / 4) + bytes / 4 + i] == pattern((r + R - 1) % R, i);
  expect(ok, "put_signal: the put landed before its signal was seen");
  std::vector<uint64_t> signals(R * 4);
  CHECK_CUDA(
      cudaMemcpy(signals.data(), world.comm.signals, signals.size() * 8, cudaMemcpyDeviceToHost));
  ok = true;
  for (int r = 0; r < R; ++r)
    ok &= signals[r * 4] == 1;
  expect(ok, "put_signal: every rank's signal 0 was raised exactly once");
  std::vector<uint64_t> traffic = world.traffic();
  ok = true;
  for (int from = 0; from < R; ++from)
    for (int to = 0; to < R; ++to) {
      const uint64_t *t = &traffic[(size_t(from) * R + to) * EPIC_TRAFFIC_KINDS];
      bool next = to == (from + 1) % R;
      ok &= t[EPIC_TRAFFIC_PUT_BYTES] == (next ? uint64_t(bytes) : 0) &&
            t[EPIC_TRAFFIC_PUT_VALUE_BYTES] == 0 && t[EPIC_TRAFFIC_SIGNALS] == (next ? 1u : 0u);
    }
  expect(ok, "put_signal: the traffic counts one put and one signal to the next rank");

  // barrier_rounds: 2000 rounds of count, barrier, check, barrier; twice, so the
  // second launch starts from the barrier generation the first one left.
  for (int launchIndex = 0; launchIndex < 2; ++launchIndex) {
    world.reset();
    int32_t rounds = 2000;
    launch(kernel(module, "barrier_rounds"), R * blocksPerRank, threads,
           {&world.commDev, &world.window, &rounds});
    CHECK_CUDA(cudaMemcpy(out.data(), world.data, R * world.stride, cudaMemcpyDeviceToHost));
    ok = true;
    for (int b = 0; b < blocksPerRank; ++b)
      ok &= out[b] == R * rounds;
    int errors = 0;
    for (int r = 0; r < R; ++r)
      for (int b = 0; b < blocksPerRank; ++b)
        errors += out[r * (world.stride / 4) + 1024 + b];
    char what[128];
    std::snprintf(what, sizeof what, "barrier_rounds #%d: %d rounds, counters %d, %d early reads",
                  launchIndex, rounds, out[0], errors);
    expect(ok && errors == 0, what);
  }
  return failures;
}

int runVirtualTimeout(const char *cubin) {
  std::printf("virtual backend: a wait that nobody satisfies\n");
  CUmodule module = loadModule(cubin);
  VirtualWorld world(1, 1 << 16);
  std::vector<void *> args = {&world.window};
  CHECK_CU(cuLaunchKernel(kernel(module, "wait_forever"), 1, 1, 1, 32, 1, 1, 0, nullptr,
                          args.data(), nullptr));
  CUresult r = cuCtxSynchronize();
  const char *message = nullptr;
  cuGetErrorString(r, &message);
  std::printf("  kernel ended with: %s\n", message);
  expect(r != CUDA_SUCCESS, "wait_forever: the bounded wait trapped instead of hanging");
  return failures;
}

/// Launches `name` (blocks 0..`block`, `threads` each), which must trap, and
/// returns the report slot of its block `block` (blockIdx.x % kWaitReportSlots).
const volatile epic_device::WaitReport &
launchUntilTrap(CUmodule module, const char *name, unsigned block, unsigned threads, void **args) {
  epic_device::WaitReport *host = mapWaitReports(module);
  CHECK_CU(cuLaunchKernel(kernel(module, name), block + 1, 1, 1, threads, 1, 1, 0, nullptr, args,
                          nullptr));
  CUresult r = cuCtxSynchronize();
  const char *message = nullptr;
  cuGetErrorString(r, &message);
  std::printf("  kernel ended with: %s\n", message);
  expect(r != CUDA_SUCCESS,
         (std::string(name) + ": the bounded wait trapped instead of hanging").c_str());
  return host[block];
}

// The call-free wait (comm.inline_waits, as in wgmma kernels): its report lands
// in mapped host memory the module's epic_wait_report points at, readable
// after the trap, as the runtime does it (runtime/lib/WaitReports.cpp).
int runVirtualTimeoutReport(const char *cubin) {
  std::printf("virtual backend: a call-free wait that nobody satisfies\n");
  CUmodule module = loadModule(cubin);
  VirtualWorld world(1, 1 << 16);
  std::vector<void *> args = {&world.window};
  const unsigned block = 3;
  const volatile epic_device::WaitReport &report =
      launchUntilTrap(module, "wait_forever_inline", block, 32, args.data());
  std::printf("  report of block %d: valid %llu, flag %s %lld (seen %lld), timeout %lld ms, "
              "thread %d\n",
              int(report.block), (unsigned long long)report.valid,
              report.predicate == 0 ? "==" : "?", (long long)report.expected,
              (long long)report.seen, (long long)(report.timeoutNs / 1000000), int(report.thread));
  expect(report.valid == 1 && report.block == int(block) && report.predicate == 0 &&
             report.expected == 1 && report.seen == 0 && report.timeoutNs == 200000000 &&
             report.rank == -1 && report.peer == -1,
         "wait_forever_inline: the timeout report is in the mapped slot of its block");
  return failures;
}

// A GEMM pipeline's bounded mbarrier wait (comm.wait_phase) that nothing
// completes: it traps, and its call-free report names the barrier (a shared
// address), the parity waited for and the barrier's state. Two warps time out
// together: the one that does not write the report must not trap before it is
// whole (a trap ends the grid).
int runVirtualPhaseTimeoutReport(const char *cubin) {
  std::printf("virtual backend: an mbarrier phase that never completes\n");
  CUmodule module = loadModule(cubin);
  const unsigned block = 5;
  const volatile epic_device::WaitReport &report =
      launchUntilTrap(module, "wait_phase_forever_inline", block, 64, nullptr);
  std::printf("  report of block %d: valid %llu, predicate %d, barrier at shared 0x%llx, parity "
              "%lld, timeout %lld ms, thread %d\n",
              int(report.block), (unsigned long long)report.valid, int(report.predicate),
              (unsigned long long)report.flag, (long long)report.expected,
              (long long)(report.timeoutNs / 1000000), int(report.thread));
  expect(report.valid == 1 && report.block == int(block) &&
             report.predicate == epic_device::kPhaseNotCompleted && report.expected == 0 &&
             report.timeoutNs == 200000000 && report.rank == -1 && report.thread < 64,
         "wait_phase_forever_inline: the report names the phase in the mapped slot of its block");
  return failures;
}

// --- The nccl backend with one rank: real communicator, window, device comm -----

int runNccl(const char *cubin) {
  int version = 0;
  CHECK_NCCL(ncclGetVersion(&version));
  std::printf("nccl backend: NCCL %d, nranks = 1\n", version);
  CUmodule module = loadModule(cubin);
  ncclUniqueId id;
  CHECK_NCCL(ncclGetUniqueId(&id));
  ncclComm_t comm;
  CHECK_NCCL(ncclCommInitRank(&comm, 1, id, 0));

  const size_t bytes = 1 << 20;
  void *data, *flagData;
  CHECK_NCCL(ncclMemAlloc(&data, bytes));
  CHECK_NCCL(ncclMemAlloc(&flagData, bytes));
  ncclWindow_t window, flags;
  CHECK_NCCL(ncclCommWindowRegister(comm, data, bytes, &window, NCCL_WIN_COLL_SYMMETRIC));
  CHECK_NCCL(ncclCommWindowRegister(comm, flagData, bytes, &flags, NCCL_WIN_COLL_SYMMETRIC));
  ncclDevCommRequirements reqs;
  std::memset(&reqs, 0, sizeof reqs);
  reqs.lsaBarrierCount = 64;
  ncclDevComm devComm;
  CHECK_NCCL(ncclDevCommCreate(comm, &reqs, &devComm));
  ncclDevComm *devCommPtr = deviceCopy(devComm);

  const int blocks = 4, threads = 256, vectors = 4096, words = vectors * 4;
  std::vector<int32_t> host(bytes / 4, 0);
  for (int i = 0; i < words; ++i)
    host[i] = pattern(0, i);
  CHECK_CUDA(cudaMemcpy(data, host.data(), bytes, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemset(flagData, 0, bytes));
  int32_t n = vectors;
  launch(kernel(module, "lsa_ring"), blocks, threads, {&devCommPtr, &window, &flags, &n});
  std::vector<int32_t> out(bytes / 4);
  CHECK_CUDA(cudaMemcpy(out.data(), data, bytes, cudaMemcpyDeviceToHost));
  bool ok = true;
  for (int i = 0; i < words && ok; ++i)
    ok = out[words + i] == pattern(0, i);
  expect(ok, "lsa_ring: rows moved through ncclGetPeerPointer");
  int32_t flag = 0;
  CHECK_CUDA(cudaMemcpy(&flag, flagData, 4, cudaMemcpyDeviceToHost));
  expect(flag == blocks, "lsa_ring: arrivals counted, LSA barrier passed");

  CHECK_CUDA(cudaMemset(data, 0, bytes));
  int32_t rounds = 2000;
  launch(kernel(module, "barrier_rounds"), blocks, threads, {&devCommPtr, &window, &rounds});
  CHECK_CUDA(cudaMemcpy(out.data(), data, bytes, cudaMemcpyDeviceToHost));
  ok = true;
  int errors = 0;
  for (int b = 0; b < blocks; ++b) {
    ok &= out[b] == rounds;
    errors += out[1024 + b];
  }
  expect(ok && errors == 0, "barrier_rounds: 2000 rounds of ncclLsaBarrierSession");

  CHECK_NCCL(ncclDevCommDestroy(comm, &devComm));
  CHECK_NCCL(ncclCommWindowDeregister(comm, flags));
  CHECK_NCCL(ncclCommWindowDeregister(comm, window));
  CHECK_NCCL(ncclMemFree(flagData));
  CHECK_NCCL(ncclMemFree(data));
  CHECK_NCCL(ncclCommDestroy(comm));
  return failures;
}

// --- convert-ep-to-comm's kernels on NCCL with one rank ------------------------------------

/// The integer after `"key": ` in the metadata JSON (first occurrence).
long long jsonInt(const std::string &json, const std::string &key) {
  size_t at = json.find("\"" + key + "\": ");
  if (at == std::string::npos) {
    std::fprintf(stderr, "metadata has no %s\n", key.c_str());
    std::exit(1);
  }
  return std::atoll(json.c_str() + at + key.size() + 4);
}

uint16_t toBF16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

int runEpNccl(const char *cubin, const char *metadataPath) {
  const int T = 200, K = 4, E = 8, H = 1024, Tmax = 256, blocks = 4, threads = 256;
  std::ifstream in(metadataPath);
  std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // The parameter records' layout is convert-ep-to-comm's (Passes.td); fail loudly if it moved.
  const char *dispatchFields =
      "\"x\",\n        \"scale_packs\",\n        \"topk_idx\",\n        \"topk_weights\",\n        "
      "\"recv_x\"";
  if (json.find(dispatchFields) == std::string::npos) {
    std::fprintf(stderr, "unexpected dispatch parameter fields in %s\n", metadataPath);
    return 1;
  }
  size_t windowBytes = (jsonInt(json, "window_bytes") + 4095) / 4096 * 4096;
  std::printf("ep on nccl, nranks = 1: T=%d K=%d E=%d H=%d, window %zu bytes\n", T, K, E, H,
              windowBytes);
  CUmodule module = loadModule(cubin);
  ncclUniqueId id;
  CHECK_NCCL(ncclGetUniqueId(&id));
  ncclComm_t comm;
  CHECK_NCCL(ncclCommInitRank(&comm, 1, id, 0));
  void *buffer;
  CHECK_NCCL(ncclMemAlloc(&buffer, windowBytes));
  CHECK_CUDA(cudaMemset(buffer, 0, windowBytes));
  ncclWindow_t window;
  CHECK_NCCL(ncclCommWindowRegister(comm, buffer, windowBytes, &window, NCCL_WIN_COLL_SYMMETRIC));
  ncclDevCommRequirements reqs;
  std::memset(&reqs, 0, sizeof reqs);
  reqs.lsaBarrierCount = 64;
  ncclDevComm devComm;
  CHECK_NCCL(ncclDevCommCreate(comm, &reqs, &devComm));
  ncclDevComm *devCommPtr = deviceCopy(devComm);

  // Inputs: tokens pick K distinct experts, some slots masked, some tokens routed nowhere.
  std::vector<uint16_t> x(T * H);
  std::vector<int64_t> idx(T * K);
  std::vector<float> w(T * K);
  uint32_t seed = 12345;
  auto rnd = [&] { return (seed = seed * 1664525u + 1013904223u) >> 8; };
  for (int i = 0; i < T * H; ++i)
    x[i] = toBF16(float(rnd() % 2000) / 1000.f + 0.001f);
  int routed = 0;
  std::vector<int> perExpert(E, 0);
  for (int t = 0; t < T; ++t) {
    int first = rnd() % E;
    bool any = false;
    for (int j = 0; j < K; ++j) {
      bool masked = t % 11 == 0 || rnd() % 10 == 0;
      idx[t * K + j] = masked ? -1 : (first + j) % E;
      w[t * K + j] = float(rnd() % 1000) / 7.f;
      if (!masked) {
        any = true;
        perExpert[(first + j) % E]++;
      }
    }
    routed += any;
  }
  auto upload = [](const void *host, size_t bytes) {
    void *p;
    CHECK_CUDA(cudaMalloc(&p, bytes));
    CHECK_CUDA(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice));
    return p;
  };
  auto zeros = [](size_t bytes) {
    void *p;
    CHECK_CUDA(cudaMalloc(&p, bytes));
    CHECK_CUDA(cudaMemset(p, 0xff, bytes)); // poisoned
    return p;
  };
  void *dX = upload(x.data(), x.size() * 2), *dIdx = upload(idx.data(), idx.size() * 8),
       *dW = upload(w.data(), w.size() * 4);
  void *recvX = zeros(size_t(Tmax) * H * 2), *recvIdx = zeros(size_t(Tmax) * K * 8),
       *recvW = zeros(size_t(Tmax) * K * 4), *meta = zeros(size_t(Tmax) * (K + 2) * 4),
       *psumRank = zeros(4), *expertCounts = zeros(E * 4), *psumExpert = zeros(E * 4),
       *hostCounts = zeros((1 + E) * 4), *slots = zeros(size_t(T) * K * 4);
  // convert-ep-to-comm's dispatch record: x, scale_packs, topk_idx, topk_weights, recv_x,
  // recv_scale_packs, recv_topk_idx, recv_topk_weights, recv_src_metadata, psum per rank,
  // per-expert counts, psum per expert, host counts, num_tokens, dst_buffer_slot_idx,
  // max_tokens_per_rank, topk_idx_copy. The table (one rank's record here) is a by-value kernel
  // parameter.
  // The last field, topk_idx_copy, stays null (no handle copy).
  const int64_t stride = jsonInt(json, "param_stride");
  if (stride < 17 * 8 || stride % 64) {
    std::fprintf(stderr, "unexpected parameter record size %lld in %s\n", (long long)stride,
                 metadataPath);
    return 1;
  }
  std::vector<uint64_t> record(size_t(stride / 8), 0);
  const uint64_t fields[16] = {(uint64_t)dX,           0,
                               (uint64_t)dIdx,         (uint64_t)dW,
                               (uint64_t)recvX,        0,
                               (uint64_t)recvIdx,      (uint64_t)recvW,
                               (uint64_t)meta,         (uint64_t)psumRank,
                               (uint64_t)expertCounts, (uint64_t)psumExpert,
                               (uint64_t)hostCounts,   (uint64_t)T,
                               (uint64_t)slots,        (uint64_t)Tmax};
  std::copy(std::begin(fields), std::end(fields), record.begin());
  launch(kernel(module, "dispatch_send"), blocks, threads, {&devCommPtr, &window, record.data()});
  launch(kernel(module, "dispatch_copy"), blocks, threads, {&devCommPtr, &window, record.data()});

  std::vector<int32_t> counts(1 + E), metaHost(Tmax * (K + 2)), psum(1);
  CHECK_CUDA(cudaMemcpy(counts.data(), hostCounts, counts.size() * 4, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(psum.data(), psumRank, 4, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(metaHost.data(), meta, metaHost.size() * 4, cudaMemcpyDeviceToHost));
  bool ok = counts[0] == routed && psum[0] == routed;
  for (int e = 0; e < E; ++e)
    ok &= counts[1 + e] == perExpert[e];
  expect(ok, "dispatch: received tokens and per-expert counts");
  std::vector<uint16_t> rx(size_t(Tmax) * H);
  std::vector<int64_t> ri(Tmax * K);
  std::vector<float> rw(Tmax * K);
  CHECK_CUDA(cudaMemcpy(rx.data(), recvX, rx.size() * 2, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(ri.data(), recvIdx, ri.size() * 8, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(rw.data(), recvW, rw.size() * 4, cudaMemcpyDeviceToHost));
  ok = true;
  std::vector<int> seen(T, 0);
  for (int i = 0; i < routed && ok; ++i) {
    int t = metaHost[i * (K + 2)];
    ok = t >= 0 && t < T && !seen[t]++;
    ok = ok && std::memcmp(&rx[size_t(i) * H], &x[size_t(t) * H], H * 2) == 0;
    for (int j = 0; j < K && ok; ++j)
      ok = ri[i * K + j] == idx[t * K + j] && rw[i * K + j] == w[t * K + j];
  }
  expect(ok, "dispatch: every routed token once, rows, ids and weights exact");

  // Combine the received rows straight back: one contribution per token.
  void *out = zeros(size_t(T) * H * 2), *outW = zeros(size_t(T) * K * 4);
  uint64_t crecord[16] = {
      (uint64_t)recvX, (uint64_t)recvW, (uint64_t)meta, (uint64_t)psumRank, (uint64_t)dIdx, 0, 0,
      (uint64_t)out,   (uint64_t)outW,  (uint64_t)T,    (uint64_t)Tmax};
  launch(kernel(module, "combine_send"), blocks, threads, {&devCommPtr, &window, crecord});
  launch(kernel(module, "combine_reduce"), blocks, threads, {&devCommPtr, &window, crecord});
  std::vector<uint16_t> ox(size_t(T) * H);
  std::vector<float> ow(T * K);
  CHECK_CUDA(cudaMemcpy(ox.data(), out, ox.size() * 2, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(ow.data(), outW, ow.size() * 4, cudaMemcpyDeviceToHost));
  ok = true;
  bool okW = true;
  for (int t = 0; t < T; ++t) {
    bool any = false;
    for (int j = 0; j < K; ++j) {
      any |= idx[t * K + j] >= 0;
      okW &= ow[t * K + j] == (idx[t * K + j] >= 0 ? w[t * K + j] : 0.f);
    }
    for (int h = 0; h < H && ok; ++h)
      ok = ox[size_t(t) * H + h] == (any ? x[size_t(t) * H + h] : 0);
  }
  expect(ok, "combine: each token's row back (a single contribution, exact), zeros if unrouted");
  expect(okW, "combine: combined_topk_weights");

  CHECK_NCCL(ncclDevCommDestroy(comm, &devComm));
  CHECK_NCCL(ncclCommWindowDeregister(comm, window));
  CHECK_NCCL(ncclMemFree(buffer));
  CHECK_NCCL(ncclCommDestroy(comm));
  return failures;
}

} // namespace

int main(int argc, char **argv) {
  if (argc == 4 && std::string(argv[1]) == "ep-nccl") {
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaFree(nullptr));
    int result = runEpNccl(argv[2], argv[3]);
    std::printf("ep-nccl: %s\n", result == 0 ? "passed" : "FAILED");
    return result == 0 ? 0 : 1;
  }
  if (argc != 3) {
    std::fprintf(
        stderr,
        "usage: %s virtual|virtual-timeout|virtual-timeout-report|virtual-phase-timeout-report|"
        "virtual-2x4|"
        "virtual-lsa-violation|virtual-lsa-violation-report|virtual-drop|nccl <cubin> | "
        "ep-nccl <cubin> <json>\n",
        argv[0]);
    return 2;
  }
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaFree(nullptr)); // creates the primary context the driver API uses
  std::string mode = argv[1];
  int result = mode.rfind("virtual-2x4", 0) == 0 || mode.rfind("virtual-lsa", 0) == 0 ||
                       mode == "virtual-drop"
                   ? runVirtualNodes(mode, argv[2])
               : mode == "virtual"                      ? runVirtual(argv[2])
               : mode == "virtual-timeout"              ? runVirtualTimeout(argv[2])
               : mode == "virtual-timeout-report"       ? runVirtualTimeoutReport(argv[2])
               : mode == "virtual-phase-timeout-report" ? runVirtualPhaseTimeoutReport(argv[2])
               : mode == "nccl" ? runNccl(argv[2])
                                : (std::fprintf(stderr, "unknown mode %s\n", argv[1]), 2);
  std::printf("%s: %s\n", argv[1], result == 0 ? "passed" : "FAILED");
  return result == 0 ? 0 : 1;
}
