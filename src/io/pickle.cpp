#include "io/pickle.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <unordered_set>

#include "common/check.h"

namespace kev {

// ---- values ----

PickleValue PickleValue::boolean(bool b) { return PickleValue(Variant(b)); }
PickleValue PickleValue::integer(int64_t i) { return PickleValue(Variant(i)); }
PickleValue PickleValue::real(double d) { return PickleValue(Variant(d)); }
PickleValue PickleValue::string(std::string s) {
  return PickleValue(Variant(std::make_shared<const std::string>(std::move(s))));
}
PickleValue PickleValue::tuple(std::vector<PickleValue> items) {
  auto t = std::make_shared<PickleTuple>();
  for (const PickleValue& item : items) {
    if (const auto* inner = std::get_if<std::shared_ptr<const PickleTuple>>(&item.v_)) {
      t->tuple_depth = std::max(t->tuple_depth, (*inner)->tuple_depth + 1);
    }
  }
  t->items = std::move(items);
  return PickleValue(Variant(std::shared_ptr<const PickleTuple>(std::move(t))));
}
PickleValue PickleValue::list(std::vector<PickleValue> items) {
  auto l = std::make_shared<PickleList>();
  l->items = std::move(items);
  return PickleValue(Variant(std::move(l)));
}
Result<PickleValue> PickleValue::dict(std::vector<std::pair<PickleValue, PickleValue>> entries) {
  auto d = std::make_shared<PickleDict>();
  for (auto& [k, v] : entries) KEV_TRY(d->set(std::move(k), std::move(v)));
  return PickleValue(Variant(std::move(d)));
}
PickleValue PickleValue::global(PickleGlobal g) {
  return PickleValue(Variant(std::make_shared<const PickleGlobal>(std::move(g))));
}
PickleValue PickleValue::storage(std::shared_ptr<const TorchStorage> s) { return PickleValue(Variant(std::move(s))); }
PickleValue PickleValue::tensor(std::shared_ptr<const TorchTensor> t) { return PickleValue(Variant(std::move(t))); }
PickleValue PickleValue::opaque(std::string type) {
  return PickleValue(Variant(std::make_shared<const PickleOpaque>(PickleOpaque{std::move(type)})));
}

std::string PickleValue::type_name() const {
  switch (kind()) {
    case Kind::None:
      return "NoneType";
    case Kind::Bool:
      return "bool";
    case Kind::Int:
      return "int";
    case Kind::Float:
      return "float";
    case Kind::String:
      return "str";
    case Kind::Tuple:
      return "tuple";
    case Kind::List:
      return "list";
    case Kind::Dict:
      return "dict";
    case Kind::Global:
      return "global";
    case Kind::Storage:
      return "storage";
    case Kind::Tensor:
      return "tensor";
    case Kind::Opaque:
      return if_opaque()->type;
  }
  return "unknown";
}

const std::string* PickleValue::if_string() const {
  const auto* p = std::get_if<std::shared_ptr<const std::string>>(&v_);
  return p ? p->get() : nullptr;
}
const PickleGlobal* PickleValue::if_global() const {
  const auto* p = std::get_if<std::shared_ptr<const PickleGlobal>>(&v_);
  return p ? p->get() : nullptr;
}
const PickleDict* PickleValue::if_dict() const {
  const auto* p = std::get_if<std::shared_ptr<PickleDict>>(&v_);
  return p ? p->get() : nullptr;
}
const std::vector<PickleValue>* PickleValue::if_tuple() const {
  const auto* p = std::get_if<std::shared_ptr<const PickleTuple>>(&v_);
  return p ? &(*p)->items : nullptr;
}
const std::vector<PickleValue>* PickleValue::if_list() const {
  const auto* p = std::get_if<std::shared_ptr<PickleList>>(&v_);
  return p ? &(*p)->items : nullptr;
}
const std::vector<PickleValue>* PickleValue::if_sequence() const {
  const std::vector<PickleValue>* t = if_tuple();
  return t ? t : if_list();
}
const std::shared_ptr<const TorchStorage>* PickleValue::if_storage() const {
  return std::get_if<std::shared_ptr<const TorchStorage>>(&v_);
}
const std::shared_ptr<const TorchTensor>* PickleValue::if_tensor() const {
  return std::get_if<std::shared_ptr<const TorchTensor>>(&v_);
}
const PickleOpaque* PickleValue::if_opaque() const {
  const auto* p = std::get_if<std::shared_ptr<const PickleOpaque>>(&v_);
  return p ? p->get() : nullptr;
}
double PickleValue::number() const {
  if (const int64_t* i = if_int()) return static_cast<double>(*i);
  if (const double* d = if_float()) return *d;
  return std::nan("");
}

// ---- dict ----

namespace {

// Equal Python keys get equal strings: True, 1 and 1.0 are one key, as in a Python dict.
Result<std::string> canonical_key(const PickleValue& key) {
  if (key.is_none()) return std::string("N");
  if (const bool* b = key.if_bool()) return std::string(*b ? "I1" : "I0");
  if (const int64_t* i = key.if_int()) return cat("I", *i);
  if (const double* d = key.if_float()) {
    // 2^63 itself does not fit; every double below it that is integral does.
    if (std::isfinite(*d) && std::trunc(*d) == *d && *d >= -9223372036854775808.0 && *d < 9223372036854775808.0) {
      return cat("I", static_cast<int64_t>(*d));
    }
    return cat("F", std::bit_cast<uint64_t>(*d));
  }
  if (const std::string* s = key.if_string()) {
    KEV_CHECK(s->size() <= PickleDict::kMaxKeyBytes, ErrorCode::InvalidArtifact, "dict key of ", s->size(),
              " bytes; at most ", PickleDict::kMaxKeyBytes, " are accepted");
    return "S" + *s;
  }
  // Python compares such objects by rules this reader does not know; identity keeps them apart.
  if (const PickleOpaque* o = key.if_opaque()) return cat("O", static_cast<const void*>(o));
  return Status(ErrorCode::InvalidArtifact, cat("dict key of type ", key.type_name(), " is not supported"));
}

}  // namespace

const PickleValue* PickleDict::find(std::string_view key) const {
  std::string canonical = "S";
  canonical.append(key);
  auto it = index_.find(canonical);
  return it == index_.end() ? nullptr : &entries_[it->second].second;
}

Status PickleDict::set(PickleValue key, PickleValue value) {
  KEV_ASSIGN_OR_RETURN(std::string canonical, canonical_key(key));
  auto [it, inserted] = index_.try_emplace(std::move(canonical), entries_.size());
  if (inserted) {
    entries_.emplace_back(std::move(key), std::move(value));
  } else {
    entries_[it->second].second = std::move(value);
  }
  return Status::success();
}

// ---- the machine ----

namespace {

struct OpcodeName {
  uint8_t code;
  const char* name;
};
// Every opcode of protocols 0-5, so that refused ones are named in errors.
constexpr OpcodeName kOpcodeNames[] = {{'(', "MARK"},          {')', "EMPTY_TUPLE"},
                                       {'.', "STOP"},          {'0', "POP"},
                                       {'1', "POP_MARK"},      {'2', "DUP"},
                                       {'B', "BINBYTES"},      {'C', "SHORT_BINBYTES"},
                                       {'F', "FLOAT"},         {'G', "BINFLOAT"},
                                       {'I', "INT"},           {'J', "BININT"},
                                       {'K', "BININT1"},       {'L', "LONG"},
                                       {'M', "BININT2"},       {'N', "NONE"},
                                       {'P', "PERSID"},        {'Q', "BINPERSID"},
                                       {'R', "REDUCE"},        {'S', "STRING"},
                                       {'T', "BINSTRING"},     {'U', "SHORT_BINSTRING"},
                                       {'V', "UNICODE"},       {'X', "BINUNICODE"},
                                       {']', "EMPTY_LIST"},    {'a', "APPEND"},
                                       {'b', "BUILD"},         {'c', "GLOBAL"},
                                       {'d', "DICT"},          {'e', "APPENDS"},
                                       {'g', "GET"},           {'h', "BINGET"},
                                       {'i', "INST"},          {'j', "LONG_BINGET"},
                                       {'l', "LIST"},          {'o', "OBJ"},
                                       {'p', "PUT"},           {'q', "BINPUT"},
                                       {'r', "LONG_BINPUT"},   {'s', "SETITEM"},
                                       {'t', "TUPLE"},         {'u', "SETITEMS"},
                                       {'}', "EMPTY_DICT"},    {0x80, "PROTO"},
                                       {0x81, "NEWOBJ"},       {0x82, "EXT1"},
                                       {0x83, "EXT2"},         {0x84, "EXT4"},
                                       {0x85, "TUPLE1"},       {0x86, "TUPLE2"},
                                       {0x87, "TUPLE3"},       {0x88, "NEWTRUE"},
                                       {0x89, "NEWFALSE"},     {0x8a, "LONG1"},
                                       {0x8b, "LONG4"},        {0x8c, "SHORT_BINUNICODE"},
                                       {0x8d, "BINUNICODE8"},  {0x8e, "BINBYTES8"},
                                       {0x8f, "EMPTY_SET"},    {0x90, "ADDITEMS"},
                                       {0x91, "FROZENSET"},    {0x92, "NEWOBJ_EX"},
                                       {0x93, "STACK_GLOBAL"}, {0x94, "MEMOIZE"},
                                       {0x95, "FRAME"},        {0x96, "BYTEARRAY8"},
                                       {0x97, "NEXT_BUFFER"},  {0x98, "READONLY_BUFFER"}};

const char* opcode_name(uint8_t op) {
  for (const OpcodeName& o : kOpcodeNames) {
    if (o.code == op) return o.name;
  }
  return nullptr;
}

uint64_t read_le(std::span<const uint8_t> b) {
  uint64_t v = 0;
  for (size_t i = b.size(); i-- > 0;) v = (v << 8) | b[i];
  return v;
}

// Module and attribute names are dotted identifiers; anything else is not worth quoting back.
bool plausible_name(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c > ' ' && c < 0x7f; });
}

constexpr size_t kMaxGlobalNameBytes = 256;

}  // namespace

class PickleMachine {
 public:
  PickleMachine(std::span<const uint8_t> bytes, const PickleHooks& hooks, const PickleLimits& limits)
      : bytes_(bytes), hooks_(hooks), limits_(limits) {}

  // Empties every list and dict that the result does not reach, so that dropping the stack, memo
  // and registry afterwards frees everything (cycles included) with recursion bounded by tuple
  // nesting. On failure the result reaches nothing.
  ~PickleMachine() {
    for (auto& l : lists_) {
      if (!reachable_.contains(l.get())) l->items.clear();
    }
    for (auto& d : dicts_) {
      if (!reachable_.contains(d.get())) {
        d->entries_.clear();
        d->index_.clear();
      }
    }
  }

  Result<PickleValue> run() {
    while (true) {
      KEV_CHECK(pos_ < bytes_.size(), ErrorCode::InvalidArtifact, "pickle ends at byte ", bytes_.size(),
                " without STOP (truncated?)");
      op_pos_ = pos_;
      op_ = bytes_[pos_++];
      if (op_ == '.') break;
      KEV_TRY(step());
    }
    KEV_TRY(need(1));
    PickleValue result = pop();
    size_t height = 0;
    KEV_TRY(measure(result, 1, height));
    for (const auto& [node, h] : heights_) reachable_.insert(node);
    return result;
  }

 private:
  Status fail(const std::string& what) const {
    const char* name = opcode_name(op_);
    return Status(ErrorCode::InvalidArtifact, cat("pickle opcode ", name ? name : "?", " (0x", std::hex,
                                                  static_cast<int>(op_), std::dec, ") at byte ", op_pos_, ": ", what));
  }

  Result<std::span<const uint8_t>> take(uint64_t n) {
    const size_t left = bytes_.size() - pos_;
    if (n > left) return fail(cat("needs ", n, " more bytes but the pickle has ", left, " left (truncated?)"));
    std::span<const uint8_t> out = bytes_.subspan(pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return out;
  }
  Result<uint64_t> take_le(size_t n) {
    KEV_ASSIGN_OR_RETURN(std::span<const uint8_t> b, take(n));
    return read_le(b);
  }
  Result<std::string> take_line() {
    const size_t left = bytes_.size() - pos_;
    const size_t window = std::min(left, kMaxGlobalNameBytes + 1);
    const uint8_t* begin = bytes_.data() + pos_;
    const uint8_t* nl = static_cast<const uint8_t*>(std::memchr(begin, '\n', window));
    if (nl == nullptr) {
      return fail(window == left ? "name is not terminated by a newline (truncated?)"
                                 : cat("name longer than ", kMaxGlobalNameBytes, " bytes"));
    }
    std::string line(reinterpret_cast<const char*>(begin), static_cast<size_t>(nl - begin));
    pos_ += line.size() + 1;
    return line;
  }

  size_t frame_size() const { return stack_.size() - (marks_.empty() ? 0 : marks_.back()); }
  Status need(size_t n) const {
    if (frame_size() >= n) return Status::success();
    return fail(cat("needs ", n, " values on the stack but ", frame_size(), " are there (since the last MARK)"));
  }
  Status push(PickleValue v) {
    if (stack_.size() >= limits_.max_stack) return fail(cat("stack holds more than ", limits_.max_stack, " values"));
    stack_.push_back(std::move(v));
    return Status::success();
  }
  PickleValue pop() {
    PickleValue v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  Result<std::vector<PickleValue>> pop_mark() {
    if (marks_.empty()) return fail("no MARK to pop to");
    const size_t mark = marks_.back();
    marks_.pop_back();
    std::vector<PickleValue> items(std::make_move_iterator(stack_.begin() + static_cast<ptrdiff_t>(mark)),
                                   std::make_move_iterator(stack_.end()));
    stack_.resize(mark);
    return items;
  }

  // Keeps track of every list and dict so that the destructor can break cycles among them.
  void adopt(const PickleValue& v) {
    if (const auto* l = std::get_if<std::shared_ptr<PickleList>>(&v.v_)) lists_.push_back(*l);
    if (const auto* d = std::get_if<std::shared_ptr<PickleDict>>(&v.v_)) dicts_.push_back(*d);
  }
  Status push_new(PickleValue v) {
    adopt(v);
    return push(std::move(v));
  }
  Status push_tuple(std::vector<PickleValue> items) {
    PickleValue t = PickleValue::tuple(std::move(items));
    const size_t depth = std::get<std::shared_ptr<const PickleTuple>>(t.v_)->tuple_depth;
    if (depth > limits_.max_depth) return fail(cat("tuples nest more than ", limits_.max_depth, " deep"));
    return push(std::move(t));
  }

  PickleList* list_at_top() {
    auto* l = std::get_if<std::shared_ptr<PickleList>>(&stack_.back().v_);
    return l ? l->get() : nullptr;
  }
  PickleDict* dict_at_top() {
    auto* d = std::get_if<std::shared_ptr<PickleDict>>(&stack_.back().v_);
    return d ? d->get() : nullptr;
  }

  Status memo_put(uint64_t index) {
    KEV_TRY(need(1));
    if (!memo_.contains(index) && memo_.size() >= limits_.max_memo) {
      return fail(cat("memo holds more than ", limits_.max_memo, " values"));
    }
    memo_[index] = stack_.back();
    return Status::success();
  }
  Status memo_get(uint64_t index) {
    auto it = memo_.find(index);
    if (it == memo_.end()) return fail(cat("memo entry ", index, " was never stored"));
    return push(it->second);
  }

  Status global(std::string module, std::string name) {
    if (!plausible_name(module) || !plausible_name(name)) return fail("malformed global name");
    PickleGlobal g{std::move(module), std::move(name)};
    if (hooks_.allow_global && hooks_.allow_global(g)) return push(PickleValue::global(std::move(g)));
    return push(PickleValue::opaque(g.qualified()));
  }

  Status string_of_length(uint64_t n) {
    KEV_ASSIGN_OR_RETURN(std::span<const uint8_t> b, take(n));
    return push(PickleValue::string(std::string(b.begin(), b.end())));
  }
  // Bytes are read for bounds and dropped: no caller needs their contents.
  Status bytes_of_length(uint64_t n) {
    KEV_TRY(take(n));
    return push(PickleValue::opaque("builtins.bytes"));
  }

  // NEWOBJ / NEWOBJ_EX: cls.__new__(cls, *args[, **kwargs]) with `n_args` argument values on top.
  Status new_object(size_t n_args) {
    KEV_TRY(need(n_args + 1));
    stack_.resize(stack_.size() - n_args);
    const PickleValue& cls = stack_.back();
    if (cls.if_opaque() == nullptr) {
      return fail(cat("creates an object of ", cls.if_global() ? cls.if_global()->qualified() : cls.type_name(),
                      "; not allowed here"));
    }
    stack_.back() = PickleValue::opaque(cls.type_name());
    return Status::success();
  }

  Status step() {
    switch (op_) {
      case 0x80: {  // PROTO
        KEV_ASSIGN_OR_RETURN(uint64_t proto, take_le(1));
        if (proto > 5) return fail(cat("pickle protocol ", proto, " is newer than 5"));
        return Status::success();
      }
      case 0x95: {  // FRAME: a length prefix only; the bytes follow inline
        KEV_ASSIGN_OR_RETURN(uint64_t n, take_le(8));
        if (n > bytes_.size() - pos_) return fail(cat("frame of ", n, " bytes runs past the end (truncated?)"));
        return Status::success();
      }
      case '(':
        if (marks_.size() >= limits_.max_marks) return fail(cat("more than ", limits_.max_marks, " open MARKs"));
        marks_.push_back(stack_.size());
        return Status::success();
      case '0':
        KEV_TRY(need(1));
        stack_.pop_back();
        return Status::success();
      case '1':
        KEV_TRY(pop_mark());
        return Status::success();
      case 'N':
        return push(PickleValue());
      case 0x88:
        return push(PickleValue::boolean(true));
      case 0x89:
        return push(PickleValue::boolean(false));
      case 'J': {
        KEV_ASSIGN_OR_RETURN(uint64_t v, take_le(4));
        return push(PickleValue::integer(static_cast<int32_t>(static_cast<uint32_t>(v))));
      }
      case 'K': {
        KEV_ASSIGN_OR_RETURN(uint64_t v, take_le(1));
        return push(PickleValue::integer(static_cast<int64_t>(v)));
      }
      case 'M': {
        KEV_ASSIGN_OR_RETURN(uint64_t v, take_le(2));
        return push(PickleValue::integer(static_cast<int64_t>(v)));
      }
      case 0x8a:    // LONG1: n-byte little-endian two's complement
      case 0x8b: {  // LONG4: the same with a 4-byte length
        KEV_ASSIGN_OR_RETURN(uint64_t n, take_le(op_ == 0x8a ? 1 : 4));
        if (n > 8) return fail(cat("integer of ", n, " bytes does not fit in 64 bits"));
        KEV_ASSIGN_OR_RETURN(uint64_t v, take_le(static_cast<size_t>(n)));
        if (n > 0 && n < 8 && (v >> (8 * n - 1)) != 0) v |= ~uint64_t{0} << (8 * n);  // sign-extend
        return push(PickleValue::integer(static_cast<int64_t>(v)));
      }
      case 'G': {  // BINFLOAT is big-endian
        KEV_ASSIGN_OR_RETURN(std::span<const uint8_t> b, take(8));
        uint64_t bits = 0;
        for (uint8_t byte : b) bits = (bits << 8) | byte;
        return push(PickleValue::real(std::bit_cast<double>(bits)));
      }
      case 'X': {
        KEV_ASSIGN_OR_RETURN(uint64_t n, take_le(4));
        return string_of_length(n);
      }
      case 0x8c: {
        KEV_ASSIGN_OR_RETURN(uint64_t n, take_le(1));
        return string_of_length(n);
      }
      case 0x8d: {
        KEV_ASSIGN_OR_RETURN(uint64_t n, take_le(8));
        return string_of_length(n);
      }
      case 'C': {
        KEV_ASSIGN_OR_RETURN(uint64_t n, take_le(1));
        return bytes_of_length(n);
      }
      case 'B': {
        KEV_ASSIGN_OR_RETURN(uint64_t n, take_le(4));
        return bytes_of_length(n);
      }
      case 0x8e: {
        KEV_ASSIGN_OR_RETURN(uint64_t n, take_le(8));
        return bytes_of_length(n);
      }
      case 0x8f:
        return push(PickleValue::opaque("builtins.set"));
      case 0x90: {  // ADDITEMS: the items are dropped with the set's contents
        KEV_TRY(pop_mark());
        KEV_TRY(need(1));
        const PickleOpaque* set = stack_.back().if_opaque();
        if (set == nullptr || set->type != "builtins.set")
          return fail(cat("adds items to a value of type ", stack_.back().type_name(), ", not a set"));
        return Status::success();
      }
      case 0x91:
        KEV_TRY(pop_mark());
        return push(PickleValue::opaque("builtins.frozenset"));
      case 0x81:
        return new_object(1);
      case 0x92:
        return new_object(2);
      case ')':
        return push_tuple({});
      case ']':
        return push_new(PickleValue::list());
      case '}':
        return push_new(PickleValue(PickleValue::Variant(std::make_shared<PickleDict>())));
      case 't': {
        KEV_ASSIGN_OR_RETURN(std::vector<PickleValue> items, pop_mark());
        return push_tuple(std::move(items));
      }
      case 0x85:
      case 0x86:
      case 0x87: {
        const size_t n = static_cast<size_t>(op_ - 0x84);
        KEV_TRY(need(n));
        std::vector<PickleValue> items(std::make_move_iterator(stack_.end() - static_cast<ptrdiff_t>(n)),
                                       std::make_move_iterator(stack_.end()));
        stack_.resize(stack_.size() - n);
        return push_tuple(std::move(items));
      }
      case 'a': {
        KEV_TRY(need(2));
        PickleValue item = pop();
        if (stack_.back().if_opaque()) return Status::success();  // a list subclass: contents dropped
        PickleList* l = list_at_top();
        if (l == nullptr) return fail(cat("appends to a value of type ", stack_.back().type_name(), ", not a list"));
        l->items.push_back(std::move(item));
        return Status::success();
      }
      case 'e': {
        KEV_ASSIGN_OR_RETURN(std::vector<PickleValue> items, pop_mark());
        KEV_TRY(need(1));
        if (stack_.back().if_opaque()) return Status::success();
        PickleList* l = list_at_top();
        if (l == nullptr) return fail(cat("appends to a value of type ", stack_.back().type_name(), ", not a list"));
        std::move(items.begin(), items.end(), std::back_inserter(l->items));
        return Status::success();
      }
      case 's': {
        KEV_TRY(need(3));
        PickleValue value = pop();
        PickleValue key = pop();
        if (stack_.back().if_opaque()) return Status::success();  // a dict subclass (defaultdict, ...)
        PickleDict* d = dict_at_top();
        if (d == nullptr)
          return fail(cat("sets an item on a value of type ", stack_.back().type_name(), ", not a dict"));
        if (Status s = d->set(std::move(key), std::move(value)); !s.ok()) return fail(s.message());
        return Status::success();
      }
      case 'u': {
        KEV_ASSIGN_OR_RETURN(std::vector<PickleValue> items, pop_mark());
        KEV_TRY(need(1));
        if (items.size() % 2 != 0) return fail(cat("has ", items.size(), " values, not key/value pairs"));
        if (stack_.back().if_opaque()) return Status::success();
        PickleDict* d = dict_at_top();
        if (d == nullptr) return fail(cat("sets items on a value of type ", stack_.back().type_name(), ", not a dict"));
        for (size_t i = 0; i < items.size(); i += 2) {
          if (Status s = d->set(std::move(items[i]), std::move(items[i + 1])); !s.ok()) return fail(s.message());
        }
        return Status::success();
      }
      case 'q': {
        KEV_ASSIGN_OR_RETURN(uint64_t i, take_le(1));
        return memo_put(i);
      }
      case 'r': {
        KEV_ASSIGN_OR_RETURN(uint64_t i, take_le(4));
        return memo_put(i);
      }
      case 0x94:
        return memo_put(memo_.size());
      case 'h': {
        KEV_ASSIGN_OR_RETURN(uint64_t i, take_le(1));
        return memo_get(i);
      }
      case 'j': {
        KEV_ASSIGN_OR_RETURN(uint64_t i, take_le(4));
        return memo_get(i);
      }
      case 'c': {
        KEV_ASSIGN_OR_RETURN(std::string module, take_line());
        KEV_ASSIGN_OR_RETURN(std::string name, take_line());
        return global(std::move(module), std::move(name));
      }
      case 0x93: {
        KEV_TRY(need(2));
        PickleValue name = pop();
        PickleValue module = pop();
        if (!module.if_string() || !name.if_string()) {
          return fail(cat("module and name are ", module.type_name(), " and ", name.type_name(), ", not str"));
        }
        if (module.if_string()->size() > kMaxGlobalNameBytes || name.if_string()->size() > kMaxGlobalNameBytes) {
          return fail(cat("name longer than ", kMaxGlobalNameBytes, " bytes"));
        }
        return global(*module.if_string(), *name.if_string());
      }
      case 'R': {
        KEV_TRY(need(2));
        PickleValue args = pop();
        if (stack_.back().if_opaque()) {
          stack_.back() = PickleValue::opaque(stack_.back().type_name());
          return Status::success();
        }
        const PickleGlobal* callable = stack_.back().if_global();
        if (callable == nullptr)
          return fail(cat("calls a value of type ", stack_.back().type_name(), ", not a global"));
        if (!hooks_.reduce) return fail(cat("calls ", callable->qualified(), "; no calls are allowed here"));
        KEV_ASSIGN_OR_RETURN(PickleValue result, hooks_.reduce(*callable, args));
        adopt(result);
        stack_.back() = std::move(result);
        return Status::success();
      }
      case 'b': {
        KEV_TRY(need(2));
        PickleValue state = pop();
        if (stack_.back().if_opaque()) return Status::success();
        if (!hooks_.build)
          return fail(cat("sets the state of a value of type ", stack_.back().type_name(), "; not allowed here"));
        return hooks_.build(stack_.back(), state);
      }
      case 'Q': {
        KEV_TRY(need(1));
        PickleValue pid = pop();
        if (!hooks_.persistent_load) return fail("refers to a persistent id; none are allowed here");
        KEV_ASSIGN_OR_RETURN(PickleValue loaded, hooks_.persistent_load(pid));
        adopt(loaded);
        return push(std::move(loaded));
      }
      default: {
        const char* name = opcode_name(op_);
        return fail(name ? "this opcode is outside the subset torch.save writes" : "not a pickle opcode");
      }
    }
  }

  // Computes the nesting height of `v` (1 for a flat container), refusing anything deeper than
  // max_depth; a value that contains itself is infinitely deep, so cycles are refused here too.
  // Heights are memoised per container, which keeps shared sub-values linear.
  Status measure(const PickleValue& v, size_t depth, size_t& height) {
    height = 0;
    const void* node = nullptr;
    const std::vector<PickleValue>* children = nullptr;
    const PickleDict* dict = v.if_dict();
    if (const auto* t = std::get_if<std::shared_ptr<const PickleTuple>>(&v.v_)) {
      node = t->get();
      children = &(*t)->items;
    } else if (const auto* l = std::get_if<std::shared_ptr<PickleList>>(&v.v_)) {
      node = l->get();
      children = &(*l)->items;
    } else if (dict != nullptr) {
      node = dict;
    } else {
      return Status::success();
    }
    if (auto it = heights_.find(node); it != heights_.end()) {
      height = it->second;
      return Status::success();
    }
    KEV_CHECK(depth <= limits_.max_depth, ErrorCode::InvalidArtifact, "pickle result nests more than ",
              limits_.max_depth, " containers deep (or contains itself)");
    size_t deepest = 0;
    size_t h = 0;
    if (children != nullptr) {
      for (const PickleValue& c : *children) {
        KEV_TRY(measure(c, depth + 1, h));
        deepest = std::max(deepest, h);
      }
    } else {
      for (const auto& [key, value] : dict->entries()) {
        KEV_TRY(measure(value, depth + 1, h));
        deepest = std::max(deepest, h);
      }
    }
    height = deepest + 1;
    heights_.emplace(node, height);
    return Status::success();
  }

  std::span<const uint8_t> bytes_;
  const PickleHooks& hooks_;
  const PickleLimits& limits_;
  size_t pos_ = 0;
  size_t op_pos_ = 0;
  uint8_t op_ = 0;
  std::vector<PickleValue> stack_;
  std::vector<size_t> marks_;  // stack sizes at each open MARK
  std::unordered_map<uint64_t, PickleValue> memo_;
  std::vector<std::shared_ptr<PickleList>> lists_;
  std::vector<std::shared_ptr<PickleDict>> dicts_;
  std::unordered_map<const void*, size_t> heights_;
  std::unordered_set<const void*> reachable_;
};

Result<PickleValue> unpickle(std::span<const uint8_t> bytes, const PickleHooks& hooks, const PickleLimits& limits) {
  PickleMachine machine(bytes, hooks, limits);
  return machine.run();
}

}  // namespace kev
