// HttpServer: the TypeSafe-compatible HTTP API (KEV_SPEC.md §8) over a ModelWorker, on cpp-httplib.
//
//   KEV_ASSIGN_OR_RETURN(auto worker, ModelWorker::open(dir, options, {}));
//   HttpServer server(*worker, {.host = "127.0.0.1", .port = 8008});
//   KEV_ASSIGN_OR_RETURN(int port, server.bind());
//   std::thread t([&] { server.listen(); });   // serves until shutdown()
//   ...  server.shutdown();  t.join();          // 503 for new requests, in-flight ones finish
//
// Routes: POST /v1/systemone, POST /v1/systemone/separate, GET /v1/models, GET /health; other methods on
// those paths are 405, other paths 404. docs/server.md lists every status, header and log field.
// Thread-safety: bind() and listen() once each from one thread; begin_shutdown(), shutdown() and
// in_flight() from any thread. httplib types stay inside http_server.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "kev/result.h"
#include "server/model_worker.h"

namespace kev {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8008;                   // 0: any free port (bind() returns it)
  std::string api_key;               // non-empty: /v1/* needs "Authorization: Bearer <api_key>"
  size_t max_body_bytes = 8u << 20;  // larger bodies are 413
  int http_threads = 128;            // connection threads; a keep-alive connection holds one
  // One JSON line per request; empty: written to stderr.
  std::function<void(std::string_view)> log;
};

class HttpServer {
 public:
  HttpServer(ModelWorker& worker, ServerOptions options);
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;
  ~HttpServer();

  // Binds the listening socket; returns the port. Io naming the address when it cannot.
  Result<int> bind();
  // Accepts and serves until shutdown() has finished. Call after bind().
  Status listen();
  // From now on every request is answered 503; requests already admitted carry on.
  void begin_shutdown();
  // begin_shutdown(), waits until no admitted request is left, then makes listen() return. Call while
  // listen() runs or is about to (e.g. from a signal thread); it waits for listen() to start.
  void shutdown();
  // Model requests admitted and not yet answered.
  int64_t in_flight() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kev
