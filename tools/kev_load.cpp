// kev_load: a closed-loop load client for kev_server, built with the project so it travels wherever
// kev_server does (wrk may be missing there). N clients, each on one keep-alive connection, send
// requests back to back for a fixed time; latency runs from sending the request to the whole answer.
//   kev_load --url http://127.0.0.1:8008 --body reference/load/request.json --clients 64 --duration 30
//            [--states 8] [--path /v1/systemone] [--wait 600]
// --states K makes K variants of the body's state ("Ticket <4411..>: " + the state); client t sends
// variants t, t+1, ... in turn, so concurrent requests share states (batching, prefix cache) without all
// being one request. KEV_API_KEY, when set, is sent as the bearer key. Prints one line:
//   kev_load: requests=N errors=E seconds=S rps=R p50_ms=.. p95_ms=.. p99_ms=.. mean_batch=..
// (mean_batch: requests per evaluate() call over the run, from /v1/models). --wait S first waits up
// to S seconds for GET /health to answer 200 (a server still loading its model). Requests still in flight
// at the end are cancelled and not counted. Exit codes: 0 done (errors are counted, not fatal), 1 error,
// 2 usage.
#include <httplib.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>
#include <vector>

#include "io/json_util.h"

namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

int fail(const std::string& message) {
  std::cerr << "kev_load: " << message << "\n";
  return 1;
}

// The value at quantile q (0..1) of sorted samples, nearest rank.
double quantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const auto rank = static_cast<size_t>(q * static_cast<double>(sorted.size() - 1) + 0.5);
  return sorted[std::min(rank, sorted.size() - 1)];
}

struct Counters {
  double requests = 0, batches = 0;
};

// Model requests and batches so far, from the first card's stats.
bool read_counters(httplib::Client& c, const httplib::Headers& headers, Counters& out) {
  auto res = c.Get("/v1/models", headers);
  if (!res || res->status != 200) return false;
  const Json stats = Json::parse(res->body, nullptr, false)["models"][0]["stats"];
  if (!stats.is_object()) return false;
  out.requests = stats["requests"].get<double>();
  out.batches = stats["batches"].get<double>();
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kev_load: closed-loop load on kev_server"};
  std::string url = "http://127.0.0.1:8008", path = "/v1/systemone", body_file;
  int clients = 1, states = 8;
  double duration = 10, wait = 0;
  app.add_option("--url", url, "server base URL (http://host:port)")->default_val("http://127.0.0.1:8008");
  app.add_option("--path", path, "endpoint")->default_val("/v1/systemone");
  app.add_option("--body", body_file, "request body (JSON file)")->required();
  app.add_option("--clients", clients, "concurrent clients")->default_val(1)->check(CLI::Range(1, 4096));
  app.add_option("--duration", duration, "seconds to run")->default_val(10)->check(CLI::PositiveNumber);
  app.add_option("--states", states, "state variants cycled per client")->default_val(8)->check(CLI::Range(1, 100000));
  app.add_option("--wait", wait, "seconds to wait for /health first")->default_val(0)->check(CLI::NonNegativeNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  const std::smatch parts = [&] {
    std::smatch m;
    std::regex_match(url, m, std::regex(R"(http://([^:/]+)(?::([0-9]+))?/?)"));
    return m;
  }();
  if (parts.empty()) return fail("--url must look like http://host:port, got '" + url + "'");
  const std::string host = parts[1];
  const int port = parts[2].matched ? std::stoi(parts[2]) : 80;

  auto text = kev::read_text_file(body_file);
  if (!text) return fail(text.status().to_string());
  Json base = Json::parse(*text, nullptr, false);
  if (!base.is_object() || !base.contains("state"))
    return fail("'" + body_file + "' must be a request object with a state");
  std::vector<std::string> bodies;
  for (int i = 0; i < states; ++i) {
    Json b = base;
    const std::string ticket = "Ticket " + std::to_string(4411 + i);
    b["state"] = b["state"].is_string() ? Json(ticket + ": " + b["state"].get<std::string>())
                                        : Json{{"ticket", ticket}, {"state", b["state"]}};
    bodies.push_back(b.dump());
  }
  httplib::Headers headers;
  if (const char* key = std::getenv("KEV_API_KEY"); key != nullptr)
    headers.emplace("Authorization", std::string("Bearer ") + key);

  httplib::Client probe(host, port);
  const auto wait_until =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(wait));
  while (true) {
    auto res = probe.Get("/health");
    if (res && res->status == 200) break;
    if (Clock::now() >= wait_until) return fail("no healthy server at " + url + " (GET /health)");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  Counters before, after;
  if (!read_counters(probe, headers, before)) return fail("cannot read " + url + "/v1/models");

  std::vector<std::unique_ptr<httplib::Client>> connections;
  for (int t = 0; t < clients; ++t) {
    auto c = std::make_unique<httplib::Client>(host, port);
    c->set_keep_alive(true);
    c->set_read_timeout(24 * 3600, 0);
    c->set_tcp_nodelay(true);
    connections.push_back(std::move(c));
  }
  std::mutex mu;
  std::vector<double> latencies_ms;
  std::atomic<int64_t> errors{0};
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(duration));
  std::vector<std::thread> threads;
  for (int t = 0; t < clients; ++t) {
    threads.emplace_back([&, t] {
      std::vector<double> mine;
      for (size_t i = 0; Clock::now() < deadline; ++i) {
        const auto t0 = Clock::now();
        const std::string& body = bodies[(static_cast<size_t>(t) + i) % bodies.size()];  // clients spread over states
        auto res = connections[t]->Post(path.c_str(), headers, body, "application/json");
        const auto t1 = Clock::now();
        if (t1 > deadline) break;  // cancelled at the deadline, or finished after it: not counted
        if (!res || res->status != 200) {
          ++errors;
          continue;
        }
        mine.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      }
      std::lock_guard<std::mutex> lock(mu);
      latencies_ms.insert(latencies_ms.end(), mine.begin(), mine.end());
    });
  }
  std::this_thread::sleep_until(deadline);
  for (auto& c : connections) c->stop();
  for (std::thread& th : threads) th.join();
  const double seconds = std::chrono::duration<double>(deadline - start).count();
  if (!read_counters(probe, headers, after)) return fail("cannot read " + url + "/v1/models after the run");

  std::sort(latencies_ms.begin(), latencies_ms.end());
  const double batches = after.batches - before.batches;
  char line[256];
  std::snprintf(line, sizeof line,
                "kev_load: requests=%zu errors=%lld seconds=%.1f rps=%.2f p50_ms=%.1f p95_ms=%.1f p99_ms=%.1f "
                "mean_batch=%.1f",
                latencies_ms.size(), static_cast<long long>(errors.load()), seconds,
                static_cast<double>(latencies_ms.size()) / seconds, quantile(latencies_ms, 0.50),
                quantile(latencies_ms, 0.95), quantile(latencies_ms, 0.99),
                batches > 0 ? (after.requests - before.requests) / batches : 0.0);
  std::cout << line << "\n";
  return 0;
}
