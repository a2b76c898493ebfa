// Answer maths (KEV_SPEC.md §7), against values worked out by hand.
#include "text/answers.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace kev {
namespace {

constexpr double kTol = 1e-12;

Question noul() { return {"n", Noul{"Is it?", "", ""}}; }
Question choice(int k) {
  Choice c{"Which?", {}};
  for (int i = 0; i < k; ++i) c.options.emplace_back("opt" + std::to_string(i), "");
  return {"c", c};
}
Question score(int levels) {
  Score s{"How much?", {}};
  for (int i = 0; i < levels; ++i) s.levels.push_back("level " + std::to_string(i));
  return {"s", s};
}

Answer answer_ok(const Question& q, const std::vector<double>& logits) {
  Result<Answer> a = make_answer(q, logits);
  EXPECT_TRUE(a.ok()) << a.status().to_string();
  return a.ok() ? *a : Answer{};
}

// logits (0, ln 2, ln 3): exp gives 1, 2, 3, so p = 1/6, 2/6, 3/6.
const std::vector<double> kOneTwoThree = {0.0, std::log(2.0), std::log(3.0)};

TEST(Answers, SoftmaxWorkedExample) {
  const std::vector<double> p = softmax(kOneTwoThree);
  ASSERT_EQ(p.size(), 3u);
  EXPECT_NEAR(p[0], 1.0 / 6, kTol);
  EXPECT_NEAR(p[1], 2.0 / 6, kTol);
  EXPECT_NEAR(p[2], 3.0 / 6, kTol);
  // Shifting every logit changes nothing; huge logits do not overflow.
  const std::vector<double> shifted =
      softmax(std::vector<double>{1000.0, 1000.0 + std::log(2.0), 1000.0 + std::log(3.0)});
  for (int j = 0; j < 3; ++j) EXPECT_NEAR(shifted[j], p[j], kTol);
  const std::vector<double> extreme = softmax(std::vector<double>{800.0, -800.0});
  EXPECT_EQ(extreme[0], 1.0);
  EXPECT_EQ(extreme[1], 0.0);
}

TEST(Answers, ScoreSpreadTable) {
  EXPECT_DOUBLE_EQ(score_spread(2), 0.5);
  EXPECT_DOUBLE_EQ(score_spread(3), 2.0 / 3);
  EXPECT_DOUBLE_EQ(score_spread(4), 1.0);
  EXPECT_DOUBLE_EQ(score_spread(5), 1.2);
  // Against the definition (1/L) sum |i - (L-1)/2| for more sizes.
  for (int l = 1; l <= 255; ++l) {
    double mean = 0;
    for (int i = 0; i < l; ++i) mean += std::abs(i - (l - 1) / 2.0);
    EXPECT_NEAR(score_spread(l), mean / l, 1e-12) << "L=" << l;
  }
}

TEST(Answers, NoulIsProbabilityOfYes) {
  const Answer a = answer_ok(noul(), {0.0, std::log(3.0)});  // p = 1/4, 3/4
  EXPECT_EQ(a.id, "n");
  EXPECT_NEAR(std::get<NoulAnswer>(a.value).yes, 0.75, kTol);
  EXPECT_EQ(a.option_keys, (std::vector<std::string>{"false", "true"}));
  EXPECT_NEAR(a.probabilities[0], 0.25, kTol);
  EXPECT_EQ(a.logits, (std::vector<double>{0.0, std::log(3.0)}));
}

TEST(Answers, ChoiceArgmaxAndConfidence) {
  const Answer a = answer_ok(choice(3), kOneTwoThree);
  const auto& c = std::get<ChoiceAnswer>(a.value);
  EXPECT_EQ(c.choice, "opt2");
  // (1/2 - 1/3) / (1 - 1/3) = 1/4
  EXPECT_NEAR(c.confidence, 0.25, kTol);
  EXPECT_EQ(a.option_keys, (std::vector<std::string>{"opt0", "opt1", "opt2"}));

  // Ties go to the first maximum; a flat distribution has confidence 0.
  const Answer tie = answer_ok(choice(3), {1.0, 1.0, 0.0});
  EXPECT_EQ(std::get<ChoiceAnswer>(tie.value).choice, "opt0");
  const Answer flat = answer_ok(choice(4), {0.3, 0.3, 0.3, 0.3});
  EXPECT_EQ(std::get<ChoiceAnswer>(flat.value).choice, "opt0");
  EXPECT_NEAR(std::get<ChoiceAnswer>(flat.value).confidence, 0.0, kTol);
  EXPECT_GE(std::get<ChoiceAnswer>(flat.value).confidence, 0.0);

  const Answer single = answer_ok(choice(1), {-3.0});
  EXPECT_EQ(std::get<ChoiceAnswer>(single.value).choice, "opt0");
  EXPECT_EQ(std::get<ChoiceAnswer>(single.value).confidence, 1.0);
  EXPECT_EQ(single.probabilities, (std::vector<double>{1.0}));
}

TEST(Answers, ScoreExpectedLevelAndConfidence) {
  // p = 1/6, 2/6, 3/6: score = (0 + 2 + 6)/6 = 4/3; mode 2; sum p|i-2| = 2/6 + 2/6 = 2/3; D_3 = 2/3.
  const Answer a = answer_ok(score(3), kOneTwoThree);
  const auto& s = std::get<ScoreAnswer>(a.value);
  EXPECT_NEAR(s.score, 4.0 / 3, kTol);
  EXPECT_NEAR(s.confidence, 0.0, kTol);
  EXPECT_EQ(a.option_keys, (std::vector<std::string>{"0", "1", "2"}));

  // L = 5, weights 1, 1, 2, e^-50, e^-50: p = (1, 1, 2, 0, 0)/4 up to 1e-22.
  const Answer b = answer_ok(score(5), {0.0, 0.0, std::log(2.0), -50.0, -50.0});
  // score = (0 + 1 + 4)/4 = 1.25; mode 2; sum p|i-2| = 2/4 + 1/4 = 0.75; D_5 = 1.2 -> 1 - 0.625 = 0.375.
  EXPECT_NEAR(std::get<ScoreAnswer>(b.value).score, 1.25, 1e-9);
  EXPECT_NEAR(std::get<ScoreAnswer>(b.value).confidence, 0.375, 1e-9);

  // Flat L = 2: distance 0.5 = D_2, confidence exactly 0; a far-off mass is clamped at 0.
  EXPECT_NEAR(std::get<ScoreAnswer>(answer_ok(score(2), {0.0, 0.0}).value).confidence, 0.0, kTol);
  const Answer split = answer_ok(score(3), {0.0, -100.0, 0.0});  // p = (1/2, 0, 1/2), mode 0
  EXPECT_NEAR(std::get<ScoreAnswer>(split.value).score, 1.0, kTol);
  EXPECT_EQ(std::get<ScoreAnswer>(split.value).confidence, 0.0);  // 1 - 1/(2/3) < 0 -> 0

  const Answer one = answer_ok(score(1), {5.0});
  EXPECT_EQ(std::get<ScoreAnswer>(one.value).score, 0.0);
  EXPECT_EQ(std::get<ScoreAnswer>(one.value).confidence, 1.0);

  const Answer sure = answer_ok(score(4), {-60.0, -60.0, 60.0, -60.0});
  EXPECT_NEAR(std::get<ScoreAnswer>(sure.value).score, 2.0, 1e-9);
  EXPECT_NEAR(std::get<ScoreAnswer>(sure.value).confidence, 1.0, 1e-9);
}

TEST(Answers, NonFiniteLogitsAreErrors) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (const double bad : {nan, inf, -inf}) {
    Result<Answer> a = make_answer(choice(3), std::vector<double>{0.0, bad, 1.0});
    ASSERT_FALSE(a.ok());
    EXPECT_EQ(a.status().code(), ErrorCode::Internal);
    EXPECT_NE(a.status().message().find("non-finite logit"), std::string::npos) << a.status().message();
    EXPECT_NE(a.status().message().find("question \"c\" option 1"), std::string::npos) << a.status().message();
  }
}

TEST(Answers, LogitCountMustMatchOptions) {
  Result<Answer> a = make_answer(noul(), std::vector<double>{0.0, 1.0, 2.0});
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), ErrorCode::Internal);
  EXPECT_NE(a.status().message().find("has 2 options but 3 logits"), std::string::npos) << a.status().message();
}

}  // namespace
}  // namespace kev
