// Where definitions land in a process: uprobe file offsets by file identity, kprobe
// symbols with and without a module, modules not loaded yet, unknown symbols.
#include "tracee/probe_places.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "events/parse.h"
#include "tests/tracee/test_functions.h"

namespace probefs::tracee {
namespace {

struct Self {
  std::vector<Mapping> maps;
  std::unique_ptr<ProcessSymbols> syms;
  Self() {
    EXPECT_EQ(read_maps(getpid(), &maps), 0);
    int err = 0;
    syms = ProcessSymbols::load(getpid(), &err);
    EXPECT_NE(syms, nullptr) << err;
  }
};

events::ProbeDefinition parse(const std::string& line) {
  events::ParseResult r = events::parse_dynamic_command(line);
  EXPECT_EQ(r.status, events::ParseStatus::kDefine) << line << ": " << r.error.message();
  return r.def;
}

// The file offset of a code address of this process, from its mapping.
bool file_offset_of(const std::vector<Mapping>& maps, uintptr_t addr, std::string* path,
                    uint64_t* off) {
  for (const Mapping& m : maps) {
    if (m.exec && m.start <= addr && addr < m.end) {
      *path = m.path;
      *off = addr - m.start + m.offset;
      return true;
    }
  }
  return false;
}

TEST(ProbePlaces, UprobeFileOffsetLandsOnTheFunction) {
  Self self;
  const auto fn = reinterpret_cast<uintptr_t>(&probefs_test_fn_a);
  std::string path;
  uint64_t off = 0;
  ASSERT_TRUE(file_offset_of(self.maps, fn, &path, &off));
  char line[512];
  snprintf(line, sizeof line, "p:t/u %s:0x%llx", path.c_str(),
           static_cast<unsigned long long>(off));
  events::ProbeDefinition def = parse(line);
  FileIdentity id;
  ASSERT_EQ(identify_file(path, &id), 0);
  std::vector<ProbePlace> places;
  events::Diagnostic diag;
  ASSERT_EQ(place_probe(def, id, self.maps, *self.syms, &places, &diag), PlaceStatus::kPlaced);
  ASSERT_EQ(places.size(), 1u);
  EXPECT_EQ(places[0].addr, fn);
  EXPECT_EQ(places[0].symbol, "probefs_test_fn_a");
  EXPECT_EQ(places[0].symbol_offset, 0u);
  EXPECT_EQ(places[0].bounds.start, fn);
  EXPECT_GT(places[0].bounds.end, fn);
}

TEST(ProbePlaces, UprobeMatchesTheInodeNotThePath) {
  Self self;
  const auto fn = reinterpret_cast<uintptr_t>(&probefs_test_fn_a);
  std::string path;
  uint64_t off = 0;
  ASSERT_TRUE(file_offset_of(self.maps, fn, &path, &off));
  // A hard link names the same inode under another path.
  char dir[] = "/tmp/probefs-places-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  std::string alias = std::string(dir) + "/alias";
  if (link(path.c_str(), alias.c_str()) != 0) {
    rmdir(dir);
    GTEST_SKIP() << "cannot hard-link the test executable here";
  }
  char line[512];
  snprintf(line, sizeof line, "p:t/u %s:0x%llx", alias.c_str(),
           static_cast<unsigned long long>(off));
  events::ProbeDefinition def = parse(line);
  FileIdentity id;
  ASSERT_EQ(identify_file(alias, &id), 0);
  unlink(alias.c_str());
  rmdir(dir);
  std::vector<ProbePlace> places;
  events::Diagnostic diag;
  ASSERT_EQ(place_probe(def, id, self.maps, *self.syms, &places, &diag), PlaceStatus::kPlaced);
  EXPECT_EQ(places[0].addr, fn);

  // Another file with the same name elsewhere matches nothing.
  FileIdentity other{id.dev, id.inode + 1};
  EXPECT_EQ(place_probe(def, other, self.maps, *self.syms, &places, &diag),
            PlaceStatus::kNotYet);
}

TEST(ProbePlaces, KprobeSymbolsModulesAndAddresses) {
  Self self;
  std::vector<ProbePlace> places;
  events::Diagnostic diag;
  const FileIdentity none;
  const auto fn = reinterpret_cast<uintptr_t>(&probefs_test_fn_b);

  ASSERT_EQ(place_probe(parse("p:t/k probefs_test_fn_b"), none, self.maps, *self.syms, &places,
                        &diag),
            PlaceStatus::kPlaced);
  EXPECT_EQ(places[0].addr, fn);
  EXPECT_EQ(places[0].module, "");

  ASSERT_EQ(place_probe(parse("p:t/k libc:getpid+0"), none, self.maps, *self.syms, &places,
                        &diag),
            PlaceStatus::kPlaced);
  EXPECT_EQ(places[0].module, "libc.so.6");
  EXPECT_EQ(places[0].symbol, "getpid");

  EXPECT_EQ(place_probe(parse("p:t/k probefs_no_such_symbol"), none, self.maps, *self.syms,
                        &places, &diag),
            PlaceStatus::kAbsent);
  // MOD loaded, SYM not in it: the kernel's failed registration, ENOENT at the place.
  ASSERT_EQ(place_probe(parse("p:t/k libc:probefs_no_such_symbol"), none, self.maps,
                        *self.syms, &places, &diag),
            PlaceStatus::kError);
  EXPECT_EQ(diag.err, ENOENT);
  EXPECT_EQ(diag.code, events::ErrorCode::kBadProbeAddr);
  EXPECT_EQ(diag.pos, static_cast<int>(std::string("p:t/k ").size()));
  // MOD not loaded: waits.
  EXPECT_EQ(place_probe(parse("p:t/k libprobefs_not_loaded:fn"), none, self.maps, *self.syms,
                        &places, &diag),
            PlaceStatus::kNotYet);

  char line[128];
  snprintf(line, sizeof line, "p:t/k 0x%llx", static_cast<unsigned long long>(fn + 1));
  ASSERT_EQ(place_probe(parse(line), none, self.maps, *self.syms, &places, &diag),
            PlaceStatus::kPlaced);
  EXPECT_EQ(places[0].addr, fn + 1);
  EXPECT_EQ(places[0].symbol, "probefs_test_fn_b");
  EXPECT_EQ(places[0].symbol_offset, 1u);
}

}  // namespace
}  // namespace probefs::tracee
