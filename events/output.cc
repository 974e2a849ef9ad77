#include "events/output.h"

#include <cstring>

namespace probefs::events {
namespace {

// Lines are formatted millions of times a second: the writer puts bytes through a raw
// pointer into room reserved up front (bounded from the record), and numbers are
// converted by hand; printf's format parsing and per-character capacity checks would
// dominate otherwise.
struct Out {
  char* p;
  void put(char c) { *p++ = c; }
  void put(std::string_view s) {
    if (s.empty()) return;  // an empty view may have no data at all
    std::memcpy(p, s.data(), s.size());
    p += s.size();
  }
  void fill(char c, size_t n) {
    std::memset(p, c, n);
    p += n;
  }
};

void put_u64(Out& o, uint64_t v) {
  char buf[24];
  int n = 0;
  do {
    buf[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v);
  while (n) o.put(buf[--n]);
}

void put_s64(Out& o, int64_t v) {
  if (v < 0) {
    o.put('-');
    put_u64(o, 0 - static_cast<uint64_t>(v));
  } else {
    put_u64(o, static_cast<uint64_t>(v));
  }
}

void put_hex(Out& o, uint64_t v) {
  static const char kDigits[] = "0123456789abcdef";
  char buf[20];
  int n = 0;
  do {
    buf[n++] = kDigits[v & 15];
    v >>= 4;
  } while (v);
  o.put('0');
  o.put('x');
  while (n) o.put(buf[--n]);
}

// Decimal, padded with `pad` to `width`.
void put_padded(Out& o, uint64_t v, int width, char pad) {
  char buf[24];
  int n = 0;
  do {
    buf[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v);
  for (int i = n; i < width; ++i) o.put(pad);
  while (n) o.put(buf[--n]);
}

uint64_t load(const uint8_t* p, unsigned size) {
  switch (size) {
    case 1: return *p;
    case 2: { uint16_t x; std::memcpy(&x, p, 2); return x; }
    case 4: { uint32_t x; std::memcpy(&x, p, 4); return x; }
    default: { uint64_t x; std::memcpy(&x, p, 8); return x; }
  }
}

int64_t sign_extend(uint64_t v, unsigned size) {
  switch (size) {
    case 1: return static_cast<int8_t>(v);
    case 2: return static_cast<int16_t>(v);
    case 4: return static_cast<int32_t>(v);
    default: return static_cast<int64_t>(v);
  }
}

// Room a symbol name may take: names are cut to this many bytes.
constexpr size_t kMaxSymText = 512;

void put_clipped(Out& o, std::string_view s) { o.put(s.substr(0, kMaxSymText)); }

// The kernel's "%pS"-style name: sym+0xoff/0xsize [mod], or the bare address.
void put_sym(Out& o, uint64_t addr, bool with_offset, Symbolizer* sym) {
  SymbolInfo si;
  if (sym && sym->lookup(addr, &si)) {
    put_clipped(o, si.name);
    if (with_offset) {
      o.put('+');
      put_hex(o, si.offset);
      o.put('/');
      put_hex(o, si.size);
    }
    if (!si.module.empty()) {
      o.put(" [");
      put_clipped(o, si.module);
      o.put(']');
    }
    if (!si.note.empty()) {
      o.put(" (");
      put_clipped(o, si.note);
      o.put(')');
    }
    return;
  }
  put_hex(o, addr);
}

void put_ip_sym(Out& o, uint64_t ip, bool with_offset, Symbolizer* sym) {
  if (!ip) {
    o.put('0');
    return;
  }
  put_sym(o, ip, with_offset, sym);
}

constexpr size_t kSymBound = 3 * kMaxSymText + 64;  // name, module and note, clipped each

// A string prints only when its bytes lie in the record's dynamic part after those of the
// string printed before it (`*next`: where that one ended, fixed_size at first), and
// hold at most kMaxStringSize bytes, as the record writer (fetch.h) lays strings out.
// Whatever the record says, the strings printed then name disjoint bytes of
// [fixed_size, len): line_bound() can count them once. Any other __data_loc prints as
// the kernel prints a string the fetch could not read, "(fault)".
void put_value(Out& o, const FetchType* t, const uint8_t* p, const uint8_t* rec, uint32_t len,
               uint32_t* next, Symbolizer* sym) {
  switch (t->print) {
    case PrintKind::kUnsigned: put_u64(o, load(p, t->size)); break;
    case PrintKind::kSigned: put_s64(o, sign_extend(load(p, t->size), t->size)); break;
    case PrintKind::kHex: put_hex(o, load(p, t->size)); break;
    case PrintKind::kChar:
      o.put('\'');
      o.put(static_cast<char>(*p));
      o.put('\'');
      break;
    case PrintKind::kSymbol: put_sym(o, load(p, 8), true, sym); break;
    case PrintKind::kString: {
      uint32_t loc = static_cast<uint32_t>(load(p, 4));
      uint32_t slen = loc >> 16, off = loc & 0xffff;
      if (slen == 0 || slen > static_cast<uint32_t>(kMaxStringSize) || off < *next ||
          off >= len || slen > len - off) {
        o.put("(fault)");
        break;
      }
      *next = off + slen;
      o.put('"');
      if (t->name[0] == 's' && t->name[1] == 'y' && slen == 8) {  // symstr
        put_sym(o, load(rec + off, 8), true, sym);
      } else {
        const char* s = reinterpret_cast<const char*>(rec + off);
        o.put(std::string_view(s, strnlen(s, slen)));
      }
      o.put('"');
      break;
    }
  }
}

// An upper bound of the text one record can produce. It is kept tight because the room
// is cleared when reserved. Every part but the strings' bytes is bounded by the event
// (names, numbers, symbol names clipped to kMaxSymText); the strings printed lie in
// disjoint bytes of the dynamic part (put_value) and each is at most kMaxStringSize, so
// together they are bounded by both the dynamic part's size and the event's string slots.
// A length the record claims never adds to the room.
size_t line_bound(const CompiledEvent& ev, const LineContext& ctx, uint32_t len) {
  size_t n = 96 + ctx.comm.size() + ev.event.size();
  n += ev.syntax == ProbeSyntax::kKprobe ? 2 * kSymBound : 48;
  for (const FieldLayout& f : ev.fields) {
    size_t per = 24;
    if (f.type->print == PrintKind::kSymbol || std::strcmp(f.type->name, "symstr") == 0)
      per = kSymBound + 8;
    n += f.name.size() + 4 + per * (f.count ? f.count : 1);
  }
  const uint64_t dynamic = len - ev.program.fixed_size;  // len >= fixed_size here
  const uint64_t slots =
      uint64_t{ev.program.string_slots} * static_cast<uint64_t>(kMaxStringSize);
  n += static_cast<size_t>(dynamic < slots ? dynamic : slots);
  return n;
}

}  // namespace

bool format_trace_line(std::string& out, const CompiledEvent& ev, const LineContext& ctx,
                       const uint8_t* rec, uint32_t len, Symbolizer* sym) {
  if (len < ev.program.fixed_size) return false;
  size_t old = out.size();
  out.resize(old + line_bound(ev, ctx, len));
  Out o{out.data() + old};
  // "%16s-%-7d [%03d] "
  if (ctx.comm.size() < 16) o.fill(' ', 16 - ctx.comm.size());
  o.put(ctx.comm);
  o.put('-');
  char* pid_start = o.p;
  put_s64(o, ctx.pid);
  size_t w = static_cast<size_t>(o.p - pid_start);
  if (w < 7) o.fill(' ', 7 - w);
  o.put(" [");
  put_padded(o, ctx.cpu, 3, '0');
  o.put("] ");
  // The five flag characters, by the kernel's legend. A user thread never has interrupts
  // off, a pending reschedule or an irq context, so these read '.' unless a record says
  // otherwise.
  uint8_t flags = rec[2], pc = rec[3];
  o.put(flags & 0x01 ? 'd' : '.');
  o.put(flags & 0x04 ? 'N' : '.');
  o.put(flags & 0x08 ? 'h' : (flags & 0x10 ? 's' : '.'));
  o.put(pc & 0x0f ? "0123456789abcdef"[pc & 0x0f] : '.');
  o.put(pc & 0xf0 ? "0123456789abcdef"[pc >> 4] : '.');
  o.put(' ');
  // "%5lu.%06lu" of the timestamp rounded to microseconds.
  uint64_t usecs = (ctx.ts_ns + 500) / 1000;
  put_padded(o, usecs / 1000000, 5, ' ');
  o.put('.');
  put_padded(o, usecs % 1000000, 6, '0');
  o.put(": ");
  o.put(ev.event);
  o.put(": (");
  uint64_t ip = load(rec + 8, 8);
  if (ev.syntax == ProbeSyntax::kKprobe) {
    if (ev.is_return) {
      put_ip_sym(o, load(rec + 16, 8), true, sym);
      o.put(" <- ");
      put_ip_sym(o, ip, false, sym);
    } else {
      put_ip_sym(o, ip, true, sym);
    }
  } else if (ev.is_return) {
    put_hex(o, load(rec + 16, 8));
    o.put(" <- ");
    put_hex(o, ip);
  } else {
    put_hex(o, ip);
  }
  o.put(')');
  uint32_t next = ev.program.fixed_size;  // where the next string may start (put_value)
  for (const FieldLayout& f : ev.fields) {
    o.put(' ');
    o.put(f.name);
    o.put('=');
    const uint8_t* p = rec + f.offset;
    if (f.count) {
      o.put('{');
      uint32_t es = f.type->size;
      for (uint32_t i = 0; i < f.count; ++i) {
        if (i) o.put(',');
        put_value(o, f.type, p + i * es, rec, len, &next, sym);
      }
      o.put('}');
    } else {
      put_value(o, f.type, p, rec, len, &next, sym);
    }
  }
  o.put('\n');
  // line_bound() is a proof, not a guess; should it ever be wrong, stop here rather than
  // go on with a heap written past its end (one comparison per line).
  if (o.p > out.data() + out.size()) __builtin_trap();
  out.resize(static_cast<size_t>(o.p - out.data()));
  return true;
}

namespace {

void append_u64(std::string& s, uint64_t v) {
  char buf[24];
  Out o{buf};
  put_u64(o, v);
  s.append(buf, static_cast<size_t>(o.p - buf));
}

void append_padded(std::string& s, uint64_t v, int width) {
  char buf[48];
  Out o{buf};
  put_padded(o, v, width < 40 ? width : 40, ' ');
  s.append(buf, static_cast<size_t>(o.p - buf));
}

}  // namespace

std::string trace_header(uint64_t entries, uint64_t written, int cpus) {
  std::string s = "# tracer: nop\n#\n# entries-in-buffer/entries-written: ";
  append_u64(s, entries);
  s.push_back('/');
  append_u64(s, written);
  s += "   #P:";
  append_u64(s, static_cast<uint64_t>(cpus));
  s +=
      "\n#\n"
      "#                                _-----=> irqs-off/BH-disabled\n"
      "#                               / _----=> need-resched\n"
      "#                              | / _---=> hardirq/softirq\n"
      "#                              || / _--=> preempt-depth\n"
      "#                              ||| / _-=> migrate-disable\n"
      "#                              |||| /     delay\n"
      "#           TASK-PID     CPU#  |||||  TIMESTAMP  FUNCTION\n"
      "#              | |         |   |||||     |         |\n";
  return s;
}

void format_profile_line(std::string& out, std::string_view path, std::string_view event,
                         uint64_t hits) {
  out += "  ";
  out += path;
  out.push_back(' ');
  out += event;
  if (event.size() < 44) out.append(44 - event.size(), ' ');
  out.push_back(' ');
  append_padded(out, hits, 15);
  out.push_back('\n');
}

void format_lost_events(std::string& out, uint32_t cpu, uint64_t lost) {
  out += "CPU:";
  append_u64(out, cpu);
  out += " [LOST ";
  append_u64(out, lost);
  out += " EVENTS]\n";
}

}  // namespace probefs::events
