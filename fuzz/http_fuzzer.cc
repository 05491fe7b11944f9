// Raw bytes of one HTTP connection (one request or several, keep-alive) through the server's
// parsing, routing and handlers (HttpServer::ServeBytes), over a real engine on the default
// model: every generation stops within 16 tokens and at most 8 choices wait, so an input stays
// cheap. Checked: never a crash, a hang past libFuzzer's timeout, or a 500 (an exception
// or a broken invariant in a handler); the engine stays healthy.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "engine/engine.h"
#include "fuzz/served_model.h"
#include "model/causal_lm.h"
#include "server/engine_loop.h"

namespace {

using namespace moeserve;

struct FuzzServer {
  std::unique_ptr<model::CausalLm> lm;
  std::unique_ptr<server::EngineLoop> loop;
  std::unique_ptr<server::HttpServer> http;
};

FuzzServer& Server() {
  static FuzzServer* s = [] {
    const fuzz::ServedModel& model = fuzz::LoadServedModel();
    auto* f = new FuzzServer;
    f->lm = fuzz::OrDie(model::CausalLm::Load(model.dir, {.weight_dtype = std::nullopt,
                                                          .threads = 1}),
                        "model");
    std::unique_ptr<engine::Engine> engine = fuzz::OrDie(
        engine::Engine::Create(*f->lm, {.max_num_seqs = 4, .max_num_batched_tokens = 256,
                                        .max_model_len = 256}),
        "engine");
    f->loop = std::make_unique<server::EngineLoop>(std::move(engine));
    f->http = std::make_unique<server::HttpServer>(model.options, *model.tok, model.chat_template);
    f->http->SetEngine(f->loop.get());
    return f;
  }();
  return *s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzServer& s = Server();
  const std::string out =
      s.http->ServeBytes(std::string_view(reinterpret_cast<const char*>(data), size));
  for (size_t at = out.find("HTTP/1.1 5"); at != std::string::npos;
       at = out.find("HTTP/1.1 5", at + 1)) {
    if (out.compare(at, 12, "HTTP/1.1 503") != 0) {  // 503: past the waiting bound
      std::fprintf(stderr, "a 5xx answer:\n%s\n", out.c_str());
      std::abort();
    }
  }
  if (!s.loop->healthy()) {
    std::fprintf(stderr, "the engine failed:\n%s\n", out.c_str());
    std::abort();
  }
  return 0;
}
