// kev_server: the TypeSafe-compatible HTTP API (KEV_SPEC.md §8) over one model; docs/server.md.
//   kev_server --model DIR [--base DIR] [--backend cpu|cuda|webgpu] [--host 127.0.0.1] [--port 8008]
//              [--max-batch N] [--max-queue N] [--queue-timeout-ms MS] [--prefix-cache N]
//              [--prefix-cache-tokens N] [--truncate-states]
//              [--max-body-bytes N] [--threads N] [--http-threads N] [--max-prefix N] [--max-context N]
// KEV_API_KEY, when set, is the bearer key /v1/* requires. SIGINT/SIGTERM: new requests get 503, the
// admitted ones finish, then it exits 0.
// Exit codes: 0 clean shutdown, 1 error (one line on stderr), 2 usage.
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <thread>

#include <CLI/CLI.hpp>

#include "backend_options.h"
#include "kev/kev.h"
#include "model/checkpoint_import.h"
#include "model/model_file.h"
#include "server/http_server.h"
#include "server/model_worker.h"

namespace {

int g_stop_pipe[2] = {-1, -1};

extern "C" void on_stop_signal(int sig) {
  const char c = static_cast<char>(sig);
  (void)!write(g_stop_pipe[1], &c, 1);
}

int fail(const kev::Status& st) {
  std::cerr << "kev_server: " << st.to_string() << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kev_server: serve a Kev model over HTTP (POST /v1/systemone)"};
  std::string model_dir;
  kev::Options options;
  kev::WorkerOptions worker_options;
  kev::ServerOptions server_options;
  int64_t max_prefix = 0, max_context = 0, queue_timeout_ms = 0;
  app.add_option("--model", model_dir, "exported model directory (kev_export), or an upstream checkpoint (head.pt)")
      ->required();
  app.add_option("--base", options.base_dir, "HF base model directory, for an upstream LoRA checkpoint");
  app.add_option("--lora-scale", options.lora_scale, "LoRA scale s for an upstream checkpoint")->default_val(1.0);
  kev::tools::add_backend_options(app, options);
  app.add_option("--max-prefix", max_prefix, "state token limit (default: the model's)");
  app.add_option("--max-context", max_context, "state + row token limit (default: the model's)");
  app.add_flag("--truncate-states", options.truncate_states, "cut long states to max-prefix instead of refusing");
  app.add_option("--host", server_options.host, "address to listen on")->default_val("127.0.0.1");
  app.add_option("--port", server_options.port, "TCP port (0 = any free port)")->default_val(8008);
  app.add_option("--max-batch", worker_options.max_batch, "requests merged into one evaluate call")
      ->default_val(32)
      ->check(CLI::Range(1, 4096));
  app.add_option("--max-queue", worker_options.max_queue,
                 "requests waiting for the model (besides the batch it runs); more are answered 503")
      ->default_val(1024)
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--queue-timeout-ms", queue_timeout_ms,
                 "a request that waited longer for the model is answered 503 unrun (0 = no limit)")
      ->default_val(0)
      ->check(CLI::Range(int64_t{0}, int64_t{3600} * 1000));
  app.add_option("--prefix-cache", worker_options.cache.max_entries, "state snapshots kept (0 = no cache)")
      ->default_val(16);
  app.add_option("--prefix-cache-tokens", worker_options.cache.max_tokens, "state tokens kept over all snapshots")
      ->default_val(65536);
  app.add_option("--max-body-bytes", server_options.max_body_bytes, "larger request bodies are 413")
      ->default_val(8u << 20);
  app.add_option("--http-threads", server_options.http_threads, "connection threads (a keep-alive client holds one)")
      ->default_val(128)
      ->check(CLI::Range(1, 4096));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (const char* key = std::getenv("KEV_API_KEY"); key != nullptr) server_options.api_key = key;
  worker_options.queue_timeout = std::chrono::milliseconds(queue_timeout_ms);
  // A server on a GPU takes its memory at start-up unless told otherwise: an out-of-memory then stops
  // the start, not a request.
  if (app.count("--reserve-memory") + app.count("--no-reserve-memory") == 0) {
    options.reserve_memory = options.backend != "cpu";
  }

  // The limits as kev_runner takes them: the model's, with the flags' overrides.
  kev::Limits limits;
  if (!kev::is_checkpoint_dir(model_dir)) {
    auto model = kev::read_model_file(model_dir);
    if (!model) return fail(model.status());
    limits = model->kev.limits;
  }
  if (max_prefix > 0) limits.max_prefix = max_prefix;
  if (max_context > 0) limits.max_context = max_context;
  options.limits = limits;
  options.override_limits = max_prefix > 0 || max_context > 0;

  // A handler that only writes to a pipe works whichever thread the signal lands on (OpenBLAS starts
  // its threads before main, so blocking the signals cannot route them to one thread).
  if (pipe(g_stop_pipe) != 0) return fail(kev::Status(kev::ErrorCode::Io, "cannot create the signal pipe"));
  struct sigaction on_stop {};
  on_stop.sa_handler = on_stop_signal;
  on_stop.sa_flags = SA_RESTART;
  sigemptyset(&on_stop.sa_mask);
  sigaction(SIGINT, &on_stop, nullptr);
  sigaction(SIGTERM, &on_stop, nullptr);

  auto worker = kev::ModelWorker::open(model_dir, options, worker_options);
  if (!worker) return fail(worker.status());
  kev::HttpServer server(**worker, server_options);
  auto port = server.bind();
  if (!port) return fail(port.status());
  const kev::ModelInfo& info = (*worker)->info();
  std::cerr << "kev_server: " << info.name << " on " << info.backend << " (" << info.device << "), listening on http://"
            << server_options.host << ":" << *port << (server_options.api_key.empty() ? "" : " (bearer key required)")
            << "\n";

  std::thread stopper([&] {
    char sig = 0;
    while (read(g_stop_pipe[0], &sig, 1) < 0 && errno == EINTR) {
    }
    if (sig != 0) {
      std::cerr << "kev_server: " << (sig == SIGINT ? "SIGINT" : "SIGTERM") << ": refusing new requests, finishing "
                << server.in_flight() << " in flight\n";
    }
    server.shutdown();
  });
  const kev::Status served = server.listen();
  // listen() returns by itself only on failure; the stopper then still waits for a signal.
  if (!served.ok()) {
    const char none = 0;
    (void)!write(g_stop_pipe[1], &none, 1);
  }
  stopper.join();
  (*worker)->stop();
  if (!served.ok()) return fail(served);
  std::cerr << "kev_server: stopped\n";
  return 0;
}
