// A spec on one object -> definitions (see probe_finder.h).
#include "tools/probe_finder.h"

#include "tools/cxx_names.h"

#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <cstdio>

#include "tools/dwarf_points.h"
#include "tools/dwarf_vars.h"
#include "tools/sdt_notes.h"

namespace probefs::tools {
namespace {

std::string basename_of(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string hex(uint64_t v) {
  char b[32];
  snprintf(b, sizeof b, "0x%" PRIx64, v);
  return b;
}


// An argument as perf shows it back: NAME= where one was given or a member chain names it.
std::string arg_text(const ProbeArg& a) {
  std::string name = a.name;
  if (name.empty())
    for (const ArgField& f : a.fields)
      if (f.kind != ArgField::Kind::kIndex) name = f.name;
  std::string body = a.var;
  for (const ArgField& f : a.fields) {
    if (f.kind == ArgField::Kind::kArrow) body += "->" + f.name;
    if (f.kind == ArgField::Kind::kDot) body += "." + f.name;
    if (f.kind == ArgField::Kind::kIndex) body += "[" + std::to_string(f.index) + "]";
  }
  if (!a.type.empty()) body += ":" + a.type;
  return name.empty() ? body : name + "=" + body;
}

// The event name perf starts from: EVENT; FUNC_L<line> for FUNC:RLN; FUNC when it names
// one function; else the place's own function. A ".isra.0"-style or "@version" tail goes.
// A C++ name (beyond perf) gives the place's qualified name as a tracefs name, with its
// parameters where OVERLOAD (another place is another overload of the same name).
std::string base_event(const ProbeSpec& spec, const std::string& real_name,
                       const std::string& linkage = "", bool overload = false) {
  const ProbePoint& p = spec.point;
  std::string e;
  if (spec.event.empty() && is_cxx_name(p.function)) {
    // FUNC:RLN is named after FUNC (its line may be in another function), as perf does.
    if (p.has_line && !p.has_lazy && !p.has_offset)
      return cxx_event_name("", p.function, false) + "_L" +
             std::to_string(p.line);
    return cxx_event_name(linkage, real_name, overload);
  }
  if (!spec.event.empty())
    e = spec.event;
  else if (!p.function.empty() && p.has_line && !p.has_lazy && !p.has_offset)
    e = p.function + "_L" + std::to_string(p.line);
  else if (!p.function.empty() && p.function.find_first_of("*?[") == std::string::npos)
    e = p.function;
  else
    e = real_name;
  size_t cut = e.find_first_of(".@");
  if (cut != std::string::npos && cut != 0) e.resize(cut);
  return e;
}

TraceProbe new_probe(const ElfImage& image, const ProbeSpec& spec, const std::string& real_name,
                     const std::string& linkage = "", bool overload = false) {
  TraceProbe t;
  t.group = spec.group.empty() ? default_group(image.path()) : spec.group;
  t.event = base_event(spec, real_name, linkage, overload);
  t.retprobe = spec.point.retprobe;
  t.path = image.path();
  t.where = point_text(spec.point);
  for (const ProbeArg& a : spec.args) t.arg_texts.push_back(arg_text(a));
  return t;
}

// Places the probe at link-time address ADDR, in function SYMBOL entered at ENTRY.
Status locate(const ElfImage& image, uint64_t addr, const std::string& symbol, uint64_t entry,
              TraceProbe* t) {
  std::optional<uint64_t> off = image.file_offset(addr);
  if (!off) return make_error(-ENOENT, "Failed to find the file offset of " + hex(addr) + " in " +
                                           image.path());
  t->file_offset = *off;
  t->symbol = symbol;
  t->symbol_offset = addr - entry;
  return Ok{};
}

// Through the symbol table: function entries (+OFFS), %return, raw arguments and $retval.
Result<std::vector<TraceProbe>> from_symbols(const ElfImage& image, const ProbeSpec& spec,
                                             const FinderOptions& options) {
  const ProbePoint& p = spec.point;
  std::vector<TraceArg> args;
  for (const ProbeArg& a : spec.args) {
    if (a.var == "$retval" && !p.retprobe)
      return make_error(-EINVAL, "$retval can be used only with %return.");
    args.push_back({a.name, a.var, a.type});
  }
  std::vector<const ElfSymbol*> syms;
  const bool glob = p.function.find_first_of("*?[") != std::string::npos;
  if (p.has_address) {
    if (const ElfSymbol* s = image.function_at(p.address)) syms.push_back(s);
  } else if (is_cxx_name(p.function)) {
    for (const ElfSymbol& s : image.symbols())
      if (s.function && cxx_name_matches(p.function, s.name.starts_with("_Z") ? s.name : "", s.name))
        syms.push_back(&s);
  } else if (glob) {
    for (const ElfSymbol& s : image.symbols())
      if (s.function && glob_match(p.function, s.name)) syms.push_back(&s);
  } else {
    syms = image.find_functions(p.function);
    // A name without a version is the default one, the one the dynamic linker binds.
    if (p.function.find('@') == std::string::npos && syms.size() > 1)
      std::erase_if(syms, [](const ElfSymbol* s) { return !s->default_version; });
  }
  if (syms.empty())
    return make_error(-ENOENT, "Failed to find symbol " +
                                   (p.has_address ? hex(p.address) : p.function) + " in " +
                                   image.path());
  std::vector<TraceProbe> out;
  for (const ElfSymbol* s : syms) {
    uint64_t addr = p.has_address ? p.address : s->value + p.offset;
    if (addr - s->value >= (s->size ? s->size : 1) && addr != s->value)
      return make_error(-ENOENT, "Offset " + std::to_string(addr - s->value) +
                                     " is bigger than the size of " + s->name);
    if (p.retprobe && addr != s->value)
      return make_error(-EINVAL, "Return probe must be on the head of the function.");
    if (out.size() == options.max_probes)
      return make_error(-ERANGE, "Too many( > " + std::to_string(options.max_probes) +
                                     ") probe point found.");
    const bool mangled = s->name.starts_with("_Z");
    bool overload = false;
    for (const ElfSymbol* o : syms)
      overload = overload || is_overload(o->name.starts_with("_Z") ? o->name : "", o->name,
                                         mangled ? s->name : "", s->name);
    TraceProbe t = new_probe(image, spec, s->name, mangled ? s->name : "", overload);
    if (Status st = locate(image, addr, s->name, s->value, &t); !st) return st.error();
    t.args = args;
    out.push_back(std::move(t));
  }
  return out;
}

VarContext context_of(const DwarfPlace& place, const DebugInfo& dbg, const ElfImage& image,
                      const FinderOptions& options, bool retprobe) {
  VarContext ctx;
  ctx.pc = place.addr;
  ctx.scopes = place.scopes;
  ctx.cfi = dbg.cfi();
  ctx.image = &image;
  ctx.retprobe = retprobe;
  ctx.kprobe_syntax = options.kprobe_syntax;
  return ctx;
}

Result<std::vector<DwarfPlace>> places_of(const DebugInfo& dbg, const ElfImage& image,
                                          const ProbeSpec& spec, const FinderOptions& options,
                                          std::vector<std::string>* notes) {
  PlaceQuery q;
  q.image = &image;
  q.point = spec.point;
  q.max_probes = options.max_probes;
  q.no_inlines = options.no_inlines;
  q.source_prefix = options.source_prefix;
  for (const ProbeArg& a : spec.args)
    if (a.is_variable() || a.var == "$params" || a.var == "$vars") q.with_variables = true;
  auto places = find_places(dbg, q);
  if (places && notes)
    for (const DwarfPlace& p : *places)
      if (p.prologue_skipped)
        notes->push_back(
            "Target program is compiled without optimization. Skipping prologue.\n"
            "Probe on address " + hex(p.unskipped) + " to force probing at the function entry.\n");
  return places;
}

}  // namespace

std::string point_text(const ProbePoint& p) {
  std::string s = p.has_address ? hex(p.address) : p.function;
  if (p.has_offset) s += "+" + std::to_string(p.offset);
  if (p.has_line && !p.function.empty()) s += ":" + std::to_string(p.line);
  if (p.retprobe) s += "%return";
  if (p.has_lazy && !p.function.empty()) s += ";" + p.lazy;
  if (!p.file.empty()) {
    s += "@" + p.file;
    if (p.function.empty() && p.has_line) s += ":" + std::to_string(p.line);
    if (p.function.empty() && p.has_lazy) s += ";" + p.lazy;
  }
  return s;
}

std::string default_group(const std::string& path) {
  std::string base = basename_of(path);
  size_t cut = 0;
  while (cut < base.size() && (isalnum(static_cast<unsigned char>(base[cut])) || base[cut] == '_'))
    ++cut;
  return "probe_" + base.substr(0, cut);
}

bool needs_dwarf(const ProbeSpec& spec) {
  const ProbePoint& p = spec.point;
  if (!p.file.empty() || p.has_line || p.has_lazy) return true;
  for (const ProbeArg& a : spec.args)
    if (a.is_variable() || a.var == "$params" || a.var == "$vars") return true;
  return false;
}

namespace {

// An SDT point's probes: one per note of that name (and provider), at the note's place,
// counted in its semaphore, its arguments the note's (perf's arg1, arg2 ...).
Result<std::vector<TraceProbe>> sdt_probes(const ElfImage& image, const ProbeSpec& spec,
                                           const FinderOptions& options) {
  const ProbePoint& pt = spec.point;
  const std::string asked =
      (pt.sdt_provider.empty() ? "%" : "sdt_" + pt.sdt_provider + ":") + pt.sdt_name;
  if (options.kprobe_syntax)
    return make_error(-EOPNOTSUPP, "SDT events are uprobe events: " + asked + " without -k.");
  if (!spec.args.empty())
    return make_error(-EINVAL, "Semantic error :SDT events take their arguments from the note: " + asked);
  std::vector<TraceProbe> out;
  for (const SdtNote& n : sdt_notes(image)) {
    if (n.name != pt.sdt_name || (!pt.sdt_provider.empty() && n.provider != pt.sdt_provider))
      continue;
    TraceProbe t;
    t.group = "sdt_" + n.provider;
    t.event = n.name;
    t.path = image.path();
    std::optional<uint64_t> at = image.file_offset(n.pc);
    if (!at) return make_error(-ENOENT, "SDT point " + asked + " is outside the file's segments.");
    t.file_offset = *at;
    if (n.semaphore != 0) {
      std::optional<uint64_t> sem = image.file_offset(n.semaphore);
      if (!sem) return make_error(-ENOENT, "The semaphore of " + asked + " is outside the file's segments.");
      t.ref_ctr_offset = *sem;
    }
    int index = 1;
    for (const std::string& a : sdt_argument_specs(n.args)) {
      auto arg = sdt_argument(a, index++);
      if (!arg) return arg.error();
      t.args.push_back(std::move(*arg));
      t.arg_texts.push_back(t.args.back().text());
    }
    t.where = "%" + n.name;
    out.push_back(std::move(t));
  }
  if (out.empty()) return make_error(-ENOENT, "Probe point '" + asked + "' not found.");
  return out;
}

}  // namespace

Result<std::vector<TraceProbe>> find_probes(const ElfImage& image, const DebugInfo* dbg,
                                            const ProbeSpec& spec, const FinderOptions& options,
                                            std::vector<std::string>* notes) {
  if (spec.point.sdt) return sdt_probes(image, spec, options);
  const bool dwarf_needed = needs_dwarf(spec);
  if (dwarf_needed && !dbg)
    return make_error(-ENOENT, "The " + image.path() +
                                   " file has no debug information.\n"
                                   "Rebuild with -g, or install an appropriate debuginfo package.");
  // A uprobe on an IFUNC name is on its resolver, which runs once, at load: say so, and how
  // to reach the code the program calls.
  if (notes && !spec.point.function.empty())
    for (const ElfSymbol* s : image.find_functions(spec.point.function))
      if (s->ifunc) {
        notes->push_back("Note: " + s->name +
                         " is an IFUNC: this probes its resolver, which runs once when the "
                         "object is loaded.\nTo probe what the program calls, name the "
                         "implementation, or define a kprobe-style '" + s->name +
                         "' in kprobe_events: probefs resolves it to the implementation "
                         "(kprobes/list names it).");
        break;
      }
  // %return goes through the symbol table, as in perf: its place is the function's entry.
  if (!dbg || spec.point.retprobe || spec.point.has_address) {
    if (spec.point.retprobe && dwarf_needed)
      return make_error(-EINVAL, "Semantic error :You can't specify local variable for kretprobe.");
    return from_symbols(image, spec, options);
  }
  auto places = places_of(*dbg, image, spec, options, notes);
  if (!places) return places.error();
  // A function the DWARF does not name (assembly, a resolver under another name) is still
  // the symbol table's, as in perf.
  if (places->empty() && !dwarf_needed && !image.find_functions(spec.point.function).empty())
    return from_symbols(image, spec, options);
  if (places->empty())
    return make_error(-ENOENT, "Probe point '" + point_text(spec.point) + "' not found.");
  std::vector<TraceProbe> out;
  for (const DwarfPlace& place : *places) {
    // Another place that is another overload of the same qualified name (C++).
    bool overload = false;
    for (const DwarfPlace& o : *places)
      overload = overload || is_overload(o.linkage, o.scope_name, place.linkage, place.scope_name);
    TraceProbe t = new_probe(image, spec, place.scope_name, place.linkage, overload);
    if (Status st = locate(image, place.addr, place.symbol, place.symbol_entry, &t); !st)
      return st.error();
    out.push_back(std::move(t));
  }
  // Each argument at every place. A variable missing at some places but found at others is
  // fetched as perf's "\deade12d" marker there, with the type it has elsewhere.
  for (const ProbeArg& a : spec.args) {
    std::vector<Result<std::vector<TraceArg>>> at;
    for (const DwarfPlace& place : *places) {
      at.push_back(translate_arg(context_of(place, *dbg, image, options, false), a));
      // $params or $vars with nothing to show is a missing variable, as in perf.
      if (at.back() && at.back()->empty())
        return make_error(-ENOENT, "Failed to find the location of the '" + a.var +
                                       "' variable at this address.");
    }
    const Result<std::vector<TraceArg>>* found = nullptr;
    for (auto& r : at) {
      if (!r && !is_missing_variable(r.error())) return r.error();
      if (r && !found) found = &r;
    }
    if (!found) {
      // perf's hints under a variable no place has.
      Error e = at.front().error();
      e.message += "\n Perhaps it has been optimized out.\n Use -V with the --range option to show '" +
                   a.var + "' location range.";
      return e;
    }
    for (size_t i = 0; i < at.size(); ++i) {
      if (at[i]) {
        out[i].args.insert(out[i].args.end(), at[i]->begin(), at[i]->end());
      } else {
        for (const TraceArg& f : **found)
          out[i].args.push_back({arg_name(a), kMissingArgFetch, f.type});
      }
    }
  }
  return out;
}

Result<std::vector<VarsAtPlace>> variables_at(const ElfImage& image, const DebugInfo& dbg,
                                              const ProbeSpec& spec, bool externs,
                                              const FinderOptions& options, bool range) {
  ProbeSpec place_only = spec;  // -V does not look past the prologue: perf's +0 at -O0
  place_only.args.clear();
  auto places = places_of(dbg, image, place_only, options, nullptr);
  // perf's -V says which point it could not find, after the reason when there is one.
  const std::string not_found = "Failed to find the address of " + point_text(spec.point);
  if (!places) {
    Error e = places.error();
    e.message += e.code == -ENOENT ? "\n" + not_found : "\nDebuginfo analysis failed.";
    return e;
  }
  if (places->empty()) return make_error(-ENOENT, not_found);
  std::vector<VarsAtPlace> out;
  for (const DwarfPlace& place : *places) {
    VarContext ctx = context_of(place, dbg, image, options, spec.point.retprobe);
    out.push_back({place.symbol + "+" + std::to_string(place.addr - place.symbol_entry),
                   available_variables(ctx, externs, range)});
  }
  return out;
}

}  // namespace probefs::tools
