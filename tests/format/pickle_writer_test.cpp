// The pickle writer against the strict reader: every value kind, integers at each encoding's edges, the memo.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "oomflight/format/pickle.hpp"
#include "oomflight/format/pickle_writer.hpp"

namespace oomflight::pickle {
namespace {

TEST(PickleWriter, IntegersAtEveryEncodingsEdgeReadBackExactly) {
  const std::vector<std::int64_t> values = {0, 1, 255, 256, 65535, 65536, -1, -128, -129, INT32_MAX,
                                            std::int64_t{INT32_MAX} + 1, INT32_MIN, std::int64_t{INT32_MIN} - 1,
                                            std::int64_t{1} << 40, -(std::int64_t{1} << 40),
                                            std::numeric_limits<std::int64_t>::max(),
                                            std::numeric_limits<std::int64_t>::min()};
  Writer w;
  w.begin_list();
  for (const auto v : values) w.integer(v);
  w.end_list();
  const Document doc = Document::parse(w.finish());
  ASSERT_EQ(doc.root().kind, Kind::list);
  ASSERT_EQ(doc.root().items.size(), values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(doc.root().items[i]->integer, values[i]) << "value " << i;
  }
}

// Device addresses and byte counts are uint64: those above 2^63 are a 9-byte LONG1, which the reader keeps.
TEST(PickleWriter, UnsignedAbove2To63ReadsBackAsItsUnsignedValue) {
  Writer w;
  w.begin_list();
  w.unsigned_integer(~std::uint64_t{0});
  w.unsigned_integer(std::uint64_t{1} << 63);
  w.unsigned_integer(42);
  w.end_list();
  const Document doc = Document::parse(w.finish());
  ASSERT_EQ(doc.root().items.size(), 3u);
  EXPECT_TRUE(doc.root().items[0]->above_int64);
  EXPECT_EQ(static_cast<std::uint64_t>(doc.root().items[0]->integer), ~std::uint64_t{0});
  EXPECT_EQ(static_cast<std::uint64_t>(doc.root().items[1]->integer), std::uint64_t{1} << 63);
  EXPECT_FALSE(doc.root().items[2]->above_int64);
  EXPECT_EQ(doc.root().items[2]->integer, 42);
}

TEST(PickleWriter, DictsListsStringsBooleansTuplesAndTheMemo) {
  Writer w;
  w.begin_dict();
  w.key("name");
  w.string(std::string(300, 'x'));  // BINUNICODE, past SHORT_BINUNICODE's 255
  w.key("flags");
  w.begin_list();
  w.boolean(true);
  w.boolean(false);
  w.none();
  w.end_list();
  w.key("pool");
  w.integer(0);
  w.integer(7);
  w.tuple2();
  w.key("empty");
  w.begin_list();
  w.end_list();
  w.key("shared");
  w.begin_list();
  w.begin_dict();
  w.key("line");
  w.integer(3);
  w.end_dict();
  const auto memo = w.memoize();
  w.get(memo);
  w.end_list();
  w.end_dict();
  const Document doc = Document::parse(w.finish());
  const Value& root = doc.root();
  ASSERT_EQ(root.kind, Kind::dict);
  EXPECT_EQ(root.get("name")->text, std::string(300, 'x'));
  const Value* flags = root.get("flags");
  ASSERT_EQ(flags->items.size(), 3u);
  EXPECT_TRUE(flags->items[0]->boolean);
  EXPECT_FALSE(flags->items[1]->boolean);
  EXPECT_EQ(flags->items[2]->kind, Kind::none);
  EXPECT_EQ(root.get("pool")->kind, Kind::tuple);
  EXPECT_EQ(root.get("pool")->items[1]->integer, 7);
  EXPECT_EQ(root.get("empty")->items.size(), 0u);
  const Value* shared = root.get("shared");
  ASSERT_EQ(shared->items.size(), 2u);
  EXPECT_EQ(shared->items[0], shared->items[1]);  // one dict, referred to twice
}

// write_value gives back what the reader read, kind for kind: a snapshot's top-level fields travel this way.
TEST(PickleWriter, WriteValueGivesBackEveryKindTheReaderKnows) {
  Writer w;
  w.begin_dict();
  w.key("float");
  w.floating(0.8);
  w.key("zero");
  w.floating(-0.0);
  w.key("bytes");
  w.bytes(std::string_view("\x00\xff", 2));
  w.key("long bytes");
  w.bytes(std::string(300, 'b'));
  w.key("none");
  w.none();
  w.key("tuple");
  w.begin_tuple();
  w.integer(1);
  w.begin_tuple();
  w.end_tuple();
  w.string("three");
  w.end_tuple();
  w.key("set");
  w.begin_set();
  w.integer(7);
  w.end_set();
  w.key("frozenset");
  w.begin_tuple();
  w.integer(8);
  w.end_frozenset();
  w.key("big");
  w.unsigned_integer(~std::uint64_t{0});
  w.end_dict();
  const Document first = Document::parse(w.finish());
  Writer again;
  write_value(again, first.root());
  const Document second = Document::parse(again.finish());
  const Value& r = second.root();
  ASSERT_EQ(r.kind, Kind::dict);
  EXPECT_EQ(r.get("float")->floating, 0.8);
  EXPECT_TRUE(std::signbit(r.get("zero")->floating));
  EXPECT_EQ(r.get("bytes")->kind, Kind::bytes);
  EXPECT_EQ(r.get("bytes")->text, std::string_view("\x00\xff", 2));
  EXPECT_EQ(r.get("long bytes")->text.size(), 300u);
  EXPECT_EQ(r.get("none")->kind, Kind::none);
  const Value& t = *r.get("tuple");
  ASSERT_EQ(t.kind, Kind::tuple);
  ASSERT_EQ(t.items.size(), 3u);
  EXPECT_EQ(t.items[1]->kind, Kind::tuple);
  EXPECT_TRUE(t.items[1]->items.empty());
  EXPECT_EQ(t.items[2]->text, "three");
  EXPECT_EQ(r.get("set")->kind, Kind::set);
  EXPECT_EQ(r.get("frozenset")->kind, Kind::frozenset);
  EXPECT_EQ(r.get("frozenset")->items[0]->integer, 8);
  EXPECT_TRUE(r.get("big")->above_int64);
}

TEST(PickleWriter, MisuseIsALogicError) {
  Writer w;
  EXPECT_THROW(w.end_dict(), std::logic_error);
  w.begin_dict();
  w.key("dangling");
  EXPECT_THROW(w.end_dict(), std::logic_error);
  Writer open;
  open.begin_list();
  EXPECT_THROW(open.finish(), std::logic_error);
}

}  // namespace
}  // namespace oomflight::pickle
