// JSON -> Kev text (KEV_SPEC.md §4.1) and the strict JSON reader.
#include "text/render.h"

#include <gtest/gtest.h>

#include <string>

#include "kev/kev.h"

namespace kev {
namespace {

std::string render(const std::string& json) {
  Result<std::string> text = render_json_text(json);
  EXPECT_TRUE(text.ok()) << json << " -> " << text.status().to_string();
  return text.ok() ? *text : std::string("<error>");
}

Status render_error(const std::string& json) {
  Result<std::string> text = render_json_text(json);
  EXPECT_FALSE(text.ok()) << json << " rendered as " << (text.ok() ? *text : "");
  return text.status();
}

TEST(Render, WorkedExampleOfSection11) {
  EXPECT_EQ(render(R"({"ticket": "Charged twice for order 88", "amount": 42.5, "tags": ["billing", "urgent"]})"),
            "ticket: Charged twice for order 88\n"
            "amount: 42.5\n"
            "tags:\n"
            "  - billing\n"
            "  - urgent");
}

TEST(Render, Scalars) {
  EXPECT_EQ(render(R"("hello")"), "hello");
  EXPECT_EQ(render("null"), "");
  EXPECT_EQ(render("true"), "True");
  EXPECT_EQ(render("false"), "False");
  EXPECT_EQ(render("42"), "42");
  EXPECT_EQ(render("-7"), "-7");
  EXPECT_EQ(render("-0"), "0");  // Python: json.loads("-0") is the int 0
  EXPECT_EQ(render("-0.0"), "-0.0");
  EXPECT_EQ(render("1.0"), "1.0");
  EXPECT_EQ(render("1e2"), "100.0");  // an exponent makes a float, as in Python
  EXPECT_EQ(render("2.5E-6"), "2.5e-06");
}

TEST(Render, IntegersKeepTheirDigits) {
  EXPECT_EQ(render("9223372036854775807"), "9223372036854775807");
  EXPECT_EQ(render("-9223372036854775808"), "-9223372036854775808");
  EXPECT_EQ(render("18446744073709551615"), "18446744073709551615");
  EXPECT_EQ(render("18446744073709551616"), "18446744073709551616");
  EXPECT_EQ(render("123456789012345678901234567890"), "123456789012345678901234567890");
  EXPECT_EQ(render("-123456789012345678901234567890"), "-123456789012345678901234567890");
  EXPECT_EQ(render(R"({"id": 99999999999999999999999})"), "id: 99999999999999999999999");
  // A big integer is a number, not a string, for type checks.
  Result<nlohmann::ordered_json> big = parse_json("99999999999999999999999");
  ASSERT_TRUE(big.ok());
  EXPECT_STREQ(json_type_name(*big), "number");
}

TEST(Render, PythonFloatRepr) {
  // Expected strings are Python 3.11's repr() of the same doubles.
  const std::pair<double, const char*> table[] = {
      {32.5, "32.5"},
      {1.0, "1.0"},
      {1e-05, "1e-05"},
      {1e16, "1e+16"},
      {0.0001, "0.0001"},
      {0.00012345, "0.00012345"},
      {123456789012345.0, "123456789012345.0"},
      {1234567890123456.0, "1234567890123456.0"},
      {9999999999999998.0, "9999999999999998.0"},
      {1.2345678901234567e16, "1.2345678901234568e+16"},
      {1e22, "1e+22"},
      {1.5e-7, "1.5e-07"},
      {123.456e-10, "1.23456e-08"},
      {5e-324, "5e-324"},
      {1.7976931348623157e308, "1.7976931348623157e+308"},
      {0.1, "0.1"},
      {0.30000000000000004, "0.30000000000000004"},
      {-2.5, "-2.5"},
      {100.0, "100.0"},
      {0.0, "0.0"},
      {-0.0, "-0.0"},
      {1e15, "1000000000000000.0"},
  };
  for (const auto& [value, expected] : table) EXPECT_EQ(python_float_repr(value), expected) << expected;
  EXPECT_EQ(render("[0.1, 1e-5, 1E16, 12.0]"), "- 0.1\n- 1e-05\n- 1e+16\n- 12.0");
}

TEST(Render, NestedContainers) {
  EXPECT_EQ(render(R"({"a": {"b": 1, "c": [1, {"d": 2, "e": [true, null]}]}, "f": "x"})"),
            "a:\n"
            "  b: 1\n"
            "  c:\n"
            "    - 1\n"
            "    - d: 2\n"
            "      e:\n"
            "        - True\n"
            "        - \n"
            "f: x");
  EXPECT_EQ(render(R"([{"a": 1, "b": 2}, {"c": {"d": 3}}])"), "- a: 1\n  b: 2\n- c:\n    d: 3");
}

TEST(Render, NestedArraysInArrays) { EXPECT_EQ(render("[[1, 2], [[3]], 4]"), "- - 1\n  - 2\n- - - 3\n- 4"); }

TEST(Render, EmptyAndNullValues) {
  EXPECT_EQ(render("{}"), "");
  EXPECT_EQ(render("[]"), "");
  // Scalars keep "key: " (null and "" both render as ""); empty containers have no lines.
  EXPECT_EQ(render(R"({"n": null, "s": "", "o": {}, "a": [], "z": 0})"), "n: \ns: \no:\na:\nz: 0");
  EXPECT_EQ(render(R"([null, "", {}, [], 0])"), "- \n- \n-\n-\n- 0");
}

TEST(Render, KeyOrderIsInsertionOrder) {
  EXPECT_EQ(render(R"({"zeta": 1, "alpha": 2, "mid": 3})"), "zeta: 1\nalpha: 2\nmid: 3");
}

TEST(Render, MultiLineStringsAreNotReindented) {
  EXPECT_EQ(render(R"({"note": "line1\nline2", "list": ["a\nb"], "deep": {"x": "p\nq"}})"),
            "note: line1\nline2\nlist:\n  - a\nb\ndeep:\n  x: p\nq");
}

TEST(Render, ArrayItemsAreLeftStrippedLikePython) {
  // str.lstrip() drops all leading whitespace, newlines and U+00A0/U+3000 included.
  EXPECT_EQ(render(R"(["  x", "\n\ny", "\u00a0z", "\u3000w", "   "])"), "- x\n- y\n- z\n- w\n- ");
}

TEST(Render, StringStatePassesVerbatim) {
  EXPECT_EQ(render(R"("  leading\n\ttabs and trailing\n")"), "  leading\n\ttabs and trailing\n");
  EXPECT_EQ(render(R"("<|fim_prefix|> is not escaped here")"), "<|fim_prefix|> is not escaped here");
}

TEST(Render, UnicodeIsKept) {
  EXPECT_EQ(render(R"({"名前": "José ☕", "emoji": ["😀", "\u00e9"]})"), "名前: José ☕\nemoji:\n  - 😀\n  - é");
}

TEST(ParseJson, DuplicateKeysAreRefusedWithTheirPath) {
  EXPECT_NE(render_error(R"({"a": 1, "a": 2})").message().find("duplicate key \"a\" in the top-level object"),
            std::string::npos);
  const Status nested = render_error(R"({"x": {"y": [0, {"k": 1, "k": 1}]}})");
  EXPECT_EQ(nested.code(), ErrorCode::InvalidRequest);
  EXPECT_NE(nested.message().find("duplicate key \"k\" in x.y[1]"), std::string::npos) << nested.message();
  // The same key in sibling objects is fine.
  EXPECT_EQ(render(R"([{"k": 1}, {"k": 2}])"), "- k: 1\n- k: 2");
}

TEST(ParseJson, MalformedJsonNamesThePosition) {
  const Status bad = render_error(R"({"a": tru})");
  EXPECT_EQ(bad.code(), ErrorCode::InvalidRequest);
  EXPECT_NE(bad.message().find("malformed JSON"), std::string::npos) << bad.message();
  EXPECT_NE(bad.message().find("line 1, column"), std::string::npos) << bad.message();
  EXPECT_EQ(bad.message().find("[json.exception"), std::string::npos) << bad.message();
  for (const char* malformed : {"", "1 2", "{\"a\": 1,}", "\"\xff\"" /* invalid UTF-8 */, "{\"a\" 1}"}) {
    EXPECT_EQ(render_error(malformed).code(), ErrorCode::InvalidRequest) << malformed;
  }
  EXPECT_NE(render_error("1e400").message().find("overflow"), std::string::npos);
}

TEST(ParseJson, DepthIsLimited) {
  const std::string ok = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  EXPECT_TRUE(parse_json(ok).ok());
  const std::string deep = std::string(kMaxJsonDepth + 1, '[') + std::string(kMaxJsonDepth + 1, ']');
  const Status status = render_error(deep);
  EXPECT_NE(status.message().find("deeper than 512"), std::string::npos) << status.message();
}

}  // namespace
}  // namespace kev
