// parse_request: the /v1/systemone body (KEV_SPEC.md §8) -> kev::Request.
#include <gtest/gtest.h>

#include <string>
#include <variant>

#include "kev/kev.h"

namespace kev {
namespace {

Request parse_ok(const std::string& body, int64_t max_options = 255) {
  Result<Request> request = parse_request(body, max_options);
  EXPECT_TRUE(request.ok()) << request.status().to_string();
  return request.ok() ? *request : Request{};
}

// Asserts an InvalidRequest whose message contains `needle`.
void expect_error(const std::string& body, const std::string& needle, int64_t max_options = 255) {
  Result<Request> request = parse_request(body, max_options);
  ASSERT_FALSE(request.ok()) << body;
  EXPECT_EQ(request.status().code(), ErrorCode::InvalidRequest);
  EXPECT_NE(request.status().message().find(needle), std::string::npos)
      << "message: " << request.status().message() << "\nexpected to contain: " << needle;
}

std::string with_questions(const std::string& questions) { return R"({"state": "s", "questions": )" + questions + "}"; }

std::string choice_with(int n_options) {
  std::string criteria;
  for (int i = 0; i < n_options; ++i) criteria += (i ? ", " : "") + std::string("\"o") + std::to_string(i) + "\": null";
  return with_questions(R"({"b": {"type": "choice", "criteria": {)" + criteria + "}}}");
}

TEST(ParseRequest, WorkedExample) {
  const Request r = parse_ok(R"({
    "model": "kev-0.8b",
    "state": {"ticket": "Charged twice for order 88", "amount": 42.5, "tags": ["billing", "urgent"]},
    "questions": {
      "dup": {"type": "noul", "instructions": "The customer was charged twice.",
              "criteria": {"true": "Two identical charges exist."}},
      "team": {"type": "choice", "instructions": "Which team handles this?",
               "criteria": {"billing": "Payments and refunds", "tech": null}}}})");
  EXPECT_EQ(r.model, "kev-0.8b");
  EXPECT_EQ(r.state_text, "ticket: Charged twice for order 88\namount: 42.5\ntags:\n  - billing\n  - urgent");
  ASSERT_EQ(r.questions.size(), 2u);
  EXPECT_EQ(r.questions[0].id, "dup");
  const auto& dup = std::get<Noul>(r.questions[0].body);
  EXPECT_EQ(dup.instructions, "The customer was charged twice.");
  EXPECT_EQ(dup.if_false, "");
  EXPECT_EQ(dup.if_true, "Two identical charges exist.");
  EXPECT_EQ(r.questions[1].id, "team");
  const auto& team = std::get<Choice>(r.questions[1].body);
  EXPECT_EQ(team.instructions, "Which team handles this?");
  ASSERT_EQ(team.options.size(), 2u);
  EXPECT_EQ(team.options[0], (std::pair<std::string, std::string>{"billing", "Payments and refunds"}));
  EXPECT_EQ(team.options[1], (std::pair<std::string, std::string>{"tech", ""}));
}

TEST(ParseRequest, QuestionOrderIsKept) {
  const Request r = parse_ok(with_questions(
      R"({"z": {"type": "noul"}, "a": {"type": "score", "criteria": ["low", "high"]}, "m": {"type": "noul"}})"));
  ASSERT_EQ(r.questions.size(), 3u);
  EXPECT_EQ(r.questions[0].id, "z");
  EXPECT_EQ(r.questions[1].id, "a");
  EXPECT_EQ(r.questions[2].id, "m");
  EXPECT_EQ(std::get<Score>(r.questions[1].body).levels, (std::vector<std::string>{"low", "high"}));
}

TEST(ParseRequest, DefaultsAndRendering) {
  const Request r = parse_ok(R"({"state": [1, 2.5, null, true], "questions": {
      "n": {"type": "noul", "instructions": null, "criteria": {"false": null, "true": 7}},
      "c": {"type": "choice", "instructions": {"ask": "Which?"}, "criteria": {"x": {"why": "because"}, "y": ""}},
      "s": {"type": "score", "criteria": [null, 1e-5, ["a", "b"]]}}})");
  EXPECT_EQ(r.model, "kev-latest");
  EXPECT_EQ(r.state_text, "- 1\n- 2.5\n- \n- True");
  const auto& n = std::get<Noul>(r.questions[0].body);
  EXPECT_EQ(n.instructions, "");
  EXPECT_EQ(n.if_false, "");
  EXPECT_EQ(n.if_true, "7");
  const auto& c = std::get<Choice>(r.questions[1].body);
  EXPECT_EQ(c.instructions, "ask: Which?");
  EXPECT_EQ(c.options[0].second, "why: because");
  EXPECT_EQ(c.options[1].second, "");
  EXPECT_EQ(std::get<Score>(r.questions[2].body).levels, (std::vector<std::string>{"", "1e-05", "- a\n- b"}));
}

TEST(ParseRequest, NoulCriteriaMayBeAbsentOrNull) {
  const Request r = parse_ok(with_questions(R"({"a": {"type": "noul"}, "b": {"type": "noul", "criteria": null}})"));
  for (const Question& q : r.questions) {
    const auto& noul = std::get<Noul>(q.body);
    EXPECT_EQ(noul.if_false, "");
    EXPECT_EQ(noul.if_true, "");
  }
  expect_error(with_questions(R"({"a": {"type": "noul", "criteria": {"maybe": "x"}}})"),
               "questions.a.criteria has unknown field \"maybe\"");
  expect_error(with_questions(R"({"a": {"type": "noul", "criteria": ["x"]}})"),
               "questions.a.criteria must be an object");
}

TEST(ParseRequest, StringStateIsVerbatim) {
  EXPECT_EQ(parse_ok(R"({"state": "  two\nlines ", "questions": {"q": {"type": "noul"}}})").state_text,
            "  two\nlines ");
  EXPECT_EQ(parse_ok(R"({"state": 123456789012345678901234567890, "questions": {"q": {"type": "noul"}}})").state_text,
            "123456789012345678901234567890");
  EXPECT_EQ(parse_ok(R"({"state": null, "questions": {"q": {"type": "noul"}}})").state_text, "");
}

TEST(ParseRequest, UnicodeIdsAndNames) {
  const Request r =
      parse_ok(with_questions(R"({"équipe": {"type": "choice", "criteria": {"財務": "お金", "😀": null}}})"));
  EXPECT_EQ(r.questions[0].id, "équipe");
  const auto& c = std::get<Choice>(r.questions[0].body);
  EXPECT_EQ(c.options[0].first, "財務");
  EXPECT_EQ(c.options[0].second, "お金");
  EXPECT_EQ(c.options[1].first, "😀");
}

TEST(ParseRequest, OptionCountLimits) {
  EXPECT_EQ(std::get<Choice>(parse_ok(choice_with(255)).questions[0].body).options.size(), 255u);
  expect_error(choice_with(256), "questions.b.criteria has 256 options; max_options is 255 (over by 1)");
  expect_error(choice_with(0), "questions.b.criteria must list at least one option");
  expect_error(choice_with(5), "has 5 options; max_options is 3 (over by 2)", 3);
  EXPECT_EQ(std::get<Choice>(parse_ok(choice_with(1)).questions[0].body).options.size(), 1u);
  expect_error(with_questions(R"({"s": {"type": "score", "criteria": []}})"),
               "questions.s.criteria must list at least one option");
  EXPECT_EQ(
      std::get<Score>(parse_ok(with_questions(R"({"s": {"type": "score", "criteria": ["only"]}})")).questions[0].body)
          .levels.size(),
      1u);
}

TEST(ParseRequest, DuplicateIdsAndNamesAreRefused) {
  expect_error(with_questions(R"({"a": {"type": "noul"}, "a": {"type": "noul"}})"), "duplicate key \"a\" in questions");
  expect_error(with_questions(R"({"b": {"type": "choice", "criteria": {"x": 1, "y": 2, "x": 3}}})"),
               "duplicate key \"x\" in questions.b.criteria");
}

TEST(ParseRequest, UnknownTypeNamesIdAndType) {
  expect_error(with_questions(R"({"q7": {"type": "multi", "criteria": {}}})"),
               "question \"q7\" has unknown type \"multi\" (expected noul, choice or score)");
  expect_error(with_questions(R"({"q7": {"criteria": {}}})"), "questions.q7.type is missing");
  expect_error(with_questions(R"({"q7": {"type": 3}})"), "questions.q7.type must be a string, got number");
}

TEST(ParseRequest, WrongFieldTypesNameThePath) {
  expect_error(with_questions(R"({"b": {"type": "choice", "criteria": ["x", "y"]}})"),
               "questions.b.criteria must be an object of option name -> description, got array");
  expect_error(with_questions(R"({"b": {"type": "choice"}})"), "questions.b.criteria is missing");
  expect_error(with_questions(R"({"c": {"type": "score", "criteria": {"0": "low"}}})"),
               "questions.c.criteria must be an array of level descriptions, got object");
  expect_error(with_questions(R"({"c": {"type": "score", "criteria": "low"}})"), "got string");
  expect_error(with_questions(R"({"c": "noul"})"), "questions.c must be an object, got string");
  expect_error(with_questions(R"({"c": {"type": "noul", "instruction": "typo"}})"),
               "questions.c has unknown field \"instruction\"");
  expect_error(with_questions(R"(["a"])"), "questions must be an object of question id -> question, got array");
  expect_error(with_questions("{}"), "questions must hold at least one question");
  expect_error(R"({"state": "s"})", "no \"questions\" field");
  expect_error(R"({"questions": {"q": {"type": "noul"}}})", "no \"state\" field");
  expect_error(R"({"model": 5, "state": "s", "questions": {"q": {"type": "noul"}}})", "model must be a string");
  expect_error(R"({"state": "s", "questions": {"q": {"type": "noul"}}, "stream": true})", "unknown field \"stream\"");
  expect_error(R"(["state"])", "the request body must be a JSON object, got array");
}

TEST(ParseRequest, MalformedJsonNamesThePosition) {
  expect_error(R"({"state": "s", "questions": {"q": {"type": "noul"}})", "malformed JSON: parse error at line 1");
  expect_error("{\"state\": \"s\",\n \"questions\": oops}", "line 2");
}

}  // namespace
}  // namespace kev
