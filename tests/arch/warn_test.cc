// PROBEFS_WARN_ON_ONCE: the value of its condition, a count of every time it held, one
// line on stderr the first time only, and a listing of the sites that warned.
#include "arch/warn.h"

#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>

namespace probefs::arch {
namespace {

bool check(int v) { return PROBEFS_WARN_ON_ONCE(v < 0, "a negative value in warn_test"); }

const Warning* find(const Warning* w, size_t n, const char* text) {
  for (size_t i = 0; i < n; ++i)
    if (std::strcmp(w[i].text, text) == 0) return &w[i];
  return nullptr;
}

TEST(Warn, CountsEveryTimePrintsOnce) {
  // Capture stderr in a pipe big enough for what the warning prints.
  int fds[2];
  ASSERT_EQ(pipe2(fds, O_NONBLOCK), 0);
  const int saved = dup(2);
  ASSERT_GE(saved, 0);
  ASSERT_EQ(dup2(fds[1], 2), 2);
  const bool first = check(1);
  const bool second = check(-1);
  const bool third = check(-2);
  dup2(saved, 2);
  close(saved);
  close(fds[1]);
  char buf[512];
  const ssize_t n = read(fds[0], buf, sizeof buf);
  close(fds[0]);

  EXPECT_FALSE(first);
  EXPECT_TRUE(second);
  EXPECT_TRUE(third);
  ASSERT_GT(n, 0);
  const std::string out(buf, static_cast<size_t>(n));
  EXPECT_EQ(out.find("probefs: warning: a negative value in warn_test (warn_test.cc:"), 0u)
      << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;

  Warning w[128];
  const size_t listed = warnings(w, 128);
  const Warning* mine = find(w, listed < 128 ? listed : 128, "a negative value in warn_test");
  ASSERT_NE(mine, nullptr);
  EXPECT_EQ(mine->count, 2u);
  EXPECT_GT(mine->line, 0);
  EXPECT_NE(std::strstr(mine->file, "warn_test.cc"), nullptr);
}

// A condition that never held is not listed.
TEST(Warn, QuietSitesAreNotListed) {
  EXPECT_FALSE(PROBEFS_WARN_ON_ONCE(false, "never in warn_test"));
  Warning w[128];
  const size_t listed = warnings(w, 128);
  EXPECT_EQ(find(w, listed < 128 ? listed : 128, "never in warn_test"), nullptr);
}

}  // namespace
}  // namespace probefs::arch
