//===- runtime_virtual.cpp - the C++ runtime on a virtual world -----------===//
//
// The ElasticBuffer path of the runtime on one GPU: virtual worlds of R in
// {1, 2, 4, 8} ranks, then one NCCL rank (real communicator and window). Kernels
// from the kernel cache (no compiler on the GPU machine), dispatch then
// combine with two biases, checked against a C++ reference; then the
// runtime's refusals (a window too small, a world that does not fit).
//
//===----------------------------------------------------------------------===//

#include "RuntimePlan.h"

#include "epic/runtime/NcclBuffer.h"
#include "epic/runtime/VirtualBuffer.h"

#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <set>
#include <thread>
#include <vector>

using namespace epic::runtime;

namespace {

int failures = 0;
void expect(bool ok, const std::string &what) {
  std::printf("  %-66s %s\n", what.c_str(), ok ? "ok" : "FAILED");
  failures += !ok;
}

void cuda(cudaError_t e, const char *what) {
  if (e != cudaSuccess)
    throw CudaError(std::string(what) + ": " + cudaGetErrorString(e));
}

float bf16ToFloat(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t floatToBf16(float f) { // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

template <typename T> T *upload(const std::vector<T> &host) {
  T *p;
  cuda(cudaMalloc(&p, std::max<size_t>(1, host.size()) * sizeof(T)), "cudaMalloc");
  cuda(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
  return p;
}
template <typename T> T *deviceArray(size_t n, int fill = 0) {
  T *p;
  cuda(cudaMalloc(&p, std::max<size_t>(1, n) * sizeof(T)), "cudaMalloc");
  cuda(cudaMemset(p, fill, std::max<size_t>(1, n) * sizeof(T)), "cudaMemset");
  return p;
}
template <typename T> std::vector<T> download(const T *p, size_t n) {
  std::vector<T> host(n);
  cuda(cudaMemcpy(host.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy");
  return host;
}
uint64_t ptr(const void *p) { return reinterpret_cast<uint64_t>(p); }

/// `call` must throw std::invalid_argument whose message contains `needle`.
template <typename Call> void refused(const std::string &what, const char *needle, Call &&call) {
  try {
    call();
    expect(false, what);
  } catch (const std::invalid_argument &e) {
    bool named = std::string(e.what()).find(needle) != std::string::npos;
    if (!named)
      std::printf("    (message: %s)\n", e.what());
    expect(named, what);
  }
}

/// Makes the ElasticBuffer under test: (window bytes, blocks per rank).
using MakeBuffer = std::function<std::unique_ptr<KernelHost>(int64_t, int)>;

/// Dispatch + combine of `R` ranks served by the buffers `make` returns: all
/// R ranks in one virtual world, or (R = 1) one NCCL rank in this process.
/// With `disagree`, instead of the checks: rank R-1's record says another
/// token cap than the others' (as if that process had called with another
/// num_max_tokens_per_rank), and the launch must trap at the entry barrier
/// with comm.agree's report naming both ranks (run.sh checks the printed
/// report; the CUDA context is lost, so this runs in a process of its own).
void runWorld(KernelProvider &provider, int R, const MakeBuffer &make, const char *what,
              bool disagree = false) {
  EPSpec spec = epic::test::planSpec(R);
  const int E = spec.experts, K = spec.topk, H = spec.hidden, Tmax = spec.maxTokensPerRank;
  const int L = E / R;
  std::mt19937 rng(1234 + R);
  // Routing: K distinct experts per token, ~10% masked slots, some tokens routed nowhere.
  std::vector<int> tokens(R);
  std::vector<std::vector<int64_t>> idx(R);
  std::vector<std::vector<float>> w(R);
  std::vector<std::vector<uint16_t>> x(R), b0(R), b1(R);
  for (int r = 0; r < R; ++r) {
    tokens[r] = Tmax - 13 * r;
    int T = tokens[r];
    idx[r].resize(size_t(T) * K);
    for (int t = 0; t < T; ++t) {
      std::vector<int> experts(E);
      for (int e = 0; e < E; ++e)
        experts[e] = e;
      std::shuffle(experts.begin(), experts.end(), rng);
      for (int j = 0; j < K; ++j)
        idx[r][t * K + j] = (t % 17 == 0 || rng() % 10 == 0) ? -1 : experts[j];
    }
    auto fill = [&](std::vector<uint16_t> &v) {
      v.resize(size_t(T) * H);
      for (auto &e : v)
        e = floatToBf16(float(int(rng() % 4001) - 2000) / 512.f);
    };
    fill(x[r]), fill(b0[r]), fill(b1[r]);
    w[r].resize(size_t(T) * K);
    for (auto &e : w[r])
      e = float(rng() % 1000) / 64.f;
  }
  const int64_t window = 4 << 20;
  std::unique_ptr<KernelHost> owned = make(window, /*blocksPerRank=*/4);
  KernelHost &buffer = *owned;
  std::printf("%s R=%d (E=%d K=%d H=%d Tmax=%d)\n", what, R, E, K, H, Tmax);

  struct RankDev {
    uint16_t *x, *recvX, *b0, *b1, *out;
    int64_t *idx, *recvIdx;
    float *w, *recvW, *outW;
    int32_t *meta, *psumRank, *counts, *psumExpert, *host, *slots;
  };
  std::vector<RankDev> dev(R);
  std::vector<DispatchCall> dispatchCalls(R);
  std::vector<CombineCall> combineCalls(R);
  std::vector<ParamRecord> dispatch(R), combine(R);
  auto tensor = [](const void *p, const char *dtype, std::vector<int64_t> shape) {
    return DeviceTensor{ptr(p), dtype, std::move(shape)};
  };
  const int64_t rows = receiveRows(spec);
  for (int r = 0; r < R; ++r) {
    RankDev &d = dev[r];
    d.x = upload(x[r]), d.idx = upload(idx[r]), d.w = upload(w[r]);
    d.b0 = upload(b0[r]), d.b1 = upload(b1[r]);
    d.recvX = deviceArray<uint16_t>(size_t(rows) * H);
    d.recvIdx = deviceArray<int64_t>(size_t(rows) * K);
    d.recvW = deviceArray<float>(size_t(rows) * K);
    d.meta = deviceArray<int32_t>(size_t(R) * Tmax * (K + 2), 0xff);
    d.psumRank = deviceArray<int32_t>(R), d.counts = deviceArray<int32_t>(L);
    d.psumExpert = deviceArray<int32_t>(L), d.host = deviceArray<int32_t>(1 + L);
    d.slots = deviceArray<int32_t>(size_t(tokens[r]) * K);
    d.out = deviceArray<uint16_t>(size_t(tokens[r]) * H, 0xff);
    d.outW = deviceArray<float>(size_t(tokens[r]) * K, 0xff);
    const int64_t T = tokens[r];
    Handle handle{tensor(d.idx, "i64", {T, K}),
                  tensor(d.slots, "i32", {T, K}),
                  tensor(d.meta, "i32", {int64_t(R) * Tmax, K + 2}),
                  tensor(d.psumRank, "i32", {R}),
                  tensor(d.counts, "i32", {L}),
                  tensor(d.psumExpert, "i32", {L})};
    DispatchCall &dc = dispatchCalls[r];
    dc.x = tensor(d.x, "bf16", {T, H});
    dc.topkWeights = tensor(d.w, "f32", {T, K});
    dc.recvX = tensor(d.recvX, "bf16", {rows, H});
    dc.recvTopkIdx = tensor(d.recvIdx, "i64", {rows, K});
    dc.recvTopkWeights = tensor(d.recvW, "f32", {rows, K});
    dc.hostCounts = tensor(d.host, "i32", {1 + L});
    dc.handle = handle;
    CombineCall &cc = combineCalls[r];
    cc.x = tensor(d.recvX, "bf16", {rows, H});
    cc.topkWeights = tensor(d.recvW, "f32", {rows, K});
    cc.bias0 = tensor(d.b0, "bf16", {T, H});
    cc.bias1 = tensor(d.b1, "bf16", {T, H});
    cc.combinedX = tensor(d.out, "bf16", {T, H});
    cc.combinedTopkWeights = tensor(d.outW, "f32", {T, K});
    cc.handle = handle;
    dispatch[r] = dispatchRecord(spec, epic::test::planDispatchVariant, dc);
    combine[r] = combineRecord(spec, epic::test::planCombineVariant, cc);
  }
  // Bad calls are refused before anything runs, naming the argument.
  {
    auto bad = dispatchCalls;
    std::vector<int64_t> wrongIdx = idx[R - 1];
    wrongIdx[5] = E + 3;
    int64_t *dWrong = upload(wrongIdx);
    bad[R - 1].handle.topkIdx.data = ptr(dWrong);
    refused("typed dispatch: a top-k index out of range is refused (topk_idx[1][1])",
            "topk_idx[1][1]", [&] { buffer.dispatch(spec, epic::test::planDispatchVariant, bad); });
    cudaFree(dWrong);
    bad = dispatchCalls;
    bad[0].x.dtype = "f16";
    refused("typed dispatch: x of the wrong dtype is refused", "x must be bf16",
            [&] { buffer.dispatch(spec, epic::test::planDispatchVariant, bad); });
    bad = dispatchCalls;
    bad[0].x.shape[0] = Tmax + 1;
    refused("typed dispatch: more tokens than the buffer's maximum are refused",
            "num_max_tokens_per_rank",
            [&] { buffer.dispatch(spec, epic::test::planDispatchVariant, bad); });
    EPSpec otherWorld = spec;
    otherWorld.ranks = R + 1, otherWorld.experts = 8 * (R + 1);
    refused("typed dispatch: a spec of another world size is refused", "num_ranks",
            [&] { buffer.dispatch(otherWorld, epic::test::planDispatchVariant, dispatchCalls); });
  }

  auto d1 = buffer.dispatch(spec, epic::test::planDispatchVariant, dispatchCalls);
  cuda(cudaDeviceSynchronize(), "dispatch");
  expect(d1.source != KernelCache::Source::compiled, "dispatch kernels came from the cache");

  // Dispatch: rank d receives each token of each source once iff one of its
  // experts lives on d; the row, local ids and weights arrive exactly.
  bool okCounts = true, okRows = true;
  for (int d = 0; d < R; ++d) {
    auto host = download(dev[d].host, 1 + L);
    int n = host[0];
    std::set<int64_t> expected;
    std::vector<int> perExpert(L, 0);
    for (int s = 0; s < R; ++s)
      for (int t = 0; t < tokens[s]; ++t) {
        bool here = false;
        for (int j = 0; j < K; ++j) {
          int64_t e = idx[s][t * K + j];
          if (e >= 0 && e / L == d) {
            here = true;
            perExpert[e % L]++;
          }
        }
        if (here)
          expected.insert(int64_t(s) * Tmax + t);
      }
    okCounts &= n == int(expected.size());
    for (int e = 0; e < L; ++e)
      okCounts &= host[1 + e] == perExpert[e];
    auto meta = download(dev[d].meta, size_t(n) * (K + 2));
    auto rx = download(dev[d].recvX, size_t(n) * H);
    auto ri = download(dev[d].recvIdx, size_t(n) * K);
    auto rw = download(dev[d].recvW, size_t(n) * K);
    std::set<int64_t> seen;
    for (int i = 0; i < n && okRows; ++i) {
      int64_t gid = meta[i * (K + 2)];
      int s = int(gid / Tmax), t = int(gid % Tmax);
      okRows &= expected.count(gid) && seen.insert(gid).second;
      okRows &= std::memcmp(&rx[size_t(i) * H], &x[s][size_t(t) * H], H * 2) == 0;
      for (int j = 0; j < K; ++j) {
        int64_t e = idx[s][t * K + j];
        okRows &= ri[i * K + j] == ((e >= 0 && e / L == d) ? e % L : -1);
        okRows &= rw[i * K + j] == w[s][t * K + j];
      }
    }
  }
  expect(okCounts, "dispatch: received tokens and per-expert counts");
  expect(okRows, "dispatch: each token once per owning rank, rows/ids/weights exact");

  // Combine the received rows straight back with two biases: token t of rank
  // s gets bf16(((0 + b0) + b1) + x + x + ...) with one x per owning rank.
  auto c1 = buffer.combine(spec, epic::test::planCombineVariant, combineCalls);
  cuda(cudaDeviceSynchronize(), "combine");
  bool okX = true, okW = true;
  for (int s = 0; s < R; ++s) {
    auto out = download(dev[s].out, size_t(tokens[s]) * H);
    auto ow = download(dev[s].outW, size_t(tokens[s]) * K);
    for (int t = 0; t < tokens[s]; ++t) {
      std::set<int64_t> ranks;
      for (int j = 0; j < K; ++j) {
        int64_t e = idx[s][t * K + j];
        if (e >= 0)
          ranks.insert(e / L);
        okW &= ow[t * K + j] == (e >= 0 ? w[s][t * K + j] : 0.f);
      }
      for (int h = 0; h < H && okX; ++h) {
        float acc = 0.f;
        acc += bf16ToFloat(b0[s][size_t(t) * H + h]);
        acc += bf16ToFloat(b1[s][size_t(t) * H + h]);
        for (size_t c = 0; c < ranks.size(); ++c)
          acc += bf16ToFloat(x[s][size_t(t) * H + h]);
        okX &= out[size_t(t) * H + h] == floatToBf16(acc);
      }
    }
  }
  expect(c1.source != KernelCache::Source::compiled, "combine kernels came from the cache");
  expect(okX, "combine: fp32 from +0.0, biases first, one rounding: bitwise");
  expect(okW, "combine: combined_topk_weights == topk_weights (0 where masked)");

  // The combine's output of the eager run: what every other way of
  // launching must reproduce (combine is deterministic; dispatch rows may be
  // permuted within a source).
  auto eager = [&] {
    std::vector<std::vector<uint16_t>> outs;
    for (int s = 0; s < R; ++s)
      outs.push_back(download(dev[s].out, size_t(tokens[s]) * H));
    return outs;
  };
  const auto reference = eager();

  // CUDA graphs: capture dispatch + combine once, replay: the same results.
  {
    auto d = buffer.prepare(epic::test::planDispatch(R), dispatch);
    auto c = buffer.prepare(epic::test::planCombine(R), combine);
    cudaStream_t stream;
    cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
         "cudaStreamBeginCapture");
    buffer.launch(d, stream);
    buffer.barrier(stream); // NCCL: an all-reduce, captured with the kernels
    buffer.launch(c, stream);
    cuda(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
    cuda(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
    bool same = true;
    for (int replay = 0; replay < 3; ++replay) {
      for (int s = 0; s < R; ++s)
        cuda(cudaMemset(dev[s].out, 0xff, size_t(tokens[s]) * H * 2), "cudaMemset");
      cuda(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
      cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      same &= eager() == reference;
    }
    expect(same, "CUDA graph: dispatch, barrier, combine captured once, 3 replays equal");
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);

    // Overlap: the comm stream waits for the compute stream's event (which
    // follows the poisoning of the outputs); the compute stream waits for
    // the event the combine returns, then reads the outputs.
    cudaStream_t compute;
    cuda(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), "cudaStreamCreate");
    cudaEvent_t ready;
    cuda(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate");
    // The poisoning comes late (after a 50 ms host step): a comm stream that
    // did not wait would combine first and the outputs would read poisoned.
    cuda(cudaLaunchHostFunc(
             compute, [](void *) { std::this_thread::sleep_for(std::chrono::milliseconds(50)); },
             nullptr),
         "cudaLaunchHostFunc");
    for (int s = 0; s < R; ++s)
      cuda(cudaMemsetAsync(dev[s].out, 0xff, size_t(tokens[s]) * H * 2, compute),
           "cudaMemsetAsync");
    cuda(cudaEventRecord(ready, compute), "cudaEventRecord");
    buffer.launch(d, stream, {/*previousEvent=*/ready, /*recordEvent=*/false});
    void *done = buffer.launch(c, stream, {nullptr, /*recordEvent=*/true});
    cuda(cudaStreamWaitEvent(compute, static_cast<cudaEvent_t>(done), 0), "cudaStreamWaitEvent");
    std::vector<std::vector<uint16_t>> overlapped(R);
    for (int s = 0; s < R; ++s) {
      overlapped[s].resize(size_t(tokens[s]) * H);
      cuda(cudaMemcpyAsync(overlapped[s].data(), dev[s].out, overlapped[s].size() * 2,
                           cudaMemcpyDeviceToHost, compute),
           "cudaMemcpyAsync");
    }
    cuda(cudaStreamSynchronize(compute), "cudaStreamSynchronize");
    expect(overlapped == reference,
           "events: previous_event, returned event, compute stream reads the combine's output");
    cudaEventDestroy(static_cast<cudaEvent_t>(done));
    cudaEventDestroy(ready);
    cudaStreamDestroy(compute);
    cudaStreamDestroy(stream);
  }

  // Launch attributes the metadata may ask for: the same kernels with
  // clusters of 2 blocks and programmatic dependent launch, stored in the
  // cache under a request of their own (another entry name), give the same
  // results.
  {
    auto withAttributes = [&](const KernelRequest &request) {
      KernelRequest variant = request;
      variant.name += "_clusters_of_2";
      CompiledModule module = *provider.get(request).module;
      // After the cooperative attribute (0 for the one-pass gather, 1 otherwise).
      size_t at = module.metadataJson.find("\"cooperative\": ");
      if (at != std::string::npos)
        at = module.metadataJson.find(',', at);
      if (at == std::string::npos)
        throw std::runtime_error("no cooperative attribute in the metadata of " +
                                 std::string(kindName(request.kind)));
      module.metadataJson.insert(at + 1,
                                 " \"cluster_dims\": [2, 1, 1], \"programmatic_launch\": 1,");
      KernelCache(provider.cacheDirectory()).store(provider.keyFor(variant), module);
      return variant;
    };
    KernelRequest d2 = withAttributes(epic::test::planDispatch(R));
    KernelRequest c2 = withAttributes(epic::test::planCombine(R));
    for (int s = 0; s < R; ++s)
      cuda(cudaMemset(dev[s].out, 0xff, size_t(tokens[s]) * H * 2), "cudaMemset");
    buffer.run(d2, dispatch);
    buffer.run(c2, combine);
    expect(eager() == reference,
           "clusters of 2 + programmatic dependent launch: the same combine results");
    // 3 blocks per rank: no whole clusters of 2 (and with 2 ranks, 6 blocks in
    // all would give a cluster of one block of each rank).
    if (R <= 2)
      refused("clusters that do not divide a rank's blocks are refused", "so that no cluster spans",
              [&] { make(window, 3)->run(d2, dispatch); });
  }

  // The runtime's refusals name what is wrong.
  refused("a window smaller than the kernels need is refused", "get_buffer_size_hint",
          [&] { make(4096, 4)->run(epic::test::planDispatch(R), dispatch); });
  try {
    make(window, 100000)->run(epic::test::planDispatch(R), dispatch);
    expect(false, "a launch that does not fit on the GPU is refused");
  } catch (const std::invalid_argument &e) {
    std::string what = e.what();
    expect(what.find("exceeds") != std::string::npos ||
               what.find("does not fit") != std::string::npos,
           "a launch that does not fit on the GPU is refused");
  } catch (const NcclError &e) { // 100000 LSA barriers may already be refused by NCCL
    expect(true, std::string("a launch that does not fit is refused by NCCL"));
  }
  if (disagree) {
    std::vector<ParamRecord> records = dispatch;
    records[R - 1]["max_tokens_per_rank"] = uint64_t(Tmax - 1);
    try {
      buffer.run(epic::test::planDispatch(R), records);
    } catch (const std::exception &e) {
      std::printf("disagree: the launch failed as it must: %s\n", e.what());
      std::fflush(stdout);
      std::_Exit(0);
    }
    std::printf("disagree: FAILED: ranks with different token caps were not stopped\n");
    std::_Exit(1);
  }
  std::vector<ParamRecord> wrong = dispatch;
  wrong[0]["recv_y"] = 0;
  refused("an unknown parameter is refused, by name", "\"recv_y\"",
          [&] { buffer.run(epic::test::planDispatch(R), wrong); });
}

} // namespace

int main(int argc, char **argv) {
  try {
    KernelCache cache;
    KernelProvider provider(cache, {"virtual", "sm_90", ""});
    if (argc > 1 && std::string(argv[1]) == "disagree") {
      const int R = 2;
      runWorld(
          provider, R,
          [&](int64_t window, int blocks) {
            return std::make_unique<VirtualElasticBuffer>(R, window, provider, blocks);
          },
          "virtual world, ranks that disagree", /*disagree=*/true);
    }
    for (int R : epic::test::planRanks())
      runWorld(
          provider, R,
          [&](int64_t window, int blocks) {
            return std::make_unique<VirtualElasticBuffer>(R, window, provider, blocks);
          },
          "virtual world");

    // The NCCL backend through the same runtime path: one rank, a real
    // communicator, symmetric window and device communicator.
    KernelProvider ncclProvider(cache, {"nccl", "sm_90", ""});
    Communicator comm(1, 0, Communicator::newUniqueId());
    runWorld(
        ncclProvider, 1,
        [&](int64_t window, int blocks) {
          auto buffer = std::make_unique<NcclElasticBuffer>(comm, window, ncclProvider, blocks);
          static bool described = false;
          if (!described)
            std::printf("  %s\n", buffer->info().describe().c_str()), described = true;
          return buffer;
        },
        "NCCL");
    refused("an NCCL buffer refuses kernels compiled for backend=virtual", "backend=nccl",
            [&] { NcclElasticBuffer wrong(comm, 1 << 20, provider, 4); });
    // Warm load of the V3 kernels: the disk cache read, then the module load.
    epic::runtime::EPSpec v3 = epic::test::v3Spec();
    VirtualElasticBuffer world(v3.ranks, 480 << 20, provider, 16);
    for (const KernelRequest &request :
         {epic::test::planV3Dispatch(), epic::test::planV3Combine()}) {
      auto start = std::chrono::steady_clock::now();
      auto prepared = world.prepare(request, std::vector<ParamRecord>(v3.ranks));
      double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("V3 %s: warm load (cache read + cuModuleLoadData + checks) %.3f ms, from %s\n",
                  kindName(request.kind), seconds * 1e3,
                  prepared.info().source == KernelCache::Source::disk ? "disk" : "memory/compiler");
    }
  } catch (const std::exception &e) {
    std::printf("runtime_virtual: error: %s\n", e.what());
    return 1;
  }
  std::printf("runtime_virtual: %s\n", failures ? "FAILED" : "passed");
  return failures ? 1 : 0;
}
