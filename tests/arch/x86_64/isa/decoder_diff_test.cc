// Differential tests of the ISA toolkit's decoder against Capstone 4 (decoder_diff.h says
// what is compared and which differences are legitimate, decoder_diff.cc why):
//   - a linear sweep through the executable sections of real objects on this machine,
//     driven by Capstone and resynchronized a byte further where Capstone cannot decode;
//   - every opcode of the legacy maps under common prefixes with every ModRM byte;
//   - random instruction-like bytes;
//   - decode()'s speed against the Capstone-based decode() it replaced, over libc's text.
#include <elf.h>
#include <gtest/gtest.h>
#include <link.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "arch/x86_64/isa/insn.h"
#include "tests/arch/x86_64/isa/capstone_oracle.h"
#include "tests/arch/x86_64/isa/decoder_diff.h"

namespace probefs::arch::x86_64::difftest {
namespace {

struct Section {
  uintptr_t addr;
  std::vector<uint8_t> bytes;
};

// The executable sections of an ELF64 file (none when it cannot be read).
std::vector<Section> executable_sections(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<uint8_t> file((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<Section> out;
  if (file.size() < sizeof(Elf64_Ehdr)) return out;
  Elf64_Ehdr eh;
  std::memcpy(&eh, file.data(), sizeof eh);
  if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64) return out;
  for (unsigned i = 0; i < eh.e_shnum; ++i) {
    const size_t at = eh.e_shoff + i * size_t{eh.e_shentsize};
    if (at + sizeof(Elf64_Shdr) > file.size()) break;
    Elf64_Shdr sh;
    std::memcpy(&sh, file.data() + at, sizeof sh);
    if (sh.sh_type != SHT_PROGBITS || !(sh.sh_flags & SHF_EXECINSTR)) continue;
    if (sh.sh_offset + sh.sh_size > file.size()) continue;
    out.push_back({sh.sh_addr, std::vector<uint8_t>(file.begin() + sh.sh_offset,
                                                    file.begin() + sh.sh_offset + sh.sh_size)});
  }
  return out;
}

// The loaded object whose name ends with `suffix`, by its path.
std::string loaded_object(const char* suffix) {
  struct Find {
    const char* suffix;
    std::string path;
  } find{suffix, {}};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* ctx) {
        auto* f = static_cast<Find*>(ctx);
        const std::string name = info->dlpi_name ? info->dlpi_name : "";
        const std::string s = f->suffix;
        if (name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) {
          f->path = name;
          return 1;
        }
        return 0;
      },
      &find);
  return find.path;
}

struct Tally {
  size_t own_sweep = 0;       // instructions of our own linear sweep of the same bytes
  size_t own_sweep_fails = 0; // ... and the offsets where it found no instruction
  size_t compared = 0;        // instructions Capstone decoded, compared field by field
  size_t capstone_fails = 0;  // offsets where Capstone could not decode (resynchronized)
  size_t ours_only = 0;       // ... of which ours decoded
  std::map<Category, size_t> categories;
  // Unexplained differences by what differed: how many, and the bytes of the first.
  std::map<std::string, std::pair<size_t, std::string>> unexplained;

  void add(const Verdict& v) {
    ++categories[v.category];
    if (v.oracle_len) ++compared;
    else ++capstone_fails;
    if (!v.oracle_len && v.our_len) ++ours_only;
    if (v.category == Category::kUnexplained) {
      const std::string detail = v.detail;
      const size_t colon = detail.find(": ");
      const std::string what = colon == std::string::npos ? detail : detail.substr(colon + 2);
      auto& [n, example] = unexplained[what];
      if (n++ == 0) example = detail.substr(0, colon);
    }
  }
  size_t count(Category c) const {
    auto it = categories.find(c);
    return it == categories.end() ? 0 : it->second;
  }
  std::string summary() const {
    std::string s = own_sweep ? "our sweep " + std::to_string(own_sweep) + " instructions, " +
                                    std::to_string(own_sweep_fails) + " undecodable offsets; "
                              : std::string();
    s += "compared " + std::to_string(compared) + ", capstone fails at " +
                    std::to_string(capstone_fails) + " offsets (ours decodes " +
                    std::to_string(ours_only) + ")";
    for (const auto& [c, n] : categories) {
      if (c == Category::kSame || c == Category::kCapstoneFails) continue;
      s += "; " + std::string(category_name(c)) + " " + std::to_string(n);
    }
    return s;
  }
};

// Capstone's linear sweep of one object, each of its instructions compared with ours; and
// our own sweep, for the instructions Capstone cannot decode (AVX-512 in libc).
Tally sweep(const std::string& path) {
  Tally t;
  for (const Section& s : executable_sections(path)) {
    const uint8_t* p = s.bytes.data();
    const size_t n = s.bytes.size();
    for (size_t off = 0; off < n;) {
      Insn insn;
      if (decode(p + off, n - off, s.addr + off, &insn) == 0) {
        ++t.own_sweep;
        off += insn.len;
      } else {
        ++t.own_sweep_fails;
        ++off;
      }
    }
    for (size_t off = 0; off < n;) {
      const Verdict v = compare(p + off, n - off, s.addr + off);
      t.add(v);
      off += v.oracle_len ? static_cast<size_t>(v.oracle_len) : 1;
    }
  }
  return t;
}

void expect_explained(const Tally& t, const std::string& what) {
  std::printf("%s: %s\n", what.c_str(), t.summary().c_str());
  EXPECT_EQ(t.count(Category::kUnexplained), 0u) << what;
  size_t shown = 0;
  for (const auto& [difference, seen] : t.unexplained) {
    if (++shown > 60) break;
    ADD_FAILURE() << what << ": " << difference << " (" << seen.first << " times, e.g. "
                  << seen.second << ")";
  }
}

void sweep_object(const std::string& path) {
  ASSERT_FALSE(path.empty());
  const Tally t = sweep(path);
  EXPECT_GT(t.compared, 1000u) << path;
  expect_explained(t, path);
}

TEST(DecoderDiff, LibcSweep) { sweep_object(loaded_object("libc.so.6")); }
TEST(DecoderDiff, DynamicLoaderSweep) { sweep_object(loaded_object("ld-linux-x86-64.so.2")); }
TEST(DecoderDiff, LibstdcxxSweep) { sweep_object(loaded_object("libstdc++.so.6")); }
TEST(DecoderDiff, CapstoneSweep) { sweep_object(loaded_object("libcapstone.so.4")); }
TEST(DecoderDiff, ThisTestSweep) { sweep_object("/proc/self/exe"); }

// The other test binaries beside this one, and python if the machine has it.
TEST(DecoderDiff, OtherProgramsSweep) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  ASSERT_GT(n, 0);
  self[n] = '\0';
  const std::string dir = std::string(self).substr(0, std::string(self).rfind('/') + 1);
  for (const std::string& path : {dir + "isa_test", std::string("/usr/bin/python3.11")}) {
    if (access(path.c_str(), R_OK) != 0) continue;
    sweep_object(path);
  }
}

// A second opinion where Capstone 4 has none (AVX-512 in libc's string functions): the
// instructions binutils' objdump finds in libc, each decoded by us to the same length.
// objdump fuses fwait with the x87 instruction after it (fstcw, fstsw): 9B is an
// instruction of its own to the CPU, and to us.
TEST(DecoderDiff, LibcAgreesWithObjdump) {
  const std::string libc = loaded_object("libc.so.6");
  ASSERT_FALSE(libc.empty());
  const std::string command = "objdump -d -w --insn-width=16 " + libc + " 2>/dev/null";
  FILE* p = popen(command.c_str(), "r");
  ASSERT_NE(p, nullptr);
  char line[512];
  size_t listed = 0, agreed = 0, evex = 0;
  std::vector<std::string> disagreed;
  while (fgets(line, sizeof line, p)) {
    // "  2a1b0:\t62 f1 7c 48 28 c1 \tvmovaps %zmm1,%zmm0"
    char* colon = std::strchr(line, ':');
    char* tab = colon ? std::strchr(colon, '\t') : nullptr;
    if (!tab || colon == line || std::strspn(line, " 0123456789abcdef") != size_t(colon - line)) {
      continue;
    }
    std::vector<uint8_t> bytes;
    char* q = tab + 1;
    while (std::isxdigit(static_cast<unsigned char>(q[0])) &&
           std::isxdigit(static_cast<unsigned char>(q[1])) && (q[2] == ' ' || q[2] == '\t')) {
      bytes.push_back(static_cast<uint8_t>(std::stoi(std::string(q, 2), nullptr, 16)));
      q += 3;
    }
    if (bytes.empty() || std::strstr(q, "(bad)")) continue;
    ++listed;
    if (bytes[0] == 0x9b && bytes.size() > 1) {  // fwait, fused
      bytes.erase(bytes.begin());
    }
    Insn insn;
    if (decode(bytes.data(), bytes.size(), 0x1000, &insn) == 0 && insn.len == bytes.size()) {
      ++agreed;
      evex += bytes[insn.opcode_offset] == 0x62;
    } else if (disagreed.size() < 20) {
      disagreed.push_back(line);
    }
  }
  pclose(p);
  std::printf("objdump lists %zu instructions in libc (%zu EVEX); %zu decode to its lengths\n",
              listed, evex, agreed);
  EXPECT_GT(listed, 100000u);
  EXPECT_EQ(agreed, listed);
  for (const std::string& d : disagreed) ADD_FAILURE() << d;
}

// Every opcode of the one-byte, 0F, 0F38 and 0F3A maps under the common prefixes, with
// every ModRM byte and a SIB that needs no displacement... and bytes after it that make
// every displacement and immediate readable.
TEST(DecoderDiff, EveryLegacyOpcodeWithEveryModrm) {
  static const std::vector<std::vector<uint8_t>> kPrefixes = {
      {}, {0x66}, {0xf3}, {0xf2}, {0x48}, {0xf0}, {0x67}, {0x66, 0x48}, {0xf3, 0x48},
      {0x2e}, {0x41}, {0x4c}, {0x66, 0xf2}, {0xf2, 0x66}, {0x64}, {0x3e},
  };
  Tally t;
  uint8_t b[32];
  for (const auto& prefixes : kPrefixes) {
    for (int map = 0; map < 4; ++map) {
      for (int op = 0; op < 256; ++op) {
        for (int modrm = 0; modrm < 256; ++modrm) {
          size_t k = 0;
          for (uint8_t p : prefixes) b[k++] = p;
          if (map >= 1) b[k++] = 0x0f;
          if (map == 2) b[k++] = 0x38;
          if (map == 3) b[k++] = 0x3a;
          b[k++] = static_cast<uint8_t>(op);
          b[k++] = static_cast<uint8_t>(modrm);
          for (size_t j = k; j < sizeof b; ++j) b[j] = static_cast<uint8_t>(j * 37 + 0x11);
          b[k] = 0x24;
          t.add(compare(b, sizeof b, 0x401000));
        }
      }
    }
  }
  expect_explained(t, "every legacy opcode");
}

// VEX, EVEX and XOP: every opcode of every map with a few payloads and ModRM forms.
TEST(DecoderDiff, EveryVexEvexXopOpcode) {
  Tally t;
  uint8_t b[32];
  auto fill = [&](size_t k) {
    for (size_t j = k; j < sizeof b; ++j) b[j] = static_cast<uint8_t>(j * 53 + 0x07);
  };
  for (int op = 0; op < 256; ++op) {
    for (uint8_t modrm : {0x00, 0x05, 0x44, 0x84, 0xc1}) {
      for (uint8_t pp = 0; pp < 4; ++pp) {
        for (uint8_t l = 0; l < 2; ++l) {
          // C5: R vvvv L pp
          b[0] = 0xc5;
          b[1] = static_cast<uint8_t>(0xf8 | l << 2 | pp);
          b[2] = static_cast<uint8_t>(op);
          b[3] = modrm;
          fill(4);
          t.add(compare(b, sizeof b, 0x401000));
          for (uint8_t map : {1, 2, 3}) {
            for (uint8_t w = 0; w < 2; ++w) {
              // C4: RXB mmmmm, W vvvv L pp
              b[0] = 0xc4;
              b[1] = static_cast<uint8_t>(0xe0 | map);
              b[2] = static_cast<uint8_t>(w << 7 | 0x78 | l << 2 | pp);
              b[3] = static_cast<uint8_t>(op);
              b[4] = modrm;
              fill(5);
              t.add(compare(b, sizeof b, 0x401000));
            }
          }
          for (uint8_t map : {1, 2, 3, 5, 6}) {
            for (uint8_t w = 0; w < 2; ++w) {
              // 62: RXBR' 0 mmm, W vvvv 1 pp, z L'L b V' aaa
              b[0] = 0x62;
              b[1] = static_cast<uint8_t>(0xf0 | map);
              b[2] = static_cast<uint8_t>(w << 7 | 0x7c | pp);
              b[3] = static_cast<uint8_t>(0x08 | (l + 1) << 5);
              b[4] = static_cast<uint8_t>(op);
              b[5] = modrm;
              fill(6);
              t.add(compare(b, sizeof b, 0x401000));
            }
          }
          for (uint8_t map : {8, 9, 10}) {
            b[0] = 0x8f;
            b[1] = static_cast<uint8_t>(0xe0 | map);
            b[2] = static_cast<uint8_t>(0x78 | l << 2 | pp);
            b[3] = static_cast<uint8_t>(op);
            b[4] = modrm;
            fill(5);
            t.add(compare(b, sizeof b, 0x401000));
          }
        }
      }
    }
  }
  expect_explained(t, "every VEX/EVEX/XOP opcode");
}

// Random bytes shaped like instructions: a few prefixes, maybe an escape, random rest.
TEST(DecoderDiff, RandomInstructionLikeBytes) {
  static const uint8_t kPrefixBytes[] = {0x66, 0x67, 0xf2, 0xf3, 0xf0, 0x2e, 0x3e, 0x26,
                                         0x64, 0x65, 0x36, 0x40, 0x41, 0x48, 0x4c, 0x4f};
  static const std::vector<std::vector<uint8_t>> kEscapes = {
      {}, {}, {}, {0x0f}, {0x0f}, {0x0f, 0x38}, {0x0f, 0x3a}, {0xc5}, {0xc4}, {0x62}, {0x8f},
      {0x0f, 0x0f},
  };
  uint64_t s = 0x9e3779b97f4a7c15;
  auto next = [&] {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  };
  Tally t;
  uint8_t b[24];
  for (int i = 0; i < 400000; ++i) {
    size_t k = 0;
    const unsigned np = next() % 4;
    for (unsigned j = 0; j < np; ++j) b[k++] = kPrefixBytes[next() % sizeof kPrefixBytes];
    for (uint8_t e : kEscapes[next() % kEscapes.size()]) b[k++] = e;
    while (k < sizeof b) b[k++] = static_cast<uint8_t>(next());
    const size_t avail = next() % 4 == 0 ? 1 + next() % sizeof b : sizeof b;
    t.add(compare(b, avail, 0x7f0000001000 + (next() & 0xffff)));
  }
  expect_explained(t, "random bytes");
}

}  // namespace
}  // namespace probefs::arch::x86_64::difftest
