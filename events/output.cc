#include "events/output.h"

#include <cstring>

#include "events/synthetic.h"

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

// "%lx": lower-case hex digits, no prefix.
void put_hex_digits(Out& o, uint64_t v) {
  static const char kDigits[] = "0123456789abcdef";
  char buf[20];
  int n = 0;
  do {
    buf[n++] = kDigits[v & 15];
    v >>= 4;
  } while (v);
  while (n) o.put(buf[--n]);
}

void put_hex(Out& o, uint64_t v) {
  o.put('0');
  o.put('x');
  put_hex_digits(o, v);
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

void put_symbol(Out& o, const SymbolInfo& si, bool with_offset) {
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
}

// The kernel's "%pS"-style name: sym+0xoff/0xsize [mod], or the bare address.
void put_sym(Out& o, uint64_t addr, bool with_offset, Symbolizer* sym) {
  SymbolInfo si;
  if (sym && sym->lookup(addr, &si)) {
    put_symbol(o, si, with_offset);
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


// ---- Synthetic events: the kernel's print_synth_event() (trace_events_synth.c) ----
//
//   NAME: f1=V1 f2=V2...\n
// Every field's value is followed by a blank unless it is the last, with the kernel's two
// exceptions kept: a gfp_t's " (FLAGS)" comes after that blank (and holds a NUL byte, the
// terminator trace_print_flags_seq() writes into the line), and a stack
// ("NAME=STACK:\n=> addr\n...") is followed by nothing.

// What the synthetic_events language called a field's type, as it prints.
enum class SynthKind : uint8_t {
  kNumber,
  kString,     // char[N], kept in place
  kDynString,  // char[]: a __data_loc in the low 32 bits of its slot
  kStack,      // long[]: a __data_loc of addresses
};

// synth_field_fmt(): %llu/%lu, %lld/%ld, %d, %u, %x.
enum class SynthConv : uint8_t { kU64, kS64, kInt, kUInt, kHex };

struct SynthShape {
  SynthKind kind = SynthKind::kNumber;
  SynthConv conv = SynthConv::kU64;  // a type the table does not name prints %llu
  bool gfp = false;                  // gfp_t: " (FLAGS)" after the number
};

struct SynthNumberType {
  std::string_view name;
  SynthConv conv;
};

constexpr SynthNumberType kSynthNumberTypes[] = {
    {"s64", SynthConv::kS64},   {"u64", SynthConv::kU64},
    {"s32", SynthConv::kInt},   {"u32", SynthConv::kUInt},
    {"s16", SynthConv::kInt},   {"u16", SynthConv::kUInt},
    {"s8", SynthConv::kInt},    {"u8", SynthConv::kUInt},
    {"char", SynthConv::kInt},  {"unsigned char", SynthConv::kUInt},
    {"int", SynthConv::kInt},   {"unsigned int", SynthConv::kUInt},
    {"long", SynthConv::kS64},  {"unsigned long", SynthConv::kU64},
    {"bool", SynthConv::kInt},  {"pid_t", SynthConv::kInt},
    {"gfp_t", SynthConv::kHex},
};

bool is_blank(char c) { return c == ' ' || c == '\t'; }

// The type, read back from the format file's declaration: everything before the last
// word ("unsigned int x", "char comm[]" for char[N], "__data_loc char[] s",
// "__data_loc long[] st"). As the kernel decides, a __data_loc type naming "char[" is a
// string and any other is a stack.
SynthShape synth_shape(const FieldLayout& f) {
  std::string_view decl = f.decl;
  while (!decl.empty() && is_blank(decl.back())) decl.remove_suffix(1);
  const size_t blank = decl.find_last_of(" \t");
  std::string_view type, name = decl;
  if (blank != std::string_view::npos) {
    type = decl.substr(0, blank);
    name = decl.substr(blank + 1);
  }
  while (!type.empty() && is_blank(type.back())) type.remove_suffix(1);
  SynthShape sh;
  if (type.starts_with("__data_loc ")) {
    sh.kind = type.find("char[") != std::string_view::npos ? SynthKind::kDynString
                                                           : SynthKind::kStack;
  } else if (name.ends_with("[]")) {
    sh.kind = SynthKind::kString;
  } else {
    for (const SynthNumberType& t : kSynthNumberTypes) {
      if (type == t.name) {
        sh.conv = t.conv;
        sh.gfp = t.conv == SynthConv::kHex;
        break;
      }
    }
  }
  return sh;
}

// The gfp flag names a synthetic event prints (include/trace/events/mmflags.h's
// __def_gfpflag_names in Linux 6.1, bit values of include/linux/gfp_types.h on a kernel
// without KASAN_HW_TAGS or LOCKDEP), in the kernel's order: the first mask wholly set
// in what is left is named and taken away.
namespace gfp {
constexpr uint64_t kDma = 0x01, kHighmem = 0x02, kDma32 = 0x04, kMovable = 0x08,
                   kReclaimable = 0x10, kHigh = 0x20, kIo = 0x40, kFs = 0x80, kZero = 0x100,
                   kAtomic = 0x200, kDirectReclaim = 0x400, kKswapdReclaim = 0x800,
                   kWrite = 0x1000, kNowarn = 0x2000, kRetryMayfail = 0x4000,
                   kNofail = 0x8000, kNoretry = 0x10000, kMemalloc = 0x20000,
                   kComp = 0x40000, kNomemalloc = 0x80000, kHardwall = 0x100000,
                   kThisnode = 0x200000, kAccount = 0x400000, kZerotags = 0x800000;
constexpr uint64_t kReclaim = kDirectReclaim | kKswapdReclaim;
constexpr uint64_t kKernel = kReclaim | kIo | kFs;
constexpr uint64_t kUser = kKernel | kHardwall;
constexpr uint64_t kHighuser = kUser | kHighmem;
constexpr uint64_t kHighuserMovable = kHighuser | kMovable;
constexpr uint64_t kTranshugeLight = (kHighuserMovable | kComp | kNomemalloc | kNowarn) & ~kReclaim;
constexpr uint64_t kTranshuge = kTranshugeLight | kDirectReclaim;

struct Name {
  uint64_t mask;
  std::string_view name;
};

constexpr Name kNames[] = {
    {kTranshuge, "GFP_TRANSHUGE"},
    {kTranshugeLight, "GFP_TRANSHUGE_LIGHT"},
    {kHighuserMovable, "GFP_HIGHUSER_MOVABLE"},
    {kHighuser, "GFP_HIGHUSER"},
    {kUser, "GFP_USER"},
    {kKernel | kAccount, "GFP_KERNEL_ACCOUNT"},
    {kKernel, "GFP_KERNEL"},
    {kReclaim | kIo, "GFP_NOFS"},
    {kHigh | kAtomic | kKswapdReclaim, "GFP_ATOMIC"},
    {kReclaim, "GFP_NOIO"},
    {kKswapdReclaim, "GFP_NOWAIT"},
    {kDma, "GFP_DMA"},
    {kHighmem, "__GFP_HIGHMEM"},
    {kDma32, "GFP_DMA32"},
    {kHigh, "__GFP_HIGH"},
    {kAtomic, "__GFP_ATOMIC"},
    {kIo, "__GFP_IO"},
    {kFs, "__GFP_FS"},
    {kNowarn, "__GFP_NOWARN"},
    {kRetryMayfail, "__GFP_RETRY_MAYFAIL"},
    {kNofail, "__GFP_NOFAIL"},
    {kNoretry, "__GFP_NORETRY"},
    {kComp, "__GFP_COMP"},
    {kZero, "__GFP_ZERO"},
    {kNomemalloc, "__GFP_NOMEMALLOC"},
    {kMemalloc, "__GFP_MEMALLOC"},
    {kHardwall, "__GFP_HARDWALL"},
    {kThisnode, "__GFP_THISNODE"},
    {kReclaimable, "__GFP_RECLAIMABLE"},
    {kMovable, "__GFP_MOVABLE"},
    {kAccount, "__GFP_ACCOUNT"},
    {kWrite, "__GFP_WRITE"},
    {kReclaim, "__GFP_RECLAIM"},
    {kDirectReclaim, "__GFP_DIRECT_RECLAIM"},
    {kKswapdReclaim, "__GFP_KSWAPD_RECLAIM"},
    {kZerotags, "__GFP_ZEROTAGS"},
};

// The most " (FLAGS\0)" can take: every name with its '|', then "0x" and 16 digits.
constexpr size_t text_bound() {
  size_t n = 4 + 18;
  for (const Name& g : kNames) n += g.name.size() + 1;
  return n;
}
}  // namespace gfp

// trace_print_flags_seq(): names joined by '|', what no name took as 0x%lx, nothing for
// 0; the NUL it ends with stays in the line.
void put_gfp_flags(Out& o, uint64_t flags) {
  o.put(" (");
  bool first = true;
  for (const gfp::Name& g : gfp::kNames) {
    if (!flags) break;
    if ((flags & g.mask) != g.mask) continue;
    flags &= ~g.mask;
    if (!first) o.put('|');
    first = false;
    o.put(g.name);
  }
  if (flags) {
    if (!first) o.put('|');
    put_hex(o, flags);
  }
  o.put('\0');
  o.put(')');
}

// print_synth_event_num_val(): the u64 slot cast to the field's size, unsigned, then
// converted as synth_field_fmt() says (so an s8 of -1 prints 255, an s32 of -1 prints -1).
void put_synth_number(Out& o, SynthConv conv, uint32_t size, uint64_t slot) {
  uint64_t v = slot;
  switch (size) {
    case 1: v = static_cast<uint8_t>(slot); break;
    case 2: v = static_cast<uint16_t>(slot); break;
    case 4: v = static_cast<uint32_t>(slot); break;
    default: break;
  }
  switch (conv) {
    case SynthConv::kU64: put_u64(o, v); break;
    case SynthConv::kS64: put_s64(o, static_cast<int64_t>(v)); break;
    case SynthConv::kInt: put_s64(o, static_cast<int32_t>(static_cast<uint32_t>(v))); break;
    case SynthConv::kUInt: put_u64(o, static_cast<uint32_t>(v)); break;
    case SynthConv::kHex: put_hex_digits(o, static_cast<uint32_t>(v)); break;
  }
}

// The most bytes a stack's __data_loc may name: the kernel's writer stores at most
// HIST_STACKTRACE_DEPTH (16) addresses, its terminating zero included.
constexpr uint32_t kSynthStackBytes = 16 * 8;

// A synthetic record's __data_loc (the low 32 bits of `slot`), by the rule of put_value:
// its 1..max bytes lie in the record after those of the dynamic field printed before it
// (*next, fixed_size at first), as the kernel's writer lays them out one after another.
// Whatever the record says, the regions accepted are disjoint bytes of [fixed_size, len).
bool synth_region(const uint8_t* slot, uint32_t len, uint32_t max, uint32_t* next,
                  uint32_t* off, uint32_t* size) {
  const uint32_t loc = static_cast<uint32_t>(load(slot, 4));
  const uint32_t n = loc >> 16, at = loc & 0xffff;
  if (n == 0 || n > max || at < *next || at >= len || n > len - at) return false;
  *next = at + n;
  *off = at;
  *size = n;
  return true;
}

void put_synth_body(Out& o, const CompiledEvent& ev, const uint8_t* rec, uint32_t len,
                    Symbolizer* sym) {
  o.put(ev.event);
  o.put(": ");
  uint32_t next = ev.program.fixed_size;  // where the next dynamic field may start
  const size_t nfields = ev.fields.size();
  for (size_t i = 0; i < nfields; ++i) {
    const FieldLayout& f = ev.fields[i];
    const SynthShape sh = synth_shape(f);
    const bool last = i + 1 == nfields;
    const uint8_t* slot = rec + f.offset;
    o.put(f.name);
    o.put('=');
    switch (sh.kind) {
      case SynthKind::kNumber: {
        const uint64_t v = load(slot, 8);
        put_synth_number(o, sh.conv, f.decl_size, v);
        if (!last) o.put(' ');
        if (sh.gfp) put_gfp_flags(o, v);  // all 64 bits of the slot, as the kernel passes them
        continue;
      }
      case SynthKind::kString: {
        // Up to the first NUL of its N bytes (of the record's, should it end sooner).
        uint32_t n = f.decl_size < kSynthStringMax ? f.decl_size : kSynthStringMax;
        const uint32_t room = f.offset < len ? len - f.offset : 0;
        if (n > room) n = room;
        const char* s = reinterpret_cast<const char*>(slot);
        o.put(std::string_view(s, strnlen(s, n)));
        break;
      }
      case SynthKind::kDynString: {
        uint32_t off = 0, n = 0;
        if (!synth_region(slot, len, static_cast<uint32_t>(kMaxStringSize), &next, &off, &n)) {
          o.put("(fault)");
          break;
        }
        const char* s = reinterpret_cast<const char*>(rec + off);
        o.put(std::string_view(s, strnlen(s, n)));
        break;
      }
      case SynthKind::kStack: {
        uint32_t off = 0, n = 0;
        if (!synth_region(slot, len, kSynthStackBytes, &next, &off, &n)) {
          o.put("(fault)");  // then a blank, as a string would have
          break;
        }
        o.put("STACK:\n");
        // Every whole address of the region up to the first zero.
        for (uint32_t at = 0; n - at >= 8; at += 8) {
          const uint64_t addr = load(rec + off + at, 8);
          if (!addr) break;
          o.put("=> ");
          put_sym(o, addr, true, sym);
          o.put('\n');
        }
        continue;  // the kernel puts no blank after a stack
      }
    }
    if (!last) o.put(' ');
  }
  o.put('\n');
}

// line_bound() for a synthetic event: names, numbers (with their flag names) and strings
// kept in place are bounded by the event; the dynamic fields accepted lie in disjoint
// bytes of the dynamic part (synth_region), so their strings' bytes are bounded by it and
// by kMaxStringSize each, and their addresses by an eighth of it and 16 each.
size_t synth_line_bound(const CompiledEvent& ev, const LineContext& ctx, uint32_t len) {
  size_t n = 96 + ctx.comm.size() + ev.event.size();
  uint64_t strings = 0, stacks = 0;
  for (const FieldLayout& f : ev.fields) {
    n += f.name.size() + 2;  // '=' and the blank
    const SynthShape sh = synth_shape(f);
    switch (sh.kind) {
      case SynthKind::kNumber: n += 24 + (sh.gfp ? gfp::text_bound() : 0); break;
      case SynthKind::kString: n += kSynthStringMax; break;
      case SynthKind::kDynString: n += 8; ++strings; break;       // "(fault)"
      case SynthKind::kStack: n += 16; ++stacks; break;           // "(fault)", "STACK:\n"
    }
  }
  const uint64_t dynamic = len - ev.program.fixed_size;  // len >= fixed_size here
  const uint64_t string_bytes = strings * static_cast<uint64_t>(kMaxStringSize);
  n += static_cast<size_t>(dynamic < string_bytes ? dynamic : string_bytes);
  const uint64_t addrs = stacks * (kSynthStackBytes / 8);
  n += static_cast<size_t>(dynamic / 8 < addrs ? dynamic / 8 : addrs) * (kSymBound + 8);
  return n;
}

}  // namespace

bool format_trace_line(std::string& out, const CompiledEvent& ev, const LineContext& ctx,
                       const uint8_t* rec, uint32_t len, Symbolizer* sym) {
  if (len < ev.program.fixed_size || len < 8) return false;
  size_t old = out.size();
  out.resize(old + (ev.synthetic ? synth_line_bound(ev, ctx, len) : line_bound(ev, ctx, len)));
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
  if (ev.synthetic) {
    put_synth_body(o, ev, rec, len, sym);
    if (o.p > out.data() + out.size()) __builtin_trap();  // as below
    out.resize(static_cast<size_t>(o.p - out.data()));
    return true;
  }
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

void format_symbol(std::string& out, const SymbolInfo& si) {
  const size_t at = out.size();
  out.resize(at + kSymBound);
  Out o{out.data() + at};
  put_symbol(o, si, true);
  out.resize(static_cast<size_t>(o.p - out.data()));
}

void format_lost_events(std::string& out, uint32_t cpu, uint64_t lost) {
  out += "CPU:";
  append_u64(out, cpu);
  out += " [LOST ";
  append_u64(out, lost);
  out += " EVENTS]\n";
}

}  // namespace probefs::events
