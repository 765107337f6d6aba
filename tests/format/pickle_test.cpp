// The strict pickle reader: real snapshots, hand-made pickles of each protocol, and hostile input.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "oomflight/format/pickle.hpp"
#include "test_support.hpp"

namespace oomflight::pickle {
namespace {

std::string bytes(std::initializer_list<int> b) {
  std::string s;
  for (int c : b) s += static_cast<char>(c);
  return s;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string error_of(const std::string& data, const Limits& limits = {}) {
  try {
    Document::parse(data, limits);
  } catch (const PickleError& e) {
    return e.what();
  }
  return "";
}

void expect_snapshot_document(const std::string& path) {
  const Document doc = read_pickle_file(path);
  ASSERT_TRUE(doc.root().is(Kind::dict)) << path;
  ASSERT_NE(doc.root().get("segments"), nullptr) << path;
  ASSERT_NE(doc.root().get("device_traces"), nullptr) << path;
}

TEST(Pickle, ReadsTheProjectsOwnSnapshot) { expect_snapshot_document(test::own_snapshot()); }

TEST(Pickle, ReadsEverySharedSnapshot) {
  OOMFLIGHT_SHARED_SNAPSHOT_OR_SKIP(cnn, "cnn-train-eor.pickle");
  OOMFLIGHT_SHARED_SNAPSHOT_OR_SKIP(forward, "transformer-lm-forward-mixed-ctx128.pickle");
  OOMFLIGHT_SHARED_SNAPSHOT_OR_SKIP(fullstep, "transformer-lm-fullstep-ctx128.pickle");
  for (const std::string& path : {cnn, forward, fullstep}) expect_snapshot_document(path);
}

// {"a": [1, -2, 300, 70000, 2**40, 1.5, True, None, "é", b"x"], "t": (1, 2)} by hand, protocol 2 style
// (BINPUT memo, as PyTorch's C++ pickler writes).
TEST(Pickle, ReadsProtocolTwoValues) {
  std::string p = bytes({0x80, 2, '}', 'q', 0, '(', 'X', 1, 0, 0, 0, 'a', ']', 'q', 1, '(', 'K', 1, 'J'});
  p += bytes({0xfe, 0xff, 0xff, 0xff, 'M', 0x2c, 0x01, 'J', 0x70, 0x11, 0x01, 0x00});
  p += bytes({0x8a, 6, 0, 0, 0, 0, 0, 1, 'G', 0x3f, 0xf8, 0, 0, 0, 0, 0, 0, 0x88, 'N'});
  p += bytes({'X', 2, 0, 0, 0, 0xc3, 0xa9, 'C', 1, 'x', 'e', 'X', 1, 0, 0, 0, 't', 'K', 1, 'K', 2, 0x86, 'u', '.'});
  const Document doc = Document::parse(p);
  const Value& a = *doc.root().get("a");
  ASSERT_EQ(a.size(), 10u);
  EXPECT_EQ(a.items[0]->integer, 1);
  EXPECT_EQ(a.items[1]->integer, -2);
  EXPECT_EQ(a.items[2]->integer, 300);
  EXPECT_EQ(a.items[3]->integer, 70000);
  EXPECT_EQ(a.items[4]->integer, std::int64_t{1} << 40);
  EXPECT_DOUBLE_EQ(a.items[5]->floating, 1.5);
  EXPECT_TRUE(a.items[6]->boolean);
  EXPECT_TRUE(a.items[7]->is(Kind::none));
  EXPECT_EQ(a.items[8]->text, "\xc3\xa9");
  EXPECT_TRUE(a.items[9]->is(Kind::bytes));
  const Value& t = *doc.root().get("t");
  ASSERT_TRUE(t.is(Kind::tuple));
  EXPECT_EQ(t.items[1]->integer, 2);
}

// Protocol 5 framing with MEMOIZE and BINGET sharing one string.
TEST(Pickle, ReadsProtocolFiveWithMemo) {
  std::string p = bytes({0x80, 5, 0x95, 13, 0, 0, 0, 0, 0, 0, 0, ']', 0x94, '(', 0x8c, 2, 'h', 'i', 0x94});
  p += bytes({'h', 1, 'e', '.'});
  const Document doc = Document::parse(p);
  ASSERT_EQ(doc.root().size(), 2u);
  EXPECT_EQ(doc.root().items[0], doc.root().items[1]);  // the memo shares the value
  EXPECT_EQ(doc.root().items[1]->text, "hi");
}

TEST(Pickle, NegativeLongs) {
  const Document doc = Document::parse(bytes({0x80, 4, 0x8a, 2, 0x00, 0xff, '.'}));
  EXPECT_EQ(doc.root().integer, -256);
}

TEST(Pickle, RefusesEveryCodeLoadingOpcodeByName) {
  const std::vector<std::pair<int, std::string>> ops = {
      {'c', "GLOBAL"}, {0x93, "STACK_GLOBAL"}, {'R', "REDUCE"}, {'b', "BUILD"},      {'i', "INST"},
      {'o', "OBJ"},    {0x81, "NEWOBJ"},       {0x92, "NEWOBJ_EX"}, {0x82, "EXT1"}, {'Q', "BINPERSID"}};
  for (const auto& [op, name] : ops) {
    const std::string message = error_of(bytes({0x80, 4, op, '.'}));
    EXPECT_NE(message.find("opcode " + name), std::string::npos) << message;
    EXPECT_NE(message.find("at offset 2"), std::string::npos) << message;
  }
  // The classic exploit: os.system("echo pwned").
  const std::string exploit = "\x80\x02" "cposix\nsystem\nq\x00X\x0a\x00\x00\x00echo pwnedq\x01\x85q\x02Rq\x03.";
  EXPECT_NE(error_of(exploit).find("GLOBAL"), std::string::npos);
}

TEST(Pickle, RefusesUnknownOpcodesAndProtocols) {
  EXPECT_NE(error_of(bytes({0x80, 4, 0xf0, '.'})).find("unsupported pickle opcode 0xf0"), std::string::npos);
  EXPECT_NE(error_of(bytes({0x80, 9, '.'})).find("protocol 9"), std::string::npos);
  EXPECT_NE(error_of(bytes({'I', '1', '\n', '.'})).find("a protocol 0 or 1 pickle"), std::string::npos);
}

TEST(Pickle, NamesTheFormatsPeopleMistakeForSnapshots) {
  EXPECT_NE(error_of(std::string("PK\x03\x04rest of a torch.save zip", 30)).find("torch.save's format"),
            std::string::npos);
  EXPECT_NE(error_of(bytes({0x1f, 0x8b, 8, 0, 0, 0})).find("a gzip file"), std::string::npos);
  EXPECT_NE(error_of(bytes({'(', 'l', 'p', '0', '\n', '.'})).find("protocol 0 or 1"), std::string::npos);
}

TEST(Pickle, TruncatedSnapshotsFailCleanly) {
  const std::string full = read_file(test::own_snapshot());
  ASSERT_NO_THROW(Document::parse(full));
  for (std::size_t cut : {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{11}, std::size_t{100},
                          full.size() / 3, full.size() / 2, full.size() - 2, full.size() - 1}) {
    EXPECT_THROW(Document::parse(full.substr(0, cut)), PickleError) << "cut at " << cut;
  }
}

TEST(Pickle, DeepNestingIsRefused) {
  std::string p = bytes({0x80, 4});
  for (int i = 0; i < 5000; ++i) p += ']';
  for (int i = 0; i < 4999; ++i) p += 'a';
  p += '.';
  EXPECT_NE(error_of(p).find("nesting deeper than 1000"), std::string::npos);
}

TEST(Pickle, HugeLengthsAreRefusedWithoutAllocating) {
  EXPECT_NE(error_of(bytes({0x80, 4, 0x8d, 0, 0, 0, 0, 0, 0, 0, 0x40, '.'})).find("runs past the end"),
            std::string::npos);  // BINUNICODE8 of 2^62 bytes
  EXPECT_NE(error_of(bytes({0x80, 4, 0x8b, 0xff, 0xff, 0xff, 0x7f, '.'})).find("runs past the end"),
            std::string::npos);  // LONG4 of 2^31 bytes
  EXPECT_NE(error_of(bytes({0x80, 4, 'j', 0xff, 0xff, 0xff, 0xff, '.'})).find("memo index"), std::string::npos);
  EXPECT_NE(error_of(bytes({0x80, 4, 'N', 'r', 0xff, 0xff, 0xff, 0x7f, '.'})).find("memo index"), std::string::npos);
  EXPECT_NE(error_of(bytes({0x80, 4, 0x8a, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9, '.'})).find("wider than 64 bits"),
            std::string::npos);
}

TEST(Pickle, StackMisuseIsAnError) {
  EXPECT_NE(error_of(bytes({0x80, 4, 'a', '.'})).find("stack underflow"), std::string::npos);
  EXPECT_NE(error_of(bytes({0x80, 4, 'e', '.'})).find("no MARK"), std::string::npos);
  EXPECT_NE(error_of(bytes({0x80, 4, 'N', 'N', '.'})).find("STOP with 2 values"), std::string::npos);
  EXPECT_NE(error_of(bytes({0x80, 4, 'N', 'N', 'a', '.'})).find("APPEND on a value that is not a list"),
            std::string::npos);
  EXPECT_NE(error_of("").find("ends without STOP"), std::string::npos);
}

// l = []; l.append(l), and its SETITEM, APPENDS and ADDITEMS forms.
TEST(Pickle, ContainerAddedToItselfIsRefused) {
  for (const std::string& p : {bytes({0x80, 4, ']', 0x94, 'h', 0, 'a', '.'}),
                               bytes({0x80, 4, '}', 0x94, 'K', 1, 'h', 0, 's', '.'}),
                               bytes({0x80, 4, ']', 0x94, '(', 'K', 1, 'h', 0, 'e', '.'}),
                               bytes({0x80, 4, 0x8f, 0x94, '(', 'h', 0, 0x90, '.'}), bytes({0x80, 4, ']', '2', 'a', '.'})}) {
    EXPECT_NE(error_of(p).find("a container added to itself"), std::string::npos) << error_of(p);
  }
}

// l = [m], m = [l], built as Python's pickler would: m is filled first, then placed in l.
TEST(Pickle, ContainerAddedToItsAncestorIsRefused) {
  EXPECT_NE(error_of(bytes({0x80, 4, ']', 0x94, ']', 0x94, 'h', 0, 'a', 'a', '.'})).find("ancestors (a cycle)"),
            std::string::npos);
  // Three levels: a = [b], b = [c], c = [a].
  const std::string three = bytes({0x80, 4, ']', 0x94, ']', 0x94, ']', 0x94, 'h', 0, 'a', 'a', 'a', '.'});
  EXPECT_NE(error_of(three).find("ancestors (a cycle)"), std::string::npos) << error_of(three);
  // Shared but acyclic: [x, x] with x = [1] reads, and both slots are one value.
  const Document doc = Document::parse(bytes({0x80, 4, ']', '(', ']', 0x94, 'K', 1, 'a', 'h', 0, 'e', '.'}));
  ASSERT_EQ(doc.root().size(), 2u);
  EXPECT_EQ(doc.root().items[0], doc.root().items[1]);
  EXPECT_EQ(doc.root().depth, 2);
}

// a = [b]; then b grows: not a cycle, but no pickler writes it, and it would make depths stale.
TEST(Pickle, ContainerGrowingDeeperAfterPlacementIsRefused) {
  const std::string p = bytes({0x80, 4, ']', ']', 0x94, 'a', 'h', 0, ']', 'a', '0', '.'});
  EXPECT_NE(error_of(p).find("grows deeper after it was placed"), std::string::npos) << error_of(p);
}

TEST(Pickle, ValueAndMemoryLimitsAreNamed) {
  std::string p = bytes({0x80, 4, ']', '('});
  for (int i = 0; i < 100; ++i) p += ']';
  p += bytes({'e', '.'});
  ASSERT_EQ(Document::parse(p).value_count(), 101u);
  Limits few;
  few.max_values = 50;
  EXPECT_NE(error_of(p, few).find("more than 50 values (Limits::max_values) at offset 53"), std::string::npos)
      << error_of(p, few);
  Limits small;
  small.max_memory_bytes = 4096;
  EXPECT_NE(error_of(p, small).find("more than 4096 bytes of memory (Limits::max_memory_bytes)"),
            std::string::npos)
      << error_of(p, small);
  // The memo is charged too: a LONG_BINPUT at index 4096 takes 32 KiB, more than this limit leaves.
  std::string memo = bytes({0x80, 4, 'N', 'r', 0x00, 0x10, 0x00, 0x00});
  memo += std::string(5000, 'N') + std::string(5000, '0') + ".";
  ASSERT_NO_THROW(Document::parse(memo));
  Limits tight;
  tight.max_memory_bytes = 30000;
  // Charged at the LONG_BINPUT, offset 3, before the memo grows.
  EXPECT_NE(error_of(memo, tight).find("(Limits::max_memory_bytes); a PyTorch snapshot needs about 7 times its "
                                       "file size at offset 3"),
            std::string::npos)
      << error_of(memo, tight);
}

TEST(Pickle, RealSnapshotsFitTheDefaultLimitsWithRoom) {
  const std::string full = read_file(test::own_snapshot());
  const Document doc = Document::parse(full);
  // About one value per 25 bytes of pickle, and a few times the file in memory: the defaults leave a factor
  // of hundreds.
  std::printf("%zu bytes: %zu values, %zu bytes decoded\n", full.size(), doc.value_count(), doc.memory_bytes());
  EXPECT_GT(doc.value_count(), full.size() / 40);
  EXPECT_LT(doc.value_count() * 100, Limits{}.max_values);
  EXPECT_GT(doc.memory_bytes(), full.size());
  EXPECT_LT(doc.memory_bytes() * 100, Limits{}.max_memory_bytes);
}

TEST(Pickle, MissingFileNamesThePath) {
  try {
    read_pickle_file("/nonexistent/snapshot.pickle");
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/snapshot.pickle"), std::string::npos);
  }
}

}  // namespace
}  // namespace oomflight::pickle
