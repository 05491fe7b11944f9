// The cost bounds of a request (issue #31), checked by CheckGenerationRequest on the default
// model's tokenizer and chat template: for each bound, a request at it passes and one past it is
// a 400 naming it (and the serve flag that sets it). Also: the unknown model's 404 quotes a
// bounded name, response_format other than text is refused, chat content parts are joined as
// vLLM joins them, and /tokenize / /detokenize (tokenize_api.h) apply the same checks.
#include "server/request_check.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "server/tokenize_api.h"
#include "core/test_paths.h"

namespace moeserve::server {
namespace {

const std::string kModelDir = MOESERVE_DEFAULT_MODEL_DIR;
constexpr int64_t kMaxModelLen = 256;
constexpr int64_t kKvCacheTokens = 64 * kMaxModelLen;  // the default sizing: 64 full requests

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class RequestCheckTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    Result<std::unique_ptr<tokenizer::Tokenizer>> tok =
        tokenizer::Tokenizer::LoadFromDir(kModelDir);
    ASSERT_TRUE(tok.ok()) << tok.status().ToString();
    tok_ = std::move(*tok).release();
    Result<tokenizer::ChatTemplate> chat = tokenizer::ChatTemplate::FromTokenizerConfig(
        ReadText(kModelDir + "/tokenizer_config.json"));
    ASSERT_TRUE(chat.ok()) << chat.status().ToString();
    chat_ = new tokenizer::ChatTemplate(std::move(*chat));
  }

  RequestContext Context() const {
    return {.tok = *tok_,
            .chat_template = chat_,
            .served_model_name = "default",
            .vocab_size = kVocab,
            .max_model_len = kMaxModelLen,
            .default_params = defaults_,
            .extra_eos_ids = extra_eos_ids_,
            .max_tokens_cap = std::nullopt,
            .limits = limits_,
            .kv_cache_tokens = kv_cache_tokens_};
  }

  std::optional<ApiError> Check(const json& body, Endpoint endpoint = Endpoint::kCompletions,
                                CheckedRequest* out = nullptr) {
    CheckedRequest checked;
    return CheckGenerationRequest(Context(), body, endpoint, out != nullptr ? out : &checked);
  }

  // Served: no error.
  void ExpectServed(const json& body, Endpoint endpoint = Endpoint::kCompletions) {
    const std::optional<ApiError> e = Check(body, endpoint);
    EXPECT_FALSE(e.has_value()) << e->Body();
  }

  // A 400 whose param is `param` and whose message says `names`.
  void ExpectRefused(const json& body, const std::string& param, const std::string& names,
                     Endpoint endpoint = Endpoint::kCompletions) {
    const std::optional<ApiError> e = Check(body, endpoint);
    ASSERT_TRUE(e.has_value()) << body.dump().substr(0, 200);
    EXPECT_EQ(e->status, 400) << e->Body();
    EXPECT_EQ(e->param, param) << e->Body();
    EXPECT_NE(e->message.find(names), std::string::npos) << e->Body();
  }

  static json Chat(json content) {
    return {{"messages", json::array({{{"role", "user"}, {"content", std::move(content)}}})},
            {"max_tokens", 4}};
  }

  // The chat prompt's ids for a message content, or the error.
  Result<std::vector<int32_t>> ChatIds(json content) {
    CheckedRequest checked;
    if (std::optional<ApiError> e = Check(Chat(std::move(content)), Endpoint::kChat, &checked)) {
      return InvalidArgument("{}", e->Body());
    }
    return checked.prompts.at(0);
  }

  static constexpr int64_t kVocab = 8192;
  static tokenizer::Tokenizer* tok_;
  static tokenizer::ChatTemplate* chat_;
  engine::SamplingParams defaults_;
  std::vector<int32_t> extra_eos_ids_;
  RequestLimits limits_;
  int64_t kv_cache_tokens_ = kKvCacheTokens;
};

tokenizer::Tokenizer* RequestCheckTest::tok_ = nullptr;
tokenizer::ChatTemplate* RequestCheckTest::chat_ = nullptr;

const json kPrompt = std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10};

TEST_F(RequestCheckTest, LogprobsAtMostMaxLogprobs) {
  ExpectServed({{"prompt", kPrompt}, {"logprobs", 20}});
  ExpectRefused({{"prompt", kPrompt}, {"logprobs", 21}}, "logprobs", "--max-logprobs");
  ExpectRefused({{"prompt", kPrompt}, {"logprobs", -1}}, "logprobs", "whole vocabulary");
  ExpectServed({{"prompt", kPrompt}, {"prompt_logprobs", 20}});
  ExpectRefused({{"prompt", kPrompt}, {"prompt_logprobs", 21}}, "prompt_logprobs",
                "--max-logprobs");
  ExpectRefused({{"prompt", kPrompt}, {"prompt_logprobs", -1}}, "prompt_logprobs",
                "--max-logprobs");
  // Echo asks for the prompt's logprobs as many as logprobs: under the same bound.
  ExpectServed({{"prompt", kPrompt}, {"logprobs", 20}, {"echo", true}});
  json chat = Chat("hi");
  chat["logprobs"] = true;
  chat["top_logprobs"] = 20;
  ExpectServed(chat, Endpoint::kChat);
  chat["top_logprobs"] = 21;
  ExpectRefused(chat, "top_logprobs", "--max-logprobs", Endpoint::kChat);
  // --max-logprobs -1: the whole vocabulary, and -1 with it (as vLLM).
  limits_.max_logprobs = -1;
  ExpectServed({{"prompt", kPrompt}, {"logprobs", -1}});
  ExpectServed({{"prompt", kPrompt}, {"prompt_logprobs", kVocab}});
  ExpectRefused({{"prompt", kPrompt}, {"logprobs", kVocab + 1}}, "logprobs", "--max-logprobs");
  CheckedRequest checked;
  ASSERT_FALSE(Check({{"prompt", kPrompt}, {"logprobs", -1}, {"echo", true}},
                     Endpoint::kCompletions, &checked));
  EXPECT_EQ(checked.request.params.prompt_logprobs, -1);  // echo: the whole vocabulary too
}

TEST_F(RequestCheckTest, ChoicesAtMostMaxChoicesPerRequest) {
  const json eight_prompts = std::vector<json>(8, kPrompt);
  ExpectServed({{"prompt", eight_prompts}, {"n", 8}, {"max_tokens", 1}});
  ExpectRefused({{"prompt", eight_prompts}, {"n", 9}, {"max_tokens", 1}}, "n",
                "--max-choices-per-request");
  ExpectServed({{"prompt", kPrompt}, {"n", 64}, {"max_tokens", 1}});
  ExpectRefused({{"prompt", kPrompt}, {"n", 65}, {"max_tokens", 1}}, "n",
                "--max-choices-per-request");
  // Huge products are refused, not overflowed.
  ExpectRefused({{"prompt", eight_prompts}, {"n", INT64_MAX}}, "n", "--max-choices-per-request");
  // Checked before any prompt is encoded: 65 text prompts refused as such.
  ExpectRefused({{"prompt", std::vector<std::string>(65, "a b c")}, {"max_tokens", 1}}, "n",
                "65 choices");
}

TEST_F(RequestCheckTest, StopBytesAtMostMaxStopBytes) {
  const int64_t max = limits_.max_stop_bytes;
  ExpectServed({{"prompt", kPrompt}, {"stop", {std::string(max - 1, 'x'), "y"}}});
  ExpectRefused({{"prompt", kPrompt}, {"stop", {std::string(max, 'x'), "y"}}}, "stop",
                "--max-stop-bytes");
  ExpectRefused({{"prompt", kPrompt}, {"stop", std::string(1 << 20, 'x')}}, "stop",
                "--max-stop-bytes");
}

TEST_F(RequestCheckTest, TokenListsAtMostTheVocabulary) {
  json bias = json::object();
  for (int64_t id = 0; id < kVocab; ++id) bias[std::to_string(id)] = 1;
  ExpectServed({{"prompt", kPrompt}, {"logit_bias", bias}});
  bias["00"] = 2;  // token 0 again: one entry past the vocabulary
  ExpectRefused({{"prompt", kPrompt}, {"logit_bias", bias}}, "logit_bias", "vocabulary");

  std::vector<int32_t> ids(kVocab);
  for (int64_t id = 0; id < kVocab; ++id) ids[id] = static_cast<int32_t>(id);
  ExpectServed({{"prompt", kPrompt}, {"allowed_token_ids", ids}});
  ExpectServed({{"prompt", kPrompt}, {"stop_token_ids", ids}});
  ids.push_back(0);
  ExpectRefused({{"prompt", kPrompt}, {"allowed_token_ids", ids}}, "allowed_token_ids",
                "vocabulary");
  ExpectRefused({{"prompt", kPrompt}, {"stop_token_ids", ids}}, "stop_token_ids", "vocabulary");
}

TEST_F(RequestCheckTest, ChoicesTokensAtMostTheKvCache) {
  // 64 choices of 10 + 246 tokens: exactly the cache.
  const json at = {{"prompt", kPrompt}, {"n", 64}, {"max_tokens", kMaxModelLen - 10}};
  ExpectServed(at);
  kv_cache_tokens_ = kKvCacheTokens - 1;
  ExpectRefused(at, "max_tokens", "--kv-cache-memory");
  kv_cache_tokens_ = 0;  // unknown: not checked
  ExpectServed(at);
}

TEST_F(RequestCheckTest, AnswerAtMostMaxResponseMib) {
  const json body = {{"prompt", {kPrompt, kPrompt}},
                     {"n", 4},
                     {"max_tokens", 100},
                     {"logprobs", 5},
                     {"echo", true}};
  CheckedRequest checked;
  ASSERT_FALSE(Check(body, Endpoint::kCompletions, &checked));
  // Per choice: 100 tokens of 8 bytes + 6 entries of 64; its prompt's 10 tokens echoed (8 bytes)
  // with 6 entries each; 8 choices.
  const int64_t bytes = EstimateResponseBytes(Context(), checked);
  EXPECT_EQ(bytes, 8 * (100 * (8 + 6 * 64) + 10 * (6 * 64 + 8)));
  limits_.max_response_bytes = bytes;
  ExpectServed(body);
  limits_.max_response_bytes = bytes - 1;
  ExpectRefused(body, "", "--max-response-mib");
  // The default lets the largest ordinary requests through: 64 choices of 246 tokens with 20
  // logprobs each.
  limits_ = RequestLimits{};
  ExpectServed({{"prompt", kPrompt}, {"n", 64}, {"max_tokens", 246}, {"logprobs", 20}});
}

TEST_F(RequestCheckTest, TextsThatCannotFitAreRefusedUnencoded) {
  const int64_t per_token = static_cast<int64_t>(tok_->max_bytes_per_token());
  ASSERT_GT(per_token, 0);
  const int64_t limit = kMaxModelLen * per_token;
  EXPECT_TRUE(CheckTextLength(Context(), std::string(limit - 1, 'a'), "prompt").ok());
  const Status refused = CheckTextLength(Context(), std::string(limit, 'a'), "prompt");
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("--max-model-len"), std::string::npos) << refused.message();
  ExpectRefused({{"prompt", std::string(1 << 20, 'a')}}, "prompt", "--max-model-len");
  ExpectRefused({{"prompt", {"a", std::string(limit, 'a')}}}, "prompt", "--max-model-len");
  ExpectRefused(Chat(std::string(limit, 'a')), "messages", "--max-model-len", Endpoint::kChat);
}

TEST_F(RequestCheckTest, UnknownModelIsQuotedShort) {
  const std::optional<ApiError> e =
      Check({{"prompt", kPrompt}, {"model", std::string(1 << 20, 'm')}});
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->status, 404);
  EXPECT_LT(e->message.size(), 400u);
  EXPECT_NE(e->message.find("mmm..."), std::string::npos) << e->message;
  // A cut never splits a character.
  std::string name;
  for (int i = 0; i < 200; ++i) name += "\xc3\xa9";  // é
  const std::optional<ApiError> utf8 = Check({{"prompt", kPrompt}, {"model", name}});
  ASSERT_TRUE(utf8.has_value());
  EXPECT_TRUE(json::accept(utf8->Body()));
  EXPECT_NE(utf8->Body().find("\xc3\xa9..."), std::string::npos);
}

TEST_F(RequestCheckTest, ResponseFormatIsReadAndCheckedByItsKey) {
  ExpectServed({{"prompt", kPrompt}, {"response_format", nullptr}});
  ExpectServed({{"prompt", kPrompt}, {"response_format", {{"type", "text"}}}});
  ExpectServed({{"prompt", kPrompt}, {"response_format", {{"type", "json_object"}}}});
  json chat = Chat("hi");
  chat["response_format"] = {{"type", "json_schema"},
                             {"json_schema", {{"name", "x"}, {"schema", {{"type", "integer"}}}}}};
  ExpectServed(chat, Endpoint::kChat);
  chat["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "x"}}}};
  ExpectRefused(chat, "response_format", "schema", Endpoint::kChat);
  ExpectRefused({{"prompt", kPrompt}, {"response_format", "json"}}, "response_format",
                "response_format");
  ExpectRefused(
      {{"prompt", kPrompt}, {"response_format", {{"type", "json_object"}}}, {"guided_regex", "a+"}},
      "response_format", "one");
}

TEST_F(RequestCheckTest, ContentPartsAreJoinedAsVllmJoinsThem) {
  const Result<std::vector<int32_t>> plain = ChatIds("Elizabeth was");
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  const Result<std::vector<int32_t>> parts =
      ChatIds(json::array({{{"type", "text"}, {"text", "Elizabeth was"}}}));
  ASSERT_TRUE(parts.ok()) << parts.status().ToString();
  EXPECT_EQ(*parts, *plain);
  // Several text parts (and bare strings) are joined by newlines; a text part without text is
  // skipped.
  const Result<std::vector<int32_t>> joined = ChatIds("Elizabeth\nwas\nhere");
  const Result<std::vector<int32_t>> several =
      ChatIds(json::array({{{"type", "text"}, {"text", "Elizabeth"}},
                           "was",
                           {{"type", "text"}},
                           {{"type", "input_text"}, {"text", "here"}}}));
  ASSERT_TRUE(several.ok()) << several.status().ToString();
  EXPECT_EQ(*several, *joined);
  EXPECT_EQ(*ChatIds(nullptr), *ChatIds(""));
  // Anything but text is refused, naming the part's type.
  for (const char* type : {"image_url", "input_audio", "file", "video_url", "made_up"}) {
    ExpectRefused(Chat(json::array({{{"type", type}, {type, {{"url", "x"}}}}})), "messages", type,
                  Endpoint::kChat);
  }
  ExpectRefused(Chat(json::array({{{"text", "no type"}}})), "messages", "\"type\"",
                Endpoint::kChat);
  ExpectRefused(Chat(json::array({42})), "messages", "content part", Endpoint::kChat);
  ExpectRefused(Chat(42), "messages", "content", Endpoint::kChat);
}

TEST_F(RequestCheckTest, TokenizeAppliesTheSameChecks) {
  Result<ordered_json> plain = TokenizeResponse(
      Context(), {{"messages", json::array({{{"role", "user"}, {"content", "Elizabeth was"}}})}});
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  Result<ordered_json> parts = TokenizeResponse(
      Context(),
      {{"messages",
        json::array(
            {{{"role", "user"},
              {"content", json::array({{{"type", "text"}, {"text", "Elizabeth was"}}})}}})}});
  ASSERT_TRUE(parts.ok()) << parts.status().ToString();
  EXPECT_EQ((*parts)["tokens"], (*plain)["tokens"]);
  EXPECT_EQ((*plain)["max_model_len"], kMaxModelLen);

  Result<ordered_json> text =
      TokenizeResponse(Context(), {{"prompt", "Elizabeth was"}, {"return_token_strs", true}});
  ASSERT_TRUE(text.ok());
  EXPECT_EQ((*text)["count"], (*text)["tokens"].size());
  EXPECT_EQ((*text)["token_strs"].size(), (*text)["tokens"].size());
  const Result<ordered_json> back = DetokenizeResponse(Context(), {{"tokens", (*text)["tokens"]}});
  ASSERT_TRUE(back.ok());
  EXPECT_EQ((*back)["prompt"], "Elizabeth was");

  const Result<ordered_json> long_text =
      TokenizeResponse(Context(), {{"prompt", std::string(1 << 20, 'a')}});
  ASSERT_FALSE(long_text.ok());
  EXPECT_EQ(ToApiError(long_text.status()).param, "prompt");
  EXPECT_NE(long_text.status().message().find("--max-model-len"), std::string::npos);
  const Result<ordered_json> image = TokenizeResponse(
      Context(),
      {{"messages",
        json::array({{{"role", "user"}, {"content", json::array({{{"type", "image_url"}}})}}})}});
  ASSERT_FALSE(image.ok());
  EXPECT_NE(image.status().message().find("image_url"), std::string::npos);
  const Result<ordered_json> model =
      TokenizeResponse(Context(), {{"prompt", "x"}, {"model", std::string(1 << 20, 'm')}});
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(ToApiError(model.status()).status, 404);
  EXPECT_LT(model.status().message().size(), 400u);
  const Result<ordered_json> bad = DetokenizeResponse(Context(), {{"tokens", {1, -1}}});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(ToApiError(bad.status()).param, "tokens");
}

}  // namespace
}  // namespace moeserve::server
