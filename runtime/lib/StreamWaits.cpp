//===- StreamWaits.cpp - bounded reporting of stream waits on flags -------===//

#include "StreamWaits.h"

#include "epic/runtime/KernelHost.h"

#include "CudaCheck.h"
#include "StreamMemOps.h"

#include <cuda_runtime.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <list>
#include <mutex>
#include <thread>

using namespace epic::runtime;
using Clock = std::chrono::steady_clock;

namespace {

struct Watched {
  cudaEvent_t done;
  int device;
  Clock::time_point since;
  double timeoutSecs;
  std::string what;
  std::vector<detail::FlagWait> waits;
};

/// The watching thread and what it watches; started by the first watch.
class Watcher {
public:
  static Watcher &get() {
    static Watcher watcher;
    return watcher;
  }

  /// An event of `device` to record after a wait: a finished watch's, or a new one.
  cudaEvent_t event(int device) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      for (auto it = spare.begin(); it != spare.end(); ++it)
        if (it->first == device) {
          cudaEvent_t e = it->second;
          spare.erase(it);
          return e;
        }
    }
    cudaEvent_t e = nullptr;
    detail::check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming),
                  "cudaEventCreate (a wait's)");
    return e;
  }

  void add(Watched w) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      watched.push_back(std::move(w));
      if (!thread.joinable())
        thread = std::thread([this] { loop(); });
    }
    wake.notify_all();
  }

  std::vector<std::string> reports() {
    std::lock_guard<std::mutex> lock(mutex);
    return reported;
  }

  ~Watcher() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopping = true;
    }
    wake.notify_all();
    if (thread.joinable())
      thread.join();
  }

private:
  void loop() {
    std::unique_lock<std::mutex> lock(mutex);
    while (!stopping) {
      // Nothing watched: sleep until a watch is added (no polling while idle).
      if (watched.empty())
        wake.wait(lock, [this] { return stopping || !watched.empty(); });
      else
        wake.wait_for(lock, std::chrono::milliseconds(20));
      for (auto it = watched.begin(); it != watched.end();) {
        cudaSetDevice(it->device);
        cudaError_t state = cudaEventQuery(it->done);
        if (state == cudaSuccess) { // over: the event serves the next watch
          spare.emplace_back(it->device, it->done);
          it = watched.erase(it);
          continue;
        }
        if (state != cudaErrorNotReady) { // the context is gone: nothing to say
          it = watched.erase(it);
          continue;
        }
        const double waited = std::chrono::duration<double>(Clock::now() - it->since).count();
        if (waited >= it->timeoutSecs) {
          report(*it, waited);
          it->timeoutSecs = 1e300; // once
        }
        ++it;
      }
    }
  }

  /// Reads each flag on a stream of its own (the watched one is held) and
  /// names those still short of their value.
  void report(const Watched &w, double waited) {
    if (!reader)
      cudaStreamCreateWithFlags(&reader, cudaStreamNonBlocking);
    std::string text = "epic: " + w.what + " has waited " + std::to_string(int64_t(waited)) +
                       " s on its stream, for:";
    for (const detail::FlagWait &f : w.waits) {
      uint32_t now = 0;
      const bool read = cudaMemcpyAsync(&now, f.flag, sizeof now, cudaMemcpyDeviceToHost, reader) ==
                            cudaSuccess &&
                        cudaStreamSynchronize(reader) == cudaSuccess;
      if (read && int32_t(now - f.value) >= 0)
        continue;
      text += " " + f.what + " (needs " + std::to_string(f.value) + ", " +
              (read ? "holds " + std::to_string(now) : std::string("unreadable")) + ");";
    }
    text += " the stream waits until they arrive (a peer that never makes this call holds it "
            "forever)";
    std::fprintf(stderr, "%s\n", text.c_str());
    reported.push_back(std::move(text));
  }

  std::mutex mutex;
  std::condition_variable wake;
  std::list<Watched> watched;
  std::vector<std::pair<int, cudaEvent_t>> spare; ///< (device, event) of finished watches
  std::vector<std::string> reported;
  std::thread thread;
  cudaStream_t reader = nullptr;
  bool stopping = false;
};

} // namespace

void detail::waitFlags(std::vector<FlagWait> waits, void *stream, const std::string &what,
                       double timeoutSecs) {
  if (waits.empty())
    return;
  std::vector<CUstreamBatchMemOpParams> ops;
  for (const FlagWait &f : waits)
    ops.push_back(waitFlagOp(const_cast<void *>(f.flag), f.value));
  streamMemOps(ops, stream, what + " (cuStreamBatchMemOp)");
  if (capturing(stream))
    return;
  Watched w{nullptr, 0, Clock::now(), timeoutSecs, what, std::move(waits)};
  check(cudaGetDevice(&w.device), "cudaGetDevice");
  w.done = Watcher::get().event(w.device);
  check(cudaEventRecord(w.done, static_cast<cudaStream_t>(stream)), "cudaEventRecord (a wait's)");
  Watcher::get().add(std::move(w));
}

std::vector<std::string> epic::runtime::streamWaitReports() { return Watcher::get().reports(); }
