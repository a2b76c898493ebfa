// The pickle VM on hand-assembled opcode streams: every supported opcode, Python's reference
// semantics, opaque objects for unknown globals (and proof that nothing runs), and malformed or
// hostile input (truncation, underflow, cycles, deep nesting, limits).

#include "io/pickle.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "io/temp_dir.h"

namespace kev {
namespace {

// ---- a tiny pickle assembler ----

std::string le(uint64_t v, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return out;
}
std::string op(uint8_t o) { return std::string(1, static_cast<char>(o)); }
std::string proto(int v) { return op(0x80) + op(static_cast<uint8_t>(v)); }
std::string stop() { return "."; }
std::string mark() { return "("; }
std::string binint(int32_t v) { return "J" + le(static_cast<uint32_t>(v), 4); }
std::string binint1(uint8_t v) { return "K" + le(v, 1); }
std::string binint2(uint16_t v) { return "M" + le(v, 2); }
std::string long1(std::string_view le_bytes) { return op(0x8a) + le(le_bytes.size(), 1) + std::string(le_bytes); }
std::string binfloat(double d) {
  const uint64_t bits = std::bit_cast<uint64_t>(d);
  std::string out = "G";
  for (int i = 7; i >= 0; --i) out.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
  return out;
}
std::string unicode(std::string_view s) { return "X" + le(s.size(), 4) + std::string(s); }
std::string short_unicode(std::string_view s) { return op(0x8c) + le(s.size(), 1) + std::string(s); }
std::string unicode8(std::string_view s) { return op(0x8d) + le(s.size(), 8) + std::string(s); }
std::string global(std::string_view module, std::string_view name) {
  return "c" + std::string(module) + "\n" + std::string(name) + "\n";
}
std::string binput(uint8_t i) { return "q" + le(i, 1); }
std::string binget(uint8_t i) { return "h" + le(i, 1); }
const std::string kNone = "N", kTrue = op(0x88), kFalse = op(0x89), kEmptyTuple = ")", kEmptyList = "]",
                  kEmptyDict = "}", kAppend = "a", kAppends = "e", kSetItem = "s", kSetItems = "u", kTuple = "t",
                  kTuple1 = op(0x85), kTuple2 = op(0x86), kTuple3 = op(0x87), kReduce = "R", kBuild = "b",
                  kBinPersId = "Q", kMemoize = op(0x94), kStackGlobal = op(0x93), kPop = "0", kPopMark = "1";

Result<PickleValue> run(const std::string& bytes, const PickleHooks& hooks = {}, const PickleLimits& limits = {}) {
  return unpickle(std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), hooks, limits);
}

PickleValue ok(const std::string& bytes, const PickleHooks& hooks = {}) {
  Result<PickleValue> r = run(bytes, hooks);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? r.value() : PickleValue();
}

// The error's message, after checking it is InvalidArtifact.
std::string fails(const std::string& bytes, const PickleHooks& hooks = {}, const PickleLimits& limits = {}) {
  Result<PickleValue> r = run(bytes, hooks, limits);
  EXPECT_FALSE(r.ok());
  if (r.ok()) return "";
  EXPECT_EQ(r.status().code(), ErrorCode::InvalidArtifact) << r.status().to_string();
  return r.status().message();
}

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << "message: " << (haystack)

// ---- scalars ----

TEST(Pickle, Scalars) {
  EXPECT_TRUE(ok(proto(2) + kNone + stop()).is_none());
  EXPECT_EQ(*ok(proto(2) + kTrue + stop()).if_bool(), true);
  EXPECT_EQ(*ok(proto(2) + kFalse + stop()).if_bool(), false);
  EXPECT_EQ(ok(proto(2) + kTrue + stop()).if_int(), nullptr);  // a bool is not an int here
  EXPECT_EQ(*ok(proto(2) + binint1(200) + stop()).if_int(), 200);
  EXPECT_EQ(*ok(proto(2) + binint2(65535) + stop()).if_int(), 65535);
  EXPECT_EQ(*ok(proto(2) + binint(-123456789) + stop()).if_int(), -123456789);
  EXPECT_EQ(*ok(proto(2) + binint(std::numeric_limits<int32_t>::min()) + stop()).if_int(),
            std::numeric_limits<int32_t>::min());
  EXPECT_DOUBLE_EQ(*ok(proto(2) + binfloat(2.35) + stop()).if_float(), 2.35);
  EXPECT_TRUE(std::isinf(*ok(proto(2) + binfloat(-INFINITY) + stop()).if_float()));
  EXPECT_EQ(*ok(proto(2) + unicode("caf\xc3\xa9") + stop()).if_string(), "caf\xc3\xa9");
  EXPECT_EQ(*ok(proto(4) + short_unicode("abc") + stop()).if_string(), "abc");
  EXPECT_EQ(*ok(proto(4) + unicode8("") + stop()).if_string(), "");
  EXPECT_EQ(*ok(proto(4) + unicode8("long form") + stop()).if_string(), "long form");
}

TEST(Pickle, Long1) {
  EXPECT_EQ(*ok(proto(2) + long1("") + stop()).if_int(), 0);
  EXPECT_EQ(*ok(proto(2) + long1("\xff") + stop()).if_int(), -1);
  EXPECT_EQ(*ok(proto(2) + long1(std::string("\x00\x01", 2)) + stop()).if_int(), 256);
  EXPECT_EQ(*ok(proto(2) + long1(std::string("\x00\x00\x00\x00\x00\x80\x00", 7)) + stop()).if_int(), int64_t{1} << 47);
  EXPECT_EQ(*ok(proto(2) + long1(std::string("\x00\x00\x00\x00\x00\x00\xff", 7)) + stop()).if_int(),
            -(int64_t{1} << 48));
  EXPECT_EQ(*ok(proto(2) + long1(std::string("\x00\x00\x00\x00\x00\x00\x00\x80", 8)) + stop()).if_int(),
            std::numeric_limits<int64_t>::min());
  EXPECT_EQ(*ok(proto(2) + long1(std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8)) + stop()).if_int(),
            std::numeric_limits<int64_t>::max());
  EXPECT_CONTAINS(fails(proto(2) + long1(std::string(9, '\x01')) + stop()), "does not fit in 64 bits");
}

// ---- containers ----

TEST(Pickle, ListsTuplesDicts) {
  const PickleValue list =
      ok(proto(2) + kEmptyList + binint1(1) + kAppend + mark() + unicode("a") + kNone + kAppends + stop());
  ASSERT_NE(list.if_list(), nullptr);
  ASSERT_EQ(list.if_list()->size(), 3u);
  EXPECT_EQ(*(*list.if_list())[0].if_int(), 1);
  EXPECT_EQ(*(*list.if_list())[1].if_string(), "a");
  EXPECT_TRUE((*list.if_list())[2].is_none());
  EXPECT_EQ(list.if_tuple(), nullptr);
  EXPECT_EQ(list.if_sequence(), list.if_list());

  EXPECT_EQ(ok(proto(2) + kEmptyTuple + stop()).if_tuple()->size(), 0u);
  EXPECT_EQ(ok(proto(2) + binint1(1) + kTuple1 + stop()).if_tuple()->size(), 1u);
  EXPECT_EQ(ok(proto(2) + binint1(1) + binint1(2) + kTuple2 + stop()).if_tuple()->size(), 2u);
  const PickleValue t3 = ok(proto(2) + binint1(1) + binint1(2) + binint1(3) + kTuple3 + stop());
  ASSERT_EQ(t3.if_tuple()->size(), 3u);
  EXPECT_EQ(*(*t3.if_tuple())[2].if_int(), 3);
  const PickleValue t = ok(proto(2) + mark() + binint1(1) + binint1(2) + binint1(3) + binint1(4) + kTuple + stop());
  ASSERT_EQ(t.if_tuple()->size(), 4u);
  EXPECT_EQ(*(*t.if_tuple())[3].if_int(), 4);

  const PickleValue d =
      ok(proto(2) + kEmptyDict + unicode("b") + binint1(2) + kSetItem + mark() + unicode("a") + binint1(1) +
         unicode("nested") + kEmptyDict + unicode("x") + kNone + kSetItem + kSetItems + stop());
  const PickleDict* dict = d.if_dict();
  ASSERT_NE(dict, nullptr);
  ASSERT_EQ(dict->size(), 3u);
  EXPECT_EQ(*dict->entries()[0].first.if_string(), "b");  // insertion order
  EXPECT_EQ(*dict->entries()[1].first.if_string(), "a");
  EXPECT_EQ(*dict->find("a")->if_int(), 1);
  EXPECT_EQ(dict->find("zzz"), nullptr);
  ASSERT_NE(dict->find("nested")->if_dict(), nullptr);
  EXPECT_TRUE(dict->find("nested")->if_dict()->find("x")->is_none());
}

TEST(Pickle, DictKeysFollowPythonEquality) {
  // {1: "a", True: "b", 1.0: "c", None: "n", 2.5: "f"} is {1: "c", None: "n", 2.5: "f"} in Python.
  const PickleValue d =
      ok(proto(2) + kEmptyDict + mark() + binint1(1) + unicode("a") + kTrue + unicode("b") + binfloat(1.0) +
         unicode("c") + kNone + unicode("n") + binfloat(2.5) + unicode("f") + kSetItems + stop());
  const PickleDict* dict = d.if_dict();
  ASSERT_NE(dict, nullptr);
  ASSERT_EQ(dict->size(), 3u);
  EXPECT_EQ(*dict->entries()[0].first.if_int(), 1);  // the first key object stays
  EXPECT_EQ(*dict->entries()[0].second.if_string(), "c");
  EXPECT_TRUE(dict->entries()[1].first.is_none());
  EXPECT_DOUBLE_EQ(*dict->entries()[2].first.if_float(), 2.5);

  EXPECT_CONTAINS(fails(proto(2) + kEmptyDict + kEmptyList + binint1(1) + kSetItem + stop()),
                  "dict key of type list is not supported");
  EXPECT_CONTAINS(fails(proto(2) + kEmptyDict + unicode(std::string(PickleDict::kMaxKeyBytes + 1, 'k')) + kNone +
                        kSetItem + stop()),
                  "dict key of 4097 bytes");
}

TEST(Pickle, MemoHasReferenceSemantics) {
  // d = {}; memo it; fill it afterwards; the list [d, d] must show the filled dict twice (one object).
  const PickleValue v = ok(proto(2) + kEmptyList + kEmptyDict + binput(0) + unicode("k") + binint1(5) + kSetItem +
                           kAppend + binget(0) + kAppend + stop());
  const std::vector<PickleValue>& items = *v.if_list();
  ASSERT_EQ(items.size(), 2u);
  ASSERT_NE(items[0].if_dict(), nullptr);
  EXPECT_EQ(items[0].if_dict(), items[1].if_dict());
  EXPECT_EQ(*items[1].if_dict()->find("k")->if_int(), 5);

  // LONG_BINPUT/LONG_BINGET and MEMOIZE (which uses the memo's size as the index).
  const PickleValue w = ok(proto(4) + unicode("x") + "r" + le(70000, 4) + kMemoize + kPop + "j" + le(70000, 4) + "j" +
                           le(1, 4) + kTuple2 + stop());
  ASSERT_EQ(w.if_tuple()->size(), 2u);
  EXPECT_EQ(*(*w.if_tuple())[1].if_string(), "x");
  EXPECT_CONTAINS(fails(proto(2) + binget(3) + stop()), "memo entry 3 was never stored");
}

TEST(Pickle, FramePopAndTrailingBytes) {
  const std::string body = short_unicode("v") + kMemoize + stop();
  const PickleValue v = ok(proto(4) + op(0x95) + le(body.size(), 8) + body + "garbage after STOP");
  EXPECT_EQ(*v.if_string(), "v");
  EXPECT_CONTAINS(fails(proto(4) + op(0x95) + le(1000, 8) + body), "frame of 1000 bytes runs past the end");
  EXPECT_EQ(*ok(proto(2) + binint1(1) + binint1(2) + kPop + stop()).if_int(), 1);
  EXPECT_EQ(*ok(proto(2) + binint1(1) + mark() + binint1(2) + binint1(3) + kPopMark + stop()).if_int(), 1);
}

// ---- globals and the hooks ----

TEST(Pickle, GlobalsOffTheAllowListAreOpaque) {
  const PickleValue call = ok(proto(2) + global("os", "system") + unicode("echo hi") + kTuple1 + kReduce + stop());
  ASSERT_NE(call.if_opaque(), nullptr);
  EXPECT_EQ(call.kind(), PickleValue::Kind::Opaque);
  EXPECT_EQ(call.if_opaque()->type, "os.system");
  EXPECT_EQ(call.type_name(), "os.system");
  EXPECT_EQ(call.if_global(), nullptr);

  PickleHooks hooks;
  hooks.allow_global = [](const PickleGlobal& g) { return g.qualified() == "collections.OrderedDict"; };
  EXPECT_EQ(ok(proto(2) + global("builtins", "eval") + stop(), hooks).if_opaque()->type, "builtins.eval");
  EXPECT_EQ(ok(proto(4) + short_unicode("os") + short_unicode("system") + kStackGlobal + stop(), hooks).if_opaque()->type,
            "os.system");

  const PickleValue g =
      ok(proto(4) + short_unicode("collections") + short_unicode("OrderedDict") + kStackGlobal + stop(), hooks);
  ASSERT_NE(g.if_global(), nullptr);
  EXPECT_EQ(g.if_global()->module, "collections");
  EXPECT_EQ(g.if_global()->name, "OrderedDict");

  // Allowed as a reference, but calling it still needs a reduce hook.
  EXPECT_CONTAINS(fails(proto(2) + global("collections", "OrderedDict") + kEmptyTuple + kReduce + stop(), hooks),
                  "calls collections.OrderedDict; no calls are allowed here");
  hooks.reduce = [](const PickleGlobal&, const PickleValue& args) -> Result<PickleValue> {
    if (!args.if_tuple() || !args.if_tuple()->empty()) return Status(ErrorCode::InvalidArtifact, "bad args");
    return PickleValue::dict();
  };
  const PickleValue od = ok(proto(2) + global("collections", "OrderedDict") + kEmptyTuple + kReduce + binput(0) +
                                unicode("k") + kTrue + kSetItem + stop(),
                            hooks);
  ASSERT_NE(od.if_dict(), nullptr);
  EXPECT_EQ(*od.if_dict()->find("k")->if_bool(), true);
  EXPECT_CONTAINS(fails(proto(2) + unicode("f") + kEmptyTuple + kReduce + stop(), hooks),
                  "calls a value of type str, not a global");

  EXPECT_CONTAINS(fails(proto(2) + global("os", "sys\x01tem") + stop(), hooks), "malformed global name");
  EXPECT_CONTAINS(fails(proto(2) + "cos\n" + std::string(300, 'x') + "\n" + stop(), hooks), "longer than 256 bytes");
  EXPECT_CONTAINS(fails(proto(2) + "cos\nsystem", hooks), "not terminated by a newline");
}

TEST(Pickle, BuildAndPersistentIdNeedHooks) {
  EXPECT_CONTAINS(fails(proto(2) + kEmptyDict + kEmptyDict + kBuild + stop()),
                  "sets the state of a value of type dict");
  EXPECT_CONTAINS(fails(proto(2) + unicode("id") + kBinPersId + stop()), "persistent id; none are allowed");

  PickleHooks hooks;
  hooks.build = [](const PickleValue& object, const PickleValue&) {
    return object.if_dict() ? Status::success() : Status(ErrorCode::InvalidArtifact, "not a dict");
  };
  hooks.persistent_load = [](const PickleValue& pid) -> Result<PickleValue> {
    return PickleValue::string("loaded " + *pid.if_string());
  };
  EXPECT_TRUE(ok(proto(2) + kEmptyDict + kEmptyDict + kBuild + stop(), hooks).if_dict());
  EXPECT_CONTAINS(fails(proto(2) + kEmptyList + kEmptyDict + kBuild + stop(), hooks), "not a dict");
  EXPECT_EQ(*ok(proto(2) + unicode("7") + kBinPersId + stop(), hooks).if_string(), "loaded 7");
}

// ---- opaque objects ----

const std::string kNewObj = op(0x81), kNewObjEx = op(0x92), kEmptySet = op(0x8f), kAddItems = op(0x90),
                  kFrozenSet = op(0x91);

TEST(Pickle, CallsAndStateOnOpaqueObjectsStayOpaque) {
  // argparse.Namespace via copyreg.__newobj__ and a state dict, as protocol 2 writes it.
  const std::string ns = global("argparse", "Namespace") + kEmptyTuple + kNewObj + kEmptyDict + mark() + unicode("lr") +
                         binfloat(1e-4) + unicode("out") + global("pathlib", "PosixPath") + unicode("/") +
                         unicode("x") + kTuple2 + kReduce + kSetItems + kBuild;
  const PickleValue v = ok(proto(2) + ns + stop());
  ASSERT_NE(v.if_opaque(), nullptr);
  EXPECT_EQ(v.if_opaque()->type, "argparse.Namespace");

  // NEWOBJ_EX(cls, args, kwargs), and BUILD with a (dict, slots) state.
  const PickleValue ex = ok(proto(4) + global("m", "C") + kEmptyTuple + kEmptyDict + kNewObjEx + kNone + kEmptyDict +
                            kTuple2 + kBuild + stop());
  EXPECT_EQ(ex.if_opaque()->type, "m.C");

  // An opaque object inside plain containers leaves them intact.
  const PickleValue d =
      ok(proto(2) + kEmptyDict + unicode("args") + ns + kSetItem + unicode("k") + binint1(3) + kSetItem + stop());
  EXPECT_EQ(d.if_dict()->find("args")->type_name(), "argparse.Namespace");
  EXPECT_EQ(*d.if_dict()->find("k")->if_int(), 3);

  // Dict and list subclasses (defaultdict(list, {"a": [1]})) add their items after REDUCE.
  const PickleValue dd = ok(proto(2) + global("collections", "defaultdict") + global("builtins", "list") + kTuple1 +
                            kReduce + unicode("a") + kEmptyList + binint1(1) + kAppend + kSetItem + mark() +
                            unicode("b") + kNone + kSetItems + stop());
  EXPECT_EQ(dd.type_name(), "collections.defaultdict");
  EXPECT_EQ(ok(proto(2) + global("m", "L") + kEmptyTuple + kNewObj + binint1(1) + kAppend + mark() + kNone +
               kAppends + stop())
                .type_name(),
            "m.L");

  // Only opaque classes can be instantiated: an allowed global still needs the reduce hook.
  PickleHooks hooks;
  hooks.allow_global = [](const PickleGlobal&) { return true; };
  EXPECT_CONTAINS(fails(proto(2) + global("collections", "OrderedDict") + kEmptyTuple + kNewObj + stop(), hooks),
                  "creates an object of collections.OrderedDict; not allowed here");
  EXPECT_CONTAINS(fails(proto(2) + unicode("s") + kEmptyTuple + kNewObj + stop()), "creates an object of str");
  EXPECT_CONTAINS(fails(proto(4) + global("m", "C") + kEmptyTuple + kNewObjEx + stop()), "needs 3 values");
  // Arguments are parsed with every bound: a truncation in them still fails.
  EXPECT_CONTAINS(fails(proto(2) + global("m", "f") + kEmptyList + "X" + le(100, 4) + "ab"), "truncated?");
}

TEST(Pickle, BytesSetsAndLong4) {
  EXPECT_EQ(ok(proto(3) + "C" + le(3, 1) + "abc" + stop()).type_name(), "builtins.bytes");
  EXPECT_EQ(ok(proto(3) + "B" + le(2, 4) + "ab" + stop()).type_name(), "builtins.bytes");
  EXPECT_EQ(ok(proto(4) + op(0x8e) + le(1, 8) + "a" + stop()).type_name(), "builtins.bytes");
  EXPECT_CONTAINS(fails(proto(3) + "B" + le(0xffffffffu, 4) + "ab" + stop()), "needs 4294967295 more bytes");
  EXPECT_CONTAINS(fails(proto(4) + op(0x8e) + le(uint64_t{1} << 62, 8) + stop()), "more bytes");

  EXPECT_EQ(ok(proto(4) + kEmptySet + mark() + binint1(1) + unicode("a") + kAddItems + stop()).type_name(),
            "builtins.set");
  EXPECT_EQ(ok(proto(4) + mark() + binint1(1) + kFrozenSet + stop()).type_name(), "builtins.frozenset");
  EXPECT_CONTAINS(fails(proto(4) + kEmptyList + mark() + binint1(1) + kAddItems + stop()),
                  "adds items to a value of type list, not a set");
  EXPECT_CONTAINS(fails(proto(4) + kEmptySet + kAddItems + stop()), "no MARK to pop to");

  EXPECT_EQ(*ok(proto(2) + op(0x8b) + le(2, 4) + std::string("\x00\x01", 2) + stop()).if_int(), 256);
  EXPECT_EQ(*ok(proto(2) + op(0x8b) + le(1, 4) + "\xff" + stop()).if_int(), -1);
  EXPECT_CONTAINS(fails(proto(2) + op(0x8b) + le(0xffffffffu, 4) + stop()), "4294967295 bytes does not fit in 64 bits");

  // Opaque keys are told apart by identity; the dict stays usable.
  const PickleValue keyed = ok(proto(4) + kEmptyDict + mark() + "C" + le(1, 1) + "k" + binint1(1) + "C" + le(1, 1) +
                               "k" + binint1(2) + unicode("s") + binint1(3) + kSetItems + stop());
  ASSERT_EQ(keyed.if_dict()->size(), 3u);
  EXPECT_EQ(*keyed.if_dict()->find("s")->if_int(), 3);
}

TEST(Pickle, NothingIsExecuted) {
  testing::TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::filesystem::path marker = dir.path("marker");
  const std::string command = "touch " + marker.string();
  // os.system(command) through GLOBAL, and builtins.exec / subprocess.call through STACK_GLOBAL.
  const std::string calls =
      proto(4) + mark() + global("os", "system") + unicode(command) + kTuple1 + kReduce + short_unicode("builtins") +
      short_unicode("exec") + kStackGlobal + unicode("open('" + marker.string() + "', 'w')") + kTuple1 + kReduce +
      short_unicode("subprocess") + short_unicode("call") + kStackGlobal + unicode("touch") + unicode(marker.string()) +
      kTuple2 + kTuple1 + kReduce + kTuple + stop();
  PickleHooks allow_everything;  // even an allowed global only reaches the caller's (unset) reduce hook
  allow_everything.allow_global = [](const PickleGlobal&) { return true; };
  const PickleValue v = ok(calls);
  ASSERT_NE(v.if_tuple(), nullptr);
  ASSERT_EQ(v.if_tuple()->size(), 3u);
  EXPECT_EQ((*v.if_tuple())[0].type_name(), "os.system");
  EXPECT_EQ((*v.if_tuple())[1].type_name(), "builtins.exec");
  EXPECT_EQ((*v.if_tuple())[2].type_name(), "subprocess.call");
  EXPECT_CONTAINS(fails(calls, allow_everything), "calls os.system; no calls are allowed here");
  EXPECT_FALSE(std::filesystem::exists(marker)) << marker << " was created: the pickle ran code";
}

// ---- malformed input ----

TEST(Pickle, EveryTruncationFails) {
  const std::string full = proto(2) + kEmptyDict + binput(0) + mark() + unicode("a") + binint(-5) + unicode("b") +
                           binfloat(0.5) + unicode("c") + mark() + binint1(1) + long1("\x01\x02") + kTuple +
                           unicode("d") + kEmptyList + binput(1) + binint2(7) + kAppend + kSetItems + stop();
  ASSERT_TRUE(run(full).ok());
  for (size_t n = 0; n < full.size(); ++n) {
    Result<PickleValue> r = run(full.substr(0, n));
    EXPECT_FALSE(r.ok()) << "prefix of " << n << " bytes";
    EXPECT_EQ(r.status().code(), ErrorCode::InvalidArtifact);
  }
  EXPECT_CONTAINS(fails(""), "without STOP");
  EXPECT_CONTAINS(fails(proto(2) + "X" + le(0xffffffffu, 4) + "abc" + stop()),
                  "needs 4294967295 more bytes but the pickle has 4 left");
  EXPECT_CONTAINS(fails(proto(4) + op(0x8d) + le(uint64_t{1} << 62, 8) + stop()), "more bytes");
}

TEST(Pickle, StackDisciplineIsChecked) {
  EXPECT_CONTAINS(fails(proto(2) + stop()), "needs 1 values on the stack but 0");
  EXPECT_CONTAINS(fails(proto(2) + kAppend + stop()), "needs 2 values");
  EXPECT_CONTAINS(fails(proto(2) + kEmptyList + kAppends + stop()), "no MARK to pop to");
  // Items below a MARK are out of reach until it is popped, as in Python.
  EXPECT_CONTAINS(fails(proto(2) + kEmptyDict + unicode("k") + mark() + binint1(1) + kSetItem + stop()),
                  "needs 3 values");
  EXPECT_CONTAINS(fails(proto(2) + kEmptyDict + mark() + unicode("k") + kSetItems + stop()),
                  "has 1 values, not key/value pairs");
  EXPECT_CONTAINS(fails(proto(2) + binint1(1) + binint1(2) + kAppend + stop()),
                  "appends to a value of type int, not a list");
  EXPECT_CONTAINS(fails(proto(2) + kEmptyList + unicode("k") + binint1(1) + kSetItem + stop()),
                  "sets an item on a value of type list, not a dict");
  EXPECT_CONTAINS(fails(proto(6) + kNone + stop()), "pickle protocol 6 is newer than 5");
}

TEST(Pickle, UnknownAndUnsupportedOpcodesAreNamed) {
  EXPECT_CONTAINS(fails(proto(2) + op(0xff) + stop()), "(0xff) at byte 2: not a pickle opcode");
  EXPECT_CONTAINS(fails(proto(2) + kEmptyTuple + op(0x81) + stop()), "NEWOBJ (0x81) at byte 3");
  EXPECT_CONTAINS(fails(proto(2) + "I42\n" + stop()), "INT (0x49)");
  EXPECT_CONTAINS(fails(proto(5) + op(0x97) + stop()), "NEXT_BUFFER (0x97)");
}

TEST(Pickle, SelfReferenceIsRefused) {
  // l = []; l.append(l)
  EXPECT_CONTAINS(fails(proto(2) + kEmptyList + binput(0) + binget(0) + kAppend + stop()), "contains itself");
  // d = {}; d["d"] = (d,)
  EXPECT_CONTAINS(fails(proto(2) + kEmptyDict + binput(0) + unicode("d") + binget(0) + kTuple1 + kSetItem + stop()),
                  "contains itself");
  // A cycle left behind in the memo while the result is a plain int must be freed too (ASan checks).
  EXPECT_EQ(*ok(proto(2) + kEmptyList + binput(0) + binget(0) + kAppend + kPop + binint1(9) + stop()).if_int(), 9);
}

TEST(Pickle, DeepNestingIsRefusedWithoutExhaustingTheStack) {
  std::string tuples = proto(2) + kNone;
  for (int i = 0; i < 100000; ++i) tuples += kTuple1;
  EXPECT_CONTAINS(fails(tuples + stop()), "tuples nest more than 64 deep");

  std::string lists = proto(2);
  for (int i = 0; i < 60000; ++i) lists += kEmptyList;
  for (int i = 0; i < 59999; ++i) lists += kAppend;
  EXPECT_CONTAINS(fails(lists + stop()), "nests more than 64 containers deep");
  // The same chain as garbage next to a flat result is freed without deep recursion.
  EXPECT_TRUE(ok(lists + kPop + kNone + stop()).is_none());

  // A chain built through the memo: l_i = [] ; l_{i-1}.append(l_i) with only two values on the stack.
  std::string memo_chain = proto(2) + kEmptyList + binput(0);
  for (int i = 0; i < 20000; ++i) memo_chain += kEmptyList + "r" + le(1, 4) + kAppend + kPop + "j" + le(1, 4);
  EXPECT_CONTAINS(fails(memo_chain + kPop + binget(0) + stop()), "nests more than 64 containers deep");

  // Exactly at the limit is fine.
  std::string at_limit = proto(2);
  for (int i = 0; i < 64; ++i) at_limit += kEmptyList;
  for (int i = 0; i < 63; ++i) at_limit += kAppend;
  EXPECT_TRUE(ok(at_limit + stop()).if_list());
  EXPECT_CONTAINS(fails(proto(2) + kEmptyList + at_limit.substr(2) + kAppend + stop()), "nests more than 64");
}

TEST(Pickle, LimitsAreEnforced) {
  PickleLimits small;
  small.max_stack = 4;
  small.max_marks = 2;
  small.max_memo = 2;
  EXPECT_CONTAINS(fails(proto(2) + kNone + kNone + kNone + kNone + kNone + stop(), {}, small),
                  "stack holds more than 4 values");
  EXPECT_CONTAINS(fails(proto(2) + mark() + mark() + mark() + stop(), {}, small), "more than 2 open MARKs");
  EXPECT_CONTAINS(fails(proto(2) + kNone + binput(0) + binput(1) + binput(2) + stop(), {}, small),
                  "memo holds more than 2 values");
  EXPECT_TRUE(run(proto(2) + kNone + binput(0) + binput(1) + binput(1) + binput(0) + stop(), {}, small).ok());
}

}  // namespace
}  // namespace kev
