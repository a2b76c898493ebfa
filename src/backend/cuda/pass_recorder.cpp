// PassRecorder and ChunkArena (see pass_recorder.h).
#include "backend/cuda/pass_recorder.h"

#include <cstring>

#include "backend/cuda/cuda_check.h"
#include "common/hash.h"

namespace kev::cuda {

namespace {

constexpr size_t kAlign = 256;
constexpr size_t kStagingChunk = size_t{4} << 20;
constexpr size_t kScratchChunk = size_t{32} << 20;
constexpr size_t kMaxGraphs = 32;
constexpr size_t kMaxSeen = 64;

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
  if (stream_) cudaStreamSynchronize(stream_);
  for (GraphEntry& e : graphs_cache_) cudaGraphExecDestroy(e.exec);
  if (stream_) cudaStreamDestroy(stream_);
}

Status PassRecorder::init() {
  KEV_CUDA_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  return Status::success();
}

void PassRecorder::record(const char* op, const CommandSig& sig, Enqueue enqueue) {
  const uint64_t head[] = {fnv1a64(op, std::strlen(op)), sig.shape.size(), sig.ptrs.size()};
  for (uint64_t w : head) {
    full_.push_back(w);
    shape_.push_back(w);
  }
  full_.insert(full_.end(), sig.shape.begin(), sig.shape.end());
  shape_.insert(shape_.end(), sig.shape.begin(), sig.shape.end());
  full_.insert(full_.end(), sig.ptrs.begin(), sig.ptrs.end());
  commands_.push_back(Command{op, std::move(enqueue)});
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
  if (last_offsets_dev_ && last_offsets_ == layout.offsets) return last_offsets_dev_;
  const size_t bytes = layout.offsets.size() * sizeof(int32_t);
  KEV_ASSIGN_OR_RETURN(char* dev, scratch_.take(bytes));
  KEV_TRY(record_upload(dev, layout.offsets.data(), bytes));
  last_offsets_ = layout.offsets;
  last_offsets_dev_ = reinterpret_cast<const int32_t*>(dev);
  return last_offsets_dev_;
}

std::string PassRecorder::pass_ops() const {
  std::string s;
  const char* prev = nullptr;
  int listed = 0;
  for (const Command& c : commands_) {
    if (prev && std::strcmp(prev, c.op) == 0) continue;
    if (++listed > 24) return s + ", ...";
    s += (s.empty() ? "" : ", ") + std::string(c.op);
    prev = c.op;
  }
  return s;
}

void PassRecorder::clear_pass() {
  commands_.clear();
  full_.clear();
  shape_.clear();
  last_offsets_.clear();
  last_offsets_dev_ = nullptr;
  staging_.restart();
  scratch_.restart();
}

Status PassRecorder::run_direct() {
  for (const Command& c : commands_) {
    const Status st = c.enqueue(stream_);
    if (!st.ok()) return Status(st.code(), cat(c.op, ": ", st.message()));
  }
  return Status::success();
}

Status PassRecorder::capture(cudaGraph_t* graph) {
  KEV_CUDA_TRY(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  for (const Command& c : commands_) {
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

Status PassRecorder::run_graph() {
  const uint64_t hash = fnv1a64(full_.data(), full_.size() * sizeof(uint64_t));
  for (auto it = graphs_cache_.begin(); it != graphs_cache_.end(); ++it) {
    if (it->hash != hash || it->full != full_) continue;
    graphs_cache_.splice(graphs_cache_.begin(), graphs_cache_, it);
    KEV_CUDA_TRY(cudaGraphLaunch(graphs_cache_.front().exec, stream_));
    ++graph_launches_;
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
    return run_direct();
  }
  cudaGraph_t graph = nullptr;
  if (!capture(&graph).ok()) {
    // Recording a graph enqueued nothing, so the pass can still run directly; a real launch error
    // shows up there again, named by its op.
    ++capture_failures_;
    return run_direct();
  }
  // Same topology and parameters but other addresses: update that exec in place instead of
  // instantiating a new one.
  for (auto it = graphs_cache_.begin(); it != graphs_cache_.end(); ++it) {
    if (it->shape != shape_) continue;
    cudaGraphExecUpdateResultInfo info{};
    if (cudaGraphExecUpdate(it->exec, graph, &info) == cudaSuccess) {
      it->hash = hash;
      it->full = full_;
      graphs_cache_.splice(graphs_cache_.begin(), graphs_cache_, it);
      cudaGraphDestroy(graph);
      KEV_CUDA_TRY(cudaGraphLaunch(graphs_cache_.front().exec, stream_));
      ++graph_launches_;
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
    return run_direct();
  }
  graphs_cache_.push_front(GraphEntry{hash, full_, shape_, exec});
  while (graphs_cache_.size() > kMaxGraphs) {
    cudaGraphExecDestroy(graphs_cache_.back().exec);
    graphs_cache_.pop_back();
  }
  KEV_CUDA_TRY(cudaGraphLaunch(exec, stream_));
  ++graph_launches_;
  return Status::success();
}

Status PassRecorder::flush() {
  if (commands_.empty()) return Status::success();
  KEV_CUDA_TRY(cudaSetDevice(device_));
  const Status run = graphs_ && commands_.size() > 1 ? run_graph() : run_direct();
  const cudaError_t sync = cudaStreamSynchronize(stream_);
  const std::string ops = pass_ops();
  const size_t n = commands_.size();
  clear_pass();
  KEV_TRY(run);
  KEV_CHECK(sync == cudaSuccess, ErrorCode::Device, "cuda: a pass of ", n, " commands failed on the GPU: ",
            cudaGetErrorName(sync), " (", cudaGetErrorString(sync), "); its ops: ", ops);
  return Status::success();
}

}  // namespace kev::cuda
