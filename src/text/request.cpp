// parse_request: the POST /v1/systemone body (KEV_SPEC.md §8) -> kev::Request. Every error names the
// field path ("questions.b.criteria") and, for limits, the count and the limit.
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include "common/check.h"
#include "kev/kev.h"
#include "text/render.h"

namespace kev {
namespace {

using Json = nlohmann::ordered_json;

Status invalid(std::string message) { return Status(ErrorCode::InvalidRequest, std::move(message)); }

std::string join_keys(std::initializer_list<std::string_view> keys) {
  std::string out;
  for (std::string_view k : keys) {
    if (!out.empty()) out += ", ";
    out += k;
  }
  return out;
}

// Unknown keys are refused rather than ignored: a misspelt "instruction" would otherwise silently drop
// the instructions from what the model sees.
Status check_keys(const Json& object, std::string_view path, std::initializer_list<std::string_view> allowed) {
  for (const auto& [key, value] : object.items()) {
    bool known = false;
    for (std::string_view a : allowed) known = known || key == a;
    KEV_CHECK(known, ErrorCode::InvalidRequest, path, " has unknown field \"", key, "\" (expected ", join_keys(allowed),
              ")");
  }
  return Status::success();
}

// Instructions and descriptions: any JSON, absent or null -> "".
std::string render_optional(const Json& object, const char* key) {
  const auto it = object.find(key);
  return it == object.end() ? std::string() : render_json(*it);
}

Status check_option_count(std::size_t count, std::string_view path, int64_t max_options) {
  KEV_CHECK(count >= 1, ErrorCode::InvalidRequest, path, " must list at least one option");
  const auto n = static_cast<int64_t>(count);
  KEV_CHECK(n <= max_options, ErrorCode::InvalidRequest, path, " has ", n, " options; max_options is ", max_options,
            " (over by ", n - max_options, ")");
  return Status::success();
}

Result<Noul> parse_noul(const Json* criteria, const std::string& path, std::string instructions) {
  Noul noul{std::move(instructions), "", ""};
  if (criteria == nullptr || criteria->is_null()) return noul;
  KEV_CHECK(criteria->is_object(), ErrorCode::InvalidRequest, path,
            " must be an object with optional \"false\" and \"true\", got ", json_type_name(*criteria));
  KEV_TRY(check_keys(*criteria, path, {"false", "true"}));
  noul.if_false = render_optional(*criteria, "false");
  noul.if_true = render_optional(*criteria, "true");
  return noul;
}

Result<Choice> parse_choice(const Json* criteria, const std::string& path, std::string instructions,
                            int64_t max_options) {
  KEV_CHECK(criteria != nullptr, ErrorCode::InvalidRequest, path, " is missing; a choice needs named options");
  KEV_CHECK(criteria->is_object(), ErrorCode::InvalidRequest, path,
            " must be an object of option name -> description, got ", json_type_name(*criteria));
  KEV_TRY(check_option_count(criteria->size(), path, max_options));
  // Names are unique here: parse_json refuses duplicate keys.
  Choice choice{std::move(instructions), {}};
  for (const auto& [name, description] : criteria->items()) {
    choice.options.emplace_back(name, render_json(description));
  }
  return choice;
}

Result<Score> parse_score(const Json* criteria, const std::string& path, std::string instructions,
                          int64_t max_options) {
  KEV_CHECK(criteria != nullptr, ErrorCode::InvalidRequest, path, " is missing; a score needs its levels");
  KEV_CHECK(criteria->is_array(), ErrorCode::InvalidRequest, path, " must be an array of level descriptions, got ",
            json_type_name(*criteria));
  KEV_TRY(check_option_count(criteria->size(), path, max_options));
  Score score{std::move(instructions), {}};
  for (const Json& level : *criteria) score.levels.push_back(render_json(level));
  return score;
}

Result<Question> parse_question(const std::string& id, const Json& body, int64_t max_options) {
  const std::string path = cat("questions.", id);
  KEV_CHECK(body.is_object(), ErrorCode::InvalidRequest, path, " must be an object, got ", json_type_name(body));
  KEV_TRY(check_keys(body, path, {"type", "instructions", "criteria"}));
  const auto type_it = body.find("type");
  KEV_CHECK(type_it != body.end(), ErrorCode::InvalidRequest, path,
            ".type is missing (expected noul, choice or score)");
  KEV_CHECK(type_it->is_string(), ErrorCode::InvalidRequest, path, ".type must be a string, got ",
            json_type_name(*type_it));
  const std::string& type = type_it->get_ref<const std::string&>();

  std::string instructions = render_optional(body, "instructions");
  const auto criteria_it = body.find("criteria");
  const Json* criteria = criteria_it == body.end() ? nullptr : &*criteria_it;
  const std::string criteria_path = path + ".criteria";

  Question question{id, Noul{}};
  if (type == "noul") {
    KEV_ASSIGN_OR_RETURN(question.body, parse_noul(criteria, criteria_path, std::move(instructions)));
  } else if (type == "choice") {
    KEV_ASSIGN_OR_RETURN(question.body, parse_choice(criteria, criteria_path, std::move(instructions), max_options));
  } else if (type == "score") {
    KEV_ASSIGN_OR_RETURN(question.body, parse_score(criteria, criteria_path, std::move(instructions), max_options));
  } else {
    return invalid(cat("question \"", id, "\" has unknown type \"", type, "\" (expected noul, choice or score)"));
  }
  return question;
}

}  // namespace

Result<Request> parse_request(std::string_view json_body, int64_t max_options) {
  KEV_ASSIGN_OR_RETURN(const Json body, parse_json(json_body));
  KEV_CHECK(body.is_object(), ErrorCode::InvalidRequest, "the request body must be a JSON object, got ",
            json_type_name(body));
  KEV_TRY(check_keys(body, "the request", {"model", "state", "questions"}));

  Request request;
  if (const auto it = body.find("model"); it != body.end() && !it->is_null()) {
    KEV_CHECK(it->is_string(), ErrorCode::InvalidRequest, "model must be a string, got ", json_type_name(*it));
    request.model = it->get<std::string>();
  }

  const auto state = body.find("state");
  KEV_CHECK(state != body.end(), ErrorCode::InvalidRequest, "the request has no \"state\" field");
  request.state_text = render_json(*state);

  const auto questions = body.find("questions");
  KEV_CHECK(questions != body.end(), ErrorCode::InvalidRequest, "the request has no \"questions\" field");
  KEV_CHECK(questions->is_object(), ErrorCode::InvalidRequest,
            "questions must be an object of question id -> question, got ", json_type_name(*questions));
  KEV_CHECK(!questions->empty(), ErrorCode::InvalidRequest, "questions must hold at least one question");
  // Ids are unique here: parse_json refuses duplicate keys.
  for (const auto& [id, question] : questions->items()) {
    KEV_ASSIGN_OR_RETURN(Question parsed, parse_question(id, question, max_options));
    request.questions.push_back(std::move(parsed));
  }
  return request;
}

}  // namespace kev
