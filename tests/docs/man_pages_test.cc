// The man pages against the programs they describe: each page renders without a warning;
// every option, subcommand and mount option that `probefs --help` prints is documented in
// probefs(8), and every option of `probefs-probe --help` in probefs-probe(1) (both parsed
// from the help text, so an option added without its page fails here); every file and
// directory of a fresh mount is in probefs(8)'s FILES; the exit statuses the programs
// give are the ones their EXIT STATUS sections name.
//
// The pages are compared as groff renders them (plain ASCII, no overstrikes, no
// hyphenation), never as roff source. Everything that runs is bounded: commands by
// run_command's timeout, the mount by tests/fs/mount_fixture.h, which also takes it down
// (fusermount3 -u, then a lazy unmount) however a test ends.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cctype>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/fs/mount_fixture.h"

namespace {

using probefs::fs::testing::CommandResult;
using probefs::fs::testing::Mount;
using probefs::fs::testing::run_command;

constexpr int kTimeoutMs = 30000;

// A page as groff renders it: -Tascii with grotty's overstriking and escapes off
// (-P-cbou), so that the text is what a reader sees; no hyphenation (-rHY=0), so that no
// name is broken across lines.
struct Rendered {
  std::string text;
  std::string error;  // groff's stderr, or why it did not run
};

Rendered render(const std::string& page) {
  CommandResult r =
      run_command({"groff", "-man", "-Tascii", "-P-cbou", "-rHY=0", page}, kTimeoutMs);
  Rendered out;
  out.text = r.out;
  out.error = r.err;
  if (r.exit_code() != 0)
    out.error += "groff -Tascii " + page + " ended with status " + std::to_string(r.status);
  return out;
}

const std::string& probefs_page() {
  static const std::string text = render(PROBEFS_MAN8).text;
  return text;
}

const std::string& probe_page() {
  static const std::string text = render(PROBEFS_PROBE_MAN1).text;
  return text;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// Runs of white space made one blank: rendered text is filled and justified.
std::string squeeze(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (std::isspace(static_cast<unsigned char>(c))) {
      if (!out.empty() && out.back() != ' ') out.push_back(' ');
    } else {
      out.push_back(c);
    }
  }
  if (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

// The sections of a rendered page, by heading: a heading is a line at column 0 of
// capitals, blanks and '+' ("EXIT STATUS", "C++ NAMES"); the page's header and footer
// lines hold other characters. Each section's text is its lines as rendered.
std::map<std::string, std::string> sections(const std::string& text) {
  static const std::regex heading("[A-Z][A-Z +]*");
  std::map<std::string, std::string> out;
  std::string current;
  for (const std::string& line : lines_of(text)) {
    if (std::regex_match(line, heading)) {
      current = line;
      out[current];
      continue;
    }
    if (!current.empty()) out[current] += line + "\n";
  }
  return out;
}

// The page but its NAME and SYNOPSIS: where an option counts as documented.
std::string body(const std::string& text) {
  std::string out;
  for (const auto& [name, section] : sections(text))
    if (name != "NAME" && name != "SYNOPSIS") out += section;
  return out;
}

bool name_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
}

// Whether `word` stands in `text` on its own, not as a piece of a longer name: no name
// character right before it, nor right after it (unless the word ends in '=', as
// "max_targets=" does before its value).
bool has_word(const std::string& text, const std::string& word) {
  for (size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1)) {
    const size_t end = at + word.size();
    const bool starts = at == 0 || !name_char(text[at - 1]);
    const bool ends = word.back() == '=' || end == text.size() || !name_char(text[end]);
    if (starts && ends) return true;
  }
  return false;
}

// In a section of a tagged list (.TP), the paragraph whose tag is `tag`: its line and the
// deeper-indented lines after it, white space squeezed. "" when there is none.
std::string tagged_entry(const std::string& section, const std::string& tag) {
  const std::vector<std::string> lines = lines_of(section);
  for (size_t i = 0; i < lines.size(); ++i) {
    const size_t indent = lines[i].find_first_not_of(' ');
    if (indent == std::string::npos) continue;
    const std::string rest = lines[i].substr(indent);
    if (rest != tag && rest.rfind(tag + " ", 0) != 0) continue;
    std::string entry = rest;
    for (size_t j = i + 1; j < lines.size(); ++j) {
      const size_t deeper = lines[j].find_first_not_of(' ');
      if (deeper == std::string::npos || deeper <= indent) break;
      entry += " " + lines[j];
    }
    return squeeze(entry);
  }
  return "";
}

std::string help_of(const std::string& program) {
  CommandResult r = run_command({program, "--help"}, kTimeoutMs);
  EXPECT_EQ(r.exit_code(), 0) << program << " --help: " << r.err;
  return r.out;
}

std::vector<std::string> matches(const std::string& line, const std::regex& re) {
  std::vector<std::string> out;
  for (auto it = std::sregex_iterator(line.begin(), line.end(), re); it != std::sregex_iterator();
       ++it)
    for (size_t g = 1; g < it->size(); ++g)
      if ((*it)[g].matched) out.push_back((*it)[g].str());
  return out;
}

// What `probefs --help` offers, from its own text.
struct ProbefsHelp {
  std::set<std::string> options;      // -f, --help, --shim, ...
  std::set<std::string> subcommands;  // exec, attach, ...
  std::set<std::string> mount_options;  // -o's: max_targets=, allow_other, ...
};

ProbefsHelp parse_probefs_help(const std::string& help) {
  static const std::regex usage_line(R"(^(usage:)?\s+probefs(\s|$).*)");
  static const std::regex usage_sub(R"(probefs ([a-z]+)\b)");
  static const std::regex usage_option(R"(\[(--?[A-Za-z][A-Za-z0-9-]*))");
  static const std::regex option_line(
      R"(^\s{2,}(-[A-Za-z0-9])(?:,\s+(--[A-Za-z][A-Za-z0-9-]*))?\s)");
  static const std::regex sub_line(R"(^  ([a-z]+) {2,}\S)");
  static const std::regex fuse_name(R"(\b([a-z]+(?:_[a-z]+)+)(=?))");
  ProbefsHelp h;
  bool in_o = false;       // inside -o's description
  bool in_usage = true;    // the usage lines, up to the first blank line
  for (const std::string& line : lines_of(help)) {
    if (line.find_first_not_of(' ') == std::string::npos) in_usage = false;
    if (in_usage && std::regex_match(line, usage_line)) {
      for (const std::string& s : matches(line, usage_sub)) h.subcommands.insert(s);
      for (const std::string& o : matches(line, usage_option)) h.options.insert(o);
      continue;
    }
    std::smatch m;
    if (std::regex_search(line, m, option_line)) {
      h.options.insert(m[1].str());
      if (m[2].matched) h.options.insert(m[2].str());
      in_o = m[1].str() == "-o";
    } else if (std::regex_search(line, m, sub_line)) {
      h.subcommands.insert(m[1].str());
      in_o = false;
    } else if (line.find_first_not_of(' ') == std::string::npos) {
      in_o = false;
    }
    if (in_o) {
      for (auto it = std::sregex_iterator(line.begin(), line.end(), fuse_name);
           it != std::sregex_iterator(); ++it)
        h.mount_options.insert((*it)[1].str() + (*it)[2].str());
    }
  }
  return h;
}

// The options `probefs-probe --help` lists: "-x, --long" and "--long" lines, and the long
// options its usage lines name.
std::set<std::string> parse_probe_help(const std::string& help) {
  static const std::regex option_line(R"(^\s+(-[A-Za-z0-9]),\s+(--[A-Za-z][A-Za-z0-9-]*)\b)");
  static const std::regex long_line(R"(^\s+(--[A-Za-z][A-Za-z0-9-]*)\b)");
  static const std::regex usage_long(R"(\s(--[A-Za-z][A-Za-z0-9-]*)\b)");
  std::set<std::string> options;
  for (const std::string& line : lines_of(help)) {
    std::smatch m;
    if (line.find("probefs-probe") != std::string::npos) {
      for (const std::string& o : matches(line, usage_long)) options.insert(o);
    } else if (std::regex_search(line, m, option_line)) {
      options.insert(m[1].str());
      options.insert(m[2].str());
    } else if (std::regex_search(line, m, long_line)) {
      options.insert(m[1].str());
    }
  }
  return options;
}

// A directory of the test's own that is not a mount of anything.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/probefs-man-XXXXXX";
    if (mkdtemp(tmpl)) path_ = tmpl;
  }
  ~TempDir() {
    if (!path_.empty()) rmdir(path_.c_str());
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(ManPages, RenderWithoutWarnings) {
  for (const std::string page : {PROBEFS_MAN8, PROBEFS_PROBE_MAN1}) {
    CommandResult r = run_command({"groff", "-man", "-Tutf8", "-ww", "-z", page}, kTimeoutMs);
    EXPECT_EQ(r.exit_code(), 0) << page;
    EXPECT_EQ(r.err, "") << page;
    Rendered ascii = render(page);
    EXPECT_EQ(ascii.error, "") << page;
    EXPECT_NE(ascii.text.find("NAME"), std::string::npos) << page;
  }
}

TEST(ManPages, ProbefsPageHasEveryOptionOfItsHelp) {
  const ProbefsHelp help = parse_probefs_help(help_of(PROBEFS_BIN));
  // The parser must have found something of each kind, or this test checks nothing.
  ASSERT_GE(help.options.size(), 5u) << help_of(PROBEFS_BIN);
  ASSERT_GE(help.subcommands.size(), 2u) << help_of(PROBEFS_BIN);
  ASSERT_GE(help.mount_options.size(), 1u) << help_of(PROBEFS_BIN);
  const std::string& page = probefs_page();
  ASSERT_FALSE(page.empty());
  const std::string documented = body(page);
  const std::string synopsis = squeeze(sections(page)["SYNOPSIS"]);
  for (const std::string& o : help.options)
    EXPECT_TRUE(has_word(documented, o)) << "probefs(8) does not document the option " << o;
  for (const std::string& o : help.mount_options)
    EXPECT_TRUE(has_word(documented, o)) << "probefs(8) does not document -o " << o;
  for (const std::string& s : help.subcommands) {
    EXPECT_NE(synopsis.find("probefs " + s + " "), std::string::npos)
        << "probefs(8)'s SYNOPSIS has no form of the subcommand " << s;
    EXPECT_TRUE(has_word(documented, s)) << "probefs(8) does not document the subcommand " << s;
  }
}

TEST(ManPages, ProbefsProbePageHasEveryOptionOfItsHelp) {
  const std::set<std::string> options = parse_probe_help(help_of(PROBEFS_PROBE_BIN));
  ASSERT_GE(options.size(), 20u) << help_of(PROBEFS_PROBE_BIN);
  const std::string& page = probe_page();
  ASSERT_FALSE(page.empty());
  const std::string documented = body(page);
  for (const std::string& o : options)
    EXPECT_TRUE(has_word(documented, o)) << "probefs-probe(1) does not document the option " << o;
}

TEST(ManPages, EachPageHasAnExitStatusSection) {
  for (const std::string* page : {&probefs_page(), &probe_page()}) {
    auto all = sections(*page);
    ASSERT_TRUE(all.count("EXIT STATUS")) << *page;
    EXPECT_NE(squeeze(all["EXIT STATUS"]), "");
  }
}

// The statuses probefs gives for a directory that is not a probefs mount, and for a
// usage error, each named in probefs(8) for that reason.
TEST(ManPages, ProbefsExitStatusesAreThePrograms) {
  TempDir plain;
  ASSERT_FALSE(plain.path().empty());
  const std::string exit_status = sections(probefs_page())["EXIT STATUS"];
  ASSERT_FALSE(exit_status.empty());

  // run checks the mount point first and says 2 (fs/run_command.cc).
  CommandResult run = run_command({PROBEFS_BIN, "run", plain.path(), "--", "true"}, kTimeoutMs);
  EXPECT_EQ(run.exit_code(), 2) << run.err;
  EXPECT_NE(tagged_entry(exit_status, "2").find("not a probefs mount"), std::string::npos)
      << "probefs(8) does not give 2 for a mount point that is not a probefs mount:\n"
      << exit_status;

  // exec, attach and detach: whatever they give, the page names it for that reason.
  for (const std::vector<std::string>& argv :
       {std::vector<std::string>{PROBEFS_BIN, "exec", plain.path(), "--", "true"},
        std::vector<std::string>{PROBEFS_BIN, "attach", plain.path(), "1"},
        std::vector<std::string>{PROBEFS_BIN, "detach", plain.path(), "1"},
        std::vector<std::string>{PROBEFS_BIN, "run", plain.path(), "--", "true"}}) {
    CommandResult r = run_command(argv, kTimeoutMs);
    ASSERT_GT(r.exit_code(), 0) << argv[1] << ": " << r.err;
    EXPECT_NE(r.err.find("not a probefs mount"), std::string::npos) << argv[1] << ": " << r.err;
    const std::string entry = tagged_entry(exit_status, std::to_string(r.exit_code()));
    EXPECT_NE(entry.find("not a probefs mount"), std::string::npos)
        << "probefs " << argv[1] << " gives " << r.exit_code()
        << " for a mount point that is not a probefs mount; probefs(8) says: " << entry;
  }

  // A usage error.
  CommandResult usage = run_command({PROBEFS_BIN}, kTimeoutMs);
  ASSERT_GT(usage.exit_code(), 0);
  EXPECT_NE(tagged_entry(exit_status, std::to_string(usage.exit_code())).find("usage error"),
            std::string::npos)
      << "probefs without operands gives " << usage.exit_code() << ":\n" << exit_status;
}

TEST(ManPages, ProbefsProbeExitStatusesAreThePrograms) {
  const std::string exit_status = sections(probe_page())["EXIT STATUS"];
  ASSERT_FALSE(exit_status.empty());
  // No action: a usage error.
  CommandResult usage = run_command({PROBEFS_PROBE_BIN}, kTimeoutMs);
  ASSERT_GT(usage.exit_code(), 0);
  EXPECT_NE(tagged_entry(exit_status, std::to_string(usage.exit_code())).find("usage error"),
            std::string::npos)
      << "probefs-probe without an action gives " << usage.exit_code() << ":\n" << exit_status;
  // A --target that is no tracefs: ENOENT, as perf gives it.
  TempDir plain;
  ASSERT_FALSE(plain.path().empty());
  CommandResult no_tracefs =
      run_command({PROBEFS_PROBE_BIN, "--target", plain.path(), "-l"}, kTimeoutMs);
  ASSERT_GT(no_tracefs.exit_code(), 0) << no_tracefs.err;
  EXPECT_TRUE(has_word(squeeze(exit_status), std::to_string(no_tracefs.exit_code())))
      << "probefs-probe gives " << no_tracefs.exit_code() << " when it finds no tracefs:\n"
      << exit_status;
}

// The .TH line carries the version the programs print.
TEST(ManPages, PagesCarryTheProgramsVersion) {
  for (const auto& [program, page] : {std::pair{PROBEFS_BIN, &probefs_page()},
                                      std::pair{PROBEFS_PROBE_BIN, &probe_page()}}) {
    CommandResult r = run_command({program, "--version"}, kTimeoutMs);
    ASSERT_EQ(r.exit_code(), 0) << program;
    const std::string version = squeeze(r.out).substr(squeeze(r.out).rfind(' ') + 1);
    ASSERT_FALSE(version.empty()) << r.out;
    EXPECT_NE(page->find("probefs " + version), std::string::npos) << program << " " << version;
    EXPECT_EQ(page->find("@PROJECT_VERSION@"), std::string::npos);
  }
}

// A fresh mount of the built probefs, taken down after each test however it ends.
class ManPagesMount : public ::testing::Test {
 protected:
  void SetUp() override {
    mount_ = std::make_unique<Mount>();
    ASSERT_TRUE(mount_->ok()) << mount_->daemon_stderr();
  }
  void TearDown() override { mount_.reset(); }  // fusermount3 -u, else umount -l

  // The names in a directory of the mount (ls, bounded).
  std::vector<std::string> names(const std::string& rel) {
    CommandResult r = run_command({"ls", "-1A", mount_->path(rel)}, kTimeoutMs);
    EXPECT_EQ(r.exit_code(), 0) << rel << ": " << r.err;
    return lines_of(r.out);
  }

  std::unique_ptr<Mount> mount_;
};

TEST_F(ManPagesMount, EveryFileOfAMountIsInTheFilesSection) {
  // One event, so that events/ has a group and the group an event.
  CommandResult define = run_command(
      {"sh", "-c", "echo 'p:mangrp/manev libc.so.6:malloc' >> \"$1\"/kprobe_events", "sh",
       mount_->dir()},
      kTimeoutMs);
  ASSERT_EQ(define.exit_code(), 0) << define.err;

  const std::string files = sections(probefs_page())["FILES"];
  ASSERT_FALSE(files.empty()) << "probefs(8) has no FILES section";
  size_t checked = 0;
  for (const std::string dir :
       {"", "kprobes", "per_cpu/cpu0", "events", "events/mangrp", "events/mangrp/manev"}) {
    const std::vector<std::string> listed = names(dir);
    EXPECT_FALSE(listed.empty()) << dir;
    for (const std::string& name : listed) {
      if (name == "mangrp" || name == "manev") continue;  // this test's own event
      ++checked;
      EXPECT_TRUE(has_word(files, name))
          << "probefs(8)'s FILES does not name " << (dir.empty() ? "" : dir + "/") << name;
    }
  }
  EXPECT_GE(checked, 40u);
}

}  // namespace
