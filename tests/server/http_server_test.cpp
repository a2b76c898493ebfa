// kev_server over real loopback HTTP (httplib client) on the tiny synthetic model: every endpoint,
// auth, request ids, server-timing, every error status with its message, the queue bound and the
// queue-wait timeout (503 + Retry-After), shutdown, and a 64-client concurrency run whose answers must
// equal each request served alone.
#include <atomic>
#include <chrono>
#include <future>
#include <regex>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kev/kev.h"
#include "server/test_server.h"
#include "support/tiny_model.h"
#include "text/response.h"
#include "text/tokenizer.h"

namespace kev {
namespace {

using Json = nlohmann::ordered_json;
using test::TestServer;

const httplib::Headers kNoHeaders;

httplib::Result post(httplib::Client& c, const std::string& path, const std::string& body,
                     const httplib::Headers& headers = kNoHeaders) {
  return c.Post(path.c_str(), headers, body, "application/json");
}

Json parse_body(const httplib::Result& res) { return Json::parse(res->body); }

// The response body the same request gets from an engine of its own, answered alone; latency_ms is
// left out of both sides (wall time).
class Reference {
 public:
  Reference() {
    auto engine = Engine::load(test::tiny_model_dir(), {});
    EXPECT_TRUE(engine.ok()) << engine.status().to_string();
    engine_ = std::make_unique<Engine>(std::move(engine).value());
    auto tokenizer = Tokenizer::load(test::tiny_model_dir() + "/tokenizer.json");
    EXPECT_TRUE(tokenizer.ok());
    tokenizer_ = std::make_unique<Tokenizer>(std::move(tokenizer).value());
  }
  Json body(const std::string& request_body) {
    auto request = parse_request(request_body);
    EXPECT_TRUE(request.ok()) << request.status().to_string();
    auto answers = engine_->system_one(request->state_text, request->questions);
    EXPECT_TRUE(answers.ok()) << answers.status().to_string();
    auto out = count_output_tokens(*tokenizer_, *request, *answers);
    EXPECT_TRUE(out.ok());
    Json j = Json::parse(format_response(*request, *answers, {*out, false}));
    j.erase("latency_ms");
    return j;
  }

 private:
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

Json without_latency(Json j) {
  j.erase("latency_ms");
  return j;
}

void expect_error(const httplib::Result& res, int status, const std::string& message_part) {
  ASSERT_TRUE(res) << "no response";
  EXPECT_EQ(res->status, status) << res->body;
  EXPECT_EQ(res->get_header_value("Content-Type"), "application/json");
  const Json body = parse_body(res);
  ASSERT_TRUE(body.contains("detail")) << res->body;
  EXPECT_NE(body["detail"].get<std::string>().find(message_part), std::string::npos)
      << "expected \"" << message_part << "\" in: " << res->body;
}

// The log line of request `id`, waiting for it: httplib logs after the response has been sent.
Json log_line(const TestServer& s, const std::string& id) {
  for (int attempt = 0; attempt < 2000; ++attempt) {
    for (const std::string& l : s.logs()) {
      Json j = Json::parse(l);
      if (j["id"] == id) return j;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ADD_FAILURE() << "no log line for request " << id;
  return Json();
}

// The first card's stats once `requests` model requests have been counted: httplib logs (and the
// server counts) after the response is sent, so a client may see its answer first.
Json stats_after(TestServer& s, int64_t requests) {
  Json st;
  for (int attempt = 0; attempt < 2000; ++attempt) {
    auto res = s.client().Get("/v1/models");
    if (res && res->status == 200) {
      st = Json::parse(res->body)["models"][0]["stats"];
      if (st["requests"].get<int64_t>() >= requests) return st;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ADD_FAILURE() << "the server counted fewer than " << requests << " requests: " << st.dump();
  return st;
}

TEST(HttpServer, SystemOneAndSeparateAnswerAsTheEngineDoes) {
  TestServer s;
  Reference ref;
  auto c = s.client();
  const std::string body = test::request_body(test::states()[2], test::question_sets()[1]);
  auto res = post(c, "/v1/systemone", body);
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(res->get_header_value("Content-Type"), "application/json");
  const Json got = parse_body(res);
  EXPECT_EQ(without_latency(got), ref.body(body));
  EXPECT_GT(got["latency_ms"].get<double>(), 0);
  std::vector<std::string> ids;  // request order
  for (const auto& [id, answer] : got["answers"].items()) ids.push_back(id);
  EXPECT_EQ(ids, (std::vector<std::string>{"urgency", "english"}));

  // /separate: each question in its own call, the same answers.
  const std::string mixed = test::request_body(test::states()[0], test::question_sets()[3]);
  auto together = post(c, "/v1/systemone", mixed);
  auto separate = post(c, "/v1/systemone/separate", mixed);
  ASSERT_TRUE(together && separate);
  ASSERT_EQ(separate->status, 200) << separate->body;
  EXPECT_EQ(without_latency(parse_body(separate)), without_latency(parse_body(together)));

  // Both model names select the checkpoint; other names are 404.
  const std::string& qs = test::question_sets()[2];
  auto kev = post(c, "/v1/systemone", test::request_body(test::states()[3], qs, "kev-latest"));
  auto jev = post(c, "/v1/systemone", test::request_body(test::states()[3], qs, "jev-latest"));
  ASSERT_TRUE(kev && jev);
  ASSERT_EQ(kev->status, 200);
  ASSERT_EQ(jev->status, 200);
  EXPECT_EQ(parse_body(jev)["model"], "jev-latest");
  EXPECT_EQ(parse_body(kev)["answers"], parse_body(jev)["answers"]);
  expect_error(post(c, "/v1/systemone", test::request_body(test::states()[3], qs, "gpt-4")), 404,
               "model \"gpt-4\" is not served here");

  // Without a key configured, any Authorization header is ignored.
  auto any_key = c.Get("/v1/models", {{"Authorization", "Bearer anything"}});
  ASSERT_TRUE(any_key);
  EXPECT_EQ(any_key->status, 200);
}

TEST(HttpServer, HealthCardRequestIdsTimingAndLogs) {
  TestServer s;
  auto c = s.client();
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(parse_body(health)["status"], "ok");

  // Request ids: echoed when usable, else 32 fresh hex digits.
  const std::string body = test::request_body(test::states()[5], test::question_sets()[0]);
  auto echoed = post(c, "/v1/systemone", body, {{"x-typesafe-request-id", "client-id-42"}});
  ASSERT_TRUE(echoed);
  ASSERT_EQ(echoed->status, 200) << echoed->body;
  EXPECT_EQ(echoed->get_header_value("x-typesafe-request-id"), "client-id-42");
  const std::regex hex32("[0-9a-f]{32}");
  auto fresh = post(c, "/v1/systemone", body);
  auto too_long = post(c, "/v1/systemone", body, {{"x-typesafe-request-id", std::string(200, 'x')}});
  auto error = post(c, "/v1/systemone", "{");
  for (const auto* res : {&health, &fresh, &too_long, &error}) {
    ASSERT_TRUE(*res);
    EXPECT_TRUE(std::regex_match((*res)->get_header_value("x-typesafe-request-id"), hex32))
        << (*res)->get_header_value("x-typesafe-request-id");
  }
  EXPECT_NE(fresh->get_header_value("x-typesafe-request-id"), too_long->get_header_value("x-typesafe-request-id"));
  EXPECT_EQ(error->status, 400);

  // server-timing: app (the whole request), queue, prefill, evaluate.
  const std::regex timing(
      R"(app;dur=[0-9.e+-]+, queue;dur=[0-9.e+-]+, prefill;dur=[0-9.e+-]+, evaluate;dur=[0-9.e+-]+)");
  EXPECT_TRUE(std::regex_match(echoed->get_header_value("server-timing"), timing))
      << echoed->get_header_value("server-timing");

  // The log line: the first request ran alone and made the state's prefix; the second hit the cache.
  const Json first = log_line(s, "client-id-42");
  EXPECT_EQ(first["status"], 200);
  EXPECT_EQ(first["method"], "POST");
  EXPECT_EQ(first["path"], "/v1/systemone");
  EXPECT_EQ(first["questions"], 2);
  EXPECT_EQ(first["batch"], 1);
  EXPECT_EQ(first["cache"], "miss");
  const Json usage = parse_body(echoed)["usage"];
  EXPECT_GT(first["state_tokens"].get<int64_t>(), 1);
  EXPECT_LT(first["state_tokens"].get<int64_t>(), usage["input_tokens"].get<int64_t>());
  for (const char* key : {"queue_ms", "prefill_ms", "evaluate_ms", "total_ms"}) {
    ASSERT_TRUE(first.contains(key)) << key;
    EXPECT_GE(first[key].get<double>(), 0) << key;
  }
  // A miss runs the state pass fused with the score pass: one call, timed as the prefill.
  EXPECT_GT(first["prefill_ms"].get<double>(), 0);
  EXPECT_EQ(first["evaluate_ms"], 0.0);
  const Json second = log_line(s, fresh->get_header_value("x-typesafe-request-id"));
  EXPECT_EQ(second["cache"], "hit");
  EXPECT_EQ(second["prefill_ms"], 0.0);
  EXPECT_GT(second["evaluate_ms"].get<double>(), 0);
  const Json bad = log_line(s, error->get_header_value("x-typesafe-request-id"));
  EXPECT_EQ(bad["status"], 400);
  EXPECT_NE(bad["detail"].get<std::string>().find("parse error"), std::string::npos) << bad.dump();

  // A second server cannot take the port (no SO_REUSEPORT sharing).
  ServerOptions same_port;
  same_port.port = s.port();
  HttpServer rival(s.worker(), same_port);
  const Result<int> bound = rival.bind();
  ASSERT_FALSE(bound.ok());
  EXPECT_NE(bound.status().message().find("cannot listen on 127.0.0.1:" + std::to_string(s.port())), std::string::npos)
      << bound.status().message();

  // The cards: both names, every field of KEV_SPEC.md §8, live counters.
  stats_after(s, 4);
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  ASSERT_EQ(models->status, 200);
  const Json m = parse_body(models);
  ASSERT_EQ(m["models"].size(), 2u);
  EXPECT_EQ(m["models"][0]["name"], "kev-latest");
  EXPECT_EQ(m["models"][1]["name"], "jev-latest");
  for (const Json& card : m["models"]) {
    for (const char* key : {"name", "description", "release_date", "run", "base", "lora", "device", "backend", "dtype",
                            "temperature", "max_state_tokens", "truncate_states", "stats"}) {
      EXPECT_TRUE(card.contains(key)) << key;
    }
    EXPECT_EQ(card["backend"], "cpu");
    EXPECT_EQ(card["dtype"], "fp32");
    EXPECT_EQ(card["max_state_tokens"], 384);  // the tiny export's max_prefix
    EXPECT_EQ(card["truncate_states"], false);
    const Json& st = card["stats"];
    EXPECT_EQ(st["requests"], 4);  // echoed, fresh, too_long, error
    EXPECT_EQ(st["errors"], 1);
    EXPECT_EQ(st["batches"], 3);
    EXPECT_EQ(st["mean_batch_size"], 1.0);
    EXPECT_EQ(st["cache_misses"], 1);
    EXPECT_EQ(st["cache_hits"], 2);
    EXPECT_GT(st["uptime_s"].get<double>(), 0);
  }
}

TEST(HttpServer, BearerKeyGuardsV1Only) {
  ServerOptions keyed;
  keyed.api_key = "s3cret-key";
  TestServer s(keyed);
  auto c = s.client();
  const std::string body = test::request_body(test::states()[3], test::question_sets()[2]);
  auto missing = post(c, "/v1/systemone", body);
  expect_error(missing, 401, "missing bearer token");
  EXPECT_EQ(missing->get_header_value("WWW-Authenticate"), "Bearer");
  auto wrong = post(c, "/v1/systemone", body, {{"Authorization", "Bearer s3cret-kez"}});
  expect_error(wrong, 401, "invalid API key");
  EXPECT_EQ(wrong->get_header_value("WWW-Authenticate"), "Bearer");
  expect_error(post(c, "/v1/systemone", body, {{"Authorization", "Bearer s3cret-key-and-more"}}), 401,
               "invalid API key");
  expect_error(post(c, "/v1/systemone", body, {{"Authorization", "Basic czNjcmV0LWtleQ=="}}), 401,
               "missing bearer token");
  expect_error(c.Get("/v1/models"), 401, "missing bearer token");

  auto right = post(c, "/v1/systemone", body, {{"Authorization", "Bearer s3cret-key"}});
  ASSERT_TRUE(right);
  EXPECT_EQ(right->status, 200) << right->body;
  auto models = c.Get("/v1/models", {{"Authorization", "Bearer s3cret-key"}});
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 200);
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200) << "/health is not under /v1 and needs no key";
}

// "word " is one token in the Qwen3 tokenizer; 400 of them overflow the tiny export's max_prefix of 384.
std::string long_state() {
  std::string text;
  for (int i = 0; i < 400; ++i) text += "word ";
  return "\"" + text + "\"";
}

TEST(HttpServer, ErrorsHaveTheirStatusAndNameTheProblem) {
  ServerOptions small_bodies;
  small_bodies.max_body_bytes = 4096;
  TestServer s(small_bodies);
  auto c = s.client();
  const std::string& state = test::states()[3];
  // Not JSON, or JSON with a duplicate key: 400.
  expect_error(post(c, "/v1/systemone", R"({"state": "x", "questions": )"), 400, "parse error");
  expect_error(post(c, "/v1/systemone", R"({"state": "x", "state": "y", "questions": {}})"), 400,
               "duplicate key \"state\"");
  // Well-formed JSON that breaks the schema or a limit: 422.
  expect_error(post(c, "/v1/systemone", "[1, 2]"), 422, "must be a JSON object");
  expect_error(post(c, "/v1/systemone", R"({"state": "x", "questions": 5})"), 422, "questions must be an object");
  expect_error(post(c, "/v1/systemone", test::request_body(state, R"({"q": {"type": 3}})")), 422,
               "questions.q.type must be a string");
  expect_error(post(c, "/v1/systemone", test::request_body(state, R"({"q": {"type": "rank"}})")), 422,
               "unknown type \"rank\"");
  expect_error(post(c, "/v1/systemone", test::request_body(state, "{}")), 422, "at least one question");
  expect_error(post(c, "/v1/systemone", R"({"questions": {"q": {"type": "noul"}}})"), 422, "no \"state\" field");
  std::string levels = "[";
  for (int i = 0; i < 256; ++i) levels += (i ? ",\"" : "\"") + std::to_string(i) + "\"";
  levels += "]";
  expect_error(
      post(c, "/v1/systemone", test::request_body(state, R"({"q": {"type": "score", "criteria": )" + levels + "}}")),
      422, "256 options; max_options is 255");
  // A state over max_prefix (no truncation): 422 naming the limit.
  expect_error(post(c, "/v1/systemone", test::request_body(long_state(), test::question_sets()[2])), 422,
               "max_prefix is 384");
  // Over the body limit: 413 naming it.
  expect_error(
      post(c, "/v1/systemone", test::request_body("\"" + std::string(5000, 'a') + "\"", test::question_sets()[2])), 413,
      "max_body_bytes is 4096");
  // Unknown path 404, wrong method 405 with Allow.
  expect_error(c.Get("/v1/nothing"), 404, "no route for GET /v1/nothing");
  auto get_model = c.Get("/v1/systemone");
  expect_error(get_model, 405, "GET is not allowed on /v1/systemone");
  EXPECT_EQ(get_model->get_header_value("Allow"), "POST");
  expect_error(post(c, "/health", "{}"), 405, "POST is not allowed on /health");
  // Every error counts in the card: 12 on the model paths (the 405 on /v1/systemone counts; /v1/nothing
  // and /health are not model paths).
  EXPECT_EQ(stats_after(s, 12)["errors"], 12);
}

TEST(HttpServer, TruncatingServerCutsLongStates) {
  const std::string body = test::request_body(long_state(), test::question_sets()[2]);
  Options truncate;
  truncate.truncate_states = true;
  TestServer truncating({}, {}, truncate);
  auto c = truncating.client();
  auto res = post(c, "/v1/systemone", body);
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const Json j = parse_body(res);
  EXPECT_EQ(j["truncated"], true);
  EXPECT_EQ(j["usage"]["state_tokens_used"], 384);
  EXPECT_GT(j["usage"]["state_tokens"].get<int64_t>(), 384);
  auto short_res = post(c, "/v1/systemone", test::request_body(test::states()[3], test::question_sets()[2]));
  ASSERT_TRUE(short_res);
  EXPECT_EQ(parse_body(short_res)["truncated"], false);
  auto card = c.Get("/v1/models");
  ASSERT_TRUE(card);
  EXPECT_EQ(parse_body(card)["models"][0]["truncate_states"], true);
}

// A POST answered on a thread of its own: the status (-1: no response), body and Retry-After header.
struct Reply {
  int status = -1;
  std::string body;
  std::string retry_after;
};
std::future<Reply> post_async(TestServer& s, const std::string& body) {
  return std::async(std::launch::async, [&s, body] {
    auto c = s.client();
    auto res = post(c, "/v1/systemone", body);
    return res ? Reply{res->status, res->body, res->get_header_value("Retry-After")} : Reply{};
  });
}

void wait_queued(TestServer& s, uint64_t n) {
  while (s.worker().stats().queued < n) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

TEST(HttpServer, AFullQueueIs503WithRetryAfterAndTheQueuedRequestsFinish) {
  test::Gate gate;
  WorkerOptions w;
  w.max_queue = 2;
  w.before_batch = gate.hook();
  TestServer s({}, w);
  const std::string body = test::request_body(test::states()[0], test::question_sets()[0]);
  // One request held inside the worker, two waiting: the queue is full.
  std::future<Reply> held = post_async(s, body);
  gate.wait_entered(1);
  std::vector<std::future<Reply>> waiting;
  for (int i = 0; i < 2; ++i) waiting.push_back(post_async(s, body));
  wait_queued(s, 2);

  auto c = s.client();
  // A full queue answers at once; the short timeout and the release before any check keep a broken
  // bound (the request queued behind the gate) a failure instead of a hang.
  c.set_read_timeout(10, 0);
  auto full = post(c, "/v1/systemone", body);
  gate.release();
  ASSERT_NO_FATAL_FAILURE(expect_error(full, 503, "the model's queue is full (2 requests waiting; --max-queue)"));
  EXPECT_EQ(full->get_header_value("Retry-After"), "1");
  const Json line = log_line(s, full->get_header_value("x-typesafe-request-id"));
  EXPECT_EQ(line["status"], 503);
  EXPECT_FALSE(line.contains("batch")) << "a refused request never ran: " << line.dump();

  const Reply first = held.get();
  EXPECT_EQ(first.status, 200) << first.body;
  for (auto& f : waiting) {
    const Reply r = f.get();
    EXPECT_EQ(r.status, 200) << r.body;
  }
  // With the queue drained, requests are taken again.
  auto after = post(c, "/v1/systemone", body);
  ASSERT_TRUE(after);
  EXPECT_EQ(after->status, 200) << after->body;

  const Json st = stats_after(s, 5);
  EXPECT_EQ(st["requests"], 5);
  EXPECT_EQ(st["errors"], 1);
  EXPECT_EQ(st["rejected_full"], 1);
  EXPECT_EQ(st["expired"], 0);
  EXPECT_EQ(st["queued"], 0);
}

TEST(HttpServer, ARequestThatWaitedOverTheTimeoutIs503AndTheOthersAreServed) {
  // The held request was taken at once by the idle worker and the fresh one waits only while the held
  // one runs (milliseconds on the tiny model), both far within the limit; the late one is kept queued
  // past it.
  constexpr auto kTimeout = std::chrono::milliseconds(1000);
  test::Gate gate;
  WorkerOptions w;
  w.queue_timeout = kTimeout;
  w.before_batch = gate.hook();
  TestServer s({}, w);
  const std::string& qs = test::question_sets()[2];
  std::future<Reply> held = post_async(s, test::request_body(test::states()[0], qs));
  gate.wait_entered(1);
  std::future<Reply> late = post_async(s, test::request_body(test::states()[1], qs));
  wait_queued(s, 1);
  // The late request is queued, so once this has passed its wait is over the limit.
  std::this_thread::sleep_for(kTimeout + std::chrono::milliseconds(20));
  std::future<Reply> fresh = post_async(s, test::request_body(test::states()[2], qs));
  wait_queued(s, 2);
  gate.release();

  const Reply first = held.get();
  EXPECT_EQ(first.status, 200) << first.body;
  const Reply expired = late.get();
  ASSERT_EQ(expired.status, 503) << expired.body;
  EXPECT_EQ(expired.retry_after, "1");
  const std::string detail = Json::parse(expired.body)["detail"];
  const std::regex message(R"(waited ([0-9]+) ms in the queue, over the 1000 ms limit \(--queue-timeout-ms\))");
  std::smatch m;
  ASSERT_TRUE(std::regex_match(detail, m, message)) << detail;
  EXPECT_GE(std::stoll(m[1]), 1000);
  const Reply other = fresh.get();
  EXPECT_EQ(other.status, 200) << other.body << " (served in the batch the expired request was dropped from)";

  const Json st = stats_after(s, 3);
  EXPECT_EQ(st["errors"], 1);
  EXPECT_EQ(st["expired"], 1);
  EXPECT_EQ(st["rejected_full"], 0);
  EXPECT_EQ(st["batches"], 2) << "the held request's batch, then the fresh one's";
}

TEST(HttpServer, ShutdownRefusesNewRequestsAndFinishesInFlightOnes) {
  // The worker waits at its first batch until released, so the first request is in flight for sure.
  std::mutex mu;
  std::condition_variable cv;
  bool entered = false, released = false;
  WorkerOptions held;
  held.before_batch = [&] {
    std::unique_lock<std::mutex> lock(mu);
    entered = true;
    cv.notify_all();
    cv.wait(lock, [&] { return released; });
  };
  TestServer s({}, held);
  const std::string body = test::request_body(test::states()[0], test::question_sets()[0]);
  std::thread in_flight([&] {
    auto c = s.client();
    auto res = post(c, "/v1/systemone", body);
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 200) << res->body;
    EXPECT_EQ(parse_body(res)["answers"].size(), 2u);
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return entered; });
  }
  EXPECT_EQ(s.server().in_flight(), 1);
  std::thread stopper([&] { s.server().shutdown(); });
  while (true) {  // shutdown() marks the server stopping first thing; wait for that
    auto c = s.client();
    auto res = c.Get("/health");
    ASSERT_TRUE(res);
    if (res->status == 503) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  auto c = s.client();
  expect_error(post(c, "/v1/systemone", body), 503, "shutting down");
  {
    std::lock_guard<std::mutex> lock(mu);
    released = true;
  }
  cv.notify_all();
  in_flight.join();
  stopper.join();
  s.shutdown();
  auto after = s.client().Get("/health");
  EXPECT_FALSE(after) << "the listener is closed after shutdown";
}

TEST(HttpServer, SixtyFourClientsGetTheAnswersEachRequestGetsAlone) {
  TestServer s;
  Reference ref;
  // 8 states x 4 question sets; each client walks them from its own offset, so states repeat across
  // clients at the same time (batching) and over time (cache).
  std::vector<std::string> bodies;
  std::vector<Json> expected;
  for (const std::string& state : test::states()) {
    for (const std::string& qs : test::question_sets()) {
      bodies.push_back(test::request_body(state, qs));
      expected.push_back(ref.body(bodies.back()));
    }
  }
  constexpr int kClients = 64, kRequests = 20;
  std::atomic<int> failures{0}, mismatches{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < kClients; ++t) {
    clients.emplace_back([&, t] {
      auto c = s.client();
      c.set_keep_alive(true);
      for (int i = 0; i < kRequests; ++i) {
        const size_t k = static_cast<size_t>(t * 7 + i * 3) % bodies.size();
        auto res = post(c, "/v1/systemone", bodies[k]);
        if (!res || res->status != 200) {
          if (++failures <= 5) {
            ADD_FAILURE() << "request " << k << ": "
                          << (res ? std::to_string(res->status) + " " + res->body : httplib::to_string(res.error()));
          }
          continue;
        }
        if (without_latency(Json::parse(res->body)) != expected[k]) ++mismatches;
      }
    });
  }
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(mismatches.load(), 0);

  const Json st = stats_after(s, kClients * kRequests);
  EXPECT_EQ(st["requests"], kClients * kRequests);
  EXPECT_EQ(st["errors"], 0);
  EXPECT_GT(st["cache_hits"].get<int64_t>(), 0);
  EXPECT_GT(st["mean_batch_size"].get<double>(), 1.0) << "64 concurrent clients should share evaluate() calls";
  EXPECT_EQ(st["cache_hits"].get<int64_t>() + st["cache_misses"].get<int64_t>(), st["batches"].get<int64_t>());
}

}  // namespace
}  // namespace kev
