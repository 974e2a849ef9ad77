// The comparison of our decoder with Capstone 4 (decoder_diff.h), and why each category of
// difference is legitimate:
//
//   kCapstoneFails     Capstone 4 knows neither AVX-512 in full, nor the instructions added
//                      since (AMX, AVX-VNNI, movdiri, enqcmd, serialize, CET, PadLock, AMD
//                      prefetch aliases...), nor reserved encodings whose length the rules
//                      still fix (x87 aliases, hint nops with a register operand). Ours
//                      must give a sane length, and refuses to probe what it does not know.
//   kUdModrm           ud0 (0F FF) and ud1 (0F B9) take a ModRM (Intel SDM, UD); Capstone
//                      4 reads them as two bytes. Both are traps either way.
//   kOpsizeTransfer    66 before a near jmp/call/jcc/loop/ret/jmp r/m: Intel ignores it in
//                      64-bit mode, AMD truncates rip to 16 bits and reads a rel16. We
//                      refuse these forms, and read rel16 consistently; Capstone 4 reads
//                      rel32 when another prefix sits between the 66 and the opcode.
//   kRetImmRexW        ret imm16 is imm16 whatever the REX.W; Capstone 4 reads 4 bytes
//                      under 66/67 with REX.W.
//   kOpsizeBeforeRep   66 F2/F3 opcode: the 66 still sizes the operand; Capstone 4 forgets
//                      it for some opcodes (push imm: 4 bytes instead of 2).
//   kIgnoredRex        a REX followed by a legacy prefix (or another REX) is ignored by the
//                      CPU; Capstone decodes without it, we refuse to probe it at all: no
//                      compiler emits it, and our opcode_offset would name the opcode where
//                      the old code named the prefix.
//   kUnknownToUs       the length follows from the encoding rules but the instruction is
//                      reserved or unassigned (a prefix an SSE opcode has no form for,
//                      LOCK on an instruction that cannot take it, a memory operand where
//                      only a register goes, 3DNow!, XOP, VIA PadLock): refused.
//   kPrefixBeforeVex   66, F2, F3, LOCK or REX before C4/C5/62 raise #UD; Capstone 4
//                      decodes some of them.
//   kNotAnInstruction  Capstone 4 takes 0F 0F ModRM 0E for femms; 0E is no 3DNow! opcode.
//   kCapstoneEvexBug   EVEX with embedded rounding (b set, register operands) has no more
//                      bytes; Capstone 4 reads one. Under 67, mod=00 rm=101 is [eip +
//                      disp32]; Capstone 4 reads a base register and no displacement.
//   kCapstoneAddr32Rel a near call/jmp/jcc takes rel32 whatever 67 says; with REX.W too,
//                      Capstone 4 reads rel16.
//   kExtrqPrefixOrder  66/F2 select extrq/insertq (with two imm8) over vmread/vmwrite
//                      wherever they stand among the prefixes; Capstone 4 only when they
//                      come last. Both are refused to probe either way.
//   kRefusedEitherWay  both refuse to probe it (kTrap, kPrivileged, kUnsupported are
//                      handled alike everywhere: relocate and the probe site refuse all
//                      three) but under different names.
//   kEipRelative       [eip + disp32] (67 with ModRM rip form): Capstone 4 reports base eip
//                      and the old classification took it for kPlain, though its address
//                      depends on where it runs. We refuse it.
//   kOursStricter      instructions we refuse by opcode that Capstone 4 leaves out of its
//                      privilege group: in/out/ins/outs (they need I/O permission), clts,
//                      rdmsr, getsec, monitor/mwait (CPL0 unless the OS allows them),
//                      femms (3DNow!). Refusing them costs nothing: no compiled function
//                      holds them where a probe goes.
//   kHintNop           Capstone 4 names the reserved-nop opcodes 0F 18 /4-7 and 0F 19-1E
//                      "nop"; newer instructions live there (MPX, cldemote, CET, prefetchi),
//                      so we do not skip them as nops (is_nop false: they are run). It also
//                      reads F3 90 as nop, not pause, when another prefix comes between.
//   kShapeCapstoneBug  Capstone 4 says test al/eax, imm writes rax (it writes only flags),
//                      that push/pop fs/gs write no register (they move rsp), and that
//                      movsxd without REX.W writes 64 bits (it writes 32, as mov does),
//                      that push/pop r/m under 66 and REX.W move 2 bytes (8: REX.W wins); it
//                      names mov al/ax/eax/rax, moffs "mov" or "movabs" under 67 depending
//                      on the order of the prefixes. Lea reads no memory: the size Capstone
//                      gives its operand under 66 is not compared.
#include "tests/arch/x86_64/isa/decoder_diff.h"

#include <cstdio>
#include <cstring>

#include "arch/x86_64/isa/decoder.h"
#include "arch/x86_64/isa/insn.h"
#include "arch/x86_64/isa/shape.h"
#include "tests/arch/x86_64/isa/capstone_oracle.h"

namespace probefs::arch::x86_64::difftest {
namespace {

bool refused(InsnKind k) {
  return k == InsnKind::kTrap || k == InsnKind::kPrivileged || k == InsnKind::kUnsupported;
}

const char* kind_name(InsnKind k) {
  switch (k) {
    case InsnKind::kPlain: return "plain";
    case InsnKind::kRipRelative: return "rip";
    case InsnKind::kJmpRel: return "jmp";
    case InsnKind::kJccRel: return "jcc";
    case InsnKind::kCallRel: return "call";
    case InsnKind::kLoopRel: return "loop";
    case InsnKind::kRet: return "ret";
    case InsnKind::kJmpIndirect: return "jmp*";
    case InsnKind::kCallIndirect: return "call*";
    case InsnKind::kSyscall: return "syscall";
    case InsnKind::kTrap: return "trap";
    case InsnKind::kPrivileged: return "priv";
    case InsnKind::kUnsupported: return "unsupp";
  }
  return "?";
}

// 66 before a near transfer (decoded by us).
bool opsize_transfer(const decoder::Decoded& d) {
  if (!(d.prefixes & decoder::kPrefixOpSize) || d.encoding != decoder::Encoding::kLegacy) {
    return false;
  }
  const uint8_t op = d.opcode;
  if (d.map == decoder::kMapOne) {
    return op == 0xe8 || op == 0xe9 || op == 0xeb || (op >= 0x70 && op <= 0x7f) ||
           (op >= 0xe0 && op <= 0xe3) || op == 0xc2 || op == 0xc3 ||
           (op == 0xff && (d.reg() == 2 || d.reg() == 4)) || (op == 0xc7 && d.reg() == 7);
  }
  return d.map == decoder::kMap0F && op >= 0x80 && op <= 0x8f;
}

// A 66 that comes before an F2 or F3 in the prefixes.
bool opsize_before_rep(const uint8_t* code, size_t n) {
  bool opsize = false;
  for (size_t i = 0; i < n; ++i) {
    if (code[i] == 0x66) opsize = true;
    else if ((code[i] == 0xf2 || code[i] == 0xf3) && opsize) return true;
  }
  return false;
}

// 66/F2/F3/F0/REX among the prefixes, then C4, C5, 62 or 8F (XOP).
bool prefix_before_vex(const uint8_t* code, size_t avail) {
  bool bad = false;
  for (size_t i = 0; i < avail && i < kMaxInsnLen; ++i) {
    const uint8_t b = code[i];
    switch (b) {
      case 0x66: case 0xf2: case 0xf3: case 0xf0:
        bad = true;
        continue;
      case 0x26: case 0x2e: case 0x36: case 0x3e: case 0x64: case 0x65: case 0x67:
        continue;
      default:
        if ((b & 0xf0) == 0x40) {
          bad = true;
          continue;
        }
        return bad && (b == 0xc4 || b == 0xc5 || b == 0x62 || b == 0x8f);
    }
  }
  return false;
}

void hex(const uint8_t* code, size_t n, char* out, size_t size) {
  size_t used = 0;
  for (size_t i = 0; i < n && used + 3 < size; ++i) {
    used += static_cast<size_t>(std::snprintf(out + used, size - used, "%02x", code[i]));
  }
}

Verdict verdict(Category c, const uint8_t* code, size_t len, const char* what = nullptr) {
  Verdict v;
  v.category = c;
  char bytes[40] = {};
  hex(code, len, bytes, sizeof bytes);
  std::snprintf(v.detail, sizeof v.detail, "%s%s%s", bytes, what ? ": " : "", what ? what : "");
  return v;
}

bool same_operand(const Operand& a, const Operand& b, uint8_t imm_size, char* why, size_t n) {
  if (a.type != b.type) {
    std::snprintf(why, n, "operand type %d vs %d", a.type, b.type);
    return false;
  }
  switch (a.type) {
    case Operand::kReg:
      if (a.reg != b.reg || a.size != b.size) {
        std::snprintf(why, n, "register %d/%u vs %d/%u", a.reg, a.size, b.reg, b.size);
        return false;
      }
      return true;
    case Operand::kImm: {
      // Only the value within the operation's size matters (the matcher masks it so);
      // Capstone's own immediate sizes are not consistent and nobody reads them.
      const uint64_t mask = imm_size >= 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * imm_size)) - 1;
      if ((static_cast<uint64_t>(a.imm ^ b.imm) & mask) != 0) {
        std::snprintf(why, n, "immediate %lld vs %lld", static_cast<long long>(a.imm),
                      static_cast<long long>(b.imm));
        return false;
      }
      return true;
    }
    case Operand::kMem:
      if (a.size != b.size || a.simple != b.simple || a.rip != b.rip || a.base != b.base ||
          a.index != b.index || a.scale != b.scale || a.disp != b.disp) {
        std::snprintf(why, n,
                      "memory size %u/%u simple %d/%d rip %d/%d base %d/%d index %d/%d "
                      "scale %d/%d disp %lld/%lld",
                      a.size, b.size, a.simple, b.simple, a.rip, b.rip, a.base, b.base,
                      a.index, b.index, a.scale, b.scale, static_cast<long long>(a.disp),
                      static_cast<long long>(b.disp));
        return false;
      }
      return true;
    default:
      return true;
  }
}

// Shapes of two decodings with equal lengths: kSame, kShapeCapstoneBug, kOpsizeBeforeRep
// or kUnexplained.
Category compare_shapes(const Insn& ours, const Insn& theirs, const decoder::Decoded& d,
                        char* why, size_t n) {
  const bool opsize_rep = opsize_before_rep(ours.bytes, d.prefix_end);
  Shape a, b;
  unsigned cs_id = 0;
  if (!shape_of(ours, &a)) {
    std::snprintf(why, n, "our shape_of fails");
    return Category::kUnexplained;
  }
  if (!oracle::shape_of(theirs, &b, &cs_id)) return Category::kSame;  // nothing to hold to
  const bool moffs = d.map == decoder::kMapOne && d.opcode >= 0xa0 && d.opcode <= 0xa3;
  if (a.id != b.id) {
    // NOP of the reserved-nop opcodes (0F 18-1E), pause: unknown to us, writes everything.
    if (a.id == InsnId::kUnknown && b.id == InsnId::kNop) return Category::kHintNop;
    if (moffs && (a.id == InsnId::kMov || a.id == InsnId::kMovabs) &&
        (b.id == InsnId::kMov || b.id == InsnId::kMovabs)) {
      return Category::kShapeCapstoneBug;
    }
    std::snprintf(why, n, "identity %d vs %d (capstone id %u)", static_cast<int>(a.id),
                  static_cast<int>(b.id), cs_id);
    return Category::kUnexplained;
  }
  Category c = Category::kSame;
  const bool seg_push_pop = d.map == decoder::kMap0F &&
                            (d.opcode == 0xa0 || d.opcode == 0xa1 || d.opcode == 0xa8 ||
                             d.opcode == 0xa9);
  const bool test_acc = d.map == decoder::kMapOne && (d.opcode == 0xa8 || d.opcode == 0xa9);
  const bool movsxd32 = a.id == InsnId::kMovsxd && !d.rex_w();
  // push/pop r/m under REX.W move 8 bytes whatever 66 or 67 say; Capstone 4 says 2.
  const bool pop_rexw = (a.id == InsnId::kPop || a.id == InsnId::kPush) &&
                        d.map == decoder::kMapOne && (d.opcode == 0x8f || d.opcode == 0xff) &&
                        d.rex_w();
  if (a.id == InsnId::kUnknown) {
    if (a.writes != 0xffff || b.writes != 0xffff) {
      std::snprintf(why, n, "unknown identity writes %04x vs %04x", a.writes, b.writes);
      return Category::kUnexplained;
    }
    return Category::kSame;
  }
  if (a.writes != b.writes) {
    if (!(test_acc || seg_push_pop || movsxd32)) {
      std::snprintf(why, n, "writes %04x vs %04x", a.writes, b.writes);
      return Category::kUnexplained;
    }
    c = Category::kShapeCapstoneBug;
  }
  if (a.count != b.count) {
    std::snprintf(why, n, "operand count %u vs %u", a.count, b.count);
    return Category::kUnexplained;
  }
  // An immediate matters within the destination's size (push: its own encoded size).
  const uint8_t imm_size = a.count >= 1 && a.ops[0].type != Operand::kImm ? a.ops[0].size
                                                                          : d.imm_size;
  if (a.id == InsnId::kNop) return c;  // reads and writes nothing: operands unused
  for (uint8_t i = 0; i < a.count && i < 2; ++i) {
    Operand mine = a.ops[i];
    if (a.id == InsnId::kLea && mine.type == Operand::kMem) mine.size = b.ops[i].size;
    if (!same_operand(mine, b.ops[i], imm_size, why, n)) {
      if (movsxd32 || pop_rexw) {
        c = Category::kShapeCapstoneBug;
        continue;
      }
      if (opsize_rep && mine.type == b.ops[i].type) {
        c = Category::kOpsizeBeforeRep;  // sizes read without the 66
        continue;
      }
      return Category::kUnexplained;
    }
  }
  return c;
}

}  // namespace

const char* category_name(Category c) {
  switch (c) {
    case Category::kSame: return "same";
    case Category::kCapstoneFails: return "capstone-fails";
    case Category::kUdModrm: return "ud0/ud1-modrm";
    case Category::kOpsizeTransfer: return "66-on-transfer";
    case Category::kRetImmRexW: return "ret-imm-rex.w";
    case Category::kOpsizeBeforeRep: return "66-before-rep";
    case Category::kIgnoredRex: return "ignored-rex";
    case Category::kUnknownToUs: return "unknown-to-us";
    case Category::kPrefixBeforeVex: return "prefix-before-vex";
    case Category::kNotAnInstruction: return "not-an-instruction";
    case Category::kCapstoneEvexBug: return "capstone-evex-bug";
    case Category::kCapstoneAddr32Rel: return "capstone-67-rel16";
    case Category::kExtrqPrefixOrder: return "extrq-prefix-order";
    case Category::kRefusedEitherWay: return "refused-either-way";
    case Category::kEipRelative: return "eip-relative";
    case Category::kOursStricter: return "ours-stricter";
    case Category::kHintNop: return "hint-nop";
    case Category::kShapeCapstoneBug: return "capstone-shape-bug";
    case Category::kUnexplained: return "UNEXPLAINED";
  }
  return "?";
}

Verdict compare(const uint8_t* code, size_t avail, uintptr_t pc) {
  Insn ours, theirs;
  const int rc_ours = decode(code, avail, pc, &ours);
  const int rc_theirs = oracle::decode(code, avail, pc, &theirs);
  decoder::Decoded d;
  const int rc_d = decoder::decode(code, avail, &d);
  const size_t shown = avail < kMaxInsnLen ? avail : kMaxInsnLen;
  char why[160] = {};
  auto done = [&](Category c, size_t len, const char* what = nullptr) {
    Verdict r = verdict(c, code, len, what);
    r.our_len = rc_ours == 0 ? ours.len : 0;
    r.oracle_len = rc_theirs == 0 ? theirs.len : 0;
    return r;
  };
  if ((rc_d == 0) != (rc_ours == 0)) return done(Category::kUnexplained, shown, "decoders disagree");
  if (rc_ours != 0 && rc_theirs != 0) return done(Category::kSame, 0);
  if (rc_theirs != 0) {
    // Ours alone decodes: the length must be sane, and what we do not know is refused.
    if (ours.len < 1 || ours.len > kMaxInsnLen || ours.len > avail || ours.addr != pc ||
        std::memcmp(ours.bytes, code, ours.len) != 0 || ours.opcode_offset >= ours.len) {
      return done(Category::kUnexplained, shown, "insane length or bytes");
    }
    if ((!d.known || d.rex_ignored) && ours.kind != InsnKind::kUnsupported) {
      return done(Category::kUnexplained, ours.len, "not known, yet probeable");
    }
    return done(Category::kCapstoneFails, ours.len);
  }
  if (rc_ours != 0) {
    if (prefix_before_vex(code, avail)) return done(Category::kPrefixBeforeVex, theirs.len);
    if (theirs.len >= 2 && theirs.bytes[theirs.len - 2] == 0x0f &&
        (theirs.bytes[theirs.len - 1] == 0xb9 || theirs.bytes[theirs.len - 1] == 0xff)) {
      return done(Category::kUdModrm, theirs.len);  // the ModRM is past the bytes given
    }
    if (theirs.len >= 4 && theirs.bytes[theirs.len - 1] == 0x0e) {
      for (unsigned i = 0; i + 1 < theirs.len; ++i) {
        if (theirs.bytes[i] == 0x0f && theirs.bytes[i + 1] == 0x0f) {
          return done(Category::kNotAnInstruction, theirs.len);
        }
      }
    }
    return done(Category::kUnexplained, theirs.len, "we refuse what Capstone decodes");
  }

  // Both decode.
  if (d.map == decoder::kMap0F && (d.opcode == 0x78 || d.opcode == 0x79) &&
      (d.mandatory == 0x66 || d.mandatory == 0xf2) && refused(ours.kind) &&
      refused(theirs.kind) && (ours.len != theirs.len || ours.kind != theirs.kind)) {
    return done(Category::kExtrqPrefixOrder, ours.len);
  }
  if (ours.len != theirs.len) {
    if (d.map == decoder::kMap0F && (d.opcode == 0xff || d.opcode == 0xb9) &&
        refused(ours.kind) && refused(theirs.kind)) {
      return done(Category::kUdModrm, ours.len);
    }
    if (opsize_transfer(d) && ours.kind == InsnKind::kUnsupported) {
      return done(Category::kOpsizeTransfer, ours.len);
    }
    if (d.map == decoder::kMapOne && d.opcode == 0xc2 && d.rex_w() && theirs.len == ours.len + 2) {
      return done(Category::kRetImmRexW, ours.len);
    }
    if (opsize_before_rep(code, d.prefix_end)) return done(Category::kOpsizeBeforeRep, ours.len);
    if (d.encoding == decoder::Encoding::kEvex) {
      const bool rounding = d.mod() == 3 && (code[d.opcode_at - 1] & 0x10);
      const bool eip = d.rip_relative() && (d.prefixes & decoder::kPrefixAddrSize);
      if ((rounding && theirs.len == ours.len + 1) || (eip && theirs.len + 4 == ours.len)) {
        return done(Category::kCapstoneEvexBug, ours.len);
      }
    }
    if ((d.prefixes & decoder::kPrefixAddrSize) && d.rex_w() && d.imm_size == 4 &&
        theirs.len + 2 == ours.len &&
        ((d.map == decoder::kMapOne && (d.opcode == 0xe8 || d.opcode == 0xe9)) ||
         (d.map == decoder::kMap0F && d.opcode >= 0x80 && d.opcode <= 0x8f))) {
      return done(Category::kCapstoneAddr32Rel, ours.len);
    }
    std::snprintf(why, sizeof why, "length %u vs %u", ours.len, theirs.len);
    return done(Category::kUnexplained, shown, why);
  }
  if (d.rex_ignored) {
    return done(ours.kind == InsnKind::kUnsupported ? Category::kIgnoredRex : Category::kUnexplained,
                ours.len, "ignored REX, yet probeable");
  }
  if (!d.known) {
    return done(ours.kind == InsnKind::kUnsupported ? Category::kUnknownToUs
                                                    : Category::kUnexplained,
                ours.len, "not known, yet probeable");
  }
  Category c = Category::kSame;
  if (ours.kind != theirs.kind) {
    if (refused(ours.kind) && refused(theirs.kind)) return done(Category::kRefusedEitherWay, ours.len);
    if (opsize_transfer(d) && ours.kind == InsnKind::kUnsupported) {
      return done(Category::kOpsizeTransfer, ours.len);
    }
    if (d.rip_relative() && (d.prefixes & decoder::kPrefixAddrSize) &&
        ours.kind == InsnKind::kUnsupported) {
      return done(Category::kEipRelative, ours.len);
    }
    if (refused(ours.kind) && (theirs.kind == InsnKind::kPlain ||
                               theirs.kind == InsnKind::kRipRelative)) {
      return done(Category::kOursStricter, ours.len);
    }
    std::snprintf(why, sizeof why, "kind %s vs %s", kind_name(ours.kind), kind_name(theirs.kind));
    return done(Category::kUnexplained, ours.len, why);
  }
  if (refused(ours.kind)) return done(Category::kSame, ours.len);  // nothing else is read
  if (ours.cond != theirs.cond || ours.loop != theirs.loop ||
      ours.disp_offset != theirs.disp_offset || ours.opcode_offset != theirs.opcode_offset ||
      ours.ret_imm != theirs.ret_imm || ours.target != theirs.target ||
      ours.uses_rsp != theirs.uses_rsp || ours.uses_rip != theirs.uses_rip) {
    std::snprintf(why, sizeof why,
                  "cond %u/%u loop %d/%d disp_offset %u/%u opcode_offset %u/%u ret_imm %u/%u "
                  "target %lx/%lx rsp %d/%d rip %d/%d",
                  ours.cond, theirs.cond, static_cast<int>(ours.loop),
                  static_cast<int>(theirs.loop), ours.disp_offset, theirs.disp_offset,
                  ours.opcode_offset, theirs.opcode_offset, ours.ret_imm, theirs.ret_imm,
                  static_cast<unsigned long>(ours.target), static_cast<unsigned long>(theirs.target),
                  ours.uses_rsp, theirs.uses_rsp, ours.uses_rip, theirs.uses_rip);
    return done(Category::kUnexplained, ours.len, why);
  }
  if (ours.is_nop != theirs.is_nop) {
    const bool hint = d.map == decoder::kMap0F && d.opcode >= 0x18 && d.opcode <= 0x1e;
    // 90 under F3 is pause, with REX.B xchg r8: Capstone misses either behind other
    // prefixes.
    const bool pause = d.map == decoder::kMapOne && d.opcode == 0x90 &&
                       ((d.prefixes & decoder::kPrefixRep) || (d.rex & 1));
    if (ours.is_nop || !(hint || pause)) {
      std::snprintf(why, sizeof why, "is_nop %d vs %d", ours.is_nop, theirs.is_nop);
      return done(Category::kUnexplained, ours.len, why);
    }
    c = Category::kHintNop;
  }
  const Category s = compare_shapes(ours, theirs, d, why, sizeof why);
  if (s == Category::kUnexplained) return done(s, ours.len, why);
  return done(c != Category::kSame ? c : s, ours.len);
}

}  // namespace probefs::arch::x86_64::difftest
