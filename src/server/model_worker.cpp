#include "server/model_worker.h"

#include <algorithm>
#include <map>
#include <utility>

#include "common/check.h"
#include "model/checkpoint_import.h"
#include "model/model_file.h"

namespace kev {
namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// The request's own usage (KEV_SPEC.md §4.4): input_tokens = Ls + sum of its rows, whatever it ran with.
Usage usage_of(const PreparedRequest& r) {
  Usage u;
  u.state_tokens = r.state.original_length;
  u.state_tokens_used = static_cast<int64_t>(r.state.tokens.size());
  u.truncated = r.state.truncated;
  u.input_tokens = u.state_tokens_used;
  for (int64_t n : r.row_tokens) u.input_tokens += n;
  return u;
}

}  // namespace

Result<std::unique_ptr<ModelWorker>> ModelWorker::open(const std::string& model_path, const Options& options,
                                                       WorkerOptions worker_options) {
  KEV_CHECK(worker_options.max_batch >= 1, ErrorCode::InvalidRequest, "max_batch is ", worker_options.max_batch,
            "; it must be at least 1");
  KEV_CHECK(worker_options.max_queue >= 1, ErrorCode::InvalidRequest, "max_queue is ", worker_options.max_queue,
            "; it must be at least 1");
  KEV_CHECK(worker_options.queue_timeout.count() >= 0, ErrorCode::InvalidRequest, "queue_timeout is ",
            worker_options.queue_timeout.count(), " ms; it must be 0 (no limit) or more");
  // The tokenizer the engine uses, found as Engine::load finds it: prepare() encodes the state the
  // engine's state pass then takes as it is (prefill_tokens) and the questions as evaluate() will.
  std::string tokenizer_path, source;
  if (is_checkpoint_dir(model_path)) {
    source = options.base_dir.empty() ? model_path : options.base_dir;
    tokenizer_path = source + "/tokenizer.json";
  } else {
    KEV_ASSIGN_OR_RETURN(ModelFile model, read_model_file(model_path));
    tokenizer_path = model.tokenizer_path();
    source = model.kev.source;
  }
  KEV_ASSIGN_OR_RETURN(Engine engine, Engine::load(model_path, options));
  KEV_ASSIGN_OR_RETURN(Tokenizer tokenizer, Tokenizer::load(tokenizer_path));
  KEV_ASSIGN_OR_RETURN(SpecialIds ids, resolve_special_ids(tokenizer));
  Encoder encoder(tokenizer, ids, engine.info().limits);
  return std::unique_ptr<ModelWorker>(new ModelWorker(std::move(engine), std::move(tokenizer), std::move(encoder),
                                                      options, std::move(worker_options), std::move(source)));
}

ModelWorker::ModelWorker(Engine engine, Tokenizer tokenizer, Encoder encoder, Options options,
                         WorkerOptions worker_options, std::string source)
    : engine_(std::move(engine)),
      tokenizer_(std::move(tokenizer)),
      encoder_(std::move(encoder)),
      options_(std::move(options)),
      worker_options_(std::move(worker_options)),
      source_(std::move(source)),
      model_key_(cat(engine_.info().checkpoint_id, "|", engine_.info().name, "|", engine_.info().backend)),
      cache_(worker_options_.cache) {
  thread_ = std::thread([this] { run(); });
}

ModelWorker::~ModelWorker() { stop(); }

void ModelWorker::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Result<PreparedRequest> ModelWorker::prepare(Request request, bool separate) const {
  PreparedRequest p;
  KEV_ASSIGN_OR_RETURN(p.state, encoder_.encode_state(request.state_text, options_.truncate_states));
  const auto Ls = static_cast<int64_t>(p.state.tokens.size());
  for (size_t i = 0; i < request.questions.size(); ++i) {
    KEV_ASSIGN_OR_RETURN(EncodedRow row, encoder_.encode_question(request.questions[i], Ls));
    p.row_tokens.push_back(static_cast<int64_t>(row.tokens.size()));
  }
  p.request = std::move(request);
  p.separate = separate;
  return p;
}

Served ModelWorker::serve(PreparedRequest request) {
  auto job = std::make_unique<Job>();
  job->request = std::move(request);
  job->queued_at = Clock::now();
  std::future<Served> done = job->done.get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      Served s;
      s.status = Status(ErrorCode::Internal, "the model worker has stopped; no new requests are taken");
      return s;
    }
    if (queue_.size() >= static_cast<size_t>(worker_options_.max_queue)) {
      ++stats_.rejected_full;
      Served s;
      s.status = Status(ErrorCode::Unavailable, cat("the model's queue is full (", queue_.size(),
                                                    " requests waiting; --max-queue)"));
      return s;
    }
    queue_.push_back(std::move(job));
    ++stats_.queued;
  }
  wake_.notify_one();
  return done.get();
}

WorkerStats ModelWorker::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void ModelWorker::run() {
  const auto timeout = worker_options_.queue_timeout;
  while (true) {
    std::vector<std::unique_ptr<Job>> jobs, expired;
    Clock::time_point taken;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything queued has been answered
      taken = Clock::now();
      while (!queue_.empty()) {
        const bool late = timeout.count() > 0 && taken - queue_.front()->queued_at > timeout;
        (late ? expired : jobs).push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      stats_.queued = 0;
      stats_.expired += expired.size();
    }
    for (const std::unique_ptr<Job>& job : expired) {
      Served s;
      s.queue_ms = ms_between(job->queued_at, taken);
      s.status = Status(ErrorCode::Unavailable,
                        cat("waited ", static_cast<int64_t>(s.queue_ms), " ms in the queue, over the ", timeout.count(),
                            " ms limit (--queue-timeout-ms)"));
      job->done.set_value(std::move(s));
    }
    if (jobs.empty()) continue;
    if (worker_options_.before_batch) worker_options_.before_batch();
    serve_jobs(std::move(jobs));
  }
}

void ModelWorker::serve_jobs(std::vector<std::unique_ptr<Job>> jobs) {
  // Groups of equal states in order of first arrival; each group runs in chunks of max_batch.
  std::vector<std::vector<Job*>> groups;
  std::map<std::vector<int32_t>, size_t> group_of;
  for (const auto& job : jobs) {
    if (job->request.separate) {
      serve_separate(*job);
      continue;
    }
    const auto [it, fresh] = group_of.try_emplace(job->request.state.tokens, groups.size());
    if (fresh) groups.emplace_back();
    groups[it->second].push_back(job.get());
  }
  const auto max_batch = static_cast<size_t>(worker_options_.max_batch);
  for (const std::vector<Job*>& group : groups) {
    for (size_t begin = 0; begin < group.size(); begin += max_batch) {
      const size_t end = std::min(group.size(), begin + max_batch);
      serve_group(std::vector<Job*>(group.begin() + static_cast<std::ptrdiff_t>(begin),
                                    group.begin() + static_cast<std::ptrdiff_t>(end)));
    }
  }
}

std::shared_ptr<const Prefix> ModelWorker::find_prefix(const Job& job) {
  std::shared_ptr<const Prefix> prefix = cache_.find(PrefixKey{model_key_, job.request.state.tokens});
  std::lock_guard<std::mutex> lock(mu_);
  ++(prefix ? stats_.cache_hits : stats_.cache_misses);
  return prefix;
}

std::shared_ptr<const Prefix> ModelWorker::cache_prefix(const Job& job, Prefix made) {
  auto prefix = std::make_shared<const Prefix>(std::move(made));
  cache_.insert(PrefixKey{model_key_, job.request.state.tokens}, prefix);
  return prefix;
}

Result<std::shared_ptr<const Prefix>> ModelWorker::make_prefix(const Job& job, double& prefill_ms) {
  const auto t0 = Clock::now();
  // prepare()'s ids, encoded on the request's thread, are the pass's input and the cache key.
  const EncodedState& enc = job.request.state;
  KEV_ASSIGN_OR_RETURN(Prefix made, engine_.prefill_tokens(enc.tokens, enc.original_length, enc.truncated));
  prefill_ms += ms_between(t0, Clock::now());
  return cache_prefix(job, std::move(made));
}

void ModelWorker::serve_group(const std::vector<Job*>& group) {
  const auto taken = Clock::now();
  std::vector<Served> out(group.size());
  for (size_t r = 0; r < group.size(); ++r) out[r].queue_ms = ms_between(group[r]->queued_at, taken);

  // One evaluation of every request's questions. Ids get a "<request>:" prefix so they stay unique
  // across requests; the answers keep question order, so request r owns a contiguous slice.
  Questions merged;
  for (size_t r = 0; r < group.size(); ++r) {
    for (const Question& q : group[r]->request.request.questions) {
      merged.push_back(group.size() == 1 ? q : Question{cat(r, ":", q.id), q.body});
    }
  }
  const std::shared_ptr<const Prefix> cached = find_prefix(*group[0]);
  const bool hit = cached != nullptr;
  Result<std::shared_ptr<const Prefix>> prefix = cached;
  double prefill_ms = 0, evaluate_ms = 0;
  const auto t0 = Clock::now();
  Result<Answers> answers = Status(ErrorCode::Internal, "not evaluated");
  if (hit) {
    answers = engine_.evaluate(*cached, merged);
    evaluate_ms = ms_between(t0, Clock::now());
  } else {
    // A miss runs the state pass and the first score pass as one forward pass
    // (Engine::prefill_tokens_and_evaluate); the whole call counts as the state pass's time.
    const EncodedState& enc = group[0]->request.state;
    Result<PrefixAndAnswers> both =
        engine_.prefill_tokens_and_evaluate(enc.tokens, enc.original_length, enc.truncated, merged);
    prefill_ms = ms_between(t0, Clock::now());
    if (both.ok()) {
      prefix = cache_prefix(*group[0], std::move(both->prefix));
      answers = std::move(both->answers);
    } else {
      answers = both.status();
      // Several requests are answered one by one below, from a snapshot made on its own.
      prefix = group.size() > 1 ? make_prefix(*group[0], prefill_ms) : Result<std::shared_ptr<const Prefix>>(both.status());
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.batches;
    stats_.batched_requests += group.size();
    stats_.cache_entries = cache_.entries();
    stats_.cache_tokens = cache_.tokens();
  }

  size_t at = 0;
  for (size_t r = 0; r < group.size(); ++r) {
    const PreparedRequest& req = group[r]->request;
    Served& s = out[r];
    s.prefill_ms = prefill_ms;
    s.evaluate_ms = evaluate_ms;
    s.batch_requests = static_cast<int>(group.size());
    s.cache_hit = hit;
    const size_t n = req.request.questions.size();
    if (answers.ok()) {
      s.answers.answers.assign(answers->answers.begin() + static_cast<std::ptrdiff_t>(at),
                               answers->answers.begin() + static_cast<std::ptrdiff_t>(at + n));
      for (size_t i = 0; i < n; ++i) s.answers.answers[i].id = req.request.questions[i].id;
      s.answers.usage = usage_of(req);
      s.answers.latency_ms = prefill_ms + evaluate_ms;
    } else if (prefix.ok() && group.size() > 1) {
      // prepare() validated every request, so a merged failure is rare (a device error, say); answer
      // each request alone so one request's error is not charged to the others.
      const auto t1 = Clock::now();
      Result<Answers> alone = engine_.evaluate(**prefix, req.request.questions);
      s.evaluate_ms = ms_between(t1, Clock::now());
      s.batch_requests = 1;
      if (alone.ok()) {
        s.answers = std::move(alone).value();
        s.answers.usage = usage_of(req);
        s.answers.latency_ms = prefill_ms + s.evaluate_ms;
      } else {
        s.status = alone.status();
      }
    } else {
      s.status = answers.status();
    }
    at += n;
  }
  for (size_t r = 0; r < group.size(); ++r) group[r]->done.set_value(std::move(out[r]));
}

void ModelWorker::serve_separate(Job& job) {
  Served s;
  s.queue_ms = ms_between(job.queued_at, Clock::now());
  s.batch_requests = 1;
  const auto answer = [&]() -> Status {
    std::shared_ptr<const Prefix> prefix = find_prefix(job);
    s.cache_hit = prefix != nullptr;
    if (!prefix) {
      KEV_ASSIGN_OR_RETURN(prefix, make_prefix(job, s.prefill_ms));
    }
    const auto t0 = Clock::now();
    for (const Question& q : job.request.request.questions) {
      KEV_ASSIGN_OR_RETURN(Answers one, engine_.evaluate(*prefix, {q}));
      s.answers.answers.push_back(std::move(one.answers[0]));
    }
    s.evaluate_ms = ms_between(t0, Clock::now());
    return Status::success();
  };
  s.status = answer();
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.batches;
    ++stats_.batched_requests;
    stats_.cache_entries = cache_.entries();
    stats_.cache_tokens = cache_.tokens();
  }
  if (s.status.ok()) {
    s.answers.usage = usage_of(job.request);
    s.answers.latency_ms = s.prefill_ms + s.evaluate_ms;
  } else {
    s.answers = Answers{};
  }
  job.done.set_value(std::move(s));
}

}  // namespace kev
