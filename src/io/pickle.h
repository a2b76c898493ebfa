// A bounded, non-executing reader for the subset of Python's pickle format that torch.save writes
// (protocols 2-5 without out-of-band buffers): None, bools, 64-bit ints, floats, str, tuples, lists,
// dicts, references to globals, persistent ids and REDUCE/NEWOBJ/BUILD calls; bytes, sets and
// frozensets are read and kept only as opaque objects.
//
//   kev::PickleHooks hooks;                        // nothing allowed: every global is opaque
//   KEV_ASSIGN_OR_RETURN(kev::PickleValue v, kev::unpickle(bytes, hooks));
//   if (const kev::PickleDict* d = v.if_dict())
//     if (const kev::PickleValue* x = d->find("temperature")) ...
//
// Nothing is ever imported or called. A GLOBAL/STACK_GLOBAL that hooks.allow_global accepts becomes
// a PickleGlobal value, and REDUCE on it, BUILD and BINPERSID are handed to the caller's hooks, which
// build plain values (torch_checkpoint.h supplies hooks for tensors); without a hook those opcodes
// are an error that names what the pickle asked for. Any other global becomes an inert opaque
// object (Kind::Opaque) that records its qualified name: REDUCE, NEWOBJ and NEWOBJ_EX on it yield
// another opaque object of that name, and BUILD, APPEND(S) and SETITEM(S) on it drop what they
// add (list and dict subclasses such as defaultdict pickle that way), so files that carry arbitrary
// Python objects (argparse.Namespace, pathlib paths, numpy scalars) load, those values unusable.
//
// Contracts:
// - Values have Python's reference semantics: a list or dict fetched from the memo is the same
//   object, so later SETITEMS on it are visible everywhere. Values are cheap to copy.
// - Every read is checked against the remaining bytes; stack, mark and memo sizes, nesting depth
//   and dict key sizes are bounded (PickleLimits). A result never refers to itself and nests at
//   most limits.max_depth deep, so callers may walk it recursively. The arguments and state that
//   an opaque object swallows are parsed under the same bounds and then dropped.
// - Errors are ErrorCode::InvalidArtifact (or whatever a hook returns) and name the opcode and the
//   byte offset. Trailing bytes after STOP are ignored, as Python does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "kev/result.h"

namespace kev {

struct TorchStorage;  // torch_checkpoint.h
struct TorchTensor;   // torch_checkpoint.h
struct PickleTuple;
struct PickleList;
struct PickleOpaque;
class PickleDict;

// A reference to a Python global such as "collections"."OrderedDict". Holding one runs nothing.
struct PickleGlobal {
  std::string module;
  std::string name;
  std::string qualified() const { return module + "." + name; }
};

class PickleValue {
 public:
  enum class Kind { None, Bool, Int, Float, String, Tuple, List, Dict, Global, Storage, Tensor, Opaque };

  PickleValue() = default;  // None
  static PickleValue boolean(bool b);
  static PickleValue integer(int64_t i);
  static PickleValue real(double d);
  static PickleValue string(std::string s);
  static PickleValue tuple(std::vector<PickleValue> items);
  static PickleValue list(std::vector<PickleValue> items = {});
  // Fails on keys that cannot be dict keys here (see PickleDict::set).
  static Result<PickleValue> dict(std::vector<std::pair<PickleValue, PickleValue>> entries = {});
  static PickleValue global(PickleGlobal g);
  static PickleValue storage(std::shared_ptr<const TorchStorage> s);
  static PickleValue tensor(std::shared_ptr<const TorchTensor> t);
  // An object this reader does not represent, of the Python type `type` (e.g. "argparse.Namespace").
  static PickleValue opaque(std::string type);

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  // The Python-side type, for messages: "NoneType", "bool", "int", "float", "str", "tuple", "list",
  // "dict", "global", "storage", "tensor", or an opaque object's qualified type name.
  std::string type_name() const;

  bool is_none() const { return kind() == Kind::None; }
  // Each returns nullptr when the value is of another kind. if_int() is false for bools (pickle
  // keeps them apart, and a bool where a count belongs is a type error).
  const bool* if_bool() const { return std::get_if<bool>(&v_); }
  const int64_t* if_int() const { return std::get_if<int64_t>(&v_); }
  const double* if_float() const { return std::get_if<double>(&v_); }
  const std::string* if_string() const;
  const PickleGlobal* if_global() const;
  const PickleDict* if_dict() const;
  // The items of a tuple or of a list.
  const std::vector<PickleValue>* if_sequence() const;
  const std::vector<PickleValue>* if_tuple() const;
  const std::vector<PickleValue>* if_list() const;
  const std::shared_ptr<const TorchStorage>* if_storage() const;
  const std::shared_ptr<const TorchTensor>* if_tensor() const;
  const PickleOpaque* if_opaque() const;
  // An int or a float, as a double (ints are converted exactly up to 2^53).
  bool is_number() const { return kind() == Kind::Int || kind() == Kind::Float; }
  double number() const;

 private:
  friend class PickleMachine;
  using Variant = std::variant<std::monostate, bool, int64_t, double, std::shared_ptr<const std::string>,
                               std::shared_ptr<const PickleTuple>, std::shared_ptr<PickleList>,
                               std::shared_ptr<PickleDict>, std::shared_ptr<const PickleGlobal>,
                               std::shared_ptr<const TorchStorage>, std::shared_ptr<const TorchTensor>,
                               std::shared_ptr<const PickleOpaque>>;
  explicit PickleValue(Variant v) : v_(std::move(v)) {}
  Variant v_;
};

struct PickleTuple {
  std::vector<PickleValue> items;
  size_t tuple_depth = 1;  // 1 + the deepest tuple among items: bounds destructor recursion
};

struct PickleList {
  std::vector<PickleValue> items;
};

// What is left of an object the reader does not build: its type. Bytes are "builtins.bytes", sets
// "builtins.set" and "builtins.frozenset"; an unknown global and whatever is made from it carry the
// global's qualified name.
struct PickleOpaque {
  std::string type;
};

// An insertion-ordered dict (Python 3.7+ dicts and OrderedDict alike).
class PickleDict {
 public:
  // Longest accepted string key; longer keys make every lookup of them costly and no checkpoint has one.
  static constexpr size_t kMaxKeyBytes = 4096;

  const std::vector<std::pair<PickleValue, PickleValue>>& entries() const { return entries_; }
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  // The value under a str key, or nullptr.
  const PickleValue* find(std::string_view key) const;

  // Python semantics: a key equal to an existing one (1 == 1.0 == True) replaces that entry's value
  // in place. Keys must be None, bool, int, float or str of at most kMaxKeyBytes bytes.
  Status set(PickleValue key, PickleValue value);

 private:
  friend class PickleMachine;
  std::vector<std::pair<PickleValue, PickleValue>> entries_;
  std::unordered_map<std::string, size_t> index_;  // canonical key -> position in entries_
};

struct PickleLimits {
  size_t max_stack = size_t{1} << 16;  // values on the stack, all MARK frames together
  size_t max_marks = 256;              // open MARKs
  size_t max_memo = size_t{1} << 20;   // memo entries
  size_t max_depth = 64;               // container nesting of any value
};

// Caller policy for the opcodes that would run code in Python. Unset hooks refuse their opcode,
// except allow_global, whose absence makes every global opaque.
struct PickleHooks {
  // GLOBAL / STACK_GLOBAL: true pushes a PickleGlobal reference (whose REDUCE goes to `reduce`);
  // false pushes an opaque object named after it.
  std::function<bool(const PickleGlobal& g)> allow_global;
  // REDUCE on an allowed global: the value `callable(*args)` stands for. `args` is whatever the pickle put there (usually
  // a tuple); it may be deep or self-referencing, so inspect only the parts you need. The result may
  // hold a new list or dict only at its top level.
  std::function<Result<PickleValue>(const PickleGlobal& callable, const PickleValue& args)> reduce;
  // BUILD (obj.__setstate__(state)) on anything but an opaque object: ok leaves `object` as it is;
  // the state is not stored.
  std::function<Status(const PickleValue& object, const PickleValue& state)> build;
  // BINPERSID: the value a persistent id refers to (torch: a storage).
  std::function<Result<PickleValue>(const PickleValue& pid)> persistent_load;
};

Result<PickleValue> unpickle(std::span<const uint8_t> bytes, const PickleHooks& hooks, const PickleLimits& limits = {});

}  // namespace kev
