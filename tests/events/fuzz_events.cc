// libFuzzer target for the definition parser, the compiler and the filter compiler.
// Input: one byte choosing the file (kprobe_events, uprobe_events, dynamic_events), a
// definition line, '\n', then a filter. Whatever parses must read back to text that parses
// to the same read-back; whatever compiles must run, format and filter without a crash.
// Two more choices feed the rest to the program and filter decoders of the agent link:
// what decodes must run inside its record. Every record the writer produces must pass the
// daemon's record check (record.h).
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "events/compile.h"
#include "events/fetch.h"
#include "events/filter.h"
#include "events/memory_reader.h"
#include "events/output.h"
#include "events/parse.h"
#include "events/record.h"
#include "events/sdt_args.h"
#include "events/synthetic.h"
#include "events/wire.h"

using namespace probefs;
using namespace probefs::events;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  if (data[0] % 5 >= 3) {
    PtRegs regs{};
    FakeMemoryReader mem;
    HitContext hc;
    hc.regs = &regs;
    static uint8_t rec[1 << 16];
    if (data[0] % 5 == 3) {
      FetchProgram p;
      if (!decode_program(data + 1, size - 1, &p)) return 0;
      uint64_t entry[kMaxStackParam] = {};
      hc.entry_args = entry;
      uint32_t cap = p.max_record_size() < sizeof rec ? p.max_record_size() : sizeof rec;
      write_record(view_of(p), hc, mem, rec, cap);
    } else {
      CompiledFilter f;
      if (!decode_filter(data + 1, size - 1, &f)) return 0;
      filter_match(f, rec, 64, FilterContext{0, "fuzz"});
    }
    return 0;
  }
  int mode = data[0] % 5;
  std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  size_t nl = rest.find('\n');
  std::string_view line = rest.substr(0, nl);
  std::string_view filter = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);

  bool too_long;
  split_write(rest, &too_long);
  // The synthetic_events language on the same line: carets inside the command, and what
  // it defines reads back into the same definition.
  for (const SynthResult& sr :
       {parse_synthetic_command(line), is_synthetic_dynamic(line) ? parse_synthetic_dynamic(line)
                                                                  : SynthResult{}}) {
    if (sr.status == SynthStatus::kError &&
        (sr.error.pos < 0 || sr.error.pos > static_cast<int>(sr.error.command.size())))
      abort();
    if (sr.status != SynthStatus::kDefine) continue;
    std::string back = synthetic_description(sr.event);
    back[back.find('\t')] = ' ';
    const SynthResult again = parse_synthetic_command(back);
    if (again.status != SynthStatus::kDefine ||
        synthetic_description(again.event) != synthetic_description(sr.event))
      abort();
    format_file(synthetic_compiled(sr.event), 1);
  }
  ParseResult r = mode == 0   ? parse_kprobe_command(line)
                  : mode == 1 ? parse_uprobe_command(line)
                              : parse_dynamic_command(line);
  if (r.status == ParseStatus::kError && r.error.logged()) {
    if (r.error.pos < 0 || r.error.pos > static_cast<int>(r.error.command.size()) + 1) abort();
    format_error_log_entry(1, r.error);
  }
  if (r.status != ParseStatus::kDefine) return 0;

  // Default names are made from the place as the kernel makes them and need not be
  // identifiers ("p_a+b_0x10"); only a definition with an identifier name can be
  // written back as it reads.
  bool ident = !r.def.event.empty();
  for (size_t i = 0; i < r.def.event.size(); ++i) {
    char c = r.def.event[i];
    bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) ident = false;
  }
  std::string text = read_back(r.def);
  if (ident) {
    ParseResult again = parse_dynamic_command(text);
    if (again.status != ParseStatus::kDefine || read_back(again.def) != text) abort();
  }

  CompiledEvent ev;
  Diagnostic err;
  auto resolve = [](std::string_view, uint64_t* a) {
    *a = 0x1000;
    return true;
  };
  // A USDT point: the input's second line as its note's argument spec, bound as the
  // daemon binds it where the point is placed.
  ProbeDefinition def = r.def;
  if (def.on_sdt()) {
    std::vector<SdtOperand> ops;
    size_t bad = 0;
    ErrorCode why{};
    if (!parse_sdt_args(filter, &ops, &bad) && bad != ops.size()) abort();
    if (!bind_sdt_args(&def, ops, &bad, &why)) {
      if (bad >= def.args.size()) abort();
      return 0;
    }
  }
  if (!compile(def, resolve, &ev, &err)) return 0;
  format_file(ev, 1);
  // What the daemon compiles, the agent link carries unchanged.
  std::vector<uint8_t> blob = encode_program(ev.program);
  FetchProgram back;
  if (!decode_program(blob.data(), blob.size(), &back)) abort();

  PtRegs regs{};
  regs.di = 0x1000;
  regs.si = 0x1008;
  regs.sp = 0x1010;
  FakeMemoryReader mem;
  char bytes[64];
  for (int i = 0; i < 64; ++i) bytes[i] = static_cast<char>(i * 7 % 23 + 0x20);
  bytes[40] = 0;
  mem.map(0x1000, bytes, sizeof bytes);
  HitContext hc;
  hc.regs = &regs;
  hc.comm = "fuzz";
  uint64_t entry[kMaxStackParam] = {};
  hc.entry_args = entry;
  static uint8_t rec[1 << 16];
  uint32_t cap = ev.program.max_record_size();
  if (cap > sizeof rec) cap = sizeof rec;
  uint32_t n = write_record(view_of(ev.program), hc, mem, rec, cap);
  // What the record writer produces is what the daemon's check lets through.
  if (n && check_record(ev, rec, n) != RecordFault::kFits) abort();
  std::string out;
  format_trace_line(out, ev, LineContext{"fuzz", 1, 0, 0}, rec, n);

  CompiledFilter f;
  if (compile_filter(filter, ev, &f, &err)) {
    filter_match(f, rec, n, FilterContext{0, "fuzz"});
    std::vector<uint8_t> fblob = encode_filter(f);
    CompiledFilter fback;
    if (!decode_filter(fblob.data(), fblob.size(), &fback)) abort();
  } else {
    filter_error_text(err);
  }
  return 0;
}
