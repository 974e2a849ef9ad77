// The histogram tables (events/hist.h): what hist_update counts, as hist_read_tables
// reads it back, in memory laid out as the daemon's memfd is; and tables full of garbage,
// as a hostile target may leave them, read within their bounds.
#include "events/hist.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <vector>

namespace probefs::events {
namespace {

// A record as compile() lays it out: the common header, __probe_ip, then a (s32 @16),
// b (u64 @20), s (a __data_loc string @28) and the string after the fixed part.
struct Rec {
  uint8_t bytes[128] = {};
  uint32_t len = 32;
  Rec(int32_t a, uint64_t b, const char* s = "") {
    std::memcpy(bytes + 16, &a, 4);
    std::memcpy(bytes + 20, &b, 8);
    const uint32_t n = static_cast<uint32_t>(std::strlen(s)) + 1;
    const uint32_t loc = n << 16 | 32;
    std::memcpy(bytes + 28, &loc, 4);
    std::memcpy(bytes + 32, s, n);
    len = 32 + n;
  }
};

HistOperand number(uint32_t offset, uint8_t size, bool is_signed) {
  HistOperand o;
  o.offset = offset;
  o.size = size;
  o.is_signed = is_signed;
  return o;
}

struct Tables {
  HistGeometry g;
  uint32_t rings;
  std::vector<uint64_t> mem;  // 8-byte aligned, zeroed: a fresh memfd
  explicit Tables(const HistGeometry& geo, uint32_t r = 2) : g(geo), rings(r) {
    mem.assign(g.memfd_bytes(rings) / 8 + 1, 0);
  }
  uint8_t* base() { return reinterpret_cast<uint8_t*>(mem.data()); }
  HistControl* ctl() { return reinterpret_cast<HistControl*>(base()); }
  uint8_t* table(uint32_t ring) { return base() + kHistControlBytes + ring * g.table_stride(); }
  bool hit(const HistProgram& p, const Rec& r, uint32_t ring = 0, uint32_t cpu = 0) {
    return hist_update(p, HistShape(g), ctl(), table(ring), r.bytes, r.len, cpu, nullptr,
                       [](char* name) { std::strcpy(name, "worker"); });
  }
  HistEntries read(HistTotals* t = nullptr) {
    HistEntries e;
    HistTotals local;
    hist_read_tables(base(), g.memfd_bytes(rings), rings, g, &e, t ? t : &local);
    return e;
  }
};

uint64_t key0(const std::string& key) {
  uint64_t v;
  std::memcpy(&v, key.data(), 8);
  return v;
}

TEST(HistTables, CountsSumsAndKeysAcrossThreadTables) {
  HistProgram p;
  p.nkeys = 1;
  p.keys[0] = number(16, 4, true);
  p.nvals = 1;
  p.vals[0] = number(20, 8, false);
  HistGeometry g;
  g.key_bytes = 8;
  g.nvals = 1;
  Tables t(g);
  for (int i = 0; i < 30; ++i) ASSERT_TRUE(t.hit(p, Rec(i % 3 - 1, 10), static_cast<uint32_t>(i % 2)));
  HistTotals tot;
  HistEntries e = t.read(&tot);
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(tot.hits, 30u);
  EXPECT_EQ(tot.drops, 0u);
  for (const auto& [k, v] : e) {
    EXPECT_EQ(v.hitcount, 10u);
    EXPECT_EQ(v.vals[0], 100u);
    const auto key = static_cast<int64_t>(key0(k));  // signed fields are sign-extended
    EXPECT_TRUE(key == -1 || key == 0 || key == 1) << key;
  }
}

// onmax/onchange: each table keeps its entries' tracked value and the fields saved with
// it; the merge takes the largest (onmax) or the latest (onchange) across tables.
TEST(HistTables, TrackedValuesAndTheirFieldsMergeAcrossTables) {
  for (HistTrackKind kind : {HistTrackKind::kMax, HistTrackKind::kChange}) {
    HistProgram p;
    p.nkeys = 1;
    p.keys[0] = number(16, 4, true);
    p.nvars = 1;
    p.vars[0].a = number(20, 8, false);
    p.track.kind = kind;
    p.track.var = 0;
    p.track.nsave = 2;
    p.track.save[0] = number(20, 8, false);
    p.track.save[1].source = HistSource::kCpu;
    HistGeometry g;
    g.key_bytes = 8;
    g.nvars = 1;
    g.track = kind;
    g.nsave = 2;
    Tables t(g);
    const HistShape shape(g);
    uint64_t now = 1000;
    auto hit = [&](int32_t key, uint64_t v, uint32_t ring, uint32_t cpu) {
      HistFired fired;
      fired.synth_id = 0;
      ASSERT_TRUE(hist_update_inter(p, shape, t.ctl(), t.table(ring), Rec(key, v).bytes, 32, cpu,
                                    nullptr, now += 10, nullptr, [](char*) {}, &fired));
    };
    hit(1, 5, 0, 3);
    hit(1, 50, 0, 4);  // ring 0's maximum, and its latest
    hit(1, 7, 1, 5);
    hit(1, 9, 1, 6);   // ring 1's latest, the latest of all
    hit(2, 0, 0, 7);   // never above 0, never different from it: untracked
    HistEntries e = t.read();
    ASSERT_EQ(e.size(), 2u);
    for (const auto& [k, v] : e) {
      if (key0(k) == 2) {
        EXPECT_EQ(v.track_when, 0u);
        EXPECT_EQ(v.track_value, 0u);
        EXPECT_EQ(v.saved[0], 0u);
        continue;
      }
      EXPECT_EQ(v.hitcount, 4u);
      EXPECT_NE(v.track_when, 0u);
      const uint64_t want = kind == HistTrackKind::kMax ? 50 : 9;
      EXPECT_EQ(v.track_value, want);
      EXPECT_EQ(v.saved[0], want);
      EXPECT_EQ(v.saved[1], kind == HistTrackKind::kMax ? 4u : 6u);
    }
  }
}

// A stacktrace key is the hit's return addresses: equal stacks count together, and no
// stack (a null one) is the key of zeros.
TEST(HistTables, StackKeysCountByTheWholeStack) {
  HistProgram p;
  p.nkeys = 2;
  p.keys[0].source = HistSource::kStack;
  p.keys[0].key_size = kHistStackBytes;
  p.keys[1] = number(16, 4, true);
  p.keys[1].key_offset = kHistStackBytes;
  ASSERT_TRUE(p.wants_stack());
  HistGeometry g;
  g.key_bytes = kHistStackBytes + 8;
  Tables t(g);
  uint64_t one[kHistStackDepth] = {0x401000, 0x401234, 0x7f0000001000};
  uint64_t two[kHistStackDepth] = {0x401000, 0x401300};
  const HistShape shape(g);
  auto hit = [&](const uint64_t* stack) {
    ASSERT_TRUE(hist_update(p, shape, t.ctl(), t.table(0), Rec(5, 0).bytes, 32, 0, stack,
                            [](char*) {}));
  };
  for (int i = 0; i < 3; ++i) hit(one);
  hit(two);
  hit(nullptr);
  HistEntries e = t.read();
  ASSERT_EQ(e.size(), 3u);
  std::map<uint64_t, uint64_t> by_second_frame;
  for (const auto& [k, v] : e) {
    ASSERT_EQ(k.size(), kHistStackBytes + 8);
    uint64_t second, a;
    std::memcpy(&second, k.data() + 8, 8);
    std::memcpy(&a, k.data() + kHistStackBytes, 8);
    EXPECT_EQ(a, 5u);
    by_second_frame[second] = v.hitcount;
  }
  EXPECT_EQ(by_second_frame, (std::map<uint64_t, uint64_t>{{0, 1}, {0x401234, 3}, {0x401300, 1}}));
}

TEST(HistTables, Log2BucketsCpuAndStringKeys) {
  HistProgram p;
  p.nkeys = 3;
  p.keys[0] = number(20, 8, false);
  p.keys[0].transform = HistTransform::kLog2;
  p.keys[1].source = HistSource::kCpu;
  p.keys[1].key_offset = 8;
  p.keys[2].source = HistSource::kString;
  p.keys[2].offset = 28;
  p.keys[2].key_offset = 16;
  p.keys[2].key_size = 16;
  HistGeometry g;
  g.key_bytes = 32;
  Tables t(g);
  for (uint64_t v : {0, 1, 2, 3, 4, 5, 1000}) ASSERT_TRUE(t.hit(p, Rec(0, v, "a-rather-long-name"), 0, 1));
  HistEntries e = t.read();
  std::map<uint64_t, uint64_t> by_log2;
  for (const auto& [k, v] : e) {
    by_log2[key0(k)] += v.hitcount;
    uint64_t cpu;
    std::memcpy(&cpu, k.data() + 8, 8);
    EXPECT_EQ(cpu, 1u);
    EXPECT_EQ(std::string(k.data() + 16), "a-rather-long-n");  // cut to 15 + NUL
  }
  EXPECT_EQ(by_log2, (std::map<uint64_t, uint64_t>{{0, 2}, {1, 1}, {2, 2}, {3, 1}, {10, 1}}));

  HistProgram b = p;
  b.nkeys = 1;
  b.keys[0].transform = HistTransform::kBuckets;
  b.keys[0].buckets = 100;
  HistGeometry gb;
  Tables tb(gb);
  for (uint64_t v = 0; v < 1000; ++v) ASSERT_TRUE(tb.hit(b, Rec(0, v)));
  HistEntries eb = tb.read();
  ASSERT_EQ(eb.size(), 10u);
  for (const auto& [k, v] : eb) {
    EXPECT_EQ(key0(k) % 100, 0u);
    EXPECT_EQ(v.hitcount, 100u);
  }
}

TEST(HistTables, AFullTableDropsNewKeysAndCountsThem) {
  HistProgram p;
  p.nkeys = 1;
  p.keys[0] = number(20, 8, false);
  HistGeometry g;
  g.capacity_bits = kHistMinBits;
  Tables t(g, 1);
  const uint32_t cap = g.capacity();
  for (uint64_t v = 0; v < cap + 50; ++v) t.hit(p, Rec(0, v));
  for (uint64_t v = 0; v < cap; ++v) ASSERT_TRUE(t.hit(p, Rec(0, v)));  // known keys still count
  HistTotals tot;
  HistEntries e = t.read(&tot);
  EXPECT_EQ(e.size(), cap);
  EXPECT_EQ(tot.drops, 50u);
  EXPECT_EQ(tot.hits, 2u * cap + 50u);
  for (const auto& [k, v] : e) EXPECT_EQ(v.hitcount, 2u);
}

// Threads' tables hold different keys: the histogram shows `size` of them at most, as the
// kernel's map holds, and the hits of the others are dropped ones.
TEST(HistTables, TheMergedHistogramHoldsSizeKeys) {
  HistProgram p;
  p.nkeys = 1;
  p.keys[0] = number(20, 8, false);
  HistGeometry g;
  g.capacity_bits = kHistMinBits;
  Tables t(g, 2);
  const uint32_t cap = g.capacity();
  for (uint64_t v = 0; v < cap; ++v) ASSERT_TRUE(t.hit(p, Rec(0, v), 0));
  for (uint64_t v = cap; v < cap + 10; ++v) ASSERT_TRUE(t.hit(p, Rec(0, v), 1));
  HistTotals tot;
  EXPECT_EQ(t.read(&tot).size(), cap);
  EXPECT_EQ(tot.hits, cap + 10u);
  EXPECT_EQ(tot.drops, 10u);
}

TEST(HistTables, ClearAndPauseTakeEffectAtTheNextHit) {
  HistProgram p;
  p.nkeys = 1;
  p.keys[0] = number(20, 8, false);
  HistGeometry g;
  g.with_comm = true;
  Tables t(g);
  for (int i = 0; i < 5; ++i) t.hit(p, Rec(0, 7));
  HistEntries e = t.read();
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e.begin()->second.comm, "worker");
  t.ctl()->epoch++;  // :clear
  EXPECT_TRUE(t.read().empty());  // the table's counts are from before the clear
  t.ctl()->paused = 1;
  t.hit(p, Rec(0, 8));
  EXPECT_TRUE(t.read().empty());
  t.ctl()->paused = 0;
  t.hit(p, Rec(0, 9));
  e = t.read();
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(key0(e.begin()->first), 9u);
  EXPECT_EQ(e.begin()->second.hitcount, 1u);
}

// Whatever a target wrote into its tables, reading them stays inside the mapping and
// names end within their bytes (the sanitizer build checks the bounds).
// hist_update_numbers, the hit path's update for number keys and values, against
// hist_update on random programs of that form and random records: the same entries and
// totals, in tables each fills alone and in one table both fill by turns (the same
// entries: the same keys and hashes), full tables and their drops included.
TEST(HistTables, TheNumbersUpdateCountsWhatTheGeneralOneCounts) {
  std::mt19937_64 rng(77);
  const uint8_t sizes[] = {1, 2, 4, 8};
  const HistTransform transforms[] = {HistTransform::kNone, HistTransform::kLog2,
                                      HistTransform::kBuckets, HistTransform::kUsecs};
  auto operand = [&](uint32_t offset_base) {
    HistOperand o = number(offset_base + 8 * static_cast<uint32_t>(rng() % 4), sizes[rng() % 4],
                           rng() % 2 != 0);
    o.transform = transforms[rng() % 4];
    o.buckets = 1 + rng() % 50;
    return o;
  };
  for (int round = 0; round < 200; ++round) {
    HistProgram p;
    p.nkeys = 1 + static_cast<uint32_t>(rng() % 2);
    p.nvals = static_cast<uint32_t>(rng() % 3);
    for (uint32_t k = 0; k < p.nkeys; ++k) {
      p.keys[k] = operand(16);
      p.keys[k].key_offset = 8 * k;
    }
    for (uint32_t v = 0; v < p.nvals; ++v) p.vals[v] = operand(16);
    HistGeometry g;
    g.key_bytes = 8 * p.nkeys;
    g.nvals = p.nvals;
    g.capacity_bits = rng() % 4 == 0 ? 4 : kHistDefaultBits;  // now and then one that fills up
    const HistShape shape(g);
    const uint32_t form = hist_numbers_form(p, shape);
    ASSERT_EQ(form, p.nkeys << 4 | p.nvals);
    Tables general(g, 1), numbers(g, 1), both(g, 1);
    auto update_numbers = [&](Tables& t, const uint8_t* rec) {
      switch (form) {
        case 1 << 4 | 0: return hist_update_numbers<1, 0>(p, shape, t.ctl(), t.table(0), rec);
        case 1 << 4 | 1: return hist_update_numbers<1, 1>(p, shape, t.ctl(), t.table(0), rec);
        case 1 << 4 | 2: return hist_update_numbers<1, 2>(p, shape, t.ctl(), t.table(0), rec);
        case 2 << 4 | 0: return hist_update_numbers<2, 0>(p, shape, t.ctl(), t.table(0), rec);
        case 2 << 4 | 1: return hist_update_numbers<2, 1>(p, shape, t.ctl(), t.table(0), rec);
        default: return hist_update_numbers<2, 2>(p, shape, t.ctl(), t.table(0), rec);
      }
    };
    for (int i = 0; i < 300; ++i) {
      alignas(8) uint8_t rec[48];
      for (uint32_t w = 0; w < 6; ++w) {
        // Few distinct values (so that keys repeat), some of them large or negative.
        const uint64_t v = rng() % 3 == 0 ? rng() : (rng() % 7) - 3;
        std::memcpy(rec + 8 * w, &v, 8);
      }
      const bool a = hist_update(p, shape, general.ctl(), general.table(0), rec, 48, 0, nullptr,
                                 [](char*) {});
      ASSERT_EQ(update_numbers(numbers, rec), a);
      if (i % 2) {
        ASSERT_EQ(update_numbers(both, rec), a);
      } else {
        ASSERT_EQ(hist_update(p, shape, both.ctl(), both.table(0), rec, 48, 0, nullptr,
                              [](char*) {}), a);
      }
    }
    HistTotals tg, tn, tb;
    const HistEntries eg = general.read(&tg), en = numbers.read(&tn), eb = both.read(&tb);
    ASSERT_EQ(en.size(), eg.size()) << round;
    ASSERT_EQ(eb.size(), eg.size()) << round;
    EXPECT_EQ(tn.hits, tg.hits);
    EXPECT_EQ(tn.drops, tg.drops);
    EXPECT_EQ(tb.hits, tg.hits);
    EXPECT_EQ(tb.drops, tg.drops);
    for (const auto& [key, e] : eg) {
      for (const HistEntries* other : {&en, &eb}) {
        auto it = other->find(key);
        ASSERT_NE(it, other->end()) << round;
        EXPECT_EQ(it->second.hitcount, e.hitcount);
        for (uint32_t v = 0; v < p.nvals; ++v) EXPECT_EQ(it->second.vals[v], e.vals[v]);
      }
    }
  }
}

// Programs hist_update_numbers does not take: the general update counts them.
TEST(HistTables, OnlyNumberKeysAndValuesTakeTheNumbersUpdate) {
  HistProgram p;
  p.nkeys = 1;
  p.keys[0] = number(16, 4, true);
  HistGeometry g;
  g.key_bytes = 8;
  EXPECT_EQ(hist_numbers_form(p, HistShape(g)), 1u << 4);
  HistProgram three = p;
  three.nkeys = 3;
  three.keys[1] = three.keys[2] = p.keys[0];
  three.keys[1].key_offset = 8;
  three.keys[2].key_offset = 16;
  g.key_bytes = 24;
  EXPECT_EQ(hist_numbers_form(three, HistShape(g)), 0u);
  g.key_bytes = 8;
  HistProgram cpu = p;
  cpu.keys[0].source = HistSource::kCpu;
  EXPECT_EQ(hist_numbers_form(cpu, HistShape(g)), 0u);
  HistProgram str = p;
  str.keys[0].source = HistSource::kString;
  str.keys[0].key_size = 32;
  g.key_bytes = 32;
  EXPECT_EQ(hist_numbers_form(str, HistShape(g)), 0u);
  g.key_bytes = 8;
  g.with_comm = true;  // common_pid.execname
  EXPECT_EQ(hist_numbers_form(p, HistShape(g)), 0u);
  g.with_comm = false;
  g.nvars = 1;
  EXPECT_EQ(hist_numbers_form(p, HistShape(g)), 0u);
}

TEST(HistTables, GarbageTablesAreReadWithinBounds) {
  std::mt19937_64 rng(42);
  for (int round = 0; round < 50; ++round) {
    HistGeometry g;
    g.capacity_bits = kHistMinBits;
    g.key_bytes = 8 * (1 + round % 4);
    g.nvals = round % 3;
    g.with_comm = round % 2;
    g.nvars = round % 5;
    g.track = static_cast<HistTrackKind>(round % 3);  // onmax/onchange blocks too
    g.nsave = g.track == HistTrackKind::kNone ? 0 : round % (kHistMaxParams + 1);
    Tables t(g, 3);
    for (uint64_t& w : t.mem) w = rng();
    t.ctl()->epoch = 0;
    for (uint32_t r = 0; r < 3; ++r) reinterpret_cast<HistTableHeader*>(t.table(r))->epoch = 0;
    HistTotals tot;
    HistEntries e = t.read(&tot);
    EXPECT_LE(e.size(), g.capacity());  // however many slots claim an entry
    for (const auto& [k, v] : e) {
      EXPECT_EQ(k.size(), g.key_bytes);
      EXPECT_LT(v.comm.size(), kHistCommBytes);
    }
    // A mapping shorter than the geometry says is not read at all.
    HistEntries none;
    hist_read_tables(t.base(), g.memfd_bytes(3) - 1, 3, g, &none, &tot);
    EXPECT_TRUE(none.empty());
  }
}

}  // namespace
}  // namespace probefs::events
