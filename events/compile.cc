#include "events/compile.h"

#include <cstdlib>
#include <cstring>

#include "events/parse.h"

namespace probefs::events {
namespace {

bool is_store(FetchOp op) {
  switch (op) {
    case FetchOp::kStRaw:
    case FetchOp::kStMem:
    case FetchOp::kStUMem:
    case FetchOp::kStString:
    case FetchOp::kStUString:
    case FetchOp::kStSymstr:
      return true;
    default:
      return false;
  }
}

// "sym+8" / "sym-8" / "sym": the kernel's split at the first '+' or '-'.
bool split_symbol_offset(const std::string& text, std::string* sym, int64_t* off) {
  size_t pm = text.find_first_of("+-");
  *off = 0;
  *sym = text.substr(0, pm);
  if (pm == std::string::npos) return true;
  const char* s = text.c_str() + pm;
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(s, &end, 0);
  if (errno || end == s || *end) return false;
  *off = v;
  return true;
}

std::string print_fmt_of(const ProbeDefinition& def) {
  std::string s = def.is_return ? "\"(%lx <- %lx)" : "\"(%lx)";
  for (const ProbeArg& a : def.args) {
    s += " " + a.name + "=";
    if (a.count) {
      s += "{";
      for (uint32_t j = 0; j < a.count; ++j) {
        if (j) s += ",";
        s += a.type->fmt;
      }
      s += "}";
    } else {
      s += a.type->fmt;
    }
  }
  s += def.is_return ? "\", REC->__probe_func, REC->__probe_ret_ip" : "\", REC->__probe_ip";
  for (const ProbeArg& a : def.args) {
    if (a.count) {
      for (uint32_t j = 0; j < a.count; ++j) {
        std::string el = a.name + "[" + std::to_string(j) + "]";
        s += a.type->is_string ? ", __get_str(" + el + ")" : ", REC->" + el;
      }
    } else {
      s += a.type->is_string ? ", __get_str(" + a.name + ")" : ", REC->" + a.name;
    }
  }
  return s;
}

}  // namespace

bool compile(const ProbeDefinition& def, const DataSymbolResolver& resolve, CompiledEvent* out,
             Diagnostic* err) {
  CompiledEvent ev;
  ev.syntax = def.syntax;
  ev.is_return = def.is_return;
  ev.group = def.group;
  ev.event = def.event;
  FetchProgram& prog = ev.program;
  prog.is_return = def.is_return;
  prog.header_size = def.is_return ? 24 : 16;
  prog.entry_args = def.entry_args;
  if (def.syntax == ProbeSyntax::kUprobe) prog.probe_offset = def.offset;
  prog.imm_string_faults = def.syntax == ProbeSyntax::kUprobe;
  prog.nargs = static_cast<uint32_t>(def.args.size());
  uint32_t off = prog.header_size;
  for (const ProbeArg& a : def.args) {
    FieldLayout f;
    f.name = a.name;
    f.type = a.type;
    f.offset = off;
    f.count = a.count;
    f.size = a.type->size * (a.count ? a.count : 1);
    off += f.size;
    if (a.type->is_string) prog.string_slots += a.count ? a.count : 1;

    for (size_t i = 0; i < a.code.size(); ++i) {
      FetchInsn in = a.code[i];
      if (in.op == FetchOp::kSymbol) {
        std::string sym;
        int64_t soff = 0;
        uint64_t addr = 0;
        if (!split_symbol_offset(a.symbol, &sym, &soff) || !resolve || !resolve(sym, &addr)) {
          if (err) *err = make_diagnostic(def, ErrorCode::kBadProbeAddr, 1, 0, ENOENT);
          return false;
        }
        // The next slot is the kImm the parser reserved for the address.
        FetchInsn imm = a.code[++i];
        imm.imm = addr + static_cast<uint64_t>(soff);
        prog.insns.push_back(imm);
        continue;
      }
      if (in.op == FetchOp::kData) {
        in.param = static_cast<uint32_t>(prog.strings.size());
        prog.strings += a.data;
        prog.strings += '\0';
      }
      if (is_store(in.op)) in.param = f.offset;
      prog.insns.push_back(in);
    }
    ev.fields.push_back(std::move(f));
  }
  prog.fixed_size = off;
  bool all_regs = !prog.insns.empty();
  for (size_t i = 0; all_regs && i < prog.insns.size(); i += 3) {
    all_regs = i + 2 < prog.insns.size() && prog.insns[i].op == FetchOp::kReg &&
               prog.insns[i + 1].op == FetchOp::kStRaw && prog.insns[i + 2].op == FetchOp::kEnd &&
               prog.insns[i + 1].param <= 0xffff;
  }
  if (all_regs) {
    for (size_t i = 0; i < prog.insns.size(); i += 3)
      prog.fast_regs.push_back(prog.insns[i].param | (uint32_t{prog.insns[i + 1].size} << 8) |
                               (prog.insns[i + 1].param << 16));
  }
  ev.print_fmt = print_fmt_of(def);
  *out = std::move(ev);
  return true;
}

std::string format_file(const CompiledEvent& ev, int id) {
  std::string s = "name: " + ev.event + "\nID: " + std::to_string(id) + "\nformat:\n";
  s += "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n";
  s += "\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n";
  s += "\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n";
  s += "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n";
  if (ev.synthetic) {
    for (const FieldLayout& f : ev.fields)
      s += "\tfield:" + f.decl + ";\toffset:" + std::to_string(f.offset) +
           ";\tsize:" + std::to_string(f.decl_size) + ";\tsigned:" + (f.decl_signed ? "1" : "0") +
           ";\n";
    return s + "\nprint fmt: " + ev.print_fmt + "\n";
  }
  if (ev.is_return) {
    s += "\tfield:unsigned long __probe_func;\toffset:8;\tsize:8;\tsigned:0;\n";
    s += "\tfield:unsigned long __probe_ret_ip;\toffset:16;\tsize:8;\tsigned:0;\n";
  } else {
    s += "\tfield:unsigned long __probe_ip;\toffset:8;\tsize:8;\tsigned:0;\n";
  }
  for (const FieldLayout& f : ev.fields) {
    s += "\tfield:";
    if (f.count && !f.type->is_string) {
      // An array declares its element type and "name[]"; a string array keeps the
      // __data_loc type with the count appended to it.
      s += std::string(f.type->fmttype) + " " + f.name + "[]";
    } else if (f.count) {
      s += std::string(f.type->fmttype) + "[" + std::to_string(f.count) + "] " + f.name;
    } else {
      s += std::string(f.type->fmttype) + " " + f.name;
    }
    s += ";\toffset:" + std::to_string(f.offset) + ";\tsize:" + std::to_string(f.size) +
         ";\tsigned:" + (f.type->is_signed ? "1" : "0") + ";\n";
  }
  s += "\nprint fmt: " + ev.print_fmt + "\n";
  return s;
}

}  // namespace probefs::events
