// The CUDA backend's execution model: ops are recorded into a per-pass command list and run at the
// next flush (synchronize / download), either directly or as a CUDA graph.
//
//   PassRecorder rec;  KEV_TRY(rec.init(device, pool, /*graphs=*/true));
//   CommandSig sig;  sig.word(n, d);  sig.ptr(x, out);
//   rec.record("add", sig, [=](cudaStream_t s) { return launch(...); });
//   KEV_TRY(rec.flush());                     // runs the pass, one cudaStreamSynchronize
//
// Each command carries a signature: its op, shapes, strides and scalars ("shape words") plus every
// device and staging address it touches ("pointer words"). A flush with graphs on looks for a cached
// graph exec whose full signature (compared word by word, not only by hash) equals the pass's and
// launches it. A signature seen for the first time runs directly (warm-up: one-off passes skip the
// capture cost, and every kernel has run once before capture); on its second sighting the commands
// are captured on the backend's stream into a graph, which updates a cached exec with the same shape
// words (cudaGraphExecUpdate: same topology, other addresses; not one this pass already launched) or
// is instantiated anew; the 128 most recently used execs are kept. (All of this is per segment when a
// pass is launched in segments, below.) Single-command passes (profiling mode synchronises after every op)
// and graphs-off run the closures directly.
//
// Segments. The GPU would idle while the host records a pass (~1 µs per command: 0.35–0.85 ms for a
// Kev pass of 330–440 commands), so a pass is launched in segments of kSegment commands as it is
// recorded: once kSegment + 1 commands are pending, the first kSegment are launched (replayed as a
// graph, captured, or run directly, each segment by its own signature, exactly as above) without
// waiting, and the host records on while the GPU runs them. The newest command always stays pending,
// so a caller may still rely on it being unlaunched. The flush launches the rest and waits once.
// Segment boundaries depend only on the command count, so a recurring pass splits the same way and
// every segment replays. A launch error is kept and returned by the flush (after the wait), and
// nothing more is launched in that pass. The per-op trace (below) keeps whole passes.
//
// Inputs of a pass live at fixed places so a replayed graph sees new data: host bytes are copied into
// pinned staging chunks at a cursor that restarts every pass (so the same op sequence puts them at
// the same addresses), and the recorded cudaMemcpyAsync reads them when the pass runs. Device scratch
// (SeqLayout offsets, the BF16 copy of a matmul input, kernel workspaces) comes from pool chunks the
// same way. Chunks are only ever added, never moved, so a recorded address stays valid.
//
// Tracing (environment variable KEV_CUDA_TRACE, read once per recorder; output on stderr):
//   =1    one line per flush: commands, how its segments ran (graph replay / update / capture, or
//         direct and why, with counts), the host time from its first record() to the flush (the
//         segments launched meanwhile run during it), the flush's own enqueue time and the wall time
//         to the end of the wait.
//   =ops  also per-op GPU times: a pass seen before runs directly with an event before every command
//         (a first sighting runs untimed, as a warm-up) and none of the graph cache is used; the
//         stream is held by a device-side gate until up to kTraceGate commands are enqueued, so host
//         launch gaps do not land in the ops' times. Ops are grouped by their trace label (op name, or
//         the op's shape where record() was given one).
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <list>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/device_pool.h"

namespace kev::cuda {

// One command's signature words (see above).
struct CommandSig {
  std::vector<uint64_t> shape;
  std::vector<uint64_t> ptrs;

  template <class... T>
  void word(T... v) {
    (shape.push_back(to_word(v)), ...);
  }
  template <class... T>
  void ptr(T... p) {
    (ptrs.push_back(static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p))), ...);
  }

 private:
  template <class T>
  static uint64_t to_word(T v) {
    if constexpr (std::is_same_v<T, float>) {
      uint32_t u;
      std::memcpy(&u, &v, sizeof(u));
      return u;
    } else if constexpr (std::is_same_v<T, double>) {
      uint64_t u;
      std::memcpy(&u, &v, sizeof(u));
      return u;
    } else {
      return static_cast<uint64_t>(v);
    }
  }
};

// Chunks of memory handed out at a cursor that restarts every pass.
class ChunkArena {
 public:
  using AllocFn = std::function<Result<void*>(size_t)>;
  using FreeFn = std::function<void(void*)>;
  ChunkArena(size_t min_chunk, AllocFn alloc, FreeFn free)
      : min_chunk_(min_chunk), alloc_(std::move(alloc)), free_(std::move(free)) {}
  ~ChunkArena();
  ChunkArena(const ChunkArena&) = delete;
  ChunkArena& operator=(const ChunkArena&) = delete;
  // `bytes` at an address aligned to 256 bytes; null for 0 bytes.
  Result<char*> take(size_t bytes);
  void restart() { chunk_ = 0, used_ = 0; }

 private:
  struct Chunk {
    char* base;
    size_t size;
  };
  size_t min_chunk_;
  AllocFn alloc_;
  FreeFn free_;
  std::vector<Chunk> chunks_;
  size_t chunk_ = 0, used_ = 0;
};

class PassRecorder {
 public:
  using Enqueue = std::function<Status(cudaStream_t)>;

  PassRecorder(int device, std::shared_ptr<DevicePool> pool, bool graphs);
  ~PassRecorder();
  PassRecorder(const PassRecorder&) = delete;
  PassRecorder& operator=(const PassRecorder&) = delete;
  Status init();

  // Commands per launched segment (see above).
  static constexpr size_t kSegment = 64;

  cudaStream_t stream() const { return stream_; }
  // Nothing recorded in this pass (launched segments count as recorded until the flush).
  bool empty() const { return pass_ops_.empty(); }
  // Commands recorded over the recorder's life, and passes cleared: a caller can tell that nothing
  // was recorded, and no flush happened, since a point it noted.
  uint64_t recorded() const { return recorded_; }
  uint64_t pass_serial() const { return pass_serial_; }

  // `label` (optional) groups the command in the per-op trace; pass one only when tracing_ops().
  void record(const char* op, const CommandSig& sig, Enqueue enqueue, std::string label = {});
  // Replaces the last command recorded in this pass (signature and closure; recorded() is unchanged):
  // an op recorded later may widen what its producer writes (matmul's FP16 input written by a norm).
  Status replace_last(const char* op, const CommandSig& sig, Enqueue enqueue, std::string label = {});
  bool tracing_ops() const { return trace_ == Trace::Ops; }
  // Copies `bytes` from host `src` into staging now and records the copy to device `dst`.
  Status record_upload(void* dst, const void* src, size_t bytes);
  // Device scratch valid for this pass only (256-byte aligned; null for 0 bytes).
  Result<char*> scratch(size_t bytes);
  // The layout's offsets as a device int32 array (uploaded in order the first time the pass sees
  // them, then reused: a fused state + score pass alternates between two layouts).
  Result<const int32_t*> offsets(const SeqLayout& layout);
  // Runs the recorded pass and waits for it; the pass is cleared even when it fails.
  Status flush();

  size_t cached_graphs() const { return graphs_cache_.size(); }
  uint64_t graph_launches() const { return graph_launches_; }
  uint64_t graph_captures() const { return graph_captures_; }
  // Passes whose capture or instantiation failed and that ran directly instead.
  uint64_t capture_failures() const { return capture_failures_; }

 private:
  struct Command {
    const char* op;
    Enqueue enqueue;
    std::string label;
    size_t full_end, shape_end;  // where its words end in full_ / shape_
  };
  enum class Trace { Off, Flushes, Ops };
  struct GraphEntry {
    uint64_t hash;
    std::vector<uint64_t> full, shape;
    cudaGraphExec_t exec;
    uint64_t pass;  // the pass that last launched it
  };
  void append(const char* op, const CommandSig& sig, Enqueue enqueue, std::string label);
  // Launches the first n pending commands (graph or direct) and drops them from the pending list.
  Status launch(size_t n);
  Status run_direct(size_t n);
  Status run_graph(size_t n, std::span<const uint64_t> full, std::span<const uint64_t> shape);
  Status run_traced();
  void release_gate();
  Status capture(size_t n, cudaGraph_t* graph);
  std::string pass_ops() const;
  void clear_pass();

  int device_;
  std::shared_ptr<DevicePool> pool_;
  bool graphs_;
  cudaStream_t stream_ = nullptr;
  ChunkArena staging_;
  ChunkArena scratch_;
  std::vector<Command> commands_;        // recorded, not yet launched
  std::vector<uint64_t> full_, shape_;  // their signature words
  std::vector<const char*> pass_ops_;   // every command of the pass, launched or not (error messages)
  Status pending_;                      // the first segment launch error of this pass
  std::vector<std::pair<std::vector<int32_t>, const int32_t*>> pass_offsets_;  // host offsets, device copy
  std::list<GraphEntry> graphs_cache_;  // most recently used first
  std::list<uint64_t> seen_;            // hashes of signatures run once without a graph, newest first
  uint64_t graph_launches_ = 0, graph_captures_ = 0, capture_failures_ = 0;
  uint64_t recorded_ = 0, pass_serial_ = 0;
  // Tracing (see above).
  Trace trace_ = Trace::Off;
  // How this pass's segments ran (counts; the trace prints them with kRanNames).
  enum class Ran { Replay, Update, Instantiate, FirstSighting, CaptureFailed, InstantiationFailed, Direct, Traced };
  static constexpr std::array<const char*, 8> kRanNames = {
      "graph replay",          "graph capture + exec update", "graph capture + instantiation",
      "direct (first sighting)", "direct (capture failed)",   "direct (instantiation failed)",
      "direct",                 "direct, traced per op"};
  std::array<int, kRanNames.size()> ran_{};
  std::chrono::steady_clock::time_point first_record_;  // when the pass's first command was recorded
  uint64_t passes_ = 0;
  std::vector<cudaEvent_t> events_;
  std::vector<uint64_t> traced_shapes_;  // pass shapes seen by the per-op trace
  volatile uint32_t* gate_host_ = nullptr;  // mapped pinned word the gate kernel polls
  uint32_t* gate_dev_ = nullptr;
  uint32_t gate_value_ = 0;
};

}  // namespace kev::cuda
