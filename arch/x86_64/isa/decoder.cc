// The x86-64 decoder (see decoder.h). Lengths come from three facts per instruction: its
// opcode map and opcode, whether a ModRM byte follows (and so maybe a SIB and a
// displacement), and the immediates. The tables below give those facts for every opcode of
// the legacy maps in 64-bit mode (Intel SDM vol. 2, appendix A, tables ); the
// VEX, EVEX and XOP maps follow fixed rules.
#include "arch/x86_64/isa/decoder.h"

#include <array>
#include <cerrno>
#include <initializer_list>
#include <utility>

namespace probefs::arch::x86_64::decoder {
namespace {

constexpr size_t kMaxLen = 15;

// ---- the legacy maps --------------------------------------------------------------------

// What follows an opcode of a legacy map.
enum Layout : uint8_t {
  kNone,       // '.'  nothing
  kModrm,      // 'M'  ModRM
  kIb,         // 'b'  imm8 (or rel8)
  kIw,         // 'w'  imm16
  kIz,         // 'z'  imm32 (or rel32); imm16 under 66
  kIv,         // 'v'  imm32; imm64 under REX.W, imm16 under 66 (mov r, imm: B8+r)
  kMoffs,      // 'o'  an 8-byte address; 4 bytes under 67 (mov al/ax, moffs: A0-A3)
  kEnter,      // 'e'  imm16, imm8 (enter)
  kModrmIb,    // 'B'  ModRM, imm8
  kModrmIz,    // 'Z'  ModRM, imm32 (imm16 under 66)
  kGroup3,     // 'G'  ModRM; /0 and /1 (test) take an immediate of the operand's size
  kControl,    // 'C'  ModRM that always names registers (mov to/from CRn, DRn)
  k3DNow,      // '3'  0F 0F: ModRM, then the opcode as an imm8
  kEscape,     // 'E'  0F, VEX (C4 C5), EVEX (62): taken before the table is looked at
  kPrefix,     // 'p'  a prefix (taken before the opcode is looked at)
  kExtrq,      // 'X'  0F 78: vmread; extrq/insertq with two imm8 under 66/F2
  kInvalid,    // 'x'  invalid in 64-bit mode
};

using LayoutTable = std::array<uint8_t, 256>;

// Not constexpr: a table with a letter layouts() does not know does not compile.
void unknown_layout_letter() {}

constexpr LayoutTable layouts(const char (&rows)[257]) {
  LayoutTable t{};
  for (size_t i = 0; i < 256; ++i) {
    switch (rows[i]) {
      case '.': t[i] = kNone; break;
      case 'M': t[i] = kModrm; break;
      case 'b': t[i] = kIb; break;
      case 'w': t[i] = kIw; break;
      case 'z': t[i] = kIz; break;
      case 'v': t[i] = kIv; break;
      case 'o': t[i] = kMoffs; break;
      case 'e': t[i] = kEnter; break;
      case 'B': t[i] = kModrmIb; break;
      case 'Z': t[i] = kModrmIz; break;
      case 'G': t[i] = kGroup3; break;
      case 'C': t[i] = kControl; break;
      case '3': t[i] = k3DNow; break;
      case 'E': t[i] = kEscape; break;
      case 'p': t[i] = kPrefix; break;
      case 'X': t[i] = kExtrq; break;
      case 'x': t[i] = kInvalid; break;
      default: unknown_layout_letter(); break;
    }
  }
  return t;
}

// One-byte map, 64-bit mode. Invalid there: push/pop of es/cs/ss/ds, daa/das/aaa/aas,
// pusha/popa, bound (62 is EVEX), 82 (an alias of 80), call/jmp far ptr, into, aam/aad,
// salc. C4/C5 are always VEX; 8F is pop r/m or XOP.
constexpr LayoutTable kOneByte = layouts(
    //0123456789abcdef
    "MMMMbzxxMMMMbzxE"   // 0_  add or; 0F escape
    "MMMMbzxxMMMMbzxx"   // 1_  adc sbb
    "MMMMbzpxMMMMbzpx"   // 2_  and sub; es cs
    "MMMMbzpxMMMMbzpx"   // 3_  xor cmp; ss ds
    "pppppppppppppppp"   // 4_  REX
    "................"   // 5_  push pop
    "xxEMppppzZbB...."   // 6_  EVEX movsxd; fs gs 66 67; push imul; ins outs
    "bbbbbbbbbbbbbbbb"   // 7_  jcc rel8
    "BZxBMMMMMMMMMMMM"   // 8_  group 1, test xchg mov lea pop (8F: XOP taken before)
    "..........x....."   // 9_  xchg cbw cwd fwait pushf popf sahf lahf
    "oooo....bz......"   // a_  mov moffs, movs cmps test stos lods scas
    "bbbbbbbbvvvvvvvv"   // b_  mov r, imm
    "BBw.EEBZe.w..bx."   // c_  group 2, ret, VEX, mov imm, enter leave retf int3 int iret
    "MMMMxxx.MMMMMMMM"   // d_  group 2, xlat, x87
    "bbbbbbbbzzxb...."   // e_  loop jrcxz in out call jmp
    "p.pp..GG......MM"); // f_  lock int1 rep hlt cmc group 3, flags, group 4, group 5

// Map 0F. Invalid: 04 0A 0C 24-27 36 39 3B-3F 7A 7B (and jmpe, B8 without F3).
constexpr LayoutTable kMap0FLayout = layouts(
    //0123456789abcdef
    "MMMMx.....x.xM.3"   // 0_  groups 6 7, lar lsl, syscall clts sysret invd wbinvd ud2,
                         //     prefetch, femms, 3DNow!
    "MMMMMMMMMMMMMMMM"   // 1_  SSE moves, prefetch/hint nops, nop r/m
    "CCCCxxxxMMMMMMMM"   // 2_  mov CRn/DRn, SSE
    "......x.ExExxxxx"   // 3_  wrmsr rdtsc rdmsr rdpmc sysenter sysexit getsec; 38 3A
    "MMMMMMMMMMMMMMMM"   // 4_  cmovcc
    "MMMMMMMMMMMMMMMM"   // 5_  SSE
    "MMMMMMMMMMMMMMMM"   // 6_  MMX/SSE
    "BBBBMMM.XMxxMMMM"   // 7_  pshuf, groups 12-14, emms, vmread/vmwrite/extrq/insertq
    "zzzzzzzzzzzzzzzz"   // 8_  jcc rel32
    "MMMMMMMMMMMMMMMM"   // 9_  setcc
    "...MBMMM...MBMMM"   // a_  push/pop fs, cpuid, bt, shld, VIA PadLock, push/pop gs,
                         //     rsm, bts, shrd, group 15, imul
    "MMMMMMMMMMBMMMMM"   // b_  cmpxchg lss btr lfs lgs movzx popcnt ud1 group 8 btc bsf
                         //     bsr movsx
    "MMBMBBBM........"   // c_  xadd, cmpps, movnti, pinsrw pextrw shufps, group 9, bswap
    "MMMMMMMMMMMMMMMM"   // d_  SSE
    "MMMMMMMMMMMMMMMM"   // e_  SSE
    "MMMMMMMMMMMMMMMM"); // f_  SSE, ud0

// Which mandatory prefixes make an opcode of maps 0F, 0F38 and 0F3A valid.
enum : uint8_t { kNP = 1, k66 = 2, kF3 = 4, kF2 = 8, kAny = 15 };

using MaskTable = std::array<uint8_t, 256>;

struct MaskRange {
  uint8_t first, last, mask;
};

constexpr MaskTable masks(uint8_t fill, std::initializer_list<MaskRange> ranges) {
  MaskTable t{};
  for (auto& v : t) v = fill;
  for (const MaskRange& r : ranges) {
    for (unsigned op = r.first; op <= r.last; ++op) t[op] = r.mask;
  }
  return t;
}

// Map 0F: the SSE/MMX opcodes pick their instruction by prefix; the others ignore 66/F2/F3.
constexpr MaskTable kMap0FMask = masks(kAny, {
    {0x10, 0x12, kAny}, {0x13, 0x15, kNP | k66}, {0x16, 0x16, kNP | k66 | kF3},
    {0x17, 0x17, kNP | k66},
    {0x28, 0x29, kNP | k66}, {0x2a, 0x2a, kAny}, {0x2b, 0x2b, kNP | k66},
    {0x2c, 0x2d, kAny}, {0x2e, 0x2f, kNP | k66},
    {0x50, 0x50, kNP | k66}, {0x51, 0x51, kAny}, {0x52, 0x53, kNP | kF3},
    {0x54, 0x57, kNP | k66}, {0x58, 0x5a, kAny}, {0x5b, 0x5b, kNP | k66 | kF3},
    {0x5c, 0x5f, kAny},
    {0x60, 0x6b, kNP | k66}, {0x6c, 0x6d, k66}, {0x6e, 0x6e, kNP | k66},
    {0x6f, 0x6f, kNP | k66 | kF3},
    {0x70, 0x70, kAny}, {0x71, 0x76, kNP | k66}, {0x77, 0x77, kNP},
    {0x78, 0x79, kNP | k66 | kF2}, {0x7c, 0x7d, k66 | kF2}, {0x7e, 0x7f, kNP | k66 | kF3},
    {0xb8, 0xb8, kF3},
    {0xc2, 0xc2, kAny}, {0xc3, 0xc3, kNP}, {0xc4, 0xc6, kNP | k66},
    {0xd0, 0xd0, k66 | kF2}, {0xd1, 0xd5, kNP | k66}, {0xd6, 0xd6, k66 | kF3 | kF2},
    {0xd7, 0xdf, kNP | k66},
    {0xe0, 0xe5, kNP | k66}, {0xe6, 0xe6, k66 | kF3 | kF2}, {0xe7, 0xef, kNP | k66},
    {0xf0, 0xf0, kF2}, {0xf1, 0xfe, kNP | k66},
});

// Map 0F38 (every opcode has a ModRM and no immediate).
constexpr MaskTable kMap0F38Mask = masks(0, {
    {0x00, 0x0b, kNP | k66}, {0x10, 0x10, k66}, {0x14, 0x15, k66}, {0x17, 0x17, k66},
    {0x1c, 0x1e, kNP | k66}, {0x20, 0x25, k66}, {0x28, 0x2b, k66}, {0x30, 0x35, k66},
    {0x37, 0x41, k66}, {0x80, 0x82, k66}, {0xc8, 0xcd, kNP}, {0xcf, 0xcf, k66},
    {0xdb, 0xdf, k66},
    {0xf0, 0xf1, kNP | k66 | kF2},  // movbe; crc32
    {0xf5, 0xf5, k66},              // wruss
    {0xf6, 0xf6, kNP | k66 | kF3},  // wrss; adcx; adox
    {0xf8, 0xf8, k66 | kF3 | kF2},  // movdir64b; enqcmds; enqcmd
    {0xf9, 0xf9, kNP},              // movdiri
});

// Map 0F3A (every opcode has a ModRM and an imm8).
constexpr MaskTable kMap0F3AMask = masks(0, {
    {0x08, 0x0e, k66}, {0x0f, 0x0f, kNP | k66}, {0x14, 0x17, k66}, {0x20, 0x22, k66},
    {0x40, 0x42, k66}, {0x44, 0x44, k66}, {0x60, 0x63, k66}, {0xcc, 0xcc, kNP},
    {0xce, 0xcf, k66}, {0xdf, 0xdf, k66},
});

uint8_t mask_bit(uint8_t mandatory) {
  switch (mandatory) {
    case 0x66: return k66;
    case 0xf3: return kF3;
    case 0xf2: return kF2;
    default: return kNP;
  }
}

// ---- VEX, EVEX, XOP, 3DNow!: which opcodes exist ------------------------------------------

struct Bits256 {
  uint64_t w[4] = {};
  constexpr bool test(uint8_t b) const { return (w[b >> 6] >> (b & 63)) & 1; }
};

constexpr Bits256 bits(std::initializer_list<std::pair<uint8_t, uint8_t>> ranges) {
  Bits256 s;
  for (const auto& [first, last] : ranges) {
    for (unsigned b = first; b <= last; ++b) s.w[b >> 6] |= uint64_t{1} << (b & 63);
  }
  return s;
}

// VEX-encoded opcodes (AVX, AVX2, FMA, F16C, BMI1/2, AVX-VNNI, AVX-IFMA, AVX-NE-CONVERT,
// GFNI, VAES, VPCLMULQDQ, AMX, the AVX-512 opmask instructions; AMD's FMA4 and vpermil2).
constexpr Bits256 kVexMap1 = bits({
    {0x10, 0x17}, {0x28, 0x2f}, {0x41, 0x42}, {0x44, 0x47}, {0x4a, 0x4b}, {0x50, 0x7f},
    {0x90, 0x93}, {0x98, 0x99}, {0xae, 0xae}, {0xc2, 0xc2}, {0xc4, 0xc6}, {0xd0, 0xff},
});
constexpr Bits256 kVexMap2 = bits({
    {0x00, 0x0f}, {0x13, 0x13}, {0x16, 0x1a}, {0x1c, 0x1e}, {0x20, 0x25}, {0x28, 0x2f},
    {0x30, 0x41}, {0x45, 0x47}, {0x49, 0x49}, {0x4b, 0x4b}, {0x50, 0x53}, {0x58, 0x5a},
    {0x5c, 0x5c}, {0x5e, 0x5e}, {0x72, 0x72}, {0x78, 0x79}, {0x8c, 0x8c}, {0x8e, 0x8e},
    {0x90, 0x93}, {0x96, 0x9f}, {0xa6, 0xaf}, {0xb0, 0xb1}, {0xb4, 0xbf}, {0xcf, 0xcf},
    {0xdb, 0xdf}, {0xf2, 0xf3}, {0xf5, 0xf7},
});
constexpr Bits256 kVexMap3 = bits({
    {0x00, 0x02}, {0x04, 0x06}, {0x08, 0x0f}, {0x14, 0x19}, {0x1d, 0x1d}, {0x20, 0x22},
    {0x30, 0x33}, {0x38, 0x39}, {0x40, 0x42}, {0x44, 0x44}, {0x46, 0x46}, {0x48, 0x4c},
    {0x5c, 0x5f}, {0x60, 0x63}, {0x68, 0x6f}, {0x78, 0x7f}, {0xce, 0xcf}, {0xdf, 0xdf},
    {0xf0, 0xf0},
});

// EVEX-encoded opcodes (AVX-512 and its extensions, AVX512-FP16 in maps 5 and 6).
constexpr Bits256 kEvexMap1 = bits({
    {0x10, 0x17}, {0x28, 0x2f}, {0x51, 0x51}, {0x54, 0x76}, {0x78, 0x7f}, {0xc2, 0xc2},
    {0xc4, 0xc6}, {0xd1, 0xd6}, {0xd8, 0xef}, {0xf1, 0xf6}, {0xf8, 0xfe},
});
constexpr Bits256 kEvexMap2 = bits({
    {0x00, 0x00}, {0x04, 0x04}, {0x0b, 0x0d}, {0x10, 0x16}, {0x18, 0x1f}, {0x20, 0x2d},
    {0x30, 0x40}, {0x42, 0x47}, {0x4c, 0x4f}, {0x50, 0x55}, {0x58, 0x5b}, {0x62, 0x66},
    {0x68, 0x68}, {0x70, 0x73}, {0x75, 0x7f}, {0x83, 0x83}, {0x88, 0x8b}, {0x8d, 0x8d},
    {0x8f, 0x93}, {0x96, 0x9f}, {0xa0, 0xa3}, {0xa6, 0xaf}, {0xb4, 0xbf}, {0xc4, 0xc4},
    {0xc6, 0xc8}, {0xca, 0xcd}, {0xcf, 0xcf}, {0xdc, 0xdf},
});
constexpr Bits256 kEvexMap3 = bits({
    {0x00, 0x05}, {0x08, 0x0f}, {0x14, 0x1b}, {0x1d, 0x1f}, {0x21, 0x23}, {0x25, 0x27},
    {0x38, 0x3b}, {0x3e, 0x3f}, {0x42, 0x44}, {0x50, 0x51}, {0x54, 0x57}, {0x66, 0x67},
    {0x70, 0x73}, {0xc2, 0xc2}, {0xce, 0xcf},
});
constexpr Bits256 kEvexMap5 = bits({
    {0x10, 0x11}, {0x1d, 0x1d}, {0x2a, 0x2a}, {0x2c, 0x2f}, {0x51, 0x51}, {0x58, 0x5f},
    {0x6e, 0x6e}, {0x78, 0x7e},
});
constexpr Bits256 kEvexMap6 = bits({
    {0x13, 0x13}, {0x2c, 0x2d}, {0x42, 0x43}, {0x4c, 0x4f}, {0x56, 0x57}, {0x96, 0x9f},
    {0xa6, 0xaf}, {0xb6, 0xbf}, {0xd6, 0xd7},
});

// 3DNow! opcodes (the imm8 after 0F 0F ModRM).
constexpr Bits256 k3DNowOps = bits({
    {0x0c, 0x0d}, {0x1c, 0x1d}, {0x8a, 0x8a}, {0x8e, 0x8e}, {0x90, 0x90}, {0x94, 0x94},
    {0x96, 0x97}, {0x9a, 0x9a}, {0x9e, 0x9e}, {0xa0, 0xa0}, {0xa4, 0xa4}, {0xa6, 0xa7},
    {0xaa, 0xaa}, {0xae, 0xae}, {0xb0, 0xb0}, {0xb4, 0xb4}, {0xb6, 0xb7}, {0xbb, 0xbb},
    {0xbf, 0xbf},
});

// ---- decoding -----------------------------------------------------------------------------

class Reader {
 public:
  Reader(const uint8_t* code, size_t avail)
      : code_(code), limit_(avail < kMaxLen ? avail : kMaxLen) {}

  bool has(size_t n) const { return pos_ + n <= limit_; }
  uint8_t peek(size_t k = 0) const { return code_[pos_ + k]; }
  size_t pos() const { return pos_; }
  void skip(size_t n) { pos_ += n; }

 private:
  const uint8_t* code_;
  size_t limit_;
  size_t pos_ = 0;
};

// ModRM, SIB and displacement at r's position. `registers_only`: mod is ignored (mov
// CRn/DRn), no SIB or displacement follows; the ModRM is recorded with mod 3.
bool read_modrm(Reader& r, Decoded* d, bool registers_only = false) {
  if (!r.has(1)) return false;
  d->has_modrm = true;
  d->modrm = static_cast<uint8_t>(r.peek() | (registers_only ? 0xc0 : 0));
  r.skip(1);
  const uint8_t mod = d->mod(), rm = d->rm();
  if (mod == 3) return true;
  uint8_t disp = mod == 1 ? 1 : mod == 2 ? 4 : 0;
  if (rm == 4) {  // SIB
    if (!r.has(1)) return false;
    d->has_sib = true;
    d->sib = r.peek();
    r.skip(1);
    if (mod == 0 && (d->sib & 7) == 5) disp = 4;  // no base: disp32
  } else if (mod == 0 && rm == 5) {
    disp = 4;  // rip + disp32
  }
  if (disp) {
    if (!r.has(disp)) return false;
    d->disp_at = static_cast<uint8_t>(r.pos());
    d->disp_size = disp;
    r.skip(disp);
  }
  return true;
}

bool read_imm(Reader& r, Decoded* d, uint8_t size, uint8_t size2 = 0) {
  if (!r.has(size + size2)) return false;
  d->imm_at = static_cast<uint8_t>(r.pos());
  d->imm_size = size;
  d->imm2_size = size2;
  r.skip(size + size2);
  return true;
}

// What a ModRM form (or a mandatory prefix) makes of an opcode that exists.
enum class Form : uint8_t {
  kValid,
  kReserved,  // the opcode and its ModRM.reg slot exist, this variant does not (a memory
              // operand where only registers go, a prefix the opcode has no form for): the
              // length is what the slot's is, the instruction is not known
  kInvalid,   // nothing is defined in this slot: not an instruction
};

Form valid_if(bool ok) { return ok ? Form::kValid : Form::kReserved; }

// x87 (D8-DF): the /reg slots of the memory forms and the register forms (C0-FF) the SDM
// defines (tables ). The others are blank there: reserved.
constexpr uint8_t kX87Memory[8] = {0xff, 0xfd, 0xff, 0xaf, 0xff, 0xdf, 0xff, 0xff};
constexpr Bits256 kX87Registers[8] = {
    bits({{0xc0, 0xff}}),                                                          // D8
    bits({{0xc0, 0xd0}, {0xe0, 0xe1}, {0xe4, 0xe5}, {0xe8, 0xee}, {0xf0, 0xff}}),  // D9
    bits({{0xc0, 0xdf}, {0xe9, 0xe9}}),                                            // DA
    bits({{0xc0, 0xdf}, {0xe2, 0xe3}, {0xe8, 0xf7}}),                              // DB
    bits({{0xc0, 0xcf}, {0xe0, 0xff}}),                                            // DC
    bits({{0xc0, 0xc7}, {0xd0, 0xef}}),                                            // DD
    bits({{0xc0, 0xcf}, {0xd9, 0xd9}, {0xe0, 0xff}}),                              // DE
    bits({{0xe0, 0xe0}, {0xe8, 0xf7}}),                                            // DF
};

Form one_byte_form(const Decoded& d) {
  const uint8_t reg = d.reg(), mod = d.mod();
  if (d.opcode >= 0xd8 && d.opcode <= 0xdf) {
    const unsigned x = d.opcode - 0xd8u;
    return valid_if(mod == 3 ? kX87Registers[x].test(d.modrm) : (kX87Memory[x] >> reg) & 1);
  }
  switch (d.opcode) {
    case 0x8c:  // mov r/m, Sreg
      return valid_if(reg < 6 && !(d.rex & 4));
    case 0x8e:  // mov Sreg, r/m (never cs)
      return valid_if(reg < 6 && reg != 1 && !(d.rex & 4));
    case 0x8d:  // lea
      return valid_if(mod != 3);
    case 0x8f:  // pop r/m
      return reg == 0 ? Form::kValid : Form::kInvalid;
    case 0xc6: case 0xc7:  // mov r/m, imm; xabort, xbegin
      return reg == 0 || d.modrm == 0xf8 ? Form::kValid : Form::kInvalid;
    case 0xfe:  // inc dec
      return reg <= 1 ? Form::kValid : Form::kInvalid;
    case 0xff:  // inc dec call callf jmp jmpf push
      if (reg == 7) return Form::kInvalid;
      return valid_if(!((reg == 3 || reg == 5) && mod == 3));
    default:
      return Form::kValid;
  }
}

// Map 0F: the group slots (tables A-6) and the operand forms of the SSE/MMX opcodes.
Form map0f_form(const Decoded& d) {
  const uint8_t reg = d.reg(), mod = d.mod(), p = d.mandatory;
  switch (d.opcode) {
    case 0x00:  // sldt str lldt ltr verr verw
      return reg < 6 ? Form::kValid : Form::kInvalid;
    case 0x01:
      if (mod != 3) {  // sgdt sidt lgdt lidt smsw (rstorssp) lmsw invlpg
        return reg != 5 ? Form::kValid : valid_if(p == 0xf3);
      }
      switch (d.modrm) {
        case 0xc1: case 0xc2: case 0xc3: case 0xc4:             // vmcall .. vmxoff
        case 0xc5:                                              // pconfig
        case 0xc8: case 0xc9: case 0xca: case 0xcb: case 0xcf:  // monitor mwait clac stac
                                                                // encls
        case 0xd0: case 0xd1: case 0xd4: case 0xd5: case 0xd6:  // xgetbv xsetbv vmfunc xend
        case 0xd7:                                              // xtest enclu
        case 0xd8: case 0xd9: case 0xda: case 0xdb: case 0xdc:  // vmrun vmmcall vmload
        case 0xdd: case 0xde: case 0xdf:                        // vmsave stgi clgi skinit
                                                                // invlpga
        case 0xf8: case 0xf9: case 0xfa: case 0xfb: case 0xfc:  // swapgs rdtscp monitorx
        case 0xfd:                                              // mwaitx clzero rdpru
          return Form::kValid;
        case 0xe8: return valid_if(p == 0 || p == 0xf3);        // serialize; setssbsy
        case 0xea: return valid_if(p == 0xf3);                  // saveprevssp
        case 0xee: case 0xef: return valid_if(p == 0);          // rdpkru wrpkru
        default:
          return reg == 4 || reg == 6 ? Form::kValid : Form::kInvalid;  // smsw, lmsw r
      }
    case 0x0d:  // prefetch, prefetchw
      return valid_if(mod != 3);
    case 0x12: case 0x16:  // movlpd, movhpd take memory (movhlps, movlhps registers)
      return valid_if(!(p == 0x66 && mod == 3));
    case 0x13: case 0x17: case 0x2b: case 0xc3: case 0xe7: case 0xf0:
      return valid_if(mod != 3);  // movlps movhps movntps movnti movntq lddqu: memory
    case 0x50: case 0xc5: case 0xd7: case 0xf7:
      return valid_if(mod == 3);  // movmskps pextrw pmovmskb maskmovq: registers
    case 0xd6:  // movq; movq2dq movdq2q
      return valid_if(p == 0x66 || mod == 3);
    case 0x71: case 0x72:  // shifts by imm8
      return mod == 3 && (reg == 2 || reg == 4 || reg == 6) ? Form::kValid : Form::kInvalid;
    case 0x73:
      if (mod != 3 || !(reg == 2 || reg == 3 || reg == 6 || reg == 7)) return Form::kInvalid;
      return valid_if(reg == 2 || reg == 6 || p == 0x66);
    case 0x78:  // vmread; extrq xmm, imm8, imm8; insertq xmm, xmm, imm8, imm8
      if (p == 0x66) return valid_if(mod == 3 && reg == 0);
      return valid_if(p == 0 || mod == 3);
    case 0x79:  // vmwrite; extrq/insertq xmm, xmm
      return valid_if(p == 0 || mod == 3);
    case 0xae:
      if (mod != 3) {  // fxsave fxrstor ldmxcsr stmxcsr xsave xrstor xsaveopt/clwb
                       // clflush/clflushopt; ptwrite
        if (p == 0) return Form::kValid;
        return valid_if((p == 0xf3 && reg == 4) || (p == 0x66 && reg >= 6));
      }
      switch (p) {  // lfence mfence sfence; rd/wr fs/gs base, ptwrite, incssp, umonitor;
                    // tpause; umwait
        case 0: return valid_if(reg >= 5);
        case 0xf3: return valid_if(reg <= 6);
        default: return valid_if(reg == 6);
      }
    case 0xb2: case 0xb4: case 0xb5:  // lss lfs lgs
      return valid_if(mod != 3);
    case 0xa6:  // VIA PadLock: montmul xsha1 xsha256
      return d.modrm == 0xc0 || d.modrm == 0xc8 || d.modrm == 0xd0 ? Form::kReserved
                                                                    : Form::kInvalid;
    case 0xa7:  // VIA PadLock: xstore xcrypt-ecb/cbc/ctr/cfb/ofb
      return mod == 3 && (d.modrm & 7) == 0 && d.modrm <= 0xe8 ? Form::kReserved
                                                               : Form::kInvalid;
    case 0xba:  // bt bts btr btc
      return reg >= 4 ? Form::kValid : Form::kInvalid;
    case 0xc7:
      if (mod != 3) {  // cmpxchg8b/16b, xrstors xsavec xsaves, vmptrld/vmclear/vmxon,
                       // vmptrst
        if (reg == 0 || reg == 2) return Form::kInvalid;
        if (reg == 6) return valid_if(p != 0xf2);
        if (reg == 7) return valid_if(p == 0);
        return Form::kValid;
      }
      if (reg < 6) return Form::kInvalid;  // rdrand/senduipi, rdseed/rdpid
      return valid_if(p != 0xf2);
    default:
      return Form::kValid;
  }
}

// Map 0F38: the forms that need memory.
Form map0f38_form(const Decoded& d) {
  switch (d.opcode) {
    case 0x2a:                        // movntdqa
    case 0x80: case 0x81: case 0x82:  // invept invvpid invpcid
    case 0xf5: case 0xf8: case 0xf9:  // wruss movdir64b/enqcmd(s) movdiri
      return valid_if(d.mod() != 3);
    case 0xf0: case 0xf1:  // movbe needs memory; crc32 takes either
      return valid_if(d.mandatory == 0xf2 || d.mod() != 3);
    case 0xf6:  // wrss needs memory; adcx adox take either
      return valid_if(d.mandatory != 0 || d.mod() != 3);
    default:
      return Form::kValid;
  }
}

// LOCK is allowed only on these, with a memory destination (SDM vol. 2, LOCK).
bool lockable(const Decoded& d) {
  if (!d.memory()) return false;
  const uint8_t op = d.opcode, reg = d.reg();
  if (d.map == kMapOne) {
    if (op < 0x40) return (op & 7) <= 1 && op != 0x38 && op != 0x39;  // add .. xor r/m, r
    switch (op) {
      case 0x80: case 0x81: case 0x83: return reg != 7;  // not cmp
      case 0x86: case 0x87: return true;                 // xchg
      case 0xf6: case 0xf7: return reg == 2 || reg == 3; // not neg
      case 0xfe: case 0xff: return reg <= 1;             // inc dec
      default: return false;
    }
  }
  if (d.map != kMap0F) return false;
  switch (op) {
    case 0xab: case 0xb3: case 0xbb: return true;  // bts btr btc
    case 0xba: return reg >= 5;
    case 0xb0: case 0xb1: case 0xc0: case 0xc1: return true;  // cmpxchg xadd
    case 0xc7: return reg == 1;                               // cmpxchg8b/16b
    default: return false;
  }
}

// Applies a form verdict: 0 or -EILSEQ, and `known` cleared for a reserved form.
int apply(Form f, Decoded* d) {
  if (f == Form::kInvalid) return -EILSEQ;
  if (f == Form::kReserved) d->known = false;
  return 0;
}

int decode_legacy(Reader& r, Decoded* d) {
  uint8_t op = r.peek();
  r.skip(1);
  LayoutTable const* layout = &kOneByte;
  if (op == 0x0f) {
    if (!r.has(1)) return -EILSEQ;
    op = r.peek();
    r.skip(1);
    if (op == 0x38 || op == 0x3a) {
      if (!r.has(1)) return -EILSEQ;
      d->map = op == 0x38 ? kMap0F38 : kMap0F3A;
      d->opcode_at = static_cast<uint8_t>(r.pos());
      d->opcode = r.peek();
      r.skip(1);
      const uint8_t mask = (op == 0x38 ? kMap0F38Mask : kMap0F3AMask)[d->opcode];
      if (mask == 0) return -EILSEQ;
      if (!(mask & mask_bit(d->mandatory))) d->known = false;
      if (!read_modrm(r, d)) return -EILSEQ;
      if (d->map == kMap0F3A && !read_imm(r, d, 1)) return -EILSEQ;
      if (d->prefixes & kPrefixLock) d->known = false;  // #UD
      return d->map == kMap0F38 ? apply(map0f38_form(*d), d) : 0;
    }
    d->map = kMap0F;
    layout = &kMap0FLayout;
    if (!(kMap0FMask[op] & mask_bit(d->mandatory))) d->known = false;
  }
  d->opcode_at = static_cast<uint8_t>(r.pos() - 1);
  d->opcode = op;

  // 66 makes the operand 16 bits, unless REX.W makes it 64.
  const uint8_t iz = (d->prefixes & kPrefixOpSize) && !d->rex_w() ? 2 : 4;
  bool ok = true;
  switch ((*layout)[op]) {
    case kNone: break;
    case kModrm: ok = read_modrm(r, d); break;
    case kIb: ok = read_imm(r, d, 1); break;
    case kIw: ok = read_imm(r, d, 2); break;
    case kIz: ok = read_imm(r, d, iz); break;
    case kIv: ok = read_imm(r, d, d->rex_w() ? 8 : iz); break;
    case kMoffs: ok = read_imm(r, d, (d->prefixes & kPrefixAddrSize) ? 4 : 8); break;
    case kEnter: ok = read_imm(r, d, 2, 1); break;
    case kModrmIb: ok = read_modrm(r, d) && read_imm(r, d, 1); break;
    case kModrmIz: ok = read_modrm(r, d) && read_imm(r, d, iz); break;
    case kGroup3:
      ok = read_modrm(r, d);
      if (ok && d->reg() <= 1) ok = read_imm(r, d, op == 0xf6 ? 1 : iz);
      break;
    case kControl: ok = read_modrm(r, d, true); break;
    case k3DNow:
      d->map = kMap3DNow;
      ok = read_modrm(r, d) && r.has(1);
      if (ok) {
        d->opcode_at = static_cast<uint8_t>(r.pos());
        d->opcode = r.peek();
        r.skip(1);
        d->known = false;  // gone from current processors
        ok = k3DNowOps.test(d->opcode);
      }
      return ok ? 0 : -EILSEQ;
    case kExtrq:
      // The imm8 pair belongs to the register forms of extrq (66; only /0 is defined)
      // and insertq (F2); a memory form is laid out like vmread.
      ok = read_modrm(r, d);
      if (ok && d->mod() == 3 && (d->mandatory == 0x66 || d->mandatory == 0xf2)) {
        ok = read_imm(r, d, 1, 1);
      }
      break;
    default:
      return -EILSEQ;  // kInvalid; kEscape and kPrefix never get here
  }
  if (!ok) return -EILSEQ;
  if ((d->prefixes & kPrefixLock) && !lockable(*d)) d->known = false;  // #UD
  return apply(d->map == kMapOne ? one_byte_form(*d) : map0f_form(*d), d);
}

// C4 C5 62 8F: VEX, EVEX and XOP. The payload's R X B W bits become `rex`.
int decode_vex(Reader& r, Decoded* d) {
  // 66, F2, F3, LOCK or REX before any of them raise #UD.
  if ((d->prefixes & (kPrefixLock | kPrefixRep | kPrefixRepne | kPrefixOpSize)) || d->rex ||
      d->rex_ignored) {
    return -EILSEQ;
  }
  const uint8_t lead = r.peek();
  uint8_t p1, p2, map, pp;
  size_t payload;
  if (lead == 0xc5) {
    if (!r.has(3)) return -EILSEQ;
    p1 = r.peek(1);
    d->encoding = Encoding::kVex;
    map = 1;
    d->rex = static_cast<uint8_t>(0x40 | (p1 & 0x80 ? 0 : 4));
    d->vex_vvvv = static_cast<uint8_t>((~p1 >> 3) & 15);
    d->vex_l = (p1 >> 2) & 1;
    pp = p1 & 3;
    payload = 2;
  } else {
    const size_t n = lead == 0x62 ? 4 : 3;
    if (!r.has(n + 1)) return -EILSEQ;
    p1 = r.peek(1);
    p2 = r.peek(2);
    d->rex = static_cast<uint8_t>(0x40 | (p2 & 0x80 ? 8 : 0) | (p1 & 0x80 ? 0 : 4) |
                                  (p1 & 0x40 ? 0 : 2) | (p1 & 0x20 ? 0 : 1));
    d->vex_vvvv = static_cast<uint8_t>((~p2 >> 3) & 15);
    pp = p2 & 3;
    payload = n;
    if (lead == 0x62) {
      const uint8_t p3 = r.peek(3);
      d->encoding = Encoding::kEvex;
      map = p1 & 7;
      // P0 bit 3 is 0 and P1 bit 2 is 1; maps 1, 2, 3, 5, 6 exist.
      if ((p1 & 0x08) || !(p2 & 0x04)) return -EILSEQ;
      if (map == 0 || map == 4 || map == 7) return -EILSEQ;
      d->vex_l = (p3 >> 5) & 3;
    } else {
      d->encoding = lead == 0xc4 ? Encoding::kVex : Encoding::kXop;
      map = p1 & 0x1f;
      if (lead == 0xc4 ? (map < 1 || map > 3) : (map < 8 || map > 10)) return -EILSEQ;
      d->vex_l = (p2 >> 2) & 1;
    }
  }
  static constexpr uint8_t kPP[4] = {0, 0x66, 0xf3, 0xf2};
  d->mandatory = kPP[pp];
  d->map = static_cast<Map>(map);
  r.skip(payload);
  d->opcode_at = static_cast<uint8_t>(r.pos());
  d->opcode = r.peek();
  r.skip(1);
  const uint8_t op = d->opcode;

  uint8_t imm = 0;
  switch (d->encoding) {
    case Encoding::kVex:
      if (map == 1 && op == 0x77) {  // vzeroupper, vzeroall
        d->known = true;
        return 0;
      }
      d->known = (map == 1 ? kVexMap1 : map == 2 ? kVexMap2 : kVexMap3).test(op);
      break;
    case Encoding::kEvex:
      switch (map) {
        case 1: d->known = kEvexMap1.test(op); break;
        case 2: d->known = kEvexMap2.test(op); break;
        case 3: d->known = kEvexMap3.test(op); break;
        case 5: d->known = kEvexMap5.test(op); break;
        default: d->known = kEvexMap6.test(op); break;
      }
      break;
    default:
      d->known = false;  // XOP: gone from current processors
      if (map == 8) imm = 1;
      if (map == 10) imm = 4;
      break;
  }
  if (d->encoding != Encoding::kXop) {
    if (map == 3) imm = 1;
    if (map == 1 && ((op >= 0x70 && op <= 0x73) || op == 0xc2 || (op >= 0xc4 && op <= 0xc6)))
      imm = 1;
  }
  if (!read_modrm(r, d)) return -EILSEQ;
  if (imm && !read_imm(r, d, imm)) return -EILSEQ;
  return 0;
}

}  // namespace

int decode(const uint8_t* code, size_t avail, Decoded* out) {
  *out = Decoded{};
  Decoded& d = *out;
  Reader r(code, avail);
  uint8_t last_rep = 0;
  for (;;) {
    if (!r.has(1)) return -EILSEQ;
    const uint8_t b = r.peek();
    switch (b) {
      case 0xf0: d.prefixes |= kPrefixLock; break;
      case 0xf2: d.prefixes |= kPrefixRepne; last_rep = b; break;
      case 0xf3: d.prefixes |= kPrefixRep; last_rep = b; break;
      case 0x66: d.prefixes |= kPrefixOpSize; break;
      case 0x67: d.prefixes |= kPrefixAddrSize; break;
      case 0x26: case 0x2e: case 0x36: case 0x3e: case 0x64: case 0x65:
        d.prefixes |= kPrefixSegment;
        d.segment = b;
        break;
      default:
        if ((b & 0xf0) == 0x40) {
          if (d.rex) d.rex_ignored = true;  // only the REX right before the opcode counts
          d.rex = b;
          r.skip(1);
          continue;
        }
        goto opcode;
    }
    if (d.rex) {  // a REX followed by a legacy prefix is ignored
      d.rex_ignored = true;
      d.rex = 0;
    }
    r.skip(1);
  }
opcode:
  d.prefix_end = static_cast<uint8_t>(r.pos());
  d.mandatory = last_rep ? last_rep : (d.prefixes & kPrefixOpSize) ? 0x66 : 0;
  const uint8_t op = r.peek();
  int rc;
  if (op == 0xc4 || op == 0xc5 || op == 0x62 ||
      (op == 0x8f && r.has(2) && (r.peek(1) & 0x1f) >= 8)) {
    rc = decode_vex(r, &d);
  } else {
    rc = decode_legacy(r, &d);
  }
  if (rc != 0) return rc;
  d.len = static_cast<uint8_t>(r.pos());
  return 0;
}

}  // namespace probefs::arch::x86_64::decoder
