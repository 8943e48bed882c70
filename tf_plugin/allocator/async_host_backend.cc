#include "tf_plugin/allocator/async_host_backend.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

namespace tensile {

AsyncHostBackend::AsyncHostBackend(Options options)
    : HostBackend(options.stitchable), options_(options) {}

std::vector<AsyncHostBackend::Worker*> AsyncHostBackend::AllWorkers() {
  std::vector<Worker*> all;
  std::lock_guard<std::mutex> lock(workers_mu_);
  for (auto& w : workers_) {
    if (w) all.push_back(w.get());
  }
  return all;
}

AsyncHostBackend::~AsyncHostBackend() {
  for (Worker* w : AllWorkers()) {
    {
      std::lock_guard<std::mutex> lock(w->mu);
      w->stop = true;
      w->demand = w->enqueued;  // lockstep: let it finish what is queued
    }
    w->cv.notify_all();
    w->thread.join();
  }
}

std::string AsyncHostBackend::Name() const {
  if (options_.lockstep) {
    return "async-host (lockstep, stream s lags " +
           std::to_string(options_.lag_ticks) + "*s ticks)";
  }
  return "async-host (free-running, stream s lags " +
         std::to_string(options_.delay_us) + "*s us)";
}

AsyncHostBackend::Worker& AsyncHostBackend::WorkerFor(StreamId stream) {
  std::lock_guard<std::mutex> lock(workers_mu_);
  const size_t i = static_cast<size_t>(std::max<StreamId>(stream, 0));
  if (workers_.size() <= i) workers_.resize(i + 1);
  if (!workers_[i]) {
    workers_[i] = std::make_unique<Worker>();
    Worker* w = workers_[i].get();
    w->stream = stream;
    w->thread = std::thread([this, w] { Loop(w); });
  }
  return *workers_[i];
}

uint64_t AsyncHostBackend::Enqueue(StreamId stream, Kind kind, char* ptr,
                                   size_t bytes, uint64_t pattern) {
  Worker& w = WorkerFor(stream);
  const int64_t lag = std::max<StreamId>(stream, 0);
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(w.mu);
    seq = ++w.enqueued;
    w.queue.push_back(Item{
        kind, ptr, bytes, pattern, seq,
        clock_.load() + options_.lag_ticks * lag,
        std::chrono::steady_clock::now() +
            std::chrono::microseconds(options_.delay_us * lag)});
  }
  if (!options_.lockstep) w.cv.notify_all();
  return seq;
}

bool AsyncHostBackend::Runnable(const Worker& w) const {
  if (w.queue.empty()) return false;
  if (!options_.lockstep) return true;
  const Item& front = w.queue.front();
  return front.ready_tick <= w.allowed_tick || front.seq <= w.demand;
}

void AsyncHostBackend::Loop(Worker* w) {
  std::unique_lock<std::mutex> lock(w->mu);
  while (true) {
    w->cv.wait(lock, [&] { return Runnable(*w) || (w->stop && w->queue.empty()); });
    if (w->queue.empty()) return;  // stopping
    Item item = w->queue.front();
    w->queue.pop_front();
    w->running = true;
    lock.unlock();
    if (!options_.lockstep) std::this_thread::sleep_until(item.ready_at);
    Run(item);
    lock.lock();
    w->running = false;
    w->completed = item.seq;
    w->cv.notify_all();
  }
}

void AsyncHostBackend::Run(const Item& item) {
  items_run_.fetch_add(1, std::memory_order_relaxed);
  if (item.kind == Kind::kMarker) return;
  // Relaxed atomic words: with the stream rule broken on purpose two
  // workers may touch one granule at once; that must be a counted
  // corruption, not undefined behaviour.
  if (item.kind == Kind::kFill) {
    for (size_t off = 0; off < item.bytes; off += kPatternGranule) {
      __atomic_store_n(reinterpret_cast<uint64_t*>(item.ptr + off),
                       item.pattern, __ATOMIC_RELAXED);
    }
    return;
  }
  for (size_t off = 0; off < item.bytes; off += kPatternGranule) {
    if (__atomic_load_n(reinterpret_cast<uint64_t*>(item.ptr + off),
                        __ATOMIC_RELAXED) != item.pattern) {
      corruptions_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
  }
}

FreeTicket AsyncHostBackend::RecordFree(StreamId stream) {
  return Enqueue(stream, Kind::kMarker, nullptr, 0, 0);
}

bool AsyncHostBackend::FreeCompleted(StreamId stream, FreeTicket ticket) {
  Worker& w = WorkerFor(stream);
  std::lock_guard<std::mutex> lock(w.mu);
  return w.completed >= ticket;
}

void AsyncHostBackend::WaitForFree(StreamId stream, FreeTicket ticket) {
  Worker& w = WorkerFor(stream);
  std::unique_lock<std::mutex> lock(w.mu);
  if (w.completed >= ticket) return;
  w.demand = std::max<uint64_t>(w.demand, ticket);
  w.cv.notify_all();
  w.cv.wait(lock, [&] { return w.completed >= ticket; });
}

void AsyncHostBackend::SynchronizeAllStreams() {
  for (Worker* w : AllWorkers()) {
    uint64_t last;
    {
      std::lock_guard<std::mutex> lock(w->mu);
      last = w->enqueued;
    }
    WaitForFree(w->stream, last);
  }
}

void AsyncHostBackend::Tick() {
  if (!options_.lockstep) return;
  const int64_t now = clock_.fetch_add(1) + 1;
  // One stream after another: the order of all work is the trace's.
  for (Worker* w : AllWorkers()) {
    std::unique_lock<std::mutex> lock(w->mu);
    w->allowed_tick = now;
    if (!Runnable(*w)) continue;
    w->cv.notify_all();
    w->cv.wait(lock, [&] { return !Runnable(*w) && !w->running; });
  }
}

void AsyncHostBackend::EnqueueFill(StreamId stream, void* ptr, size_t bytes,
                                   uint64_t pattern) {
  Enqueue(stream, Kind::kFill, static_cast<char*>(ptr), bytes, pattern);
}

void AsyncHostBackend::EnqueueVerify(StreamId stream, void* ptr, size_t bytes,
                                     uint64_t pattern) {
  Enqueue(stream, Kind::kVerify, static_cast<char*>(ptr), bytes, pattern);
}

int64_t AsyncHostBackend::DrainAndCountCorruptions() {
  SynchronizeAllStreams();
  return corruptions_.load();
}

std::unique_ptr<PoolBackend> MakeBackend(const std::string& name, bool stitch) {
  if (name == "host") return std::make_unique<HostBackend>(stitch);
  if (name == "async-host") {
    // Lockstep with no one ticking: queued work (the free markers) runs only
    // when the pool waits for it, the most asynchronous a device can be.
    AsyncHostBackend::Options o;
    o.stitchable = stitch;
    return std::make_unique<AsyncHostBackend>(o);
  }
  throw std::invalid_argument("unknown pool backend '" + name +
                              "': the backends built in are: host, async-host");
}

}  // namespace tensile
