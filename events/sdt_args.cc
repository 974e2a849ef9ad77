#include "events/sdt_args.h"

#include <string>

#include "events/kstrto.h"
#include "events/parse.h"

namespace probefs::events {
namespace {

// The register the fetch arguments name for an x86-64 register of any width ("eax" is
// %ax, "r8d" is %r8), as its PtRegs offset; -1 for one they do not have.
int whole_register(std::string_view r) {
  static constexpr const char* kLegacy[][5] = {
      // 64, 32, 16, 8 low: the pt_regs name last
      {"rax", "eax", "ax", "al", "ax"},  {"rbx", "ebx", "bx", "bl", "bx"},
      {"rcx", "ecx", "cx", "cl", "cx"},  {"rdx", "edx", "dx", "dl", "dx"},
      {"rsi", "esi", "si", "sil", "si"}, {"rdi", "edi", "di", "dil", "di"},
      {"rbp", "ebp", "bp", "bpl", "bp"}, {"rsp", "esp", "sp", "spl", "sp"},
  };
  for (const auto& row : kLegacy)
    for (int i = 0; i < 4; ++i)
      if (r == row[i]) return register_offset(row[4]);
  // r8..r15, with the b/w/d suffixes of their low parts.
  if (r.size() < 2 || r[0] != 'r') return -1;
  std::string_view number = r.substr(1);
  if (!number.empty() && (number.back() == 'd' || number.back() == 'w' || number.back() == 'b'))
    number.remove_suffix(1);
  if (number != "8" && number != "9" && number != "10" && number != "11" && number != "12" &&
      number != "13" && number != "14" && number != "15")
    return -1;
  return register_offset(std::string("r") + std::string(number));
}

bool signed_number(std::string_view s, int64_t* out) {
  if (s.empty()) return false;
  const bool negative = s[0] == '-';
  if (s[0] == '-' || s[0] == '+') s.remove_prefix(1);
  uint64_t v = 0;
  if (s.empty() || !kstrtoull(s, 0, &v) || v > (uint64_t{1} << 63)) return false;
  if (!negative && v == (uint64_t{1} << 63)) return false;
  *out = negative ? static_cast<int64_t>(0 - v) : static_cast<int64_t>(v);
  return true;
}

bool parse_operand(std::string_view spec, SdtOperand* op) {
  const size_t at = spec.find('@');
  if (at == std::string_view::npos) return false;
  std::string_view size = spec.substr(0, at);
  std::string_view operand = spec.substr(at + 1);
  op->is_signed = !size.empty() && size[0] == '-';
  if (op->is_signed) size.remove_prefix(1);
  if (size != "1" && size != "2" && size != "4" && size != "8") return false;
  op->size = static_cast<uint8_t>(size[0] - '0');
  if (operand.size() > 1 && operand[0] == '%') {
    op->kind = SdtOperand::Kind::kRegister;
    op->reg_offset = whole_register(operand.substr(1));
    return op->reg_offset >= 0;
  }
  if (operand.size() > 1 && operand[0] == '$') {
    int64_t v = 0;
    if (!signed_number(operand.substr(1), &v)) return false;
    op->kind = SdtOperand::Kind::kImmediate;
    op->imm = static_cast<uint64_t>(v);
    return true;
  }
  // DISP(%reg): a base register and a numeric displacement, nothing else.
  const size_t open = operand.find('(');
  if (open == std::string_view::npos || operand.size() < open + 4 || operand.back() != ')' ||
      operand[open + 1] != '%')
    return false;
  const std::string_view disp = operand.substr(0, open);
  op->disp = 0;
  if (!disp.empty() && !signed_number(disp, &op->disp)) return false;
  op->kind = SdtOperand::Kind::kMemory;
  op->reg_offset = whole_register(operand.substr(open + 2, operand.size() - open - 3));
  return op->reg_offset >= 0;
}

}  // namespace

bool parse_sdt_args(std::string_view spec, std::vector<SdtOperand>* out, size_t* bad) {
  out->clear();
  size_t i = 0;
  while (i < spec.size()) {
    while (i < spec.size() && spec[i] == ' ') ++i;
    const size_t start = i;
    while (i < spec.size() && spec[i] != ' ') ++i;
    if (i == start) break;
    SdtOperand op;
    if (!parse_operand(spec.substr(start, i - start), &op)) {
      *bad = out->size();
      return false;
    }
    out->push_back(op);
  }
  return true;
}

bool bind_sdt_args(ProbeDefinition* def, const std::vector<SdtOperand>& operands,
                   size_t* bad_arg, ErrorCode* why) {
  for (size_t a = 0; a < def->args.size(); ++a) {
    std::vector<FetchInsn>& code = def->args[a].code;
    if (code.empty() || code[0].op != FetchOp::kArg) continue;  // $argN is always a load
    const uint32_t n = code[0].param;
    if (n >= operands.size()) {
      *bad_arg = a;
      *why = ErrorCode::kBadArgNum;
      return false;
    }
    const SdtOperand& op = operands[n];
    FetchInsn load;
    switch (op.kind) {
      case SdtOperand::Kind::kImmediate:
        load.op = FetchOp::kImm;
        load.imm = op.imm;
        code[0] = load;
        break;
      case SdtOperand::Kind::kRegister:
        load.op = FetchOp::kReg;
        load.param = static_cast<uint32_t>(op.reg_offset);
        code[0] = load;
        break;
      case SdtOperand::Kind::kMemory:
        load.op = FetchOp::kReg;
        load.param = static_cast<uint32_t>(op.reg_offset);
        code[0] = load;
        if (code.size() > 1 && code[1].op == FetchOp::kStRaw) {
          // The value itself: read from memory as the parser writes DISP(%reg).
          code[1].op = FetchOp::kStMem;
          code[1].offset = op.disp;
        } else {
          // A dereference of it: one more step through memory.
          FetchInsn deref;
          deref.op = FetchOp::kDeref;
          deref.offset = op.disp;
          if (code.size() >= static_cast<size_t>(kFetchInsnMax)) {
            *bad_arg = a;
            *why = ErrorCode::kTooManyOps;
            return false;
          }
          code.insert(code.begin() + 1, deref);
        }
        break;
    }
  }
  return true;
}

}  // namespace probefs::events
