// ElfImage and DebugInfo on the bundled program, its library and its stripped and split
// copies (debuginfo_variants.cmake), checked against what binutils said at build time (nm,
// readelf -n) and against the ELF's section headers read here independently.
#include <dlfcn.h>
#include <elfutils/libdw.h>
#include <fcntl.h>
#include <gelf.h>
#include <gnu/libc-version.h>
#include <libelf.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tools/debuginfo.h"
#include "tools/elf_image.h"

namespace probefs::tools {
namespace {

namespace fs = std::filesystem;

// A directory under TMPDIR, removed with what it holds.
class TempDir {
 public:
  TempDir() {
    const char* base = getenv("TMPDIR");
    std::string tmpl = std::string(base != nullptr && *base != '\0' ? base : "/tmp") +
                       "/probefs-elf-test.XXXXXX";
    if (mkdtemp(tmpl.data()) != nullptr) path_ = fs::canonical(tmpl).string();
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  // Copies FROM to REL (relative to the directory), creating the directories on the way.
  std::string put(const std::string& from, const std::string& rel) const {
    const fs::path to = fs::path(path_) / rel;
    fs::create_directories(to.parent_path());
    fs::copy_file(from, to, fs::copy_options::overwrite_existing);
    return to.string();
  }
  std::string write(const std::string& rel, const std::string& bytes) const {
    const fs::path to = fs::path(path_) / rel;
    fs::create_directories(to.parent_path());
    std::ofstream(to, std::ios::binary) << bytes;
    return to.string();
  }

 private:
  std::string path_;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string expected_build_id() {
  std::string id = read_file(PROBE_PROG_BUILD_ID_FILE);
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
  return id;
}

std::string debuglink_name() { return fs::path(PROBE_PROG_SPLIT_DEBUG).filename().string(); }

std::unique_ptr<ElfImage> open_ok(const std::string& path) {
  auto r = ElfImage::open(path);
  EXPECT_TRUE(r.ok()) << path << ": " << (r.ok() ? "" : r.error().message);
  return r.ok() ? std::move(*r) : nullptr;
}

struct NmEntry {
  uint64_t value;
  char type;
};

// `nm --defined-only`: "VALUE TYPE NAME", the name with a version suffix where nm shows one.
std::multimap<std::string, NmEntry> read_nm(const std::string& path) {
  std::multimap<std::string, NmEntry> out;
  std::istringstream in(read_file(path));
  std::string value, type, name;
  while (in >> value >> type >> name)
    out.insert({name, {std::stoull(value, nullptr, 16), type[0]}});
  return out;
}

std::string nm_name(const ElfSymbol& s) {
  if (s.version.empty()) return s.name;
  return s.name + (s.default_version ? "@@" : "@") + s.version;
}

bool nm_has(const std::multimap<std::string, NmEntry>& nm, const std::string& name,
            uint64_t value, std::string_view types) {
  auto [lo, hi] = nm.equal_range(name);
  for (auto it = lo; it != hi; ++it)
    if (it->second.value == value && types.find(it->second.type) != std::string_view::npos)
      return true;
  return false;
}

const ElfSymbol* only_function(const ElfImage& image, const std::string& name) {
  auto found = image.find_functions(name);
  EXPECT_EQ(found.size(), 1u) << name;
  return found.size() == 1 ? found[0] : nullptr;
}

// The bytes at ADDR as the section headers place them (not the program headers that
// file_offset uses).
std::string section_bytes(const std::string& path, uint64_t addr, size_t n) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  elf_version(EV_CURRENT);
  Elf* elf = elf_begin(fd, ELF_C_READ, nullptr);
  std::string out;
  for (Elf_Scn* scn = elf_nextscn(elf, nullptr); scn != nullptr && out.empty();
       scn = elf_nextscn(elf, scn)) {
    GElf_Shdr sh;
    if (gelf_getshdr(scn, &sh) == nullptr || sh.sh_type != SHT_PROGBITS ||
        (sh.sh_flags & SHF_ALLOC) == 0 || addr < sh.sh_addr || addr + n > sh.sh_addr + sh.sh_size)
      continue;
    Elf_Data* data = elf_rawdata(scn, nullptr);
    if (data != nullptr && data->d_buf != nullptr)
      out.assign(static_cast<const char*>(data->d_buf) + (addr - sh.sh_addr), n);
  }
  elf_end(elf);
  close(fd);
  return out;
}

std::string file_bytes(const std::string& path, uint64_t offset, size_t n) {
  std::string all = read_file(path);
  return offset + n <= all.size() ? all.substr(offset, n) : "";
}

TEST(ElfImage, FunctionsAndObjectsAreNmsSymbols) {
  for (auto [bin, nm_path] : {std::pair{PROBE_PROG_O0, PROBE_PROG_O0_NM},
                              std::pair{PROBE_PROG_O2, PROBE_PROG_O2_NM},
                              std::pair{PROBE_LIB, PROBE_LIB_NM}}) {
    SCOPED_TRACE(bin);
    auto image = open_ok(bin);
    ASSERT_NE(image, nullptr);
    const auto nm = read_nm(nm_path);
    ASSERT_FALSE(nm.empty());
    size_t functions = 0;
    for (const ElfSymbol& s : image->symbols()) {
      EXPECT_TRUE(nm_has(nm, nm_name(s), s.value, s.function ? "TtWwi" : "BbDdRrVvGgSsu"))
          << nm_name(s) << " at 0x" << std::hex << s.value;
      functions += s.function;
    }
    // And the other way round: every text symbol of nm is a function here.
    for (const auto& [name, e] : nm) {
      if (e.type != 'T' && e.type != 't') continue;
      bool found = false;
      for (const ElfSymbol* f : image->find_functions(name)) found |= f->value == e.value;
      EXPECT_TRUE(found) << name;
    }
    EXPECT_GT(functions, 3u);
    EXPECT_TRUE(std::is_sorted(image->symbols().begin(), image->symbols().end(),
                               [](auto& a, auto& b) { return a.value < b.value; }));
  }
}

TEST(ElfImage, KnownSymbolsOfTheProgramAndItsLibrary) {
  auto o2 = open_ok(PROBE_PROG_O2);
  auto o0 = open_ok(PROBE_PROG_O0);
  auto lib = open_ok(PROBE_LIB);
  ASSERT_TRUE(o2 && o0 && lib);
  const auto nm = read_nm(PROBE_PROG_O2_NM);

  const ElfSymbol* price = only_function(*o2, "price_order");
  ASSERT_NE(price, nullptr);
  EXPECT_TRUE(price->global);
  EXPECT_FALSE(price->ifunc);
  EXPECT_GT(price->size, 0u);
  EXPECT_EQ(price->value, nm.find("price_order")->second.value);
  EXPECT_EQ(o2->function_at(price->value), price);
  EXPECT_EQ(o2->function_at(price->value + price->size - 1), price);
  EXPECT_NE(o2->function_at(price->value + price->size), price);
  const ElfSymbol* main_fn = only_function(*o2, "main");
  ASSERT_NE(main_fn, nullptr);
  EXPECT_TRUE(main_fn->global);

  const ElfSymbol* scale = only_function(*o0, "scale");  // static: .symtab only
  ASSERT_NE(scale, nullptr);
  EXPECT_FALSE(scale->global);
  EXPECT_EQ(o0->function_at(scale->value + 1), scale);

  const ElfSymbol* checksum = only_function(*lib, "lib_checksum");
  ASSERT_NE(checksum, nullptr);
  EXPECT_TRUE(checksum->global);
  EXPECT_EQ(checksum->value, read_nm(PROBE_LIB_NM).find("lib_checksum")->second.value);
  EXPECT_TRUE(o2->find_functions("lib_checksum").empty());  // undefined in the program

  const ElfSymbol* seen = o2->find_object("orders_seen");
  ASSERT_NE(seen, nullptr);
  EXPECT_FALSE(seen->function);
  EXPECT_TRUE(seen->global);
  EXPECT_EQ(seen->size, 8u);
  EXPECT_EQ(seen->value, nm.find("orders_seen")->second.value);
  const ElfSymbol* total = o2->find_object("static_total");
  ASSERT_NE(total, nullptr);
  EXPECT_FALSE(total->global);
  EXPECT_EQ(o2->find_object("price_order"), nullptr);
  EXPECT_TRUE(o2->find_functions("orders_seen").empty());
  EXPECT_EQ(o2->function_at(seen->value), nullptr);
  EXPECT_EQ(o2->function_at(0), nullptr);

  EXPECT_TRUE(o2->is_shared_object());  // a PIE
  EXPECT_TRUE(lib->is_shared_object());
}

TEST(ElfImage, DynsymWithVersionsWhenThereIsNoSymtab) {
  auto image = open_ok(PROBE_PROG_STRIPPED);
  ASSERT_NE(image, nullptr);
  EXPECT_TRUE(image->find_functions("price_order").empty());  // not exported
  // A copy-relocated reference to libc's stdin: a version of another object.
  const ElfSymbol* in = image->find_object("stdin");
  ASSERT_NE(in, nullptr);
  EXPECT_EQ(in->version, "GLIBC_2.2.5");
  EXPECT_FALSE(in->default_version);
  EXPECT_EQ(image->find_object("stdin@GLIBC_2.2.5"), in);
  EXPECT_EQ(image->find_object("stdin@GLIBC_2.3"), nullptr);
  // In .symtab the version is part of the name; it is split off the same way.
  auto full = open_ok(PROBE_PROG_O2);
  ASSERT_NE(full, nullptr);
  const ElfSymbol* in2 = full->find_object("stdin");
  ASSERT_NE(in2, nullptr);
  EXPECT_EQ(in2->version, "GLIBC_2.2.5");
  EXPECT_FALSE(in2->default_version);
}

TEST(ElfImage, DefinedVersionsAndIfuncsOfLibc) {
  Dl_info info;
  ASSERT_NE(dladdr(reinterpret_cast<void*>(&gnu_get_libc_version), &info), 0);
  auto libc = open_ok(info.dli_fname);
  ASSERT_NE(libc, nullptr);
  std::map<std::string, const ElfSymbol*> by_version;
  for (const ElfSymbol* s : libc->find_functions("memcpy")) by_version[s->version] = s;
  ASSERT_TRUE(by_version.count("GLIBC_2.14") && by_version.count("GLIBC_2.2.5"));
  EXPECT_TRUE(by_version["GLIBC_2.14"]->default_version);  // memcpy@@GLIBC_2.14
  EXPECT_TRUE(by_version["GLIBC_2.14"]->ifunc);
  EXPECT_FALSE(by_version["GLIBC_2.2.5"]->default_version);  // memcpy@GLIBC_2.2.5
  auto old = libc->find_functions("memcpy@GLIBC_2.2.5");
  ASSERT_EQ(old.size(), 1u);
  EXPECT_EQ(old[0], by_version["GLIBC_2.2.5"]);
  auto current = libc->find_functions("memcpy@@GLIBC_2.14");
  ASSERT_EQ(current.size(), 1u);
  EXPECT_EQ(current[0], by_version["GLIBC_2.14"]);
  EXPECT_TRUE(libc->find_functions("memcpy@GLIBC_1.0").empty());
}

TEST(ElfImage, FileOffsetsAreWhereTheSectionsPutTheBytes) {
  auto image = open_ok(PROBE_PROG_O2);
  ASSERT_NE(image, nullptr);
  // Text and initialised data: the second sits in a segment whose address and offset differ.
  for (const ElfSymbol* s :
       {only_function(*image, "price_order"), image->find_object("greeting")}) {
    ASSERT_NE(s, nullptr);
    SCOPED_TRACE(s->name);
    auto off = image->file_offset(s->value);
    ASSERT_TRUE(off.has_value());
    const std::string expected = section_bytes(PROBE_PROG_O2, s->value, s->size);
    ASSERT_EQ(expected.size(), s->size);
    EXPECT_EQ(file_bytes(PROBE_PROG_O2, *off, s->size), expected);
  }
  // .bss continues its segment's file offsets.
  const ElfSymbol* greeting = image->find_object("greeting");
  const ElfSymbol* seen = image->find_object("orders_seen");
  ASSERT_TRUE(greeting && seen);
  auto seen_off = image->file_offset(seen->value);
  ASSERT_TRUE(seen_off.has_value());
  EXPECT_EQ(*seen_off - *image->file_offset(greeting->value), seen->value - greeting->value);
  EXPECT_FALSE(image->file_offset(0x7fff00000000).has_value());
}

TEST(ElfImage, BuildIdIsReadelfs) {
  const std::string id = expected_build_id();
  ASSERT_EQ(id.size(), 40u) << id;  // SHA-1, ld's default
  for (const char* path : {PROBE_PROG_O2, PROBE_PROG_STRIPPED, PROBE_PROG_NODEBUG,
                           PROBE_PROG_SPLIT, PROBE_PROG_SPLIT_DEBUG}) {
    auto image = open_ok(path);
    ASSERT_NE(image, nullptr);
    EXPECT_EQ(image->build_id(), id) << path;
    EXPECT_EQ(elf_build_id(image->elf()), id) << path;
  }
  auto o0 = open_ok(PROBE_PROG_O0);
  ASSERT_NE(o0, nullptr);
  EXPECT_EQ(o0->build_id().size(), 40u);
  EXPECT_NE(o0->build_id(), id);
}

TEST(ElfImage, DebuglinkAndItsCrc) {
  auto split = open_ok(PROBE_PROG_SPLIT);
  auto full = open_ok(PROBE_PROG_O2);
  auto debug = open_ok(PROBE_PROG_SPLIT_DEBUG);
  ASSERT_TRUE(split && full && debug);
  EXPECT_EQ(split->debuglink(), debuglink_name());
  // objcopy computed the CRC it recorded; ours over the same file must agree.
  EXPECT_EQ(split->debuglink_crc(), debuglink_crc32(debug->fd()));
  EXPECT_NE(split->debuglink_crc(), debuglink_crc32(full->fd()));
  EXPECT_EQ(full->debuglink(), "");

  EXPECT_TRUE(full->has_debug_info());
  EXPECT_TRUE(debug->has_debug_info());
  EXPECT_FALSE(split->has_debug_info());
  for (const char* path : {PROBE_PROG_STRIPPED, PROBE_PROG_NODEBUG}) {
    auto image = open_ok(path);
    ASSERT_NE(image, nullptr);
    EXPECT_FALSE(image->has_debug_info()) << path;
    EXPECT_EQ(image->debuglink(), "") << path;
  }
}

TEST(ElfImage, Crc32IsZlibs) {
  TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  // zlib.crc32 of the same bytes; the last one takes more than one read.
  for (auto [bytes, crc] : {std::pair<std::string, uint32_t>{"123456789", 0xcbf43926u},
                            {"", 0u},
                            {std::string(200000, 'a'), 0xe069539bu}}) {
    const std::string path = tmp.write("f", bytes);
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    EXPECT_EQ(debuglink_crc32(fd), crc) << bytes.size() << " bytes";
    close(fd);
  }
}

TEST(ElfImage, OpenErrors) {
  auto missing = ElfImage::open("/nonexistent/probe_prog");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, -ENOENT);
  EXPECT_EQ(missing.error().message, "Failed to get the absolute path of /nonexistent/probe_prog: "
                                     "No such file or directory");

  TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  std::string elf = read_file(PROBE_PROG_O2);
  ASSERT_GT(elf.size(), 64u);
  std::string elf32 = elf, arm = elf;
  elf32[EI_CLASS] = ELFCLASS32;
  arm[18] = static_cast<char>(EM_AARCH64);  // e_machine, little-endian
  arm[19] = 0;
  const std::map<std::string, std::string> not_objects = {
      {"not_elf", PROBE_NOT_ELF},
      {"empty", tmp.write("empty", "")},
      {"magic_only", tmp.write("magic_only", "\x7f" "ELF\x02\x01")},
      {"elf32", tmp.write("elf32", elf32)},
      {"aarch64", tmp.write("aarch64", arm)},
      {"directory", tmp.path()},
  };
  for (const auto& [what, path] : not_objects) {
    auto r = ElfImage::open(path);
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_EQ(r.error().code, -ENOEXEC) << what;
    EXPECT_EQ(r.error().message.rfind("Failed to open " + path + ": ", 0), 0u)
        << r.error().message;
  }
  EXPECT_EQ(ElfImage::open(PROBE_NOT_ELF).error().message,
            std::string("Failed to open ") + PROBE_NOT_ELF + ": cannot get elf header.");

  // A truncated object opens or fails, but reads nothing past its end (ASan would see it).
  for (size_t len : {size_t{64}, elf.size() / 3, elf.size() - 100}) {
    auto r = ElfImage::open(tmp.write("cut", elf.substr(0, len)));
    if (r.ok()) {
      for (const ElfSymbol& s : (*r)->symbols()) EXPECT_FALSE(s.name.empty());
    } else {
      EXPECT_EQ(r.error().code, -ENOEXEC);
    }
  }
}

TEST(ElfImage, PathIsAbsoluteAndResolved) {
  TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  const std::string link = tmp.path() + "/link";
  ASSERT_EQ(symlink(PROBE_PROG_O2, link.c_str()), 0);
  auto image = open_ok(link);
  ASSERT_NE(image, nullptr);
  EXPECT_EQ(image->path(), fs::canonical(PROBE_PROG_O2).string());
  EXPECT_GE(image->fd(), 0);
  EXPECT_NE(image->elf(), nullptr);
}

// perf probe -F's list: functions, objects and text/data labels of .symtab and .dynsym
// (a symbol in both is listed twice, as perf lists it), and the PLT's entries.
TEST(ElfImage, ListedNamesArePerfsSymbols) {
  auto image = open_ok(PROBE_PROG_O2);
  ASSERT_NE(image, nullptr);
  auto count = [](const std::vector<std::string>& v, const std::string& s) {
    return std::count(v.begin(), v.end(), s);
  };
  const auto all = image->listed_names(true);
  EXPECT_TRUE(std::is_sorted(all.begin(), all.end()));
  EXPECT_EQ(count(all, "main"), 1);
  EXPECT_EQ(count(all, "price_order"), 1);
  EXPECT_EQ(count(all, "_start"), 1);
  EXPECT_EQ(count(all, "greeting"), 1);       // data
  EXPECT_EQ(count(all, "orders_seen"), 1);
  EXPECT_EQ(count(all, "data_start"), 1);     // a label in .data
  EXPECT_EQ(count(all, "__bss_start"), 0);    // a label in .bss
  EXPECT_EQ(count(all, "lib_checksum"), 0);   // undefined here
  EXPECT_EQ(count(all, "lib_checksum@plt"), 1);
  EXPECT_EQ(count(all, "stdin"), 1);          // .dynsym's copy-relocated object
  EXPECT_EQ(count(all, "stdin@GLIBC_2.2.5"), 1);  // and .symtab's name of it

  auto lib = open_ok(PROBE_LIB);
  ASSERT_NE(lib, nullptr);
  EXPECT_EQ(count(lib->listed_names(true), "lib_checksum"), 2);  // .symtab and .dynsym
  auto stripped = open_ok(PROBE_PROG_STRIPPED);
  ASSERT_NE(stripped, nullptr);
  EXPECT_EQ(count(stripped->listed_names(true), "price_order"), 0);
}

// --- DebugInfo ---

// The name of the first compilation unit of DBG's DWARF.
std::string first_cu_name(const DebugInfo& dbg) {
  Dwarf_Off next = 0;
  size_t header = 0;
  if (dwarf_nextcu(dbg.dwarf(), 0, &next, &header, nullptr, nullptr, nullptr) != 0) return "";
  Dwarf_Die die;
  if (dwarf_offdie(dbg.dwarf(), header, &die) == nullptr) return "";
  const char* name = dwarf_diename(&die);
  return name != nullptr ? name : "";
}

// Opens IMAGE's debuginfo with EXTRA and ROOT and returns where it came from, "" on
// -ENODATA (any other outcome fails the test).
std::string found_at(const ElfImage& image, const std::vector<std::string>& extra,
                     const std::string& root) {
  auto r = DebugInfo::open(image, extra, root);
  if (!r.ok()) {
    EXPECT_EQ(r.error().code, -ENODATA);
    EXPECT_EQ(r.error().message, "The " + image.path() + " file has no debug information.");
    return "";
  }
  EXPECT_NE((*r)->dwarf(), nullptr);
  EXPECT_EQ(fs::path(first_cu_name(**r)).filename().string(), "probe_prog.c");
  return (*r)->debug_path();
}

// The split program copied into a temporary tree (so that its debug file can be put in
// each place the search knows), and an empty debug root.
class DebugInfoSearch : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(tmp_.path().empty());
    prog_ = tmp_.put(PROBE_PROG_SPLIT, "bin/" + fs::path(PROBE_PROG_SPLIT).filename().string());
    root_ = tmp_.path() + "/root";
    fs::create_directories(root_);
    image_ = open_ok(prog_);
    ASSERT_NE(image_, nullptr);
    ASSERT_EQ(image_->debuglink(), debuglink_name());
  }
  std::string put_debug(const std::string& rel, const char* from = PROBE_PROG_SPLIT_DEBUG) {
    return tmp_.put(from, rel);
  }
  std::string bin_dir() const { return tmp_.path() + "/bin"; }
  std::string build_id_rel() const {
    const std::string id = expected_build_id();
    return ".build-id/" + id.substr(0, 2) + "/" + id.substr(2) + ".debug";
  }

  TempDir tmp_;
  std::string prog_, root_;
  std::unique_ptr<ElfImage> image_;
};

TEST(DebugInfo, TheObjectsOwnDwarf) {
  auto image = open_ok(PROBE_PROG_O2);
  ASSERT_NE(image, nullptr);
  TempDir root;
  ASSERT_FALSE(root.path().empty());
  auto r = DebugInfo::open(*image, {}, root.path());
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ((*r)->debug_path(), image->path());
  EXPECT_EQ(fs::path(first_cu_name(**r)).filename().string(), "probe_prog.c");
  // The CFI answers for the function's entry.
  const ElfSymbol* price = only_function(*image, "price_order");
  ASSERT_NE(price, nullptr);
  ASSERT_NE((*r)->cfi(), nullptr);
  Dwarf_Frame* frame = nullptr;
  EXPECT_EQ(dwarf_cfi_addrframe((*r)->cfi(), price->value, &frame), 0) << dwarf_errmsg(-1);
  free(frame);
}

TEST(DebugInfo, TheBuildDirsDebugInfoSearchThroughDebuglink) {
  auto image = open_ok(PROBE_PROG_SPLIT);
  ASSERT_NE(image, nullptr);
  TempDir root;
  ASSERT_FALSE(root.path().empty());
  auto r = DebugInfo::open(*image, {}, root.path());
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ((*r)->debug_path(), fs::path(image->path()).parent_path().string() + "/.debug/" +
                                    debuglink_name());
  // The stripped object keeps its .eh_frame.
  const ElfSymbol* price = only_function(*image, "price_order");
  ASSERT_NE(price, nullptr);
  ASSERT_NE((*r)->cfi(), nullptr);
  Dwarf_Frame* frame = nullptr;
  EXPECT_EQ(dwarf_cfi_addrframe((*r)->cfi(), price->value, &frame), 0) << dwarf_errmsg(-1);
  free(frame);
}

TEST_F(DebugInfoSearch, DebuglinkBesideTheObject) {
  const std::string at = put_debug("bin/" + debuglink_name());
  EXPECT_EQ(found_at(*image_, {}, root_), at);
}

TEST_F(DebugInfoSearch, DebuglinkInDotDebug) {
  const std::string at = put_debug("bin/.debug/" + debuglink_name());
  EXPECT_EQ(found_at(*image_, {}, root_), at);
}

TEST_F(DebugInfoSearch, DebuglinkUnderTheDebugRoot) {
  const std::string at = root_ + bin_dir() + "/" + debuglink_name();
  put_debug(fs::relative(at, tmp_.path()).string());
  EXPECT_EQ(found_at(*image_, {}, root_), at);
}

TEST_F(DebugInfoSearch, BuildIdUnderTheDebugRoot) {
  const std::string at = put_debug("root/" + build_id_rel());
  EXPECT_EQ(found_at(*image_, {}, root_), at);
}

TEST_F(DebugInfoSearch, NothingInAnyPlace) { EXPECT_EQ(found_at(*image_, {}, root_), ""); }

TEST_F(DebugInfoSearch, DebuglinkWithAnotherCrcIsPassedOver) {
  // A valid debug file, but not the one the link was made for (one byte more).
  const std::string stale = put_debug("bin/.debug/" + debuglink_name());
  std::ofstream(stale, std::ios::app | std::ios::binary) << '\0';
  EXPECT_EQ(found_at(*image_, {}, root_), "");
  // Another program's DWARF under the same name.
  put_debug("bin/" + debuglink_name(), PROBE_PROG_O0);
  EXPECT_EQ(found_at(*image_, {}, root_), "");
  // The search goes on to the next place.
  const std::string good = put_debug("root/" + build_id_rel());
  EXPECT_EQ(found_at(*image_, {}, root_), good);
}

TEST_F(DebugInfoSearch, BuildIdOfAnotherBuildIsPassedOver) {
  put_debug("root/" + build_id_rel(), PROBE_PROG_O0);
  EXPECT_EQ(found_at(*image_, {}, root_), "");
}

TEST_F(DebugInfoSearch, DebuginfoDirsEachWay) {
  const std::string extra = tmp_.path() + "/extra";
  fs::create_directories(extra);
  EXPECT_EQ(found_at(*image_, {extra}, root_), "");
  const std::string nested = put_debug(fs::relative(extra + bin_dir() + "/" + debuglink_name(),
                                                    tmp_.path()).string());
  EXPECT_EQ(found_at(*image_, {extra}, root_), nested);
  const std::string by_id = put_debug("extra/" + build_id_rel());
  EXPECT_EQ(found_at(*image_, {extra}, root_), by_id);
  const std::string by_name = put_debug("extra/" + debuglink_name());
  EXPECT_EQ(found_at(*image_, {extra}, root_), by_name);
}

TEST_F(DebugInfoSearch, Precedence) {
  // From last to first: each new place must win over all the ones before.
  std::string at = put_debug("root/" + build_id_rel());
  EXPECT_EQ(found_at(*image_, {}, root_), at);
  at = put_debug(fs::relative(root_ + bin_dir() + "/" + debuglink_name(), tmp_.path()).string());
  EXPECT_EQ(found_at(*image_, {}, root_), at);
  at = put_debug("bin/.debug/" + debuglink_name());
  EXPECT_EQ(found_at(*image_, {}, root_), at);
  at = put_debug("bin/" + debuglink_name());
  EXPECT_EQ(found_at(*image_, {}, root_), at);
  at = put_debug("second/" + debuglink_name());
  EXPECT_EQ(found_at(*image_, {tmp_.path() + "/first", tmp_.path() + "/second"}, root_), at);
  at = put_debug("first/" + build_id_rel());
  EXPECT_EQ(found_at(*image_, {tmp_.path() + "/first", tmp_.path() + "/second"}, root_), at);
}

TEST(DebugInfo, TheObjectsOwnDwarfWinsOverDebuginfoDirs) {
  auto image = open_ok(PROBE_PROG_O2);
  ASSERT_NE(image, nullptr);
  EXPECT_EQ(found_at(*image, {PROBE_BUILD_ID_ROOT}, PROBE_BUILD_ID_ROOT), image->path());
}

TEST(DebugInfo, StrippedCopiesThroughTheBuildId) {
  const std::string at = std::string(PROBE_BUILD_ID_ROOT) + "/.build-id/" +
                         expected_build_id().substr(0, 2) + "/" +
                         expected_build_id().substr(2) + ".debug";
  TempDir empty;
  ASSERT_FALSE(empty.path().empty());
  for (const char* path : {PROBE_PROG_STRIPPED, PROBE_PROG_NODEBUG}) {
    SCOPED_TRACE(path);
    auto image = open_ok(path);
    ASSERT_NE(image, nullptr);
    EXPECT_EQ(found_at(*image, {}, PROBE_BUILD_ID_ROOT), at);
    EXPECT_EQ(found_at(*image, {PROBE_BUILD_ID_ROOT}, empty.path()), at);
    EXPECT_EQ(found_at(*image, {}, empty.path()), "");
  }
}

}  // namespace
}  // namespace probefs::tools
