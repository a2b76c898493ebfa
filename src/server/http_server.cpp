#include "server/http_server.h"

#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <mutex>
#include <random>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "common/check.h"
#include "text/render.h"
#include "text/response.h"

namespace kev {
namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

constexpr const char* kRequestIdHeader = "x-typesafe-request-id";
constexpr const char* kModelNames[] = {"kev-latest", "jev-latest"};
constexpr size_t kMaxRequestIdLength = 128;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// Milliseconds to 3 decimals (microseconds) for headers and logs.
double ms3(double ms) { return round_decimals(ms, 3); }

std::string dump(const Json& value) { return value.dump(-1, ' ', false, Json::error_handler_t::replace); }

void set_error(httplib::Response& res, int status, const std::string& message) {
  res.status = status;
  res.set_content(dump(Json{{"detail", message}}), "application/json");
}

// Compares every byte of the expected key whatever the input, so the time taken does not reveal how
// long a prefix of a guessed key was right.
bool keys_match(std::string_view given, std::string_view expected) {
  unsigned diff = given.size() == expected.size() ? 0u : 1u;
  for (size_t i = 0; i < expected.size(); ++i) {
    const unsigned char g = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
    diff |= g ^ static_cast<unsigned char>(expected[i]);
  }
  return diff == 0;
}

// A client's id is echoed when it is short printable ASCII (it goes back into a header and the log).
bool usable_request_id(const std::string& id) {
  if (id.empty() || id.size() > kMaxRequestIdLength) return false;
  for (char c : id) {
    if (c <= ' ' || c > '~') return false;
  }
  return true;
}

// 32 hex digits, as uuid4().hex.
std::string new_request_id() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(rng()));
  return buf;
}

// A model-side error as an HTTP answer: the caller's request (limits, types) is 422; an overloaded worker
// (full queue, queue-wait timeout) is 503 with Retry-After, so clients back off and retry; the rest is ours.
void set_model_error(httplib::Response& res, const Status& st) {
  switch (st.code()) {
    case ErrorCode::InvalidRequest: return set_error(res, 422, st.message());
    case ErrorCode::Unavailable:
      res.set_header("Retry-After", "1");
      return set_error(res, 503, st.message());
    default: return set_error(res, 500, st.message());
  }
}

bool is_model_path(const std::string& path) { return path == "/v1/systemone" || path == "/v1/systemone/separate"; }

// What the systemone handler learnt, for the request's log line. httplib calls the logger on the
// handler's thread right after the handler, and its Response has no slot for such data, so it is
// passed through a thread_local that the logger reads and clears.
struct ModelLog {
  int64_t state_tokens = -1;  // -1: not known (the request failed before encoding)
  int64_t questions = -1;
  bool served = false;  // the worker answered (successfully or not): the fields below are set
  int batch = 0;
  bool cache_hit = false;
  double queue_ms = 0, prefill_ms = 0, evaluate_ms = 0, total_ms = 0;
};
thread_local ModelLog t_model_log;

}  // namespace

struct HttpServer::Impl {
  ModelWorker& worker;
  ServerOptions options;
  httplib::Server http;
  const Clock::time_point started = Clock::now();

  mutable std::mutex mu;
  std::condition_variable idle;
  bool stopping = false;         // under mu
  int64_t admitted = 0;          // under mu
  bool listen_returned = false;  // under mu

  std::atomic<uint64_t> requests{0}, errors{0};
  int listen_fd = -1;  // set by the socket-options hook during bind()
  std::mutex log_mu;

  Impl(ModelWorker& w, ServerOptions o) : worker(w), options(std::move(o)) {}

  bool stopping_now() {
    std::lock_guard<std::mutex> lock(mu);
    return stopping;
  }

  // Counts a model request in, unless the server is stopping.
  bool admit() {
    std::lock_guard<std::mutex> lock(mu);
    if (stopping) return false;
    ++admitted;
    return true;
  }
  void release() {
    std::lock_guard<std::mutex> lock(mu);
    if (--admitted == 0) idle.notify_all();
  }

  void write_log(std::string_view line) {
    if (options.log) {
      options.log(line);
      return;
    }
    std::lock_guard<std::mutex> lock(log_mu);
    std::cerr << line << '\n';
  }

  Json card(const char* name) const {
    const ModelInfo& info = worker.info();
    const WorkerStats ws = worker.stats();
    Json c = Json::object();
    c["name"] = name;
    c["description"] = cat("Kev decision model ", info.name, " (", info.architecture, ") served by kev-native");
    c["release_date"] = nullptr;  // model.json records none
    c["run"] = info.name;
    c["base"] = worker.source();
    c["lora"] = info.checkpoint_id;
    c["device"] = info.device;
    c["backend"] = info.backend;
    c["dtype"] = info.dtype;
    c["temperature"] = info.temperature;
    c["max_state_tokens"] = info.limits.max_prefix;
    c["truncate_states"] = worker.options().truncate_states;
    Json stats = Json::object();
    stats["requests"] = requests.load();
    stats["errors"] = errors.load();
    stats["batches"] = ws.batches;
    stats["mean_batch_size"] =
        ws.batches == 0 ? 0.0 : static_cast<double>(ws.batched_requests) / static_cast<double>(ws.batches);
    stats["cache_hits"] = ws.cache_hits;
    stats["cache_misses"] = ws.cache_misses;
    stats["cache_entries"] = ws.cache_entries;
    stats["cache_tokens"] = ws.cache_tokens;
    stats["queued"] = ws.queued;
    stats["rejected_full"] = ws.rejected_full;
    stats["expired"] = ws.expired;
    stats["in_flight"] = admitted_now();
    stats["uptime_s"] = ms_since(started) / 1e3;
    c["stats"] = std::move(stats);
    return c;
  }

  int64_t admitted_now() const {
    std::lock_guard<std::mutex> lock(mu);
    return admitted;
  }

  void handle_systemone(const httplib::Request& req, httplib::Response& res, bool separate) {
    const auto t0 = Clock::now();
    if (!admit()) return set_error(res, 503, "the server is shutting down");
    struct Release {
      Impl* self;
      ~Release() { self->release(); }
    } release_on_exit{this};

    Result<Request> request = parse_request(req.body, worker.info().limits.max_options);
    if (!request.ok()) {
      // Syntax errors (not JSON, duplicate keys) are 400; well-formed JSON that breaks the schema or a
      // limit is 422, as FastAPI-style servers answer validation errors.
      const Result<nlohmann::ordered_json> syntax = parse_json(req.body);
      if (!syntax.ok()) return set_error(res, 400, syntax.status().message());
      return set_error(res, 422, request.status().message());
    }
    bool known_model = false;
    for (const char* name : kModelNames) known_model = known_model || request->model == name;
    if (!known_model) {
      return set_error(res, 404,
                       cat("model \"", request->model, "\" is not served here; use kev-latest or jev-latest"));
    }
    t_model_log.questions = static_cast<int64_t>(request->questions.size());

    Result<PreparedRequest> prepared = worker.prepare(std::move(request).value(), separate);
    if (!prepared.ok()) return set_model_error(res, prepared.status());
    const Request kept = prepared->request;  // the worker consumes the prepared request
    t_model_log.state_tokens = static_cast<int64_t>(prepared->state.tokens.size());

    Served served = worker.serve(std::move(prepared).value());
    ModelLog& log = t_model_log;
    log.served = true;
    log.batch = served.batch_requests;
    log.cache_hit = served.cache_hit;
    log.queue_ms = served.queue_ms;
    log.prefill_ms = served.prefill_ms;
    log.evaluate_ms = served.evaluate_ms;
    if (!served.status.ok()) return set_model_error(res, served.status);

    Result<int64_t> output_tokens = count_output_tokens(worker.tokenizer(), kept, served.answers);
    if (!output_tokens.ok()) return set_error(res, 500, output_tokens.status().message());
    res.set_content(format_response(kept, served.answers, {*output_tokens, worker.options().truncate_states}),
                    "application/json");
    log.total_ms = ms_since(t0);
    res.set_header("server-timing",
                   cat("app;dur=", ms3(log.total_ms), ", queue;dur=", ms3(served.queue_ms),
                       ", prefill;dur=", ms3(served.prefill_ms), ", evaluate;dur=", ms3(served.evaluate_ms)));
  }

  void log_request(const httplib::Request& req, const httplib::Response& res) {
    const bool model = is_model_path(req.path);
    if (model) {
      ++requests;
      if (res.status >= 400) ++errors;
    }
    Json line = Json::object();
    line["id"] = res.get_header_value(kRequestIdHeader);
    line["method"] = req.method;
    line["path"] = req.path;
    line["status"] = res.status;
    ModelLog& log = t_model_log;
    if (log.state_tokens >= 0) line["state_tokens"] = log.state_tokens;
    if (log.questions >= 0) line["questions"] = log.questions;
    if (log.served) {
      // batch 0: answered without running (full queue, expired wait), so there is no cache or model time.
      const bool ran = log.batch > 0;
      if (ran) {
        line["batch"] = log.batch;
        line["cache"] = log.cache_hit ? "hit" : "miss";
      }
      line["queue_ms"] = ms3(log.queue_ms);
      if (ran) {
        line["prefill_ms"] = ms3(log.prefill_ms);
        line["evaluate_ms"] = ms3(log.evaluate_ms);
      }
      if (res.status < 400) line["total_ms"] = ms3(log.total_ms);
    }
    if (res.status >= 400 && !res.body.empty()) {
      const Result<nlohmann::ordered_json> body = parse_json(res.body);
      if (body.ok() && body->is_object() && body->contains("detail")) line["detail"] = (*body)["detail"];
    }
    log = ModelLog{};
    write_log(dump(line));
  }

  void install_routes() {
    http.new_task_queue = [n = options.http_threads] { return new httplib::ThreadPool(static_cast<size_t>(n)); };
    http.set_payload_max_length(options.max_body_bytes);
    http.set_keep_alive_max_count(1000);
    // Responses go out as headers then body; with Nagle on, a keep-alive client's delayed ACK holds the
    // body back for ~40 ms.
    http.set_tcp_nodelay(true);
    // Debian's libcpp-httplib 0.11.4 listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG is compiled
    // into the shared library), so a burst of new connections waits for SYN retransmits (1 s and more).
    // The hook sees the listening socket; bind() raises the backlog on it afterwards. It also replaces
    // httplib's default options, which add SO_REUSEPORT: with it a second server on the same port binds
    // silently and the kernel splits the connections between the two.
    http.set_socket_options([this](socket_t sock) {
      const int yes = 1;
      ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
      listen_fd = sock;
    });

    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      t_model_log = ModelLog{};
      const std::string given = req.get_header_value(kRequestIdHeader);
      res.set_header(kRequestIdHeader, usable_request_id(given) ? given : new_request_id());
      if (stopping_now()) {
        res.set_header("Connection", "close");
        set_error(res, 503, "the server is shutting down");
        return httplib::Server::HandlerResponse::Handled;
      }
      if (!options.api_key.empty() && req.path.rfind("/v1/", 0) == 0) {
        const std::string auth = req.get_header_value("Authorization");
        constexpr std::string_view kBearer = "Bearer ";
        const bool bearer = auth.size() > kBearer.size() && std::string_view(auth).substr(0, kBearer.size()) == kBearer;
        if (!bearer || !keys_match(std::string_view(auth).substr(kBearer.size()), options.api_key)) {
          res.set_header("WWW-Authenticate", "Bearer");
          set_error(res, 401,
                    bearer ? "invalid API key" : "missing bearer token: send \"Authorization: Bearer <key>\"");
          return httplib::Server::HandlerResponse::Handled;
        }
      }
      return httplib::Server::HandlerResponse::Unhandled;
    });

    http.Post("/v1/systemone",
              [this](const httplib::Request& req, httplib::Response& res) { handle_systemone(req, res, false); });
    http.Post("/v1/systemone/separate",
              [this](const httplib::Request& req, httplib::Response& res) { handle_systemone(req, res, true); });
    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      Json models = Json::array();
      for (const char* name : kModelNames) models.push_back(card(name));
      res.set_content(dump(Json{{"models", std::move(models)}}), "application/json");
    });
    http.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"status":"ok"})", "application/json");
    });

    // Known paths with another method are 405 with Allow; httplib alone would say 404.
    const auto not_allowed = [](const char* allow) {
      return [allow](const httplib::Request& req, httplib::Response& res) {
        res.set_header("Allow", allow);
        set_error(res, 405, cat(req.method, " is not allowed on ", req.path, "; use ", allow));
      };
    };
    for (const char* path : {"/v1/systemone", "/v1/systemone/separate"}) {
      http.Get(path, not_allowed("POST"));
      http.Put(path, not_allowed("POST"));
      http.Patch(path, not_allowed("POST"));
      http.Delete(path, not_allowed("POST"));
    }
    for (const char* path : {"/v1/models", "/health"}) {
      http.Post(path, not_allowed("GET"));
      http.Put(path, not_allowed("GET"));
      http.Patch(path, not_allowed("GET"));
      http.Delete(path, not_allowed("GET"));
    }

    // Every error without a body of its own (404 from routing, 413 from httplib's size check) gets a
    // JSON detail; the request id may be missing when httplib answered before pre-routing.
    http.set_error_handler(httplib::Server::HandlerWithResponse(
        [max = options.max_body_bytes](const httplib::Request& req, httplib::Response& res) {
          if (!res.has_header(kRequestIdHeader)) res.set_header(kRequestIdHeader, new_request_id());
          if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
          if (res.status == 404) {
            set_error(res, 404, cat("no route for ", req.method, " ", req.path));
          } else if (res.status == 413) {
            set_error(res, 413,
                      cat("the request body has ", req.get_header_value("Content-Length"), " bytes; max_body_bytes is ",
                          max));
          } else {
            set_error(res, res.status, cat("HTTP ", res.status));
          }
          return httplib::Server::HandlerResponse::Handled;
        }));
    http.set_logger([this](const httplib::Request& req, const httplib::Response& res) { log_request(req, res); });
  }
};

HttpServer::HttpServer(ModelWorker& worker, ServerOptions options)
    : impl_(std::make_unique<Impl>(worker, std::move(options))) {
  impl_->install_routes();
}

HttpServer::~HttpServer() = default;

Result<int> HttpServer::bind() {
  Impl& s = *impl_;
  const int port = s.options.port == 0 ? s.http.bind_to_any_port(s.options.host)
                                       : (s.http.bind_to_port(s.options.host, s.options.port) ? s.options.port : -1);
  KEV_CHECK(port > 0, ErrorCode::Io, "cannot listen on ", s.options.host, ":", s.options.port,
            " (address in use, or not an address of this machine)");
  // Linux takes a second listen() on a listening socket as a new backlog.
  KEV_CHECK(::listen(s.listen_fd, SOMAXCONN) == 0, ErrorCode::Io, "cannot raise the listen backlog on ", s.options.host,
            ":", port, ": ", std::strerror(errno));
  return port;
}

Status HttpServer::listen() {
  Impl& s = *impl_;
  const bool ok = s.http.listen_after_bind();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.listen_returned = true;
  }
  KEV_CHECK(ok || s.stopping_now(), ErrorCode::Io, "the HTTP server stopped accepting connections unexpectedly");
  return Status::success();
}

void HttpServer::begin_shutdown() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->stopping = true;
}

void HttpServer::shutdown() {
  Impl& s = *impl_;
  std::unique_lock<std::mutex> lock(s.mu);
  s.stopping = true;
  s.idle.wait(lock, [&] { return s.admitted == 0; });
  // httplib's stop() only acts on a running server, so wait for listen() to have started.
  while (!s.listen_returned) {
    lock.unlock();
    if (s.http.is_running()) {
      s.http.stop();
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    lock.lock();
  }
}

int64_t HttpServer::in_flight() const { return impl_->admitted_now(); }

}  // namespace kev
