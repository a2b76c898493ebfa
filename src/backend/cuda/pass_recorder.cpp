// PassRecorder and ChunkArena (see pass_recorder.h).
#include "backend/cuda/pass_recorder.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/op_time_table.h"
#include "common/hash.h"

namespace kev::cuda {

namespace {

constexpr size_t kAlign = 256;
constexpr size_t kStagingChunk = size_t{4} << 20;
constexpr size_t kScratchChunk = size_t{32} << 20;
// A Kev pass is 4–8 segments (PassRecorder::kSegment), and a workload recurs with 2–3 pass shapes.
constexpr size_t kMaxGraphs = 128;
constexpr size_t kMaxSeen = 256;
// Commands enqueued behind one trace gate: with up to 4 kernels or copies and an event each this stays
// well inside the launch queue, so the host never blocks on a stream the gate still holds.
constexpr size_t kTraceGate = 64;

// A pass signature's hash, a word at a time (a pass has ~20 K words: byte-wise FNV took ~0.2 ms per
// flush). Only a cache key: a match is confirmed by comparing the words.
uint64_t hash_words(std::span<const uint64_t> words) {
  uint64_t h = 1469598103934665603ull;
  for (uint64_t w : words) {
    h = (h ^ w) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 32;
  }
  return h;
}

}  // namespace

ChunkArena::~ChunkArena() {
  for (const Chunk& c : chunks_) free_(c.base);
}

Result<char*> ChunkArena::take(size_t bytes) {
  if (bytes == 0) return static_cast<char*>(nullptr);
  KEV_CHECK(bytes <= SIZE_MAX - kAlign, ErrorCode::InvalidRequest, "cuda: scratch request of ", bytes,
            " bytes is too large");
  while (chunk_ < chunks_.size()) {
    const size_t at = (used_ + kAlign - 1) / kAlign * kAlign;
    if (at <= chunks_[chunk_].size && bytes <= chunks_[chunk_].size - at) {
      used_ = at + bytes;
      return chunks_[chunk_].base + at;
    }
    ++chunk_;
    used_ = 0;
  }
  const size_t size = bytes > min_chunk_ ? (bytes + kAlign - 1) / kAlign * kAlign : min_chunk_;
  KEV_ASSIGN_OR_RETURN(void* base, alloc_(size));
  chunks_.push_back(Chunk{static_cast<char*>(base), size});
  chunk_ = chunks_.size() - 1;
  used_ = bytes;
  return chunks_.back().base;
}

PassRecorder::PassRecorder(int device, std::shared_ptr<DevicePool> pool, bool graphs)
    : device_(device),
      pool_(std::move(pool)),
      graphs_(graphs),
      staging_(
          kStagingChunk,
          [](size_t bytes) -> Result<void*> {
            void* p = nullptr;
            KEV_CUDA_TRY(cudaHostAlloc(&p, bytes, cudaHostAllocDefault));
            return p;
          },
          [](void* p) { cudaFreeHost(p); }),
      scratch_(
          kScratchChunk, [pool = pool_](size_t bytes) { return pool->acquire(bytes); },
          [pool = pool_](void* p) { pool->release(p); }) {}

PassRecorder::~PassRecorder() {
  cudaSetDevice(device_);
  if (gate_host_) *gate_host_ = UINT32_MAX;  // never leave a gate closed
  if (stream_) cudaStreamSynchronize(stream_);
  for (GraphEntry& e : graphs_cache_) cudaGraphExecDestroy(e.exec);
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
  if (gate_host_) cudaFreeHost(const_cast<uint32_t*>(gate_host_));
  if (stream_) cudaStreamDestroy(stream_);
}

Status PassRecorder::init() {
  KEV_CUDA_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  const char* env = std::getenv("KEV_CUDA_TRACE");
  if (env != nullptr && *env != '\0' && std::strcmp(env, "0") != 0) {
    trace_ = std::strcmp(env, "ops") == 0 ? Trace::Ops : Trace::Flushes;
  }
  if (trace_ == Trace::Ops) {
    void* word = nullptr;
    KEV_CUDA_TRY(cudaHostAlloc(&word, sizeof(uint32_t), cudaHostAllocMapped));
    gate_host_ = static_cast<volatile uint32_t*>(word);
    *gate_host_ = 0;
    void* dev = nullptr;
    KEV_CUDA_TRY(cudaHostGetDevicePointer(&dev, word, 0));
    gate_dev_ = static_cast<uint32_t*>(dev);
  }
  return Status::success();
}

void PassRecorder::record(const char* op, const CommandSig& sig, Enqueue enqueue, std::string label) {
  if (trace_ != Trace::Off && pass_ops_.empty()) first_record_ = std::chrono::steady_clock::now();
  append(op, sig, std::move(enqueue), std::move(label));
  pass_ops_.push_back(op);
  ++recorded_;
  // Launching only once kSegment + 1 are pending keeps the newest command unlaunched (replace_last).
  if (commands_.size() > kSegment && trace_ != Trace::Ops && pending_.ok()) pending_ = launch(kSegment);
}

Status PassRecorder::replace_last(const char* op, const CommandSig& sig, Enqueue enqueue, std::string label) {
  KEV_CHECK(!commands_.empty(), ErrorCode::Internal, op, ": no command recorded in this pass to replace");
  commands_.pop_back();
  full_.resize(commands_.empty() ? 0 : commands_.back().full_end);
  shape_.resize(commands_.empty() ? 0 : commands_.back().shape_end);
  append(op, sig, std::move(enqueue), std::move(label));
  pass_ops_.back() = op;
  return Status::success();
}

void PassRecorder::append(const char* op, const CommandSig& sig, Enqueue enqueue, std::string label) {
  const uint64_t head[] = {fnv1a64(op, std::strlen(op)), sig.shape.size(), sig.ptrs.size()};
  for (uint64_t w : head) {
    full_.push_back(w);
    shape_.push_back(w);
  }
  full_.insert(full_.end(), sig.shape.begin(), sig.shape.end());
  shape_.insert(shape_.end(), sig.shape.begin(), sig.shape.end());
  full_.insert(full_.end(), sig.ptrs.begin(), sig.ptrs.end());
  commands_.push_back(Command{op, std::move(enqueue), std::move(label), full_.size(), shape_.size()});
}

Status PassRecorder::record_upload(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return Status::success();
  KEV_ASSIGN_OR_RETURN(char* slot, staging_.take(bytes));
  std::memcpy(slot, src, bytes);
  CommandSig sig;
  sig.word(bytes);
  sig.ptr(slot, dst);
  record("upload", sig, [=](cudaStream_t s) -> Status {
    KEV_CUDA_TRY(cudaMemcpyAsync(dst, slot, bytes, cudaMemcpyHostToDevice, s));
    return Status::success();
  });
  return Status::success();
}

Result<char*> PassRecorder::scratch(size_t bytes) { return scratch_.take(bytes); }

Result<const int32_t*> PassRecorder::offsets(const SeqLayout& layout) {
  for (const auto& [host, dev] : pass_offsets_) {
    if (host == layout.offsets) return dev;
  }
  const size_t bytes = layout.offsets.size() * sizeof(int32_t);
  KEV_ASSIGN_OR_RETURN(char* dev, scratch_.take(bytes));
  KEV_TRY(record_upload(dev, layout.offsets.data(), bytes));
  pass_offsets_.emplace_back(layout.offsets, reinterpret_cast<const int32_t*>(dev));
  return pass_offsets_.back().second;
}

std::string PassRecorder::pass_ops() const {
  std::string s;
  const char* prev = nullptr;
  int listed = 0;
  for (const char* op : pass_ops_) {
    if (prev && std::strcmp(prev, op) == 0) continue;
    if (++listed > 24) return s + ", ...";
    s += (s.empty() ? "" : ", ") + std::string(op);
    prev = op;
  }
  return s;
}

void PassRecorder::clear_pass() {
  ++pass_serial_;
  commands_.clear();
  full_.clear();
  shape_.clear();
  pass_ops_.clear();
  pending_ = Status::success();
  ran_.fill(0);
  pass_offsets_.clear();
  staging_.restart();
  scratch_.restart();
}

Status PassRecorder::launch(size_t n) {
  KEV_CUDA_TRY(cudaSetDevice(device_));
  const size_t full_end = commands_[n - 1].full_end, shape_end = commands_[n - 1].shape_end;
  Status st;
  if (graphs_ && n > 1) {
    st = run_graph(n, std::span<const uint64_t>(full_).first(full_end),
                   std::span<const uint64_t>(shape_).first(shape_end));
  } else {
    st = run_direct(n);
    ++ran_[static_cast<size_t>(Ran::Direct)];
  }
  commands_.erase(commands_.begin(), commands_.begin() + static_cast<std::ptrdiff_t>(n));
  full_.erase(full_.begin(), full_.begin() + static_cast<std::ptrdiff_t>(full_end));
  shape_.erase(shape_.begin(), shape_.begin() + static_cast<std::ptrdiff_t>(shape_end));
  for (Command& c : commands_) c.full_end -= full_end, c.shape_end -= shape_end;
  return st;
}

Status PassRecorder::run_direct(size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const Status st = commands_[i].enqueue(stream_);
    if (!st.ok()) return Status(st.code(), cat(commands_[i].op, ": ", st.message()));
  }
  return Status::success();
}

Status PassRecorder::capture(size_t n, cudaGraph_t* graph) {
  KEV_CUDA_TRY(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  for (size_t i = 0; i < n; ++i) {
    const Command& c = commands_[i];
    const Status st = c.enqueue(stream_);
    if (!st.ok()) {
      cudaGraph_t partial = nullptr;
      cudaStreamEndCapture(stream_, &partial);
      if (partial) cudaGraphDestroy(partial);
      cudaGetLastError();
      return Status(st.code(), cat(c.op, ": ", st.message(), " (while capturing the pass into a CUDA graph)"));
    }
  }
  KEV_CUDA_TRY(cudaStreamEndCapture(stream_, graph));
  ++graph_captures_;
  return Status::success();
}

Status PassRecorder::run_graph(size_t n, std::span<const uint64_t> full, std::span<const uint64_t> shape) {
  const uint64_t hash = hash_words(full);
  for (auto it = graphs_cache_.begin(); it != graphs_cache_.end(); ++it) {
    if (it->hash != hash || !std::ranges::equal(it->full, full)) continue;
    graphs_cache_.splice(graphs_cache_.begin(), graphs_cache_, it);
    it->pass = pass_serial_;
    KEV_CUDA_TRY(cudaGraphLaunch(it->exec, stream_));
    ++graph_launches_;
    ++ran_[static_cast<size_t>(Ran::Replay)];
    return Status::success();
  }
  // The first sighting of a signature runs directly: a pass that never recurs does not pay for a
  // capture and an instantiation, and every kernel and cuBLASLt algorithm has run once (modules
  // loaded, errors reported per op) before it is captured.
  bool seen = false;
  for (auto it = seen_.begin(); it != seen_.end(); ++it) {
    if (*it != hash) continue;
    seen_.erase(it);
    seen = true;
    break;
  }
  if (!seen) {
    seen_.push_front(hash);
    if (seen_.size() > kMaxSeen) seen_.pop_back();
    ++ran_[static_cast<size_t>(Ran::FirstSighting)];
    return run_direct(n);
  }
  cudaGraph_t graph = nullptr;
  if (!capture(n, &graph).ok()) {
    // Recording a graph enqueued nothing, so the pass can still run directly; a real launch error
    // shows up there again, named by its op.
    ++capture_failures_;
    ++ran_[static_cast<size_t>(Ran::CaptureFailed)];
    return run_direct(n);
  }
  // Same topology and parameters but other addresses: update that exec in place instead of
  // instantiating a new one — unless this pass launched it already (two segments of one pass with
  // equal shape words would otherwise take the exec from each other on every pass).
  for (auto it = graphs_cache_.begin(); it != graphs_cache_.end(); ++it) {
    if (it->pass == pass_serial_ || !std::ranges::equal(it->shape, shape)) continue;
    cudaGraphExecUpdateResultInfo info{};
    if (cudaGraphExecUpdate(it->exec, graph, &info) == cudaSuccess) {
      it->hash = hash;
      it->full.assign(full.begin(), full.end());
      it->pass = pass_serial_;
      graphs_cache_.splice(graphs_cache_.begin(), graphs_cache_, it);
      cudaGraphDestroy(graph);
      KEV_CUDA_TRY(cudaGraphLaunch(it->exec, stream_));
      ++graph_launches_;
      ++ran_[static_cast<size_t>(Ran::Update)];
      return Status::success();
    }
    cudaGetLastError();  // a refused update is not an error of the pass
    break;
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (inst != cudaSuccess) {
    cudaGetLastError();
    ++capture_failures_;
    ++ran_[static_cast<size_t>(Ran::InstantiationFailed)];
    return run_direct(n);
  }
  graphs_cache_.push_front(
      GraphEntry{hash, {full.begin(), full.end()}, {shape.begin(), shape.end()}, exec, pass_serial_});
  while (graphs_cache_.size() > kMaxGraphs) {
    cudaGraphExecDestroy(graphs_cache_.back().exec);
    graphs_cache_.pop_back();
  }
  KEV_CUDA_TRY(cudaGraphLaunch(exec, stream_));
  ++graph_launches_;
  ++ran_[static_cast<size_t>(Ran::Instantiate)];
  return Status::success();
}

void PassRecorder::release_gate() {
  __atomic_store_n(const_cast<uint32_t*>(gate_host_), gate_value_, __ATOMIC_RELEASE);
}

Status PassRecorder::run_traced() {
  const size_t n = commands_.size();
  while (events_.size() < n + 1) {
    cudaEvent_t e = nullptr;
    KEV_CUDA_TRY(cudaEventCreate(&e));
    events_.push_back(e);
  }
  for (size_t i = 0; i < n; ++i) {
    if (i % kTraceGate == 0) {
      if (i > 0) release_gate();
      const cudaError_t gate = launch_wait_gate(gate_dev_, ++gate_value_, stream_);
      if (gate != cudaSuccess) {
        release_gate();
        KEV_CUDA_TRY(gate);
      }
    }
    const cudaError_t err = cudaEventRecord(events_[i], stream_);
    const Status st =
        err == cudaSuccess ? commands_[i].enqueue(stream_) : cuda_status(err, "trace event", __FILE__, __LINE__);
    if (!st.ok()) {
      release_gate();
      return Status(st.code(), cat(commands_[i].op, ": ", st.message()));
    }
  }
  const cudaError_t last = cudaEventRecord(events_[n], stream_);
  release_gate();
  KEV_CUDA_TRY(last);
  KEV_CUDA_TRY(cudaStreamSynchronize(stream_));
  OpTimeTable table;
  for (size_t i = 0; i < n; ++i) {
    float ms = 0;
    KEV_CUDA_TRY(cudaEventElapsedTime(&ms, events_[i], events_[i + 1]));
    table.add(commands_[i].label.empty() ? std::string(commands_[i].op) : commands_[i].label, ms);
  }
  table.print(stderr, cat("kev-cuda-trace pass ", passes_, " ops: ", n, " commands"), "back to back");
  ++ran_[static_cast<size_t>(Ran::Traced)];
  return Status::success();
}

Status PassRecorder::flush() {
  if (pass_ops_.empty()) return Status::success();
  KEV_CUDA_TRY(cudaSetDevice(device_));
  ++passes_;
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  // The per-op trace gates only passes it has seen before: a first sighting may load kernel modules
  // lazily, which can wait for the device while the gate holds it. (It never segments, so the whole
  // pass is pending here.)
  bool traced = false;
  if (trace_ == Trace::Ops && commands_.size() > 1) {
    const uint64_t shape_hash = hash_words(shape_);
    traced = std::find(traced_shapes_.begin(), traced_shapes_.end(), shape_hash) != traced_shapes_.end();
    if (!traced) traced_shapes_.push_back(shape_hash);
  }
  Status run = pending_;
  if (run.ok() && !commands_.empty()) run = traced ? run_traced() : launch(commands_.size());
  const auto t1 = Clock::now();
  const cudaError_t sync = cudaStreamSynchronize(stream_);
  const size_t n = pass_ops_.size();
  if (trace_ != Trace::Off && n > 1) {
    const auto t2 = Clock::now();
    std::string how;
    for (size_t i = 0; i < ran_.size(); ++i) {
      if (ran_[i] > 0) how += cat(how.empty() ? "" : ", ", ran_[i], " ", kRanNames[i]);
    }
    std::fprintf(stderr,
                 "kev-cuda-trace pass %llu: %zu commands (segments: %s), recorded in %.3f ms, final enqueue %.3f ms, "
                 "wall %.3f ms\n",
                 static_cast<unsigned long long>(passes_), n, how.c_str(),
                 std::chrono::duration<double, std::milli>(t0 - first_record_).count(),
                 std::chrono::duration<double, std::milli>(t1 - t0).count(),
                 std::chrono::duration<double, std::milli>(t2 - t0).count());
  }
  const std::string ops = pass_ops();
  clear_pass();
  KEV_TRY(run);
  KEV_CHECK(sync == cudaSuccess, ErrorCode::Device, "cuda: a pass of ", n, " commands failed on the GPU: ",
            cudaGetErrorName(sync), " (", cudaGetErrorString(sync), "); its ops: ", ops);
  return Status::success();
}

}  // namespace kev::cuda
