// A kev_server inside the test process: a ModelWorker on the tiny synthetic model and an HttpServer on
// an ephemeral loopback port, a gate that holds the worker, plus request bodies the server tests share.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>

#include "kev/kev.h"
#include "server/http_server.h"
#include "server/model_worker.h"

namespace kev::test {

// Holds the worker in WorkerOptions::before_batch until release(), so requests pile up and batch (or
// stay in flight) deterministically. Once released it never holds again.
class Gate {
 public:
  std::function<void()> hook();
  void wait_entered(int n);  // until the worker has entered the hook n times
  int entered() const;
  void release();

 private:
  mutable std::mutex mu_;
  std::condition_variable entered_cv_, open_cv_;
  int entered_ = 0;
  bool open_ = false;
};

class TestServer {
 public:
  explicit TestServer(ServerOptions server_options = {}, WorkerOptions worker_options = {},
                      Options engine_options = {});
  ~TestServer();  // shutdown() if still running

  httplib::Client client() const;
  void shutdown();
  std::vector<std::string> logs() const;

  ModelWorker& worker() { return *worker_; }
  HttpServer& server() { return *server_; }
  int port() const { return port_; }

 private:
  std::unique_ptr<ModelWorker> worker_;
  std::unique_ptr<HttpServer> server_;
  int port_ = 0;
  std::thread listener_;
  mutable std::mutex log_mu_;
  std::vector<std::string> logs_;
};

// A POST /v1/systemone body: `state_json` and `questions_json` are JSON texts.
std::string request_body(const std::string& state_json, const std::string& questions_json,
                         const std::string& model = "kev-latest");
// Four question sets of mixed types (noul, choice, score; 1 to 5 options), as "questions" JSON objects.
const std::vector<std::string>& question_sets();
// Eight distinct short states, as JSON values (strings, objects, arrays).
const std::vector<std::string>& states();

}  // namespace kev::test
