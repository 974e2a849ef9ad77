// tracee/code_sections.h: the instruction at a file offset of an object, proven by decoding
// the code section that holds it from its start, on a small object made here byte by byte.
#include "tracee/code_sections.h"

#include <elf.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace probefs::tracee {
namespace {

constexpr uint64_t kCodeAt = 0x100;
// sub $8,%rsp (4); mov 0x0(%rip),%rax (7); ret (1)
const uint8_t kCode[] = {0x48, 0x83, 0xec, 0x08, 0x48, 0x8b, 0x05, 0x00,
                         0x00, 0x00, 0x00, 0xc3};
constexpr uint64_t kDataAt = 0x120;

// An ELF64 object: its header, then at 0x40 three section headers (null, a code section
// at kCodeAt holding kCode, a data section at kDataAt), the bytes themselves after.
std::vector<uint8_t> object(uint64_t code_flags = SHF_ALLOC | SHF_EXECINSTR) {
  std::vector<uint8_t> f(0x140, 0);
  Elf64_Ehdr eh{};
  memcpy(eh.e_ident, ELFMAG, SELFMAG);
  eh.e_ident[EI_CLASS] = ELFCLASS64;
  eh.e_ident[EI_DATA] = ELFDATA2LSB;
  eh.e_shoff = 0x40;
  eh.e_shentsize = sizeof(Elf64_Shdr);
  eh.e_shnum = 3;
  memcpy(f.data(), &eh, sizeof eh);
  Elf64_Shdr code{};
  code.sh_type = SHT_PROGBITS;
  code.sh_flags = code_flags;
  code.sh_offset = kCodeAt;
  code.sh_size = sizeof kCode;
  memcpy(f.data() + 0x40 + sizeof(Elf64_Shdr), &code, sizeof code);
  Elf64_Shdr data{};
  data.sh_type = SHT_PROGBITS;
  data.sh_flags = SHF_ALLOC | SHF_WRITE;
  data.sh_offset = kDataAt;
  data.sh_size = 16;
  memcpy(f.data() + 0x40 + 2 * sizeof(Elf64_Shdr), &data, sizeof data);
  memcpy(f.data() + kCodeAt, kCode, sizeof kCode);
  return f;
}

int at(const std::vector<uint8_t>& f, uint64_t offset, size_t* len) {
  return section_instruction(
      [&](uint64_t a, void* out, size_t n) {
        if (a > f.size() || f.size() - a < n) return false;
        memcpy(out, f.data() + a, n);
        return true;
      },
      offset, len);
}

TEST(CodeSections, EachInstructionOfTheSectionIsFoundWithItsLength) {
  const std::vector<uint8_t> f = object();
  size_t len = 0;
  ASSERT_EQ(at(f, kCodeAt, &len), 0);
  EXPECT_EQ(len, 4u);
  ASSERT_EQ(at(f, kCodeAt + 4, &len), 0);
  EXPECT_EQ(len, 7u);
  ASSERT_EQ(at(f, kCodeAt + 11, &len), 0);
  EXPECT_EQ(len, 1u);
}

TEST(CodeSections, InsideAnInstructionOrOutsideCodeIsRefused) {
  const std::vector<uint8_t> f = object();
  size_t len = 0;
  for (uint64_t inside : {kCodeAt + 1, kCodeAt + 3, kCodeAt + 5, kCodeAt + 10})
    EXPECT_EQ(at(f, inside, &len), -EILSEQ) << inside;
  EXPECT_EQ(at(f, kDataAt, &len), -ENOENT);          // a data section
  EXPECT_EQ(at(f, kCodeAt + sizeof kCode, &len), -ENOENT);  // just past the code
  EXPECT_EQ(at(object(SHF_ALLOC), kCodeAt, &len), -ENOENT);  // not executable
}

TEST(CodeSections, ABrokenObjectIsNoObject) {
  std::vector<uint8_t> f = object();
  size_t len = 0;
  f.resize(0x60);  // the section headers cut short
  EXPECT_EQ(at(f, kCodeAt, &len), -ENOEXEC);
  f = object();
  f.resize(kCodeAt + 4);  // the code section cut short
  EXPECT_EQ(at(f, kCodeAt, &len), -ENOEXEC);
  f = object();
  f[EI_CLASS] = ELFCLASS32;
  EXPECT_EQ(at(f, kCodeAt, &len), -ENOEXEC);
  EXPECT_EQ(at({}, 0, &len), -ENOEXEC);
}

}  // namespace
}  // namespace probefs::tracee
