#include "events/output.h"

#include <cstring>

namespace probefs::events {
namespace {

// Number formatting by hand: lines are formatted millions of times a second and printf's
// format parsing would dominate.
void put_u64(std::string& out, uint64_t v) {
  char buf[24];
  int n = 0;
  do {
    buf[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v);
  while (n) out.push_back(buf[--n]);
}

void put_s64(std::string& out, int64_t v) {
  if (v < 0) {
    out.push_back('-');
    put_u64(out, 0 - static_cast<uint64_t>(v));
  } else {
    put_u64(out, static_cast<uint64_t>(v));
  }
}

void put_hex(std::string& out, uint64_t v) {
  static const char kDigits[] = "0123456789abcdef";
  char buf[20];
  int n = 0;
  do {
    buf[n++] = kDigits[v & 15];
    v >>= 4;
  } while (v);
  out += "0x";
  while (n) out.push_back(buf[--n]);
}

// Decimal, zero- or space-padded to `width`.
void put_padded(std::string& out, uint64_t v, int width, char pad) {
  char buf[24];
  int n = 0;
  do {
    buf[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v);
  for (int i = n; i < width; ++i) out.push_back(pad);
  while (n) out.push_back(buf[--n]);
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

// The kernel's "%pS"-style name: sym+0xoff/0xsize [mod], or the bare address.
void put_sym(std::string& out, uint64_t addr, bool with_offset, Symbolizer* sym) {
  SymbolInfo si;
  if (sym && sym->lookup(addr, &si)) {
    out += si.name;
    if (with_offset) {
      out.push_back('+');
      put_hex(out, si.offset);
      out.push_back('/');
      put_hex(out, si.size);
    }
    if (!si.module.empty()) {
      out += " [";
      out += si.module;
      out.push_back(']');
    }
    return;
  }
  put_hex(out, addr);
}

void put_ip_sym(std::string& out, uint64_t ip, bool with_offset, Symbolizer* sym) {
  if (!ip) {
    out.push_back('0');
    return;
  }
  put_sym(out, ip, with_offset, sym);
}

void put_value(std::string& out, const FetchType* t, const uint8_t* p, const uint8_t* rec,
               uint32_t len, Symbolizer* sym) {
  switch (t->print) {
    case PrintKind::kUnsigned: put_u64(out, load(p, t->size)); break;
    case PrintKind::kSigned: put_s64(out, sign_extend(load(p, t->size), t->size)); break;
    case PrintKind::kHex: put_hex(out, load(p, t->size)); break;
    case PrintKind::kChar:
      out.push_back('\'');
      out.push_back(static_cast<char>(*p));
      out.push_back('\'');
      break;
    case PrintKind::kSymbol: put_sym(out, load(p, 8), true, sym); break;
    case PrintKind::kString: {
      uint32_t loc = static_cast<uint32_t>(load(p, 4));
      uint32_t slen = loc >> 16, off = loc & 0xffff;
      if (slen == 0 || off >= len || slen > len - off) {
        out += "(fault)";
        break;
      }
      out.push_back('"');
      if (std::strcmp(t->name, "symstr") == 0 && slen == 8) {
        put_sym(out, load(rec + off, 8), true, sym);
      } else {
        const char* s = reinterpret_cast<const char*>(rec + off);
        size_t n = strnlen(s, slen);
        out.append(s, n);
      }
      out.push_back('"');
      break;
    }
  }
}

}  // namespace

bool format_trace_line(std::string& out, const CompiledEvent& ev, const LineContext& ctx,
                       const uint8_t* rec, uint32_t len, Symbolizer* sym) {
  if (len < ev.program.fixed_size) return false;
  // "%16s-%-7d [%03d] "
  if (ctx.comm.size() < 16) out.append(16 - ctx.comm.size(), ' ');
  out += ctx.comm;
  out.push_back('-');
  size_t before = out.size();
  put_s64(out, ctx.pid);
  size_t w = out.size() - before;
  if (w < 7) out.append(7 - w, ' ');
  out += " [";
  put_padded(out, ctx.cpu, 3, '0');
  out += "] ";
  // The five flag characters, by the kernel's legend. A user thread never has interrupts
  // off, a pending reschedule or an irq context, so these read '.' unless a record says
  // otherwise.
  uint8_t flags = rec[2], pc = rec[3];
  out.push_back(flags & 0x01 ? 'd' : '.');
  out.push_back(flags & 0x04 ? 'N' : '.');
  out.push_back(flags & 0x08 ? 'h' : (flags & 0x10 ? 's' : '.'));
  out.push_back(pc & 0x0f ? "0123456789abcdef"[pc & 0x0f] : '.');
  out.push_back(pc & 0xf0 ? "0123456789abcdef"[pc >> 4] : '.');
  out.push_back(' ');
  // "%5lu.%06lu" of the timestamp rounded to microseconds.
  uint64_t usecs = (ctx.ts_ns + 500) / 1000;
  put_padded(out, usecs / 1000000, 5, ' ');
  out.push_back('.');
  put_padded(out, usecs % 1000000, 6, '0');
  out += ": ";
  out += ev.event;
  out += ": (";
  uint64_t ip = load(rec + 8, 8);
  if (ev.syntax == ProbeSyntax::kKprobe) {
    if (ev.is_return) {
      put_ip_sym(out, load(rec + 16, 8), true, sym);
      out += " <- ";
      put_ip_sym(out, ip, false, sym);
    } else {
      put_ip_sym(out, ip, true, sym);
    }
  } else if (ev.is_return) {
    put_hex(out, load(rec + 16, 8));
    out += " <- ";
    put_hex(out, ip);
  } else {
    put_hex(out, ip);
  }
  out.push_back(')');
  for (const FieldLayout& f : ev.fields) {
    out.push_back(' ');
    out += f.name;
    out.push_back('=');
    const uint8_t* p = rec + f.offset;
    if (f.count) {
      out.push_back('{');
      uint32_t es = f.type->size;
      for (uint32_t i = 0; i < f.count; ++i) {
        if (i) out.push_back(',');
        put_value(out, f.type, p + i * es, rec, len, sym);
      }
      out.push_back('}');
    } else {
      put_value(out, f.type, p, rec, len, sym);
    }
  }
  out.push_back('\n');
  return true;
}

std::string trace_header(uint64_t entries, uint64_t written, int cpus) {
  std::string s = "# tracer: nop\n#\n# entries-in-buffer/entries-written: ";
  put_u64(s, entries);
  s.push_back('/');
  put_u64(s, written);
  s += "   #P:";
  put_u64(s, static_cast<uint64_t>(cpus));
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
  put_padded(out, hits, 15, ' ');
  out.push_back('\n');
}

void format_lost_events(std::string& out, uint32_t cpu, uint64_t lost) {
  out += "CPU:";
  put_u64(out, cpu);
  out += " [LOST ";
  put_u64(out, lost);
  out += " EVENTS]\n";
}

}  // namespace probefs::events
