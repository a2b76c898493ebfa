// ModelWorker on the tiny synthetic model: batching across requests is invisible in the answers
// (bitwise, CPU), the prefix cache's LRU bounds, max_batch, separate requests, validation on prepare,
// the queue bound and the queue-wait timeout.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <thread>

#include <gtest/gtest.h>

#include "kev/kev.h"
#include "server/model_worker.h"
#include "server/test_server.h"
#include "support/tiny_model.h"

namespace kev {
namespace {

using test::Gate;

std::unique_ptr<ModelWorker> open_worker(WorkerOptions w, Options o = {}) {
  auto worker = ModelWorker::open(test::tiny_model_dir(), o, std::move(w));
  EXPECT_TRUE(worker.ok()) << worker.status().to_string();
  return worker.ok() ? std::move(worker).value() : nullptr;
}

Request parse(const std::string& body) {
  auto r = parse_request(body);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? std::move(r).value() : Request{};
}

PreparedRequest prepare(ModelWorker& w, const std::string& body, bool separate = false) {
  auto p = w.prepare(parse(body), separate);
  EXPECT_TRUE(p.ok()) << p.status().to_string();
  return p.ok() ? std::move(p).value() : PreparedRequest{};
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Every number of two answer lists, bit for bit.
void expect_bitwise_equal(const Answers& got, const Answers& want) {
  ASSERT_EQ(got.answers.size(), want.answers.size());
  for (size_t i = 0; i < got.answers.size(); ++i) {
    const Answer& g = got.answers[i];
    const Answer& w = want.answers[i];
    EXPECT_EQ(g.id, w.id);
    EXPECT_EQ(g.option_keys, w.option_keys);
    ASSERT_EQ(g.probabilities.size(), w.probabilities.size());
    ASSERT_EQ(g.logits.size(), w.logits.size());
    for (size_t j = 0; j < g.probabilities.size(); ++j) {
      EXPECT_TRUE(same_bits(g.probabilities[j], w.probabilities[j]))
          << g.id << " option " << j << ": " << g.probabilities[j] << " vs " << w.probabilities[j];
      EXPECT_TRUE(same_bits(g.logits[j], w.logits[j])) << g.id << " option " << j;
    }
    ASSERT_EQ(g.value.index(), w.value.index());
    if (const auto* c = std::get_if<ChoiceAnswer>(&g.value)) {
      EXPECT_EQ(c->choice, std::get<ChoiceAnswer>(w.value).choice);
      EXPECT_TRUE(same_bits(c->confidence, std::get<ChoiceAnswer>(w.value).confidence));
    } else if (const auto* s = std::get_if<ScoreAnswer>(&g.value)) {
      EXPECT_TRUE(same_bits(s->score, std::get<ScoreAnswer>(w.value).score));
      EXPECT_TRUE(same_bits(s->confidence, std::get<ScoreAnswer>(w.value).confidence));
    } else {
      EXPECT_TRUE(same_bits(std::get<NoulAnswer>(g.value).yes, std::get<NoulAnswer>(w.value).yes));
    }
  }
  EXPECT_EQ(got.usage.input_tokens, want.usage.input_tokens);
  EXPECT_EQ(got.usage.state_tokens_used, want.usage.state_tokens_used);
}

// Answers of `body` from a separate engine, alone.
Answers alone(Engine& engine, const std::string& body) {
  const Request r = parse(body);
  auto a = engine.system_one(r.state_text, r.questions);
  EXPECT_TRUE(a.ok()) << a.status().to_string();
  return a.ok() ? std::move(a).value() : Answers{};
}

TEST(ModelWorker, BatchedAnswersAreBitwiseTheAnswersAloneAndMaxBatchSplits) {
  {
    Gate gate;
    auto worker = open_worker({.max_batch = 32, .cache = {}, .before_batch = gate.hook()});
    ASSERT_TRUE(worker);
    auto engine = Engine::load(test::tiny_model_dir(), {});
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();

    // 3 states x 4 question sets; the first request holds the worker while the other 11 queue.
    std::vector<std::string> bodies;
    for (int s = 0; s < 3; ++s) {
      for (const std::string& qs : test::question_sets()) bodies.push_back(test::request_body(test::states()[s], qs));
    }
    std::vector<std::future<Served>> served;
    served.push_back(std::async(std::launch::async, [&] { return worker->serve(prepare(*worker, bodies[0])); }));
    gate.wait_entered(1);
    for (size_t i = 1; i < bodies.size(); ++i) {
      served.push_back(std::async(std::launch::async, [&, i] { return worker->serve(prepare(*worker, bodies[i])); }));
    }
    while (worker->stats().queued < bodies.size() - 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    gate.release();

    for (size_t i = 0; i < bodies.size(); ++i) {
      Served s = served[i].get();
      ASSERT_TRUE(s.status.ok()) << s.status.to_string();
      // Request 0 ran alone; the rest ran four to an evaluate() call, one call per state.
      EXPECT_EQ(s.batch_requests, i == 0 ? 1 : (i < 4 ? 3 : 4)) << "request " << i;
      expect_bitwise_equal(s.answers, alone(*engine, bodies[i]));
    }
    const WorkerStats st = worker->stats();
    EXPECT_EQ(st.batches, 4u);
    EXPECT_EQ(st.batched_requests, 12u);
    EXPECT_EQ(st.cache_misses, 3u);  // one state pass per state
    EXPECT_EQ(st.cache_hits, 1u);    // state 0 again, after request 0 put it in the cache
  }
  // max_batch splits a group of equal states into several evaluate() calls.
  {
    Gate gate;
    auto worker = open_worker({.max_batch = 2, .cache = {}, .before_batch = gate.hook()});
    ASSERT_TRUE(worker);
    const std::string body = test::request_body(test::states()[1], test::question_sets()[0]);
    std::vector<std::future<Served>> served;
    served.push_back(std::async(std::launch::async, [&] { return worker->serve(prepare(*worker, body)); }));
    gate.wait_entered(1);
    for (int i = 0; i < 5; ++i) {
      served.push_back(std::async(std::launch::async, [&] { return worker->serve(prepare(*worker, body)); }));
    }
    while (worker->stats().queued < 5) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    gate.release();
    std::vector<int> sizes;
    for (auto& f : served) {
      Served s = f.get();
      ASSERT_TRUE(s.status.ok()) << s.status.to_string();
      sizes.push_back(s.batch_requests);
    }
    std::sort(sizes.begin() + 1, sizes.end());
    EXPECT_EQ(sizes, (std::vector<int>{1, 1, 2, 2, 2, 2}));
    EXPECT_EQ(worker->stats().batches, 4u);  // the held request, then 2 + 2 + 1
  }
}

TEST(ModelWorker, PrefixCacheIsLeastRecentlyUsedAndBounded) {
  {
    auto worker =
        open_worker({.max_batch = 32, .cache = {.max_entries = 2, .max_tokens = 1 << 20}, .before_batch = {}});
    ASSERT_TRUE(worker);
    const std::string& qs = test::question_sets()[2];
    // A miss, B miss, A hit, C miss (evicts B, the least recently used), B miss, A miss (evicted by B).
    const int order[] = {0, 1, 0, 2, 1, 0};
    const bool hit[] = {false, false, true, false, false, false};
    for (size_t i = 0; i < std::size(order); ++i) {
      Served s = worker->serve(prepare(*worker, test::request_body(test::states()[order[i]], qs)));
      ASSERT_TRUE(s.status.ok()) << s.status.to_string();
      EXPECT_EQ(s.cache_hit, hit[i]) << "request " << i;
      EXPECT_EQ(s.prefill_ms == 0, hit[i]) << "a hit runs no state pass";
    }
    const WorkerStats st = worker->stats();
    EXPECT_EQ(st.cache_hits, 1u);
    EXPECT_EQ(st.cache_misses, 5u);
    EXPECT_EQ(st.cache_entries, 2u);
  }
  // The token bound: a state longer than max_tokens is never kept; 0 entries disables the cache.
  {
    const std::string& qs = test::question_sets()[2];
    const std::string small = test::request_body(R"("Short.")", qs);
    auto worker = open_worker({.max_batch = 32, .cache = {.max_entries = 8, .max_tokens = 6}, .before_batch = {}});
    ASSERT_TRUE(worker);
    const PreparedRequest probe = prepare(*worker, small);
    ASSERT_LE(probe.state.tokens.size(), 6u) << "\"Short.\" should be at most 6 tokens with its delimiter";
    const std::string long_state = test::request_body(test::states()[0], qs);
    for (int i = 0; i < 2; ++i) {
      EXPECT_FALSE(worker->serve(prepare(*worker, long_state)).cache_hit) << "a state over max_tokens is never kept";
    }
    EXPECT_FALSE(worker->serve(prepare(*worker, small)).cache_hit);
    EXPECT_TRUE(worker->serve(prepare(*worker, small)).cache_hit);
    EXPECT_LE(worker->stats().cache_tokens, 6);

    auto uncached =
        open_worker({.max_batch = 32, .cache = {.max_entries = 0, .max_tokens = 1 << 20}, .before_batch = {}});
    ASSERT_TRUE(uncached);
    for (int i = 0; i < 2; ++i) EXPECT_FALSE(uncached->serve(prepare(*uncached, small)).cache_hit);
  }
}

TEST(ModelWorker, SeparateRequestsAnswerEachQuestionAloneWithTheSameBits) {
  auto worker = open_worker({});
  ASSERT_TRUE(worker);
  const std::string body = test::request_body(test::states()[4], test::question_sets()[3]);
  Served together = worker->serve(prepare(*worker, body));
  Served separate = worker->serve(prepare(*worker, body, /*separate=*/true));
  ASSERT_TRUE(together.status.ok() && separate.status.ok());
  EXPECT_TRUE(separate.cache_hit);
  expect_bitwise_equal(separate.answers, together.answers);
}

TEST(ModelWorker, PrepareChecksLimitsAndAStoppedWorkerRefuses) {
  {
    Options small;
    small.override_limits = true;
    small.limits.max_prefix = 8;
    small.limits.max_context = 16;
    auto worker = open_worker({}, small);
    ASSERT_TRUE(worker);
    const std::string long_state = test::request_body(test::states()[0], test::question_sets()[2]);
    auto p = worker->prepare(parse(long_state), false);
    ASSERT_FALSE(p.ok());
    EXPECT_EQ(p.status().code(), ErrorCode::InvalidRequest);
    EXPECT_NE(p.status().message().find("max_prefix is 8"), std::string::npos) << p.status().message();

    const std::string long_row = test::request_body(R"("Short.")", test::question_sets()[0]);
    auto r = worker->prepare(parse(long_row), false);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("max_context is 16"), std::string::npos) << r.status().message();
  }
  // After stop(), serve() fails without queueing.
  {
    auto worker = open_worker({});
    ASSERT_TRUE(worker);
    PreparedRequest p = prepare(*worker, test::request_body(test::states()[3], test::question_sets()[2]));
    worker->stop();
    Served s = worker->serve(std::move(p));
    EXPECT_FALSE(s.status.ok());
    EXPECT_NE(s.status.message().find("stopped"), std::string::npos) << s.status.message();
  }
}

TEST(ModelWorker, OpenRefusesQueueOptionsOutOfRange) {
  WorkerOptions no_queue;
  no_queue.max_queue = 0;
  auto a = ModelWorker::open(test::tiny_model_dir(), {}, no_queue);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), ErrorCode::InvalidRequest);
  EXPECT_NE(a.status().message().find("max_queue is 0; it must be at least 1"), std::string::npos)
      << a.status().message();

  WorkerOptions negative;
  negative.queue_timeout = std::chrono::milliseconds(-1);
  auto b = ModelWorker::open(test::tiny_model_dir(), {}, negative);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), ErrorCode::InvalidRequest);
  EXPECT_NE(b.status().message().find("queue_timeout is -1 ms"), std::string::npos) << b.status().message();
}

TEST(ModelWorker, ABatchOfOnlyExpiredRequestsIsAnsweredWithoutRunning) {
  // The first request is taken at once by the idle worker (far within the limit) and held; the second
  // waits behind it for longer than the limit, so when the worker takes it, it has expired.
  constexpr auto kTimeout = std::chrono::milliseconds(200);
  Gate gate;
  WorkerOptions w;
  w.queue_timeout = kTimeout;
  w.before_batch = gate.hook();
  auto worker = open_worker(w);
  ASSERT_TRUE(worker);
  const std::string body = test::request_body(test::states()[3], test::question_sets()[2]);
  auto held = std::async(std::launch::async, [&] { return worker->serve(prepare(*worker, body)); });
  gate.wait_entered(1);
  auto late = std::async(std::launch::async, [&] { return worker->serve(prepare(*worker, body)); });
  while (worker->stats().queued < 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // Queued by now, so past this point its wait is over the limit whatever the scheduling.
  std::this_thread::sleep_for(kTimeout + std::chrono::milliseconds(20));
  gate.release();

  Served first = held.get();
  EXPECT_TRUE(first.status.ok()) << first.status.to_string();
  Served expired = late.get();
  EXPECT_EQ(expired.status.code(), ErrorCode::Unavailable) << expired.status.to_string();
  EXPECT_NE(expired.status.message().find("ms in the queue, over the 200 ms limit (--queue-timeout-ms)"),
            std::string::npos)
      << expired.status.message();
  EXPECT_GT(expired.queue_ms, 200.0);
  EXPECT_EQ(expired.batch_requests, 0) << "an expired request never runs";
  EXPECT_TRUE(expired.answers.answers.empty());
  EXPECT_EQ(gate.entered(), 1) << "a take where every request had expired is no batch";

  WorkerStats st = worker->stats();
  EXPECT_EQ(st.expired, 1u);
  EXPECT_EQ(st.rejected_full, 0u);
  EXPECT_EQ(st.batches, 1u);
  EXPECT_EQ(st.queued, 0u);
  // The worker carries on: a fresh request runs.
  Served next = worker->serve(prepare(*worker, body));
  EXPECT_TRUE(next.status.ok()) << next.status.to_string();
  EXPECT_EQ(gate.entered(), 2);
  EXPECT_EQ(worker->stats().expired, 1u);
}

}  // namespace
}  // namespace kev
