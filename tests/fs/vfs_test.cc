// The file tree apart from FUSE: shape, readdir order, inode lifetimes, text snapshots.
#include "fs/vfs.h"

#include <fcntl.h>
#include <gtest/gtest.h>

namespace probefs::fs {
namespace {

std::string read_all(Handle& h, size_t chunk = 7) {
  Request rq;
  std::string all, part;
  for (uint64_t off = 0;; off += part.size()) {
    EXPECT_EQ(h.read(rq, off, chunk, &part), 0);
    if (part.empty()) return all;
    all += part;
  }
}

TEST(Vfs, DirectoriesKeepInsertionOrderAndBefore) {
  Tree t;
  NodePtr events = t.mkdir(t.root(), "events");
  ASSERT_TRUE(events);
  EXPECT_EQ(t.mkdir(t.root(), "events"), events);
  auto f = make_text_file([] { return std::string("x\n"); });
  ASSERT_TRUE(t.add_file(events, "enable", kModeReadWrite, f));
  ASSERT_TRUE(t.add_file(events, "filter", kModeReadWrite, f, "enable"));
  EXPECT_FALSE(t.add_file(events, "filter", kModeReadWrite, f));
  std::vector<std::string> names;
  for (const NodePtr& c : t.children(events)) names.push_back(c->name());
  EXPECT_EQ(names, (std::vector<std::string>{"filter", "enable"}));
  EXPECT_EQ(t.walk("events/enable")->mode(), kModeReadWrite);
  EXPECT_EQ(t.walk("events/nothing"), nullptr);
  EXPECT_EQ(t.walk("events")->parent(), t.root());
}

TEST(Vfs, RemovedNodesLiveWhileTheKernelKnowsThem) {
  Tree t;
  NodePtr d = t.mkdir(t.root(), "g");
  NodePtr e = t.mkdir(d, "e");
  const uint64_t ino = e->ino();
  t.remember(e);
  e.reset();
  ASSERT_TRUE(t.remove(t.root(), "g"));
  EXPECT_EQ(t.walk("g"), nullptr);
  ASSERT_NE(t.find(ino), nullptr);  // a lookup is outstanding
  EXPECT_EQ(t.find(ino)->parent(), d);
  d.reset();
  ASSERT_NE(t.find(ino), nullptr);
  t.forget(ino, 1);
  EXPECT_EQ(t.find(ino), nullptr);
  EXPECT_NE(t.find(1), nullptr);  // the root is never forgotten
  t.forget(1, 100);
  EXPECT_NE(t.find(1), nullptr);
}

TEST(Vfs, TextIsASnapshotFromOffsetZero) {
  Tree t;
  int generation = 0;
  auto f = make_text_file([&] { return "generation " + std::to_string(++generation) + "\n"; });
  t.add_file(t.root(), "gen", kModeRead, f);
  std::unique_ptr<Handle> h;
  ASSERT_EQ(t.open("gen", Request{}, O_RDONLY, &h), 0);
  EXPECT_EQ(read_all(*h), "generation 1\n");  // one snapshot across short reads
  EXPECT_EQ(read_all(*h), "generation 2\n");  // reading from 0 again makes a new one
  EXPECT_EQ(t.open("nothing", Request{}, O_RDONLY, &h), -ENOENT);
  t.mkdir(t.root(), "dir");
  EXPECT_EQ(t.open("dir", Request{}, O_RDONLY, &h), -EISDIR);
}

TEST(Vfs, WritesAndTruncationReachTheFile) {
  Tree t;
  std::string stored;
  int truncs = 0;
  bool busy = false;
  auto f = make_text_file([] { return std::string(); },
                          [&](const Request&, std::string_view d) -> int64_t {
                            stored += d;
                            return static_cast<int64_t>(d.size());
                          },
                          [&](const Request&) {
                            ++truncs;
                            return busy ? -EBUSY : 0;
                          });
  t.add_file(t.root(), "defs", kModeReadWrite, f);
  std::unique_ptr<Handle> h;
  ASSERT_EQ(t.open("defs", Request{}, O_WRONLY | O_APPEND, &h), 0);
  EXPECT_EQ(truncs, 0);
  EXPECT_EQ(h->write(Request{}, 0, "p:a b"), 5);
  EXPECT_EQ(stored, "p:a b");
  ASSERT_EQ(t.open("defs", Request{}, O_WRONLY | O_TRUNC, &h), 0);
  EXPECT_EQ(truncs, 1);
  busy = true;
  EXPECT_EQ(t.open("defs", Request{}, O_WRONLY | O_TRUNC, &h), -EBUSY);
  EXPECT_EQ(t.open("defs", Request{}, O_RDONLY | O_TRUNC, &h), 0);  // read-only: no trunc
  EXPECT_EQ(truncs, 2);
  // A read-only file refuses writes with the kernel's EINVAL.
  t.add_file(t.root(), "ro", kModeRead, make_text_file([] { return std::string("r\n"); }));
  ASSERT_EQ(t.open("ro", Request{}, O_RDONLY, &h), 0);
  EXPECT_EQ(h->write(Request{}, 0, "x"), -EINVAL);
}

}  // namespace
}  // namespace probefs::fs
