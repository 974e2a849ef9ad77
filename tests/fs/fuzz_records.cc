// libFuzzer target: records as a traced process can write them, through everything the
// daemon runs on them before a line is printed: the ring consumer (events::RingAreaReader
// and RingMerger over an area the input scribbles on), the record check (events/record.h),
// the event filters and the formatter
// (events::format_trace_line, with a Symbolizer that returns names longer than any line
// room set aside for them). The events have several strings, string arrays and every
// fetch type (u8..u64, s8..s64, x8..x64, char, string, ustring, symbol, symstr, bitfields,
// arrays, $comm). Marker records (the layout of fs/trace_reader.h) go through the
// consumer; their text is the trace reader's to print, which this target does not link.
//
// Input. Byte 0: bit 0 chooses the mode, the other bits the line's context. Mode 0: byte 1 picks the event (low 3 bits) and, with bit 3 set, is followed
// by a 24-bit length and a fill byte that pad the record up to that length (at most
// 256 KiB, so that a short input makes a record long enough for any __data_loc); the
// rest is one record of it. Mode 1: ring operations, each a byte and its operands:
//   0 produce  ring, event, u16 length, payload (its event id is set from the event byte)
//   1 scribble u16 offset into the area, count, bytes (the target writing its own area)
//   2 consume  count: records through the consuming merger (trace_pipe)
//   3 walk     count: records through a non-consuming merger (trace), from the start
// then everything left is consumed. Every record found goes through check, filters and
// formatter, whatever the check said, since each must be safe on its own.
//
// Seeds: with PROBEFS_RECORDS_FUZZ_SEEDS=DIR set, the target writes its seed inputs there
// (well-formed records from the record writer, and hostile ones made from them) and exits.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "events/compile.h"
#include "events/fetch.h"
#include "events/filter.h"
#include "events/memory_reader.h"
#include "events/output.h"
#include "events/parse.h"
#include "events/record.h"
#include "events/ring.h"
#include "events/ring_consumer.h"
#include "events/synthetic.h"
#include "fs/trace_reader.h"
#include "fs/tracefs.h"

using namespace probefs;
using namespace probefs::events;

namespace {

// Every fetch type, strings and string arrays among them; kprobe syntax for symbol and
// symstr; entry and return probes of both syntaxes; an event without arguments.
const char* const kDefinitions[] = {
    ("p:uprobes/u_all /bin/true:0x1370 a=%di:u8 b=%si:u16 c=%dx:u32 d=%cx:u64 e=%di:s8 "
     "f=%si:s16 g=%dx:s32 h=%cx:s64 i=%di:x8 j=%si:x16 k=%dx:x32 l=%cx:x64 ch=%di:char "
     "s=+0(%si):string u=+0(%dx):ustring arr=+0(%cx):string[3] bf=+0(%si):b4@2/32 "
     "nums=+0(%si):s16[4] chs=+0(%si):char[3] cm=$comm"),
    ("p:kprobes/k_sym do_thing sym=%di:symbol syms=+0(%si):symbol[2] ss=+0(%dx):symstr "
     "ss2=%ax:symstr s=+0(%si):string x=%ax:x32 bf=+8(%si):b3@5/16"),
    "r:kprobes/k_ret do_thing ret=$retval:s64 s=+0(%di):string arr=+0(%si):ustring[2]",
    "r:uprobes/u_ret /bin/true:0x1370 ret=$retval:s32 s=+0(%di):string t=+0(%si):string",
    "p:uprobes/u_none /bin/true:0x1370",
    // Seventeen string slots: room in the layout for a record past 64 KiB.
    "p:uprobes/u_many /bin/true:0x1370 s=+0(%si):string arr=+0(%cx):string[16]",
};
constexpr size_t kEvents = sizeof kDefinitions / sizeof kDefinitions[0];

// Synthetic events (events/synthetic.h) after the probe events: numbers of every size,
// a string kept in place, a __data_loc string and address list, gfp_t's flag names.
const char* const kSynthDefinitions[] = {
    "synth_all s8 a; u16 b; char s[16]; char d[]; gfp_t g; pid_t pid; bool flag",
    "synth_stack u64 lat; long st[]; char d[]",
};
constexpr size_t kSynthEvents = sizeof kSynthDefinitions / sizeof kSynthDefinitions[0];
constexpr size_t kAllEvents = kEvents + kSynthEvents;

// Tried on every event; those that compile against it are its filters.
const char* const kFilters[] = {
    "s == \"hello\" || a > 3",
    "s ~ \"h*l?o\" && !(c & 0x10)",
    "cm ~ \"[a-f]*\" || u != \"x\"",
    "comm ~ \"fuzz*\" && common_pid > 0",
    "ss == \"sym*\" || sym == 0",
    "ret < 0 || s ~ \"*[!a]\"",
    "t ~ \"*\" && s != \"\" && CPU < 4",
    "nums == 5 || chs == 3 || bf & 2",
    "s ~ \"*a*\" || common_pid == 4243",
};

struct Event {
  fs::EventView view;
  std::vector<CompiledFilter> filters;
};

class LongNames : public Symbolizer {
 public:
  bool lookup(uint64_t addr, SymbolInfo* out) override {
    if ((addr >> 4) % 3 == 0) return false;
    static const std::string name(3000, 'n'), module(700, 'm'), note(900, 'o');
    out->name = name;
    out->offset = addr & 0xfff;
    out->size = addr >> 40;
    out->module = addr & 1 ? std::string_view(module) : std::string_view();
    out->note = addr & 2 ? std::string_view(note) : std::string_view();
    return true;
  }
};

std::vector<Event>& events_table() {
  static std::vector<Event>* table = [] {
    auto* t = new std::vector<Event>;
    for (size_t i = 0; i < kEvents; ++i) {
      ParseResult r = parse_dynamic_command(kDefinitions[i]);
      Event e;
      Diagnostic err;
      if (r.status != ParseStatus::kDefine || !compile(r.def, nullptr, &e.view.compiled, &err)) {
        std::fprintf(stderr, "fuzz_records: %s does not compile: %s at %d\n", kDefinitions[i],
                     std::string(r.error.message()).c_str(), r.error.pos);
        std::abort();
      }
      e.view.id = static_cast<uint16_t>(fs::kFirstEventId + i);
      e.view.system = e.view.compiled.group;
      e.view.name = e.view.compiled.event;
      e.view.kprobe_style = e.view.compiled.syntax == ProbeSyntax::kKprobe;
      for (const char* text : kFilters) {
        CompiledFilter f;
        if (compile_filter(text, e.view.compiled, &f, &err)) e.filters.push_back(std::move(f));
      }
      if (!e.view.compiled.fields.empty() && e.filters.empty()) {
        std::fprintf(stderr, "fuzz_records: no filter compiles for %s\n", kDefinitions[i]);
        std::abort();
      }
      t->push_back(std::move(e));
    }
    for (size_t i = 0; i < kSynthEvents; ++i) {
      SynthResult r = parse_synthetic_command(kSynthDefinitions[i]);
      if (r.status != SynthStatus::kDefine) {
        std::fprintf(stderr, "fuzz_records: %s is no synthetic event\n", kSynthDefinitions[i]);
        std::abort();
      }
      Event e;
      e.view.compiled = synthetic_compiled(r.event);
      e.view.id = static_cast<uint16_t>(fs::kFirstEventId + kEvents + i);
      e.view.system = e.view.compiled.group;
      e.view.name = e.view.compiled.event;
      for (const char* text : kFilters) {
        CompiledFilter f;
        Diagnostic err;
        if (compile_filter(text, e.view.compiled, &f, &err)) e.filters.push_back(std::move(f));
      }
      t->push_back(std::move(e));
    }
    return t;
  }();
  return *table;
}

const Event* event_by_id(uint16_t id) {
  for (const Event& e : events_table())
    if (e.view.id == id) return &e;
  return nullptr;
}

// One record through the check, every filter of its event and the formatter.
// `data` is copied into a buffer of exactly `len` bytes, so that a read past the record
// is a read past a heap block.
void run_record(const Event& e, uint8_t ctl, const uint8_t* data, uint32_t len) {
  std::unique_ptr<uint8_t[]> rec(new uint8_t[len ? len : 1]);
  if (len) std::memcpy(rec.get(), data, len);
  const CompiledEvent& ev = e.view.compiled;
  const RecordFault fault = check_record(ev, rec.get(), len);
  if (fault == RecordFault::kFits && (len < ev.program.fixed_size || len > max_record_len(ev)))
    std::abort();
  for (const CompiledFilter& f : e.filters) {
    FilterContext fc;
    fc.cpu = ctl & 3;
    fc.comm = "fuzz-comm";
    filter_match(f, rec.get(), len, fc);
  }

  static const std::string long_comm(40, 'c');
  LineContext lc;
  lc.comm = ctl & 0x40 ? std::string_view(long_comm) : std::string_view("fuzz");
  lc.pid = 4243;
  lc.cpu = ctl & 3;
  lc.ts_ns = 426361180000ull;
  LongNames names;
  Symbolizer* sym = ctl & 0x80 ? nullptr : &names;
  std::string out;
  const bool ok = format_trace_line(out, ev, lc, rec.get(), len, sym);
  if (ok != (len >= ev.program.fixed_size)) std::abort();
  if (ok && (out.empty() || out.back() != '\n')) std::abort();
  if (!ok && !out.empty()) std::abort();
  // Appended to a line already there, as trace_pipe fills its buffer.
  std::string more = "previous line\n";
  format_trace_line(more, ev, lc, rec.get(), len, sym);
  if (ok && more.compare(14, std::string::npos, out) != 0) std::abort();
}

struct Input {
  const uint8_t* p;
  size_t n;
  bool take(uint8_t* b) {
    if (!n) return false;
    *b = *p++;
    --n;
    return true;
  }
  uint16_t u16() {
    uint8_t lo = 0, hi = 0;
    take(&lo);
    take(&hi);
    return static_cast<uint16_t>(lo | hi << 8);
  }
};

// The ids a produced record may carry: each event's, the marker's, one nobody defined.
uint16_t id_for(uint8_t sel) {
  const size_t k = sel % (kAllEvents + 2);
  if (k < kAllEvents) return static_cast<uint16_t>(fs::kFirstEventId + k);
  return k == kAllEvents ? fs::kMarkerEventId : static_cast<uint16_t>(0x1234);
}

void run_ring(Input in, uint8_t ctl) {
  RingGeometry g;
  g.ring_count = 2;
  g.ring_bytes = kRingMinBytes;
  g.probe_slots = 8;
  RingLayout l;
  if (!ring_layout(g, &l)) std::abort();
  const size_t size = l.area_bytes;
  // aligned_alloc wants a size that is a multiple of the alignment.
  void* mem = std::aligned_alloc(kRingPageBytes, ring_align_up(size, kRingPageBytes));
  std::memset(mem, 0, size);
  if (ring_area_init(mem, size, g, ring_stamp_mode(kRingStampCounter, kRingCpuNone)) != 0)
    std::abort();
  auto* area = static_cast<RingAreaHeader*>(mem);
  RingAreaReader reader;
  if (reader.attach(mem, size, getpid()) != 0) std::abort();
  RingMerger pipe(true);
  pipe.add(&reader, 1);
  RingProducer prod[2];
  for (uint32_t r = 0; r < 2; ++r)
    if (!ring_claim(area, 1000 + r, &prod[r])) std::abort();

  auto deliver = [&](const RingRecord& rec) {
    const uint32_t len = static_cast<uint32_t>(rec.payload.size());
    if (len < 2) return;
    uint16_t id;
    std::memcpy(&id, rec.payload.data(), 2);
    // A marker has no event; the consumer is what it goes through.
    if (const Event* e = event_by_id(id)) run_record(*e, ctl, rec.payload.data(), len);
  };

  std::vector<uint8_t> payload;
  for (int ops = 0; ops < 256; ++ops) {
    uint8_t op;
    if (!in.take(&op)) break;
    switch (op % 4) {
      case 0: {  // produce
        uint8_t ring = 0, sel = 0;
        in.take(&ring);
        in.take(&sel);
        const uint32_t len = in.u16() % 2048;
        payload.assign(len, 0);
        for (uint32_t i = 0; i < len && in.take(&payload[i]); ++i) {
        }
        if (len >= 2) {
          const uint16_t id = id_for(sel);
          std::memcpy(payload.data(), &id, 2);
        }
        RingProducer* p = &prod[ring & 1];
        if (void* dst = ring_reserve(p, len)) {
          if (len) std::memcpy(dst, payload.data(), len);
          ring_commit(p, len);
        }
        break;
      }
      case 1: {  // scribble
        const uint32_t off = in.u16() % size;
        uint8_t count = 0;
        in.take(&count);
        for (uint32_t i = 0; i < (count % 32u) && off + i < size; ++i) {
          uint8_t b;
          if (!in.take(&b)) break;
          static_cast<uint8_t*>(mem)[off + i] = b;
        }
        break;
      }
      case 2: {  // consume: one at a time, or in batches of runs as the raw readers do
        uint8_t count = 0;
        in.take(&count);
        RingRecord rec;
        if (count & 0x80) {
          RingRunRecord run[8];
          for (int i = 0; i < count % 8 && pipe.next_kept(&rec); ++i) {
            deliver(rec);
            const size_t n = pipe.next_run(run, count % 8, (count >> 4) % 3 == 2 ? 0 : -1);
            for (size_t k = 0; k < n; ++k) {
              rec.payload = std::span<const uint8_t>(run[k].payload, run[k].len);
              rec.cpu = run[k].cpu;
              deliver(rec);
            }
          }
          pipe.release_kept();
        } else {
          for (int i = 0; i < count % 8 && pipe.next(&rec); ++i) deliver(rec);
        }
        break;
      }
      case 3: {  // walk
        uint8_t count = 0;
        in.take(&count);
        RingMerger look(false);
        look.add(&reader, 2);
        RingRecord rec;
        for (int i = 0; i < count % 16 && look.next(&rec); ++i) deliver(rec);
        break;
      }
    }
  }
  // Whatever is left, as a trace_pipe read to the end would take it; bounded however the
  // area reads.
  RingRecord rec;
  for (int i = 0; i < 4096 && pipe.next(&rec); ++i) deliver(rec);
  pipe.publish();
  reader.entries();
  reader.has_data();
  reader.dropped();
  reader.rings_in_use();
  std::vector<uint64_t> hits(reader.probe_slots());
  reader.hits_all(hits);
  std::string comm;
  reader.owner_comm(0, 1000, &comm);
  pipe.remove(&reader);
  std::free(mem);
}

// ---- seeds ------------------------------------------------------------------------------

// A hit of every event as the agent records it: strings, arrays, symbols.
std::vector<uint8_t> written_record(const Event& e) {
  static const uint64_t table[3] = {0x40000, 0x40010, 0x40020};
  PtRegs regs{};
  regs.di = 0x10000;
  regs.si = 0x20000;
  regs.dx = 0x10000;
  regs.cx = 0x30000;
  regs.ax = 0x55ded62af370;
  HitContext hc;
  hc.regs = &regs;
  hc.ip = 0x55ded62af370;
  hc.ret_ip = 0x55ded62af17b;
  hc.comm = "fuzzprog";
  hc.pid = 4243;
  hc.event_id = e.view.id;
  uint64_t entry[8] = {};
  hc.entry_args = entry;
  FakeMemoryReader mem;
  mem.map_string(0x10000, "hello");
  mem.map_string(0x20000, "world-of-records");
  mem.map(0x30000, table, sizeof table);
  mem.map_string(0x40000, "x");
  mem.map_string(0x40010, "yy");
  mem.map_string(0x40020, "zzz");
  std::vector<uint8_t> rec(e.view.compiled.program.max_record_size());
  rec.resize(write_record(view_of(e.view.compiled.program), hc, mem, rec.data(),
                          static_cast<uint32_t>(rec.size())));
  return rec;
}

void put_loc(std::vector<uint8_t>& rec, const FieldLayout& f, uint32_t i, uint32_t loc) {
  std::memcpy(rec.data() + f.offset + 4 * i, &loc, 4);
}

void write_seed(const std::string& dir, const std::string& name,
                const std::vector<uint8_t>& bytes) {
  const std::string path = dir + "/" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) std::abort();
  std::fclose(f);
}

std::vector<uint8_t> direct_input(uint8_t ctl, size_t event, const std::vector<uint8_t>& rec) {
  std::vector<uint8_t> in = {static_cast<uint8_t>(ctl & ~1u), static_cast<uint8_t>(event)};
  in.insert(in.end(), rec.begin(), rec.end());
  return in;
}

void append_produce(std::vector<uint8_t>& in, uint8_t ring, uint8_t sel,
                    const std::vector<uint8_t>& rec) {
  in.push_back(0);
  in.push_back(ring);
  in.push_back(sel);
  in.push_back(static_cast<uint8_t>(rec.size()));
  in.push_back(static_cast<uint8_t>(rec.size() >> 8));
  in.insert(in.end(), rec.begin(), rec.end());
}

void write_seeds(const std::string& dir) {
  const std::vector<Event>& table = events_table();
  for (size_t i = 0; i < table.size(); ++i) {
    const std::vector<uint8_t> rec = written_record(table[i]);
    if (check_record(table[i].view.compiled, rec.data(), static_cast<uint32_t>(rec.size())) !=
        RecordFault::kFits)
      std::abort();
    write_seed(dir, "direct_" + table[i].view.name, direct_input(0x1e, i, rec));
  }
  // Hostile records of the first event (strings, a string array) and the kprobe one.
  const Event& all = table[0];
  const CompiledEvent& ev = all.view.compiled;
  const std::vector<uint8_t> good = written_record(all);
  auto field = [&](const char* name) -> const FieldLayout& {
    for (const FieldLayout& f : ev.fields)
      if (f.name == name) return f;
    std::abort();
  };
  uint32_t s_loc;
  std::memcpy(&s_loc, good.data() + field("s").offset, 4);
  std::vector<uint8_t> r = good;
  put_loc(r, field("u"), 0, s_loc);  // two locs on the same bytes
  write_seed(dir, "same_bytes", direct_input(0x02, 0, r));
  r = good;
  put_loc(r, field("s"), 0, 0xffffu << 16 | ev.program.fixed_size);  // 64 KiB loc
  write_seed(dir, "loc_64k", direct_input(0x04, 0, r));
  // ... inside a record that long, of an event whose layout has room for one: padded with
  // 'a' up to fixed_size + 0xffff.
  const Event& many = table[kEvents - 1];
  std::vector<uint8_t> m = written_record(many);
  const uint32_t mfixed = many.view.compiled.program.fixed_size;
  put_loc(m, many.view.compiled.fields[0], 0, 0xffffu << 16 | mfixed);
  const uint32_t padded = mfixed + 0xffff;
  std::vector<uint8_t> in = {0x06, static_cast<uint8_t>(8 | (kEvents - 1)),
                             static_cast<uint8_t>(padded),
                             static_cast<uint8_t>(padded >> 8),
                             static_cast<uint8_t>(padded >> 16), 'a'};
  in.insert(in.end(), m.begin(), m.end());
  write_seed(dir, "loc_64k_inside", in);
  r = good;
  for (uint32_t k = 0; k < 3; ++k) put_loc(r, field("arr"), k, s_loc);  // overlapping array
  write_seed(dir, "array_overlap", direct_input(0x0a, 0, r));
  r = good;
  put_loc(r, field("cm"), 0, 8u << 16 | static_cast<uint32_t>(good.size() - 2));  // past end
  write_seed(dir, "loc_past_end", direct_input(0x12, 0, r));
  r.assign(good.begin(), good.begin() + ev.program.fixed_size / 2);  // a cut fixed part
  write_seed(dir, "short", direct_input(0x22, 0, r));
  const Event& sym = table[1];
  std::vector<uint8_t> k = written_record(sym);
  write_seed(dir, "kprobe_long_names", direct_input(0x42, 1, k));

  // The ring: well-formed records of each event and a marker, consumed and walked; then
  // the same with a scribbled record header and head.
  std::vector<uint8_t> ring = {0x01};
  for (size_t i = 0; i < table.size(); ++i)
    append_produce(ring, static_cast<uint8_t>(i & 1), static_cast<uint8_t>(i),
                   written_record(table[i]));
  std::vector<uint8_t> marker(fs::kMarkerHeaderSize + 6, 0);
  std::memcpy(marker.data() + 16, "fuzzprog", 8);
  marker[12] = 6;
  std::memcpy(marker.data() + fs::kMarkerHeaderSize, "hello\n", 6);
  append_produce(ring, 0, static_cast<uint8_t>(kAllEvents), marker);
  std::vector<uint8_t> walked = ring;
  walked.insert(walked.end(), {3, 15, 2, 3});
  write_seed(dir, "ring_well_formed", walked);
  // Hostile records delivered (a cut fixed part, two locs on the same bytes), then the
  // same again with ring 0's next record header and ring 1's head scribbled over.
  std::vector<uint8_t> hostile = {0x03};
  std::vector<uint8_t> same = good;
  put_loc(same, field("u"), 0, s_loc);
  append_produce(hostile, 0, 0, r);
  append_produce(hostile, 1, 0, same);
  hostile.insert(hostile.end(), {2, 7});
  append_produce(hostile, 0, 0, r);
  append_produce(hostile, 1, 0, same);
  RingLayout l;
  RingGeometry g;
  g.ring_count = 2;
  g.ring_bytes = kRingMinBytes;
  g.probe_slots = 8;
  ring_layout(g, &l);
  // Ring 0's second record header.
  const uint32_t data0 = l.rings_offset + l.data_offset +
                         ((kRingRecordHeaderSize + static_cast<uint32_t>(r.size()) + 7) & ~7u);
  hostile.insert(hostile.end(), {1, static_cast<uint8_t>(data0), static_cast<uint8_t>(data0 >> 8),
                                 4, 0xf0, 0x0f, 0, 0});  // its len: 4080
  const uint32_t head1 = l.rings_offset + l.ring_stride + 4;  // ring 1's head
  hostile.insert(hostile.end(), {1, static_cast<uint8_t>(head1), static_cast<uint8_t>(head1 >> 8),
                                 4, 0x09, 0, 0, 0});  // odd
  hostile.insert(hostile.end(), {2, 7, 3, 15});
  write_seed(dir, "ring_scribbled", hostile);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  events_table();
  if (const char* dir = std::getenv("PROBEFS_RECORDS_FUZZ_SEEDS")) {
    write_seeds(dir);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2 || ((data[0] & 1) == 0 && (data[1] & 8) && size < 6)) return 0;
  const uint8_t ctl = data[0];
  if ((ctl & 1) == 0) {
    const Event& e = events_table()[(data[1] & 7) % kAllEvents];
    if (data[1] & 8) {
      const size_t want = (data[2] | size_t{data[3]} << 8 | size_t{data[4]} << 16) % (1u << 18);
      std::vector<uint8_t> rec(data + 6, data + size);
      if (rec.size() < want) rec.resize(want, data[5]);
      run_record(e, ctl, rec.data(), static_cast<uint32_t>(rec.size()));
    } else {
      run_record(e, ctl, data + 2, static_cast<uint32_t>(size - 2));
    }
  } else {
    run_ring(Input{data + 1, size - 1}, ctl);
  }
  return 0;
}
