// format_response: the /v1/systemone response body (KEV_SPEC.md §8).
#include "text/response.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kev/kev.h"
#include "text/tokenizer.h"

namespace kev {
namespace {

using Json = nlohmann::ordered_json;

std::vector<std::string> keys_of(const Json& object) {
  std::vector<std::string> keys;
  for (const auto& [key, value] : object.items()) keys.push_back(key);
  return keys;
}

Request sample_request() {
  Request r;
  r.model = "kev-latest";
  r.state_text = "s";
  r.questions = {
      {"a", Noul{"", "", ""}}, {"b", Choice{"", {{"x", ""}, {"y", "why"}}}}, {"c", Score{"", {"low", "high"}}}};
  return r;
}

Answers sample_answers() {
  Answers out;
  out.answers.push_back({"a", NoulAnswer{0.31}, {"false", "true"}, {0.69, 0.31}, {0.0, 0.0}});
  out.answers.push_back({"b", ChoiceAnswer{"x", 0.409999}, {"x", "y"}, {0.70549999, 0.29450001}, {0.0, 0.0}});
  out.answers.push_back({"c", ScoreAnswer{0.8, 1.0 / 3}, {"0", "1"}, {0.2, 0.8}, {0.0, 0.0}});
  out.usage.input_tokens = 177;
  out.usage.state_tokens = 40;
  out.usage.state_tokens_used = 31;
  out.latency_ms = 20.1234;
  return out;
}

TEST(Response, ShapeAndOrderOfSection8) {
  const std::string body = format_response(sample_request(), sample_answers());
  const Json j = Json::parse(body);
  EXPECT_EQ(keys_of(j), (std::vector<std::string>{"model", "answers", "usage", "latency_ms"}));
  EXPECT_EQ(j["model"], "kev-latest");
  EXPECT_EQ(keys_of(j["answers"]), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(keys_of(j["answers"]["a"]), (std::vector<std::string>{"type", "noul"}));
  EXPECT_EQ(j["answers"]["a"]["type"], "noul");
  EXPECT_EQ(j["answers"]["a"]["noul"].get<double>(), 0.31);
  EXPECT_EQ(keys_of(j["answers"]["b"]), (std::vector<std::string>{"type", "choice", "confidence", "probabilities"}));
  EXPECT_EQ(j["answers"]["b"]["choice"], "x");
  EXPECT_EQ(j["answers"]["b"]["confidence"].get<double>(), 0.41);
  EXPECT_EQ(keys_of(j["answers"]["b"]["probabilities"]), (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(keys_of(j["answers"]["c"]),
            (std::vector<std::string>{"type", "score", "legend", "probabilities", "confidence"}));
  EXPECT_EQ(j["answers"]["c"]["legend"], (Json{{"0", "low"}, {"1", "high"}}));
  EXPECT_EQ(j["answers"]["c"]["probabilities"], (Json{{"0", 0.2}, {"1", 0.8}}));
  EXPECT_EQ(j["answers"]["c"]["confidence"].get<double>(), 0.3333);
  EXPECT_EQ(keys_of(j["usage"]), (std::vector<std::string>{"input_tokens"}));  // no tokenizer here
  EXPECT_EQ(j["usage"]["input_tokens"], 177);
  EXPECT_EQ(j["latency_ms"].get<double>(), 20.12);
  // Rounded numbers print as Python's json.dumps would print round(x, 4).
  EXPECT_NE(body.find(R"("probabilities":{"x":0.7055,"y":0.2945})"), std::string::npos) << body;
}

TEST(Response, ExtrasAddOutputTokensAndTruncation) {
  Answers answers = sample_answers();
  answers.usage.truncated = true;
  const Json j = Json::parse(format_response(sample_request(), answers, ResponseExtras{64, true}));
  EXPECT_EQ(keys_of(j), (std::vector<std::string>{"model", "answers", "usage", "latency_ms", "truncated"}));
  EXPECT_EQ(j["truncated"], true);
  EXPECT_EQ(j["usage"],
            (Json{{"input_tokens", 177}, {"output_tokens", 64}, {"state_tokens", 40}, {"state_tokens_used", 31}}));
  // The public overload adds the truncation fields only when this state was cut.
  EXPECT_TRUE(Json::parse(format_response(sample_request(), answers)).contains("truncated"));
  answers.usage.truncated = false;
  EXPECT_FALSE(Json::parse(format_response(sample_request(), answers)).contains("truncated"));
  EXPECT_EQ(Json::parse(format_response(sample_request(), answers, ResponseExtras{std::nullopt, true}))["truncated"],
            false);
}

TEST(Response, RoundingMatchesPythonRound) {
  // Python 3.11: round(x, 4) / round(2.675, 2); exact binary ties go to even.
  EXPECT_EQ(round_decimals(0.03125, 4), 0.0312);
  EXPECT_EQ(round_decimals(0.09375, 4), 0.0938);
  EXPECT_EQ(round_decimals(0.00005, 4), 0.0001);  // 0.00005 is slightly above the tie in binary
  EXPECT_EQ(round_decimals(0.99995, 4), 1.0);
  EXPECT_EQ(round_decimals(0.70549999, 4), 0.7055);
  EXPECT_EQ(round_decimals(2.675, 2), 2.67);  // 2.675 is slightly below the tie in binary
  EXPECT_EQ(round_decimals(1e-9, 4), 0.0);
  EXPECT_EQ(round_decimals(254.99999, 4), 255.0);
}

TEST(Response, SerialisedAnswersAreTheBodysAnswersObject) {
  const Request r = sample_request();
  const Answers a = sample_answers();
  const std::string answers_text = serialise_answers(r, a);
  EXPECT_EQ(Json::parse(answers_text), Json::parse(format_response(r, a))["answers"]);
  EXPECT_NE(format_response(r, a).find(answers_text), std::string::npos);
}

TEST(Response, OutputTokensCountTheSerialisedAnswers) {
  Result<Tokenizer> tokenizer = Tokenizer::load(KEV_QWEN3_TOKENIZER);
  ASSERT_TRUE(tokenizer.ok()) << "the Qwen3 tokenizer is required at " << KEV_QWEN3_TOKENIZER << ": "
                              << tokenizer.status().to_string();
  const Request r = sample_request();
  const Answers a = sample_answers();
  Result<int64_t> count = count_output_tokens(*tokenizer, r, a);
  ASSERT_TRUE(count.ok()) << count.status().to_string();
  Result<std::vector<int32_t>> ids = tokenizer->encode(serialise_answers(r, a));
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*count, static_cast<int64_t>(ids->size()));
  EXPECT_GT(*count, 20);
}

TEST(Response, InvalidUtf8InNamesDoesNotThrow) {
  Request r = sample_request();
  r.model = "bad\xff";
  EXPECT_NO_THROW({
    const std::string body = format_response(r, sample_answers());
    EXPECT_TRUE(Json::accept(body));
  });
}

}  // namespace
}  // namespace kev
