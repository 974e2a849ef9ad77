// probefs-probe: perf probe's command line on a probefs mount (or any tracefs). Function
// names, source lines and variables become uprobe_events definitions (kprobe_events with
// -k), written through the mount's files only.
//
//   probefs-probe [--target MNT] -x BIN [-a] SPEC [ARG...]   add (-n: only show)
//   probefs-probe -d [GROUP:]EVENT            delete (globs)
//   probefs-probe -l [[GROUP:]EVENT]          list, with source locations
//   probefs-probe -x BIN -L RANGE | -V SPEC | -F [FILTER]
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tools/debuginfo.h"
#include "tools/dwarf_points.h"
#include "tools/elf_image.h"
#include "tools/probe_finder.h"
#include "tools/probe_spec.h"
#include "tools/sdt_notes.h"
#include "tools/strfilter.h"
#include "tools/object_lookup.h"
#include "tools/tracefs_files.h"

namespace probefs::tools {
namespace {

struct Options {
  std::vector<std::string> adds, dels;
  bool list = false, line = false, vars = false, funcs = false;
  std::string list_filter, line_range, vars_spec;
  // -F's own argument and --filter, in order: perf ORs them, and -F without one adds its
  // default (so a --filter before a bare -F lists what the default lists, and more).
  std::vector<std::string> filters;
  bool definition = false;  // -D: the adds are shown, not written
  bool demangle = true;
  bool no_inlines = false;  // --no-inlines
  std::string source;       // -s: where source files are read
  std::string symfs;        // --symfs: the root debug files are looked for under
  int pid = 0;              // --pid: the objects of this process, attached once defined
  bool range = false;       // --range: -V shows where each variable is valid
  std::string exec, module, target;
  std::vector<std::string> debuginfo_dirs;
  bool externs = false, quiet = false, dry_run = false, force = false, kprobe = false;
  bool cache = false;  // --cache: with --list, the SDT points of -x/-m, as perf's cache lists them
  int verbose = 0;
  size_t max_probes = 128;
};

const char kUsage[] =
    "\n"
    " Usage: probefs-probe [<options>] 'PROBEDEF' ['PROBEDEF' ...]\n"
    "    or: probefs-probe [<options>] --add 'PROBEDEF' [--add 'PROBEDEF' ...]\n"
    "    or: probefs-probe [<options>] --del '[GROUP:]EVENT' ...\n"
    "    or: probefs-probe --list [GROUP:]EVENT ...\n"
    "    or: probefs-probe [<options>] --line 'LINEDESC'\n"
    "    or: probefs-probe [<options>] --vars 'PROBEPOINT'\n"
    "    or: probefs-probe [<options>] --funcs\n"
    "\n"
    "    -a, --add <[EVENT=]FUNC[@SRC][+OFF|%return|:RL|;PT]|SRC:AL|SRC;PT [[NAME=]ARG ...]>\n"
    "                          probe point definition, where\n"
    "\t\tGROUP:\tGroup name (optional)\n"
    "\t\tEVENT:\tEvent name\n"
    "\t\tFUNC:\tFunction name\n"
    "\t\tOFF:\tOffset from function entry (in byte)\n"
    "\t\t%return:\tPut the probe at function return\n"
    "\t\tSRC:\tSource code path\n"
    "\t\tRL:\tRelative line number from function entry.\n"
    "\t\tAL:\tAbsolute line number in file.\n"
    "\t\tPT:\tLazy expression of line code.\n"
    "\t\tARG:\tProbe argument (local variable name or\n"
    "\t\t\tkprobe-tracer argument format.)\n"
    "\n"
    "    -D, --definition <[EVENT=]FUNC[@SRC][+OFF|%return|:RL|;PT]|SRC:AL|SRC;PT [[NAME=]ARG ...]>\n"
    "                          Show trace event definition of given traceevent for k/uprobe_events.\n"
    "    -d, --del <[GROUP:]EVENT>\n"
    "                          delete a probe event.\n"
    "    -f, --force           forcibly add events with existing name\n"
    "    -F, --funcs <[FILTER]>\n"
    "                          Show potential probe-able functions.\n"
    "    -k, --kprobe-syntax   write MOD:SYM+OFF definitions into kprobe_events\n"
    "    -L, --line <FUNC[:RLN[+NUM|-RLN2]]|SRC:ALN[+NUM|-ALN2]>\n"
    "                          Show source code lines.\n"
    "    -l, --list <[GROUP:]EVENT>\n"
    "                          list up probe events\n"
    "    -m, --module <NAME|PATH>\n"
    "                          target library: a name searched where the dynamic linker\n"
    "                          looks (libc, libc.so.6) or a path\n"
    "    -n, --dry-run         dry run\n"
    "    -q, --quiet           be quiet (do not show any warnings or messages)\n"
    "    -s, --source <directory>\n"
    "                          path to the source files (-L and ;PTN read them there)\n"
    "    -V, --vars <FUNC[@SRC][+OFF|%return|:RL|;PT]|SRC:AL|SRC;PT>\n"
    "                          Show accessible variables on PROBEDEF\n"
    "    -v, --verbose         be more verbose (show parsed arguments, etc)\n"
    "    -x, --exec <executable|path>\n"
    "                          target executable name or path\n"
    "        --cache           (With --list) Show the SDT points of -x/-m as perf\n"
    "                          shows cached probes (read from the binary: no cache)\n"
    "        --debuginfo-dir <directory>\n"
    "                          directory to search for debuginfo before the system's\n"
    "        --demangle        Enable symbol demangling (the default)\n"
    "        --externs         Show external variables too (with --vars only)\n"
    "        --filter <[!]FILTER>\n"
    "                          Set a filter (with --vars/funcs only)\n"
    "\t\t\t(default: \"!__k???tab_* & !__crc_*\" for --vars,\n"
    "\t\t\t \"!_* & !*@plt\" for --funcs)\n"
    "        --max-probes <n>  Set how many probe points can be found for a probe.\n"
    "        --no-demangle     Show C++ names as the symbol tables spell them\n"
    "        --no-inlines      Don't search inlined functions\n"
    "        --range           Show variables location range in scope (with --vars only)\n"
    "        --pid <pid>       the executable (and -m's libraries) of a running process, which\n"
    "                          is attached through the mount once the events are defined\n"
    "        --symfs <directory>\n"
    "                          Look for files with symbols relative to this directory\n"
    "        --target <mountpoint>\n"
    "                          the tracefs (default: $TRACEFS_PATH, then the current\n"
    "                          directory if it is a probefs mount)\n"
    "        --version         show the version\n"
    "\n";

// perf probe returns the negative errno from main: the shell sees it modulo 256 (254 for
// -ENOENT, 234 for -EINVAL).
int exit_status(int code) { return code < 0 ? code & 0xff : 255; }

void usage_error(const std::string& msg) {
  if (!msg.empty()) fprintf(stderr, "  Error: %s\n", msg.c_str());
  fputs(kUsage, stderr);
  exit(129);
}

// perf's answer to a bad value of one option: the usage's head and that option's lines
// (from the one that starts with OPTION to the next option), status 129.
[[noreturn]] void option_usage_error(const std::string& option) {
  const std::string usage = kUsage;
  const size_t head_end = usage.find("\n\n", 1);
  std::string out = usage.substr(0, head_end + 2);
  const size_t at = usage.find("\n" + option);
  if (at != std::string::npos) {
    size_t end = at + 1;
    do {
      end = usage.find('\n', end) + 1;
    } while (end < usage.size() && usage.compare(end, 5, "    -") != 0 &&
             usage.compare(end, 10, "        --") != 0 && usage[end] != '\n');
    out += usage.substr(at + 1, end - at - 1);
  }
  fputs(out.c_str(), stderr);
  exit(129);
}

// A filter of -F or --filter as perf checks it when the option is read: a text that is
// not one is reported with its position and refused with that option's usage.
void check_filter(const std::string& text, const std::string& option) {
  size_t at = 0;
  if (StrFilter::parse(text, &at)) return;
  fprintf(stderr, "Filter parse error at %zu.\nSource: \"%s\"\n         %*c\n", at, text.c_str(),
          static_cast<int>(at), '^');
  option_usage_error(option);
}

// perf's option rules: "-xBIN", "-x BIN", "--exec=BIN", "--exec BIN"; an optional value
// (-l, -F) is the next word only when it does not start with '-'.
Options parse_options(int argc, char** argv_in) {
  // Bundled flags ("-nv", "-qf") become one word each.
  static const std::string kFlags = "qvnfkh";
  std::vector<std::string> words;
  for (int i = 1; i < argc; ++i) {
    std::string w = argv_in[i];
    bool bundle = w.size() > 2 && w[0] == '-' && w[1] != '-' &&
                  w.find_first_not_of(kFlags, 1) == std::string::npos;
    if (!bundle) {
      words.push_back(w);
      continue;
    }
    for (size_t k = 1; k < w.size(); ++k) words.push_back(std::string("-") + w[k]);
  }
  std::vector<const char*> argv = {argv_in[0]};
  for (const std::string& w : words) argv.push_back(w.c_str());
  argc = static_cast<int>(argv.size());
  Options o;
  std::vector<std::string> rest;
  bool explicit_add = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    std::string name, value;
    bool has_value = false;
    if (a == "--") {
      for (++i; i < argc; ++i) rest.push_back(argv[i]);
      break;
    }
    if (a.rfind("--", 0) == 0) {
      size_t eq = a.find('=');
      name = a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
      if (eq != std::string::npos) value = a.substr(eq + 1), has_value = true;
    } else if (a.size() > 1 && a[0] == '-') {
      static const std::pair<char, const char*> kShort[] = {
          {'a', "add"}, {'d', "del"}, {'l', "list"}, {'L', "line"}, {'V', "vars"},
          {'F', "funcs"}, {'x', "exec"}, {'m', "module"}, {'q', "quiet"}, {'v', "verbose"},
          {'D', "definition"}, {'s', "source"},
          {'n', "dry-run"}, {'f', "force"}, {'k', "kprobe-syntax"}, {'h', "help"}};
      for (auto& [c, long_name] : kShort)
        if (a[1] == c) name = long_name;
      if (name.empty()) usage_error(std::string("unknown switch `") + a[1] + "'");
      // An option with a value takes the rest of the word ("-xBIN"); bundled flags were
      // split before ("-nv").
      if (a.size() > 2) value = a.substr(2), has_value = true;
    } else {
      rest.push_back(a);
      continue;
    }
    auto need = [&]() -> std::string {
      if (has_value) return value;
      if (i + 1 >= argc) usage_error("switch `" + name + "' requires a value");
      return argv[++i];
    };
    auto optional = [&]() -> std::string {
      if (has_value) return value;
      if (i + 1 < argc && argv[i + 1][0] != '-') return argv[++i];
      return "";
    };
    if (name == "add" || name == "definition") {
      // perf parses the spec of -a and -D as it reads the option: a bad one ends the
      // command with that option's usage (a spec given without -a is parsed later).
      const std::string spec = need();
      if (auto parsed = parse_probe_spec(spec); !parsed) {
        fprintf(stderr, "%s\n", parsed.error().message.c_str());
        option_usage_error(name == "add" ? "    -a, --add" : "    -D, --definition");
      }
      o.adds.push_back(spec);
      (name == "add" ? explicit_add : o.definition) = true;
    }
    else if (name == "del") o.dels.push_back(need());
    else if (name == "list") o.list = true, o.list_filter = optional();
    else if (name == "line") o.line = true, o.line_range = need();
    else if (name == "vars") {
      o.vars = true;
      o.vars_spec = need();
      if (auto parsed = parse_probe_spec(o.vars_spec); !parsed) {
        fprintf(stderr, "%s\n", parsed.error().message.c_str());
        option_usage_error("    -V, --vars");
      }
    }
    else if (name == "funcs") {
      o.funcs = true;
      // An empty word is a filter too (one that does not parse), not the default.
      const bool given = has_value || (i + 1 < argc && argv[i + 1][0] != '-');
      const std::string f = given ? optional() : std::string(kDefaultFuncsFilter);
      check_filter(f, "    -F, --funcs");
      o.filters.push_back(f);
    } else if (name == "filter") {
      const std::string f = need();
      check_filter(f, "        --filter");
      o.filters.push_back(f);
    }
    else if (name == "demangle") o.demangle = true;
    else if (name == "no-inlines") o.no_inlines = true;
    else if (name == "source") o.source = need();
    else if (name == "symfs") o.symfs = need();
    else if (name == "pid") {
      const std::string v = need();
      char* end = nullptr;
      const long n = strtol(v.c_str(), &end, 10);
      if (*end || n <= 0 || n > INT_MAX) usage_error("--pid takes a process id");
      o.pid = static_cast<int>(n);
    }
    else if (name == "range") o.range = true;
    else if (name == "cache") o.cache = true;
    else if (name == "no-demangle") o.demangle = false;
    else if (name == "exec") o.exec = need();
    else if (name == "module") o.module = need();
    else if (name == "target") o.target = need();
    else if (name == "debuginfo-dir") o.debuginfo_dirs.push_back(need());
    else if (name == "max-probes") {
      std::string v = need();
      char* end = nullptr;
      long n = strtol(v.c_str(), &end, 0);
      if (*end || n <= 0) usage_error("--max-probes takes a positive number");
      o.max_probes = static_cast<size_t>(n);
    } else if (name == "externs") o.externs = true;
    else if (name == "quiet") o.quiet = true;
    else if (name == "verbose") ++o.verbose;
    else if (name == "dry-run") o.dry_run = true;
    else if (name == "force") o.force = true;
    else if (name == "kprobe-syntax") o.kprobe = true;
    else if (name == "help") {
      fputs(kUsage, stdout);
      exit(0);
    } else if (name == "version") {
      printf("probefs-probe %s\n", PROBEFS_VERSION);
      exit(0);
    } else if (!name.empty()) {
      usage_error("unknown option `" + name + "'");
    }
  }
  if (o.definition && explicit_add) {
    fputs(" Error: switch `D' cannot be used with switch `a'\n", stderr);
    fputs(kUsage, stderr);
    exit(129);
  }
  if (o.definition && !rest.empty()) usage_error("another command except --add is set.");
  if (!rest.empty()) {
    std::string spec;
    for (const std::string& w : rest) spec += (spec.empty() ? "" : " ") + w;
    o.adds.push_back(spec);
  }
  int actions = !o.adds.empty() + !o.dels.empty() + o.list + o.line + o.vars + o.funcs;
  if (actions == 0) usage_error("");
  if (actions > 1 && !(o.adds.size() && o.dels.size() && actions == 2))
    usage_error("Only one action (add, del, list, line, vars, funcs) can be used at a time.");
  if (o.externs && !o.vars) usage_error("--externs is for --vars only");
  // perf stores added probes in its cache and lists it; probefs-probe keeps none, and
  // reads the SDT points of the object itself.
  if (o.cache && !o.list)
    usage_error("--cache is for --list only: probefs-probe keeps no probe cache.");
  return o;
}

class Command {
 public:
  explicit Command(const Options& o) : o_(o) {}

  int run() {
    if (!o_.dels.empty()) {
      int rc = del();
      if (rc || o_.adds.empty()) return rc;
    }
    if (!o_.adds.empty()) return add();
    if (o_.list) return list();
    if (o_.line) return line();
    if (o_.vars) return vars();
    return funcs();
  }

 private:
  void info(const std::string& s) const { fputs(s.c_str(), stderr); }
  void verbose(const std::string& s) const {
    if (o_.verbose) fputs(s.c_str(), stderr);
  }
  // perf's last line, "  Error: WHAT.", with the reason and the code only when verbose.
  int fail(const Error& e, const char* what) const {
    if (!e.message.empty()) fprintf(stderr, "%s\n", e.message.c_str());
    fprintf(stderr, "  Error: %s.", what);
    if (o_.verbose) fprintf(stderr, " Reason: %s (Code: %d)", strerror(-e.code), e.code);
    fputc('\n', stderr);
    return exit_status(e.code);
  }

  // The object -x or -m names; -x falls back to PATH for a bare name. With --pid, the
  // process's executable, or the library -m names among those it maps.
  Result<std::string> object_path() const {
    if (o_.pid != 0 && o_.exec.empty()) {
      if (!o_.module.empty()) return mapped_library(o_.pid, o_.module);
      char exe[PATH_MAX];
      const std::string link = "/proc/" + std::to_string(o_.pid) + "/exe";
      const ssize_t n = readlink(link.c_str(), exe, sizeof exe - 1);
      if (n <= 0) return make_error(-errno, "Failed to read " + link + ": " + strerror(errno));
      return std::string(exe, static_cast<size_t>(n));
    }
    if (!o_.module.empty()) return find_library(o_.module);
    if (o_.exec.empty())
      return make_error(-EINVAL, "A target is needed: -x EXECUTABLE or -m LIBRARY.");
    if (o_.exec.find('/') == std::string::npos && access(o_.exec.c_str(), F_OK) != 0) {
      if (const char* path = getenv("PATH")) {
        std::string dirs = path;
        for (size_t at = 0; at <= dirs.size();) {
          size_t colon = dirs.find(':', at);
          if (colon == std::string::npos) colon = dirs.size();
          std::string cand = dirs.substr(at, colon - at) + "/" + o_.exec;
          if (access(cand.c_str(), X_OK) == 0) return cand;
          at = colon + 1;
        }
      }
    }
    return o_.exec;
  }

  // Opens the object and its DWARF (nullptr when it has none, which is not an error).
  Status open_object() {
    auto path = object_path();
    if (!path) return path.error();
    auto image = ElfImage::open(*path);
    if (!image) return image.error();
    image_ = std::move(*image);
    // --symfs: the debug files live under another root (a target machine's, a container's).
    auto dbg = DebugInfo::open(*image_, o_.debuginfo_dirs,
                               o_.symfs.empty() ? std::string(kSystemDebugRoot)
                                                : o_.symfs + kSystemDebugRoot);
    if (dbg) {
      dbg_ = std::move(*dbg);
      verbose("Open Debuginfo file: " + dbg_->debug_path() + "\n");
    } else {
      verbose("Could not open debuginfo. Try to use symbols.\n");
    }
    return Ok{};
  }

  Result<Tracefs> tracefs() const {
    auto dir = find_tracefs(o_.target);
    if (!dir) return dir.error();
    return Tracefs(*dir);
  }

  int add() {
    if (Status st = open_object(); !st) return fail(st.error(), "Failed to add events");
    FinderOptions fo;
    fo.max_probes = o_.max_probes;
    fo.kprobe_syntax = o_.kprobe;
    fo.no_inlines = o_.no_inlines;
    fo.source_prefix = o_.source;
    std::vector<std::vector<TraceProbe>> per_spec;
    for (const std::string& text : o_.adds) {
      auto spec = parse_probe_spec(text);
      if (!spec) return fail(spec.error(), "Command Parse Error");
      std::vector<std::string> notes;
      auto probes = find_probes(*image_, dbg_.get(), *spec, fo, &notes);
      for (const std::string& n : notes) info(n + "\n");
      if (!probes) return fail(probes.error(), "Failed to add events");
      per_spec.push_back(std::move(*probes));
    }
    std::optional<Tracefs> fs;
    std::vector<std::string> taken;  // event names defined, in any group
    if (auto t = tracefs()) {
      fs.emplace(*t);
      if (auto ev = fs->events())
        for (const DefinedEvent& d : *ev) taken.push_back(d.event);
    } else if (!o_.dry_run && !o_.definition) {
      return fail(t.error(), "Failed to add events");
    }
    // perf's test of whether probes can join an existing event (kernel 5.8 and probefs).
    const bool appends = fs && fs->readme().find("Create/append/") != std::string::npos;
    std::vector<TraceProbe> all;
    for (std::vector<TraceProbe>& probes : per_spec) {
      if (Status st = name_probes(&probes, taken, appends); !st)
        return fail(st.error(), "Failed to add events");
      if (!appends)
        for (const TraceProbe& t : probes) taken.push_back(t.event);
      for (TraceProbe& t : probes) all.push_back(std::move(t));
    }
    std::vector<DefinedEvent> created;  // by this run, taken back if a later write fails
    for (const TraceProbe& t : all) {
      std::string def = t.definition(o_.kprobe);
      if (o_.definition) {
        printf("%s\n", def.c_str());
        continue;
      }
      verbose("Writing event: " + def + "\n");
      if (o_.dry_run) continue;
      Status st = fs->add(def, o_.kprobe);
      if (st && std::find(taken.begin(), taken.end(), t.event) == taken.end()) {
        DefinedEvent d;
        d.group = t.group;
        d.event = t.event;
        d.uprobe = !o_.kprobe;
        taken.push_back(t.event);
        created.push_back(d);
      }
      if (!st) {
        for (const DefinedEvent& d : created) (void)fs->remove(d);
        // The tracefs's own words, with the part of the definition it refused marked.
        if (std::optional<LogEntry> e = parse_log_entry(st.error().message)) {
          fprintf(stderr, "Failed to write event: %s\n  %s: error: %s\n  Command: %s\n%*s^\n",
                  strerror(-st.error().code), e->source.c_str(), e->message.c_str(),
                  e->command.c_str(), e->caret + 11, "");
        } else {
          fprintf(stderr, "%s\n", st.error().message.c_str());
        }
        return fail(Error{st.error().code, ""}, "Failed to add events");
      }
    }
    if (!o_.definition) print_added(all, fs ? fs->dir() : "");
    // --pid: the process is traced from now on (its events reach the mount's buffer).
    if (o_.pid != 0 && !o_.dry_run && !o_.definition) {
      if (Status st = fs->attach(o_.pid); !st) return fail(st.error(), "Failed to attach");
      info("Process " + std::to_string(o_.pid) + " is traced now.\n");
    }
    return 0;
  }

  // perf's names, with a tracefs that appends probes to an event of the same name and
  // format (the kernel does, and so does probefs): each probe takes its base name (with
  // "__return" for a return probe), checked only against the events defined before this
  // run. The first probe of a spec refuses a name in use unless -f; later ones, and -f,
  // take the first free BASE_N instead.
  // Where the tracefs does not say that it appends (README's "Create/append/"), or there
  // is none to ask (-D), perf gives each place a name of its own (BASE, BASE_1, ...): so
  // does this one then.
  Status name_probes(std::vector<TraceProbe>* probes, std::vector<std::string> taken,
                     bool appends) const {
    auto used = [&](const std::string& n) {
      return std::find(taken.begin(), taken.end(), n) != taken.end();
    };
    for (size_t i = 0; i < probes->size(); ++i) {
      TraceProbe& t = (*probes)[i];
      std::string name = t.event + (t.retprobe ? "__return" : "");
      if (used(name)) {
        if (i == 0 && !o_.force)
          return make_error(-EEXIST, "Error: event \"" + name +
                                         "\" already exists.\n"
                                         " Hint: Remove existing event by 'probefs-probe -d'\n"
                                         "       or force duplicates by 'probefs-probe -f'");
        for (int k = 1; used(name = t.event + "_" + std::to_string(k)); ++k) {
        }
      }
      t.event = name;
      if (!appends) taken.push_back(name);
    }
    return Ok{};
  }

  void print_added(const std::vector<TraceProbe>& all, const std::string& dir) const {
    if (all.empty()) return;
    std::vector<const TraceProbe*> shown;
    for (const TraceProbe& t : all) shown.push_back(&t);
    std::string out = shown.size() > 1 ? "Added new events:\n" : "Added new event:\n";
    for (const TraceProbe* t : shown) {
      char name[512];
      snprintf(name, sizeof name, "  %-20s ", (t->group + ":" + t->event).c_str());
      out += name;
      out += "(on " + t->where + " in " + t->path;
      if (!t->arg_texts.empty()) {
        out += " with";
        for (const std::string& a : t->arg_texts) out += " " + a;
      }
      out += ")\n";
    }
    const TraceProbe& last = all.back();
    if (dir.rfind("/sys/kernel/", 0) == 0 || dir.empty()) {
      out += "\nYou can now use it in all perf tools, such as:\n\n\tperf record -e " +
             last.group + ":" + last.event + " -aR sleep 1\n\n";
    } else {
      out += "\nYou can now use it on the mount, such as:\n\n\techo 1 > " + dir + "/events/" +
             last.group + "/" + last.event + "/enable\n\tcat " + dir + "/trace_pipe\n\n";
    }
    fputs(out.c_str(), stderr);
  }

  // perf's filter of -d and -l: a glob over EVENT, or over GROUP:EVENT as a whole.
  static bool matches(const std::string& pattern, const DefinedEvent& d) {
    return glob_match(pattern, d.event) || glob_match(pattern, d.group + ":" + d.event);
  }

  // As perf: what any pattern matches goes, kprobe_events' events first, each file's by
  // GROUP:EVENT, each once; only when nothing matches is it an error.
  int del() {
    auto fs = tracefs();
    if (!fs) return fail(fs.error(), "Failed to delete events");
    auto events = fs->events();
    if (!events) return fail(events.error(), "Failed to delete events");
    auto key = [](const DefinedEvent* d) {
      return std::pair(d->uprobe, d->group + ":" + d->event);
    };
    std::vector<const DefinedEvent*> hits;
    for (const DefinedEvent& d : *events)
      if (std::any_of(o_.dels.begin(), o_.dels.end(),
                      [&](const std::string& p) { return matches(p, d); }))
        hits.push_back(&d);
    std::sort(hits.begin(), hits.end(), [&](auto* a, auto* b) { return key(a) < key(b); });
    hits.erase(std::unique(hits.begin(), hits.end(),
                           [&](auto* a, auto* b) { return key(a) == key(b); }),
               hits.end());
    if (hits.empty()) {
      std::string all;
      for (const std::string& p : o_.dels) all += (all.empty() ? "" : "|") + p;
      return fail(make_error(-ENOENT, "\"" + all + "\" does not hit any event."),
                  "Failed to delete events");
    }
    for (const DefinedEvent* d : hits) {
      if (Status st = fs->remove(*d); !st) return fail(st.error(), "Failed to delete events");
      info("Removed event: " + key(d).second + "\n");
    }
    return 0;
  }

  // perf's order: kprobe_events' lines first, each file's sorted by their text.
  int list() {
    if (o_.cache) return list_sdt();
    auto fs = tracefs();
    if (!fs) return fail(fs.error(), "Failed to show event list");
    auto events = fs->events();
    if (!events) return fail(events.error(), "Failed to show event list");
    std::sort(events->begin(), events->end(), [](const DefinedEvent& a, const DefinedEvent& b) {
      return std::pair(a.uprobe, a.line) < std::pair(b.uprobe, b.line);
    });
    const std::string filter = o_.list_filter.empty() ? "*" : o_.list_filter;
    for (const DefinedEvent& d : *events) {
      if (!matches(filter, d)) continue;
      char name[512];
      snprintf(name, sizeof name, "  %-20s ", (d.group + ":" + d.event).c_str());
      std::string where = source_location(d);
      printf("%s(on %s", name, where.c_str());
      std::string names;
      for (const std::string& a : arg_names(d.args)) names += " " + a;
      if (!names.empty()) printf(" with%s", names.c_str());
      printf(")\n");
    }
    return 0;
  }

  // --cache --list: the object's SDT points as perf lists them once perf buildid-cache
  // has scanned it ("PATH (BUILDID):", then "sdt_PROVIDER:NAME=NAME"), through the same
  // filter on GROUP:EVENT; with -v, each point's definition after it, as perf's cache
  // file keeps it.
  int list_sdt() {
    if (o_.exec.empty() && o_.module.empty() && o_.pid == 0)
      return fail(make_error(-EINVAL, "probefs-probe keeps no probe cache: --cache --list "
                                      "reads the SDT notes of -x BIN or -m LIB."),
                  "Failed to show caches");
    if (Status st = open_object(); !st) return fail(st.error(), "Failed to show caches");
    const std::string filter = o_.list_filter.empty() ? "*" : o_.list_filter;
    printf("%s (%s):\n", image_->path().c_str(), image_->build_id().c_str());
    std::vector<std::string> shown;  // a name at several places is listed once
    for (const SdtNote& n : sdt_notes(*image_)) {
      const std::string event = "sdt_" + n.provider + ":" + n.name;
      if (!glob_match(filter, event) ||
          std::find(shown.begin(), shown.end(), event) != shown.end())
        continue;
      shown.push_back(event);
      printf("%s=%s\n", event.c_str(), n.name.c_str());
      if (!o_.verbose) continue;
      ProbeSpec spec;
      spec.point.sdt = true;
      spec.point.sdt_provider = n.provider;
      spec.point.sdt_name = n.name;
      FinderOptions fo;
      auto probes = find_probes(*image_, nullptr, spec, fo, nullptr);
      if (!probes) {
        printf("# %s\n", probes.error().message.c_str());
        continue;
      }
      for (const TraceProbe& t : *probes) printf("%s\n", t.definition(false).c_str());
    }
    return 0;
  }

  int line() {
    if (Status st = open_object(); !st) return fail(st.error(), "Failed to show lines");
    auto range = parse_line_range(o_.line_range);
    if (!range) return fail(range.error(), "Failed to show lines");
    if (!dbg_) return fail(no_debuginfo(), "Failed to show lines");
    auto text = show_lines(*dbg_, *range, o_.source);
    if (!text) return fail(text.error(), "Failed to show lines");
    fputs(text->c_str(), stdout);
    return 0;
  }

  int vars() {
    if (Status st = open_object(); !st) return fail(st.error(), "Failed to show vars");
    auto spec = parse_probe_spec(o_.vars_spec);
    if (!spec) return fail(spec.error(), "Failed to show vars");
    if (!dbg_) return fail(no_debuginfo(), "Failed to show vars");
    FinderOptions fo;
    fo.max_probes = o_.max_probes;
    fo.no_inlines = o_.no_inlines;
    auto places = variables_at(*image_, *dbg_, *spec, o_.externs, fo, o_.range);
    if (!places) return fail(places.error(), "Failed to show vars");
    const std::unique_ptr<StrFilter> filter = joined_filter(kDefaultVarsFilter);
    ProbePoint shown = spec->point;  // perf's header leaves a lazy pattern out
    shown.lazy.clear();
    shown.has_lazy = false;
    printf("Available variables at %s\n", point_text(shown).c_str());
    for (const VarsAtPlace& p : *places) {
      printf("\t@<%s>\n", p.where.c_str());
      // Filtered by what follows the first tab, as perf does: the name ("TYPE\tNAME"),
      // or with --range "TYPE\tNAME\tRANGE".
      std::vector<const std::string*> shown;
      for (const std::string& v : p.variables)
        if (filter->matches(std::string_view(v).substr(v.find('\t') + 1))) shown.push_back(&v);
      if (shown.empty()) printf("\t\t(No matched variables)\n");
      for (const std::string* v : shown) printf("\t\t%s\n", v->c_str());
    }
    return 0;
  }

  // The filters of the command line ORed as perf ORs them (each was checked as it was
  // read), or FALLBACK when there are none.
  std::unique_ptr<StrFilter> joined_filter(std::string_view fallback) const {
    size_t at = 0;
    std::unique_ptr<StrFilter> filter = StrFilter::parse(fallback, &at);
    for (size_t i = 0; i < o_.filters.size(); ++i) {
      if (i == 0) filter = StrFilter::parse(o_.filters[i], &at);
      else (void)filter->add_or(o_.filters[i], &at);
    }
    return filter;
  }

  int funcs() {
    if (Status st = open_object(); !st) return fail(st.error(), "Failed to show functions");
    const std::unique_ptr<StrFilter> filter = joined_filter(kDefaultFuncsFilter);
    for (const std::string& name :
         image_->listed_names(o_.demangle, dbg_ ? dbg_->debug_elf() : nullptr, o_.verbose > 0))
      if (filter->matches(name)) printf("%s\n", name.c_str());
    return 0;
  }

  Error no_debuginfo() const {
    return make_error(-ENOENT, "The " + image_->path() +
                                   " file has no debug information.\n"
                                   "Rebuild with -g, or install an appropriate debuginfo package.");
  }

  // "price_order:1@tests/tools/probe_prog.c in /path/prog" for a defined event, from the
  // object's DWARF where it has one; the raw location otherwise.
  std::string source_location(const DefinedEvent& d) const {
    return describe_location(d.location, d.uprobe, d.kind == 'r', o_.debuginfo_dirs);
  }

  static std::vector<std::string> arg_names(const std::string& args) {
    std::vector<std::string> names;
    size_t at = 0;
    while (at < args.size()) {
      size_t end = args.find(' ', at);
      if (end == std::string::npos) end = args.size();
      std::string a = args.substr(at, end - at);
      if (!a.empty()) names.push_back(a.substr(0, a.find('=')));
      at = end + 1;
    }
    return names;
  }

  const Options& o_;
  std::unique_ptr<ElfImage> image_;
  std::unique_ptr<DebugInfo> dbg_;
};

}  // namespace
}  // namespace probefs::tools

int main(int argc, char** argv) {
  probefs::tools::Options o = probefs::tools::parse_options(argc, argv);
  // perf's -q silences its errors too (everything it says goes to stderr): the exit
  // status tells.
  if (o.quiet) (void)!freopen("/dev/null", "w", stderr);
  return probefs::tools::Command(o).run();
}
