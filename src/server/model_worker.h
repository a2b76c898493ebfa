// ModelWorker: one Engine served by one thread that batches the requests waiting for it.
//
//   KEV_ASSIGN_OR_RETURN(auto worker, ModelWorker::open("models/kev-0.8b", options, {.max_batch = 32}));
//   KEV_ASSIGN_OR_RETURN(Request req, parse_request(body));              // any thread
//   KEV_ASSIGN_OR_RETURN(PreparedRequest p, worker->prepare(std::move(req), false));  // any thread
//   Served s = worker->serve(std::move(p));                               // blocks until answered
//
// prepare() tokenises and validates on the caller's thread (state and row limits are 422s before the
// request ever queues). serve() queues the request; the worker thread takes everything queued at
// once, groups requests whose states tokenise alike (same model), takes each group's Prefix from the
// PrefixCache or makes it with one state pass, and answers up to max_batch requests of a group with ONE
// evaluate() call over their merged questions, so rows of different requests share passes. Answers are
// split back by request. A request never sees what it was batched with: rows are independent sequences
// (KEV_SPEC.md §4.4) and the CPU backend's matmul is row-invariant, so a batched answer is bitwise the
// answer of the request served alone (tests/server/model_worker_test.cpp checks it).
// "separate" requests run each question in its own evaluate() call and are never merged.
// Overload: serve() refuses at once (Unavailable) while max_queue requests wait, and a request that
// waited longer than queue_timeout when the worker takes it is answered Unavailable without running,
// so a client learns it should back off instead of waiting behind a backlog it cannot see.
// Thread-safety: prepare(), serve(), stats() and the accessors may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kev/kev.h"
#include "server/prefix_cache.h"
#include "text/encode.h"
#include "text/tokenizer.h"

namespace kev {

struct WorkerOptions {
  int max_batch = 32;  // requests merged into one evaluate() call, >= 1
  PrefixCacheLimits cache;
  // Requests waiting for the worker thread (not counting the batch it is serving), >= 1; serve() on a
  // full queue fails at once with Unavailable.
  int max_queue = 1024;
  // A request that has waited longer than this when the worker takes it is answered Unavailable without
  // running. 0: no limit; never negative.
  std::chrono::milliseconds queue_timeout{0};
  // Runs on the worker thread before each batch it takes, after expired requests have been dropped from
  // it (not at all when every request taken had expired). Tests hold the worker with it so that
  // requests pile up and batch (or stay in flight) deterministically.
  std::function<void()> before_batch;
};

// A request parsed and encoded on the caller's thread, ready to queue.
struct PreparedRequest {
  Request request;
  EncodedState state;               // the state's ids as the state pass will see them
  std::vector<int64_t> row_tokens;  // |B_k| per question, request order
  bool separate = false;            // one evaluate() call per question, never batched
};

// The outcome of serve(). Timings are wall milliseconds on the worker's clock.
struct Served {
  Status status;           // not ok: answers is empty
  Answers answers;         // ids and usage are the request's own; latency_ms is the model time of its batch
  double queue_ms = 0;     // from serve() until the worker took the request
  // The state pass (0 on a cache hit). A miss runs it fused with the first score pass
  // (Engine::prefill_tokens_and_evaluate), and that whole call counts here.
  double prefill_ms = 0;
  double evaluate_ms = 0;  // the evaluate() call(s) that answered it (on a miss: any after the fused one)
  int batch_requests = 0;  // requests answered by the same evaluate() call
  bool cache_hit = false;
};

struct WorkerStats {
  uint64_t batches = 0;           // evaluate() calls for merged groups (separate requests count once)
  uint64_t batched_requests = 0;  // requests over those calls: mean batch size = batched_requests / batches
  uint64_t cache_hits = 0;        // prefix lookups answered by the cache
  uint64_t cache_misses = 0;      // prefix lookups that ran a state pass
  uint64_t queued = 0;            // requests waiting now
  uint64_t rejected_full = 0;     // serve() calls refused because max_queue requests were waiting
  uint64_t expired = 0;           // requests answered unrun because they waited over queue_timeout
  size_t cache_entries = 0;
  int64_t cache_tokens = 0;
};

class ModelWorker {
 public:
  // Loads the model (an exported directory or an upstream checkpoint, as Engine::load) and its
  // tokenizer, and starts the worker thread. Worker options out of range are InvalidRequest.
  static Result<std::unique_ptr<ModelWorker>> open(const std::string& model_path, const Options& options,
                                                   WorkerOptions worker_options);
  ModelWorker(const ModelWorker&) = delete;
  ModelWorker& operator=(const ModelWorker&) = delete;
  ~ModelWorker();  // stop()

  // Tokenises the state and every question row and checks the limits (InvalidRequest naming the limit).
  Result<PreparedRequest> prepare(Request request, bool separate) const;
  // Queues the request and waits for its answers. After stop() it fails without queueing (Internal); on
  // a full queue, or when it waited over queue_timeout, it fails with Unavailable.
  Served serve(PreparedRequest request);
  // Answers everything already queued, then ends the worker thread. Idempotent.
  void stop();

  WorkerStats stats() const;
  const ModelInfo& info() const { return engine_.info(); }
  const Options& options() const { return options_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }
  // Where the weights came from: the base directory of a checkpoint, else model.json's "source".
  const std::string& source() const { return source_; }

 private:
  struct Job {
    PreparedRequest request;
    std::chrono::steady_clock::time_point queued_at;
    std::promise<Served> done;
  };

  ModelWorker(Engine engine, Tokenizer tokenizer, Encoder encoder, Options options, WorkerOptions worker_options,
              std::string source);
  void run();
  void serve_jobs(std::vector<std::unique_ptr<Job>> jobs);
  void serve_group(const std::vector<Job*>& group);
  void serve_separate(Job& job);
  // The cached snapshot of the job's state, or null (counts the hit or miss).
  std::shared_ptr<const Prefix> find_prefix(const Job& job);
  // Caches a snapshot of the job's state.
  std::shared_ptr<const Prefix> cache_prefix(const Job& job, Prefix prefix);
  // The state pass alone, its snapshot cached.
  Result<std::shared_ptr<const Prefix>> make_prefix(const Job& job, double& prefill_ms);

  Engine engine_;
  Tokenizer tokenizer_;
  Encoder encoder_;
  Options options_;
  WorkerOptions worker_options_;
  std::string source_;
  std::string model_key_;  // checkpoint id + backend: the PrefixCache key's model part
  PrefixCache cache_;      // worker thread only

  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::unique_ptr<Job>> queue_;
  bool stopping_ = false;
  WorkerStats stats_;  // under mu_
  std::thread thread_;
};

}  // namespace kev
