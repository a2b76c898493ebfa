// Engine workflow tests on a synthetic tiny model: prefix path vs full recompute, batching invariance,
// prefix immutability, limits and bad input.
#include <algorithm>
#include <cmath>

#include <gtest/gtest.h>

#include "support/tiny_model.h"
#include "kev/kev.h"
#include "model/forward.h"
#include "model/model_file.h"
#include "model/weights.h"
#include "text/encode.h"
#include "text/tokenizer.h"

namespace kev {
namespace {

const char* kState =
    "Order 88 was charged twice: once on March 3 and again on March 4. The customer wants the second "
    "charge refunded and asks whether the export API outage from last week is related.";

Questions sample_questions() {
  return {
      {"dup", Noul{"The customer was charged twice.", "", "Two identical charges exist."}},
      {"team", Choice{"Which team handles this?", {{"billing", "Payments and refunds"}, {"tech", ""}, {"sales", "Upgrades"}}}},
      {"urgency", Score{"How urgent is it?", {"low", "medium", "high", "critical", "outage"}}},
      {"single", Choice{"Only one way to go.", {{"only", "The single option"}}}},
      {"lang", Noul{"Is the ticket written in English?", "", ""}},
  };
}

// Options whose limits override the model's: the state limit and the state + row limit.
Options with_limits(int64_t max_prefix, int64_t max_context) {
  Options o;
  o.override_limits = true;
  o.limits.max_prefix = max_prefix;
  o.limits.max_context = max_context;
  return o;
}

Engine load_tiny(Options opts = {}) {
  auto e = Engine::load(test::tiny_model_dir(), opts);
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  return std::move(e).value();
}

double max_abs_diff(const Answer& a, const Answer& b) {
  EXPECT_EQ(a.probabilities.size(), b.probabilities.size());
  double m = 0;
  for (size_t j = 0; j < a.probabilities.size(); ++j) m = std::max(m, std::fabs(a.probabilities[j] - b.probabilities[j]));
  return m;
}

TEST(Engine, AnswersEveryQuestionInOrderWithValidProbabilities) {
  Engine engine = load_tiny();
  auto answers = engine.system_one(kState, sample_questions());
  ASSERT_TRUE(answers.ok()) << answers.status().to_string();
  const Questions qs = sample_questions();
  ASSERT_EQ(answers->answers.size(), qs.size());
  for (size_t i = 0; i < qs.size(); ++i) {
    const Answer& a = answers->answers[i];
    EXPECT_EQ(a.id, qs[i].id);
    double sum = 0;
    for (double p : a.probabilities) {
      EXPECT_TRUE(p >= 0 && p <= 1);
      sum += p;
    }
    EXPECT_NEAR(sum, 1.0, 1e-12);
    for (double z : a.logits) EXPECT_TRUE(std::isfinite(z));
  }
  // Random weights still give distinct logits: a constant output would mean the model did nothing.
  const Answer& urgency = answers->answers[2];
  EXPECT_GT(*std::max_element(urgency.logits.begin(), urgency.logits.end()) -
                *std::min_element(urgency.logits.begin(), urgency.logits.end()),
            1e-4);
  EXPECT_EQ(answers->answers[3].probabilities.size(), 1u);
  EXPECT_DOUBLE_EQ(answers->answers[3].probabilities[0], 1.0);
}

TEST(Engine, QuestionsTogetherEqualQuestionsAlone) {
  Engine engine = load_tiny();
  auto prefix = engine.prefill(kState);
  ASSERT_TRUE(prefix.ok()) << prefix.status().to_string();
  const Questions qs = sample_questions();
  auto together = engine.evaluate(*prefix, qs);
  ASSERT_TRUE(together.ok()) << together.status().to_string();
  double worst = 0;
  for (size_t i = 0; i < qs.size(); ++i) {
    auto alone = engine.evaluate(*prefix, {qs[i]});
    ASSERT_TRUE(alone.ok()) << alone.status().to_string();
    worst = std::max(worst, max_abs_diff(together->answers[i], alone->answers[0]));
  }
  EXPECT_LE(worst, 1e-6);
}

TEST(Engine, SplittingIntoPassesKeepsAnswers) {
  Options small;
  small.override_limits = true;
  small.limits.max_questions = 2;  // 5 questions -> 3 passes
  small.limits.pass_token_budget = 8;
  Engine split = load_tiny(small);
  Engine whole = load_tiny();
  auto a = split.system_one(kState, sample_questions());
  auto b = whole.system_one(kState, sample_questions());
  ASSERT_TRUE(a.ok() && b.ok());
  for (size_t i = 0; i < a->answers.size(); ++i) EXPECT_LE(max_abs_diff(a->answers[i], b->answers[i]), 1e-6);
  EXPECT_NE(split.placement_report().find("score passes: 5"), std::string::npos) << split.placement_report();
}

TEST(Engine, PrefixIsBitIdenticalAfterFiftyEvaluations) {
  Engine engine = load_tiny();
  auto prefix = engine.prefill(kState);
  ASSERT_TRUE(prefix.ok());
  auto before = prefix->content_hash();
  ASSERT_TRUE(before.ok());
  auto first = engine.evaluate(*prefix, sample_questions());
  ASSERT_TRUE(first.ok());
  for (int i = 0; i < 49; ++i) ASSERT_TRUE(engine.evaluate(*prefix, sample_questions()).ok());
  auto last = engine.evaluate(*prefix, sample_questions());
  ASSERT_TRUE(last.ok());
  auto after = prefix->content_hash();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(*before, *after);
  for (size_t i = 0; i < first->answers.size(); ++i)
    EXPECT_EQ(first->answers[i].probabilities, last->answers[i].probabilities);
}

TEST(Engine, ManyPrefixesCoexist) {
  Engine engine = load_tiny();
  auto p1 = engine.prefill(kState);
  auto p2 = engine.prefill("A completely different state about a printer that will not turn on.");
  ASSERT_TRUE(p1.ok() && p2.ok());
  auto a1 = engine.evaluate(*p1, sample_questions());
  auto a2 = engine.evaluate(*p2, sample_questions());
  auto a1_again = engine.evaluate(*p1, sample_questions());
  ASSERT_TRUE(a1.ok() && a2.ok() && a1_again.ok());
  EXPECT_EQ(a1->answers[2].probabilities, a1_again->answers[2].probabilities);
  EXPECT_NE(a1->answers[2].probabilities, a2->answers[2].probabilities);
}

// The prefix path (state pass, then each row continuing from the snapshot) against a plain pass over
// state ⧺ row from zero state, on the same runner.
TEST(Engine, PrefixContinuationEqualsFullRecompute) {
  auto model = read_model_file(test::tiny_model_dir());
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  auto backend = create_backend("cpu", {});
  ASSERT_TRUE(backend.ok());
  auto weights = load_model_weights(**backend, *model);
  ASSERT_TRUE(weights.ok()) << weights.status().to_string();
  auto tok = Tokenizer::load(model->tokenizer_path());
  ASSERT_TRUE(tok.ok());
  auto ids = resolve_special_ids(*tok);
  ASSERT_TRUE(ids.ok());
  Encoder encoder(*tok, *ids, model->kev.limits);
  ModelRunner runner(*backend, model->config, std::move(*weights), 1.0 / 16.0);

  auto state = encoder.encode_state(kState, false);
  ASSERT_TRUE(state.ok());
  const int64_t Ls = static_cast<int64_t>(state->tokens.size());
  ASSERT_GT(Ls, 30);
  auto prefix = runner.prefill(state->tokens);
  ASSERT_TRUE(prefix.ok()) << prefix.status().to_string();

  double worst = 0;
  for (const Question& q : sample_questions()) {
    auto row = encoder.encode_question(q, Ls);
    ASSERT_TRUE(row.ok());
    ScorePass cont;
    cont.tokens = row->tokens;
    cont.layout.offsets = {0, static_cast<int32_t>(row->tokens.size())};
    cont.layout.pos0 = Ls;
    cont.layout.from_prefix = true;
    ScorePass full;
    full.tokens = state->tokens;
    full.tokens.insert(full.tokens.end(), row->tokens.begin(), row->tokens.end());
    full.layout.offsets = {0, static_cast<int32_t>(full.tokens.size())};
    full.layout.pos0 = 0;
    full.layout.from_prefix = false;
    for (int32_t c : row->close_offsets) {
      cont.option_rows.push_back(c);
      full.option_rows.push_back(static_cast<int32_t>(Ls) + c);
      cont.option_question.push_back(0);
      full.option_question.push_back(0);
    }
    cont.decide_rows = {row->decide_offset};
    full.decide_rows = {static_cast<int32_t>(Ls) + row->decide_offset};
    auto a = runner.score(*prefix, cont);
    auto b = runner.score(PrefixState{}, full);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status().to_string() << b.status().to_string();
    for (size_t j = 0; j < a->size(); ++j) worst = std::max(worst, static_cast<double>(std::fabs((*a)[j] - (*b)[j])));
  }
  EXPECT_LE(worst, 1e-5) << "max |Δlogit| between the prefix path and a full recompute";
}

// The state pass fused with the first score pass (prefill_and_evaluate, system_one's path) against
// prefill then evaluate on the same engine: on the CPU every op is per row or per sequence and the
// matmul is row-invariant, so snapshot and logits are bit-identical — with one pass, with the questions
// split over five passes (the first fused), and when state + first pass exceed the limits' largest
// pass and the two run apart.
TEST(Engine, FusedStateAndScorePassEqualsPrefillThenEvaluate) {
  int64_t Ls = 0;
  {
    Engine probe = load_tiny();
    auto p = probe.prefill(kState);
    ASSERT_TRUE(p.ok());
    Ls = p->state_tokens();
  }
  Options split;
  split.override_limits = true;
  split.limits.max_questions = 2;
  split.limits.pass_token_budget = 8;  // every row over it: one row a pass
  Options apart = with_limits(Ls, 1024);
  apart.limits.pass_token_budget = Ls;  // Ls + any row > max(max_prefix, budget)
  const struct {
    const char* name;
    Options options;
    const char* passes;
    const char* fused;
  } cases[] = {{"one pass", Options{}, "score passes: 2 (10 rows", "fused state + score passes: 1"},
               {"five passes", split, "score passes: 10 (10 rows", "fused state + score passes: 1"},
               {"too large to fuse", apart, "score passes: ", "fused state + score passes: 0"}};
  const Questions qs = sample_questions();
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    Engine engine = load_tiny(c.options);
    auto prefix = engine.prefill(kState);
    ASSERT_TRUE(prefix.ok()) << prefix.status().to_string();
    auto separate = engine.evaluate(*prefix, qs);
    ASSERT_TRUE(separate.ok()) << separate.status().to_string();
    auto fused = engine.prefill_and_evaluate(kState, qs);
    ASSERT_TRUE(fused.ok()) << fused.status().to_string();
    EXPECT_EQ(*fused->prefix.content_hash(), *prefix->content_hash());
    EXPECT_EQ(fused->prefix.tokens(), prefix->tokens());
    ASSERT_EQ(fused->answers.answers.size(), qs.size());
    for (size_t q = 0; q < qs.size(); ++q) {
      EXPECT_EQ(fused->answers.answers[q].id, qs[q].id);
      EXPECT_EQ(fused->answers.answers[q].logits, separate->answers[q].logits) << qs[q].id;
    }
    EXPECT_EQ(fused->answers.usage.input_tokens, separate->usage.input_tokens);
    const std::string report = engine.placement_report();
    EXPECT_NE(report.find(c.passes), std::string::npos) << report;
    EXPECT_NE(report.find(c.fused), std::string::npos) << report;
    // The fused call's snapshot serves later evaluations like any other.
    auto again = engine.evaluate(fused->prefix, qs);
    ASSERT_TRUE(again.ok());
    for (size_t q = 0; q < qs.size(); ++q) EXPECT_EQ(again->answers[q].logits, separate->answers[q].logits);
  }
}

// Reserving memory at load runs throw-away passes; they must leave nothing behind that a request sees:
// the same answers bit for bit and the same placement report (its op counts start after the load).
TEST(Engine, ReservingMemoryAtLoadChangesNoAnswer) {
  Options plain = with_limits(64, 160);
  plain.limits.pass_token_budget = 96;  // max_context − 1 > budget: the lone-row pass runs too
  Options reserved = plain;
  reserved.reserve_memory = true;
  Engine a = load_tiny(plain);
  Engine b = load_tiny(reserved);
  EXPECT_FALSE(b.device_memory().has_value());  // the CPU backend has no device pool
  auto ra = a.system_one(kState, sample_questions());
  auto rb = b.system_one(kState, sample_questions());
  ASSERT_TRUE(ra.ok() && rb.ok());
  for (size_t q = 0; q < ra->answers.size(); ++q) EXPECT_EQ(ra->answers[q].logits, rb->answers[q].logits);
  EXPECT_EQ(a.placement_report(), b.placement_report());
}

// State ids encoded by the caller (kev_server encodes on its request threads) give the same snapshot
// as the text; ids the engine would never have produced are refused with the reason.
TEST(Engine, PrefillTokensEqualsPrefillOfTheText) {
  Options opts = with_limits(64, 256);
  Engine e = load_tiny(opts);
  auto from_text = e.prefill(kState);
  ASSERT_TRUE(from_text.ok()) << from_text.status().to_string();
  const std::vector<int32_t> ids = from_text->tokens();
  auto from_ids = e.prefill_tokens(ids, static_cast<int64_t>(ids.size()) + 5, true);
  ASSERT_TRUE(from_ids.ok()) << from_ids.status().to_string();
  EXPECT_EQ(from_ids->tokens(), ids);
  EXPECT_TRUE(from_ids->truncated());
  EXPECT_EQ(*from_ids->content_hash(), *from_text->content_hash());
  auto a = e.evaluate(*from_text, sample_questions());
  auto b = e.evaluate(*from_ids, sample_questions());
  ASSERT_TRUE(a.ok() && b.ok());
  for (size_t q = 0; q < a->answers.size(); ++q) EXPECT_EQ(a->answers[q].logits, b->answers[q].logits);
  EXPECT_EQ(b->usage.state_tokens, static_cast<int64_t>(ids.size()) + 5);

  auto expect_refused = [&](std::vector<int32_t> t, int64_t original, const std::string& words) {
    auto r = e.prefill_tokens(std::move(t), original, false);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), ErrorCode::InvalidRequest);
    EXPECT_NE(r.status().message().find(words), std::string::npos) << r.status().message();
  };
  expect_refused({}, 0, "state delimiter");
  expect_refused(std::vector<int32_t>(ids.begin() + 1, ids.end()), static_cast<int64_t>(ids.size()), "state delimiter");
  std::vector<int32_t> long_ids(ids);
  long_ids.resize(65, ids.back());
  expect_refused(long_ids, 65, "over max_prefix 64 by 1");
  expect_refused(ids, 1, "original_length 1");
  std::vector<int32_t> bad_id(ids);
  bad_id.back() = 1 << 30;
  expect_refused(bad_id, static_cast<int64_t>(ids.size()), "outside the model's vocabulary");
}

TEST(Engine, RejectsBadRequestsWithClearErrors) {
  Options opts = with_limits(16, 64);
  Engine engine = load_tiny(opts);

  auto long_state = engine.prefill(kState);
  ASSERT_FALSE(long_state.ok());
  EXPECT_EQ(long_state.status().code(), ErrorCode::InvalidRequest);
  EXPECT_NE(long_state.status().message().find("max_prefix"), std::string::npos) << long_state.status().message();

  auto prefix = engine.prefill("Short state.");
  ASSERT_TRUE(prefix.ok());
  Choice none{"Pick one.", {}};
  auto empty = engine.evaluate(*prefix, {{"c", none}});
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().code(), ErrorCode::InvalidRequest);

  Score too_many{"Level?", {}};
  for (int i = 0; i < 256; ++i) too_many.levels.push_back("l" + std::to_string(i));
  auto over = engine.evaluate(*prefix, {{"s", too_many}});
  ASSERT_FALSE(over.ok());
  EXPECT_NE(over.status().message().find("255"), std::string::npos) << over.status().message();

  auto dup = engine.evaluate(*prefix, {{"a", Noul{"x", "", ""}}, {"a", Noul{"y", "", ""}}});
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find("'a'"), std::string::npos) << dup.status().message();

  Noul long_row{std::string(400, 'x') + " is this long?", "", ""};
  auto row = engine.evaluate(*prefix, {{"long", long_row}});
  ASSERT_FALSE(row.ok());
  EXPECT_NE(row.status().message().find("max_context"), std::string::npos) << row.status().message();

  auto no_questions = engine.evaluate(*prefix, {});
  ASSERT_FALSE(no_questions.ok());
}

TEST(Engine, TruncatesStatesOnlyWhenAsked) {
  Options opts = with_limits(16, 128);
  opts.truncate_states = true;
  Engine engine = load_tiny(opts);
  auto answers = engine.system_one(kState, {{"lang", Noul{"English?", "", ""}}});
  ASSERT_TRUE(answers.ok()) << answers.status().to_string();
  EXPECT_TRUE(answers->usage.truncated);
  EXPECT_EQ(answers->usage.state_tokens_used, 16);
  EXPECT_GT(answers->usage.state_tokens, 16);
}

TEST(Engine, LoadErrorsNameTheProblem) {
  auto missing = Engine::load("/nonexistent/model", {});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/model"), std::string::npos);
  Options bad_backend;
  bad_backend.backend = "tpu";
  auto tpu = Engine::load(test::tiny_model_dir(), bad_backend);
  ASSERT_FALSE(tpu.ok());
  EXPECT_NE(tpu.status().message().find("tpu"), std::string::npos) << tpu.status().message();
}

}  // namespace
}  // namespace kev
