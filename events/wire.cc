#include "events/wire.h"

#include <cstring>
#include <type_traits>

#include "arch/regs.h"

namespace probefs::events {
namespace {

static_assert(std::is_trivially_copyable_v<FetchInsn>);
static_assert(std::is_trivially_copyable_v<FilterInsn>);

constexpr uint32_t kProgramMagic = 0x31504650;  // "PFP1"
constexpr uint32_t kFilterMagic = 0x31464650;   // "PFF1"

struct Writer {
  std::vector<uint8_t> out;
  void raw(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out.insert(out.end(), b, b + n);
  }
  template <class T>
  void put(T v) {
    raw(&v, sizeof v);
  }
  void align() {
    while (out.size() % 8) out.push_back(0);
  }
};

struct Reader {
  const uint8_t* p;
  size_t n;
  size_t at = 0;
  bool ok = true;
  bool raw(void* dst, size_t len) {
    if (!ok || len > n - at) return ok = false;
    std::memcpy(dst, p + at, len);
    at += len;
    return true;
  }
  template <class T>
  T get() {
    T v{};
    raw(&v, sizeof v);
    return v;
  }
  void align() {
    size_t pad = (8 - at % 8) % 8;
    if (pad > n - at) ok = false;
    else at += pad;
  }
};

bool is_size(unsigned s) { return s == 1 || s == 2 || s == 4 || s == 8; }

}  // namespace

bool validate_program(const FetchProgram& p) {
  if (p.header_size != (p.is_return ? 24u : 16u)) return false;
  if (p.fixed_size < p.header_size || p.fixed_size > 0xffff) return false;
  if (p.nargs > static_cast<uint32_t>(kMaxTraceArgs)) return false;
  if (p.entry_args > static_cast<uint32_t>(kMaxStackParam)) return false;
  if (!p.strings.empty() && p.strings.back() != '\0') return false;
  const std::vector<FetchInsn>& in = p.insns;
  size_t pc = 0;
  uint32_t slots = 0;
  for (uint32_t a = 0; a < p.nargs; ++a) {
    if (pc >= in.size()) return false;
    const FetchInsn& load = in[pc++];
    switch (load.op) {
      case FetchOp::kReg:
        if (load.param % 8 || load.param > sizeof(PtRegs) - 8) return false;
        break;
      case FetchOp::kArg:
        if (load.param >= static_cast<uint32_t>(kMaxStackParam)) return false;
        break;
      case FetchOp::kEntryData:
        if (load.param % 8 || load.param / 8 >= p.entry_args) return false;
        break;
      case FetchOp::kData:
        if (load.param >= p.strings.size()) return false;
        break;
      case FetchOp::kStackP:
      case FetchOp::kStack:
      case FetchOp::kRetval:
      case FetchOp::kImm:
      case FetchOp::kComm:
      case FetchOp::kFileOffset:
        break;
      default:
        return false;  // kSymbol must have been resolved by compile()
    }
    while (pc < in.size() && (in[pc].op == FetchOp::kDeref || in[pc].op == FetchOp::kUDeref))
      ++pc;
    if (pc >= in.size()) return false;
    const FetchInsn& st = in[pc++];
    bool str = st.op == FetchOp::kStString || st.op == FetchOp::kStUString ||
               st.op == FetchOp::kStSymstr;
    bool mem = st.op == FetchOp::kStMem || st.op == FetchOp::kStUMem;
    bool raw = st.op == FetchOp::kStRaw;
    if (!str && !mem && !raw) return false;
    if (!str && !is_size(st.size)) return false;
    if (pc < in.size() && in[pc].op == FetchOp::kModBitfield) {
      const FetchInsn& bf = in[pc++];
      unsigned bits = bf.size * 8u;
      if (str || bf.size != st.size || bf.lshift >= bits || bf.rshift >= bits) return false;
    }
    uint32_t count = 1;
    if (pc < in.size() && in[pc].op == FetchOp::kLoopArray) {
      count = in[pc++].param;
      if (raw || count == 0 || count > static_cast<uint32_t>(kMaxArrayLen)) return false;
    }
    if (pc >= in.size() || in[pc++].op != FetchOp::kEnd) return false;
    uint64_t width = static_cast<uint64_t>(str ? 4u : st.size) * count;
    if (st.param < p.header_size || st.param + width > p.fixed_size) return false;
    if (str) slots += count;
  }
  if (pc != in.size() || slots != p.string_slots) return false;
  if (!p.fast_regs.empty()) {
    if (p.fast_regs.size() != p.nargs) return false;
    for (uint32_t f : p.fast_regs) {
      uint32_t reg = f & 0xff, size = (f >> 8) & 0xff, dest = f >> 16;
      if (reg % 8 || reg > sizeof(PtRegs) - 8 || !is_size(size)) return false;
      if (dest < p.header_size || dest + size > p.fixed_size) return false;
    }
  }
  return true;
}

bool validate_filter(const CompiledFilter& f) {
  if (f.max_depth > kMaxFilterDepth || f.insns.empty()) return false;
  uint32_t depth = 0;
  for (const FilterInsn& in : f.insns) {
    switch (in.kind) {
      case FilterInsn::kPred:
        if (in.source > FilterInsn::kComm || static_cast<uint8_t>(in.op) > 7) return false;
        if (in.source == FilterInsn::kCpu && in.size != 4) return false;
        if ((in.source == FilterInsn::kRecordString || in.source == FilterInsn::kComm) &&
            static_cast<uint64_t>(in.pattern) + in.pattern_len > f.patterns.size())
          return false;
        if (++depth > kMaxFilterDepth) return false;
        break;
      case FilterInsn::kAnd:
      case FilterInsn::kOr:
        if (depth < 2) return false;
        --depth;
        break;
      case FilterInsn::kNot:
        if (depth < 1) return false;
        break;
      default:
        return false;
    }
  }
  return depth == 1;
}

std::vector<uint8_t> encode_program(const FetchProgram& p) {
  Writer w;
  w.put(kProgramMagic);
  w.put(p.nargs);
  w.put(p.header_size);
  w.put(p.fixed_size);
  w.put(p.string_slots);
  w.put(p.entry_args);
  w.put(p.probe_offset);
  w.put(static_cast<uint8_t>(p.is_return));
  w.put(static_cast<uint8_t>(p.imm_string_faults));
  w.put(uint16_t{0});
  w.put(static_cast<uint32_t>(p.insns.size()));
  w.put(static_cast<uint32_t>(p.strings.size()));
  w.put(static_cast<uint32_t>(p.fast_regs.size()));
  w.align();
  for (const FetchInsn& in : p.insns) {
    FetchInsn copy{};  // a clean copy, so that padding bytes are zero on the wire
    copy.op = in.op;
    copy.size = in.size;
    copy.lshift = in.lshift;
    copy.rshift = in.rshift;
    copy.param = in.param;
    copy.offset = in.offset;
    copy.imm = in.imm;
    w.raw(&copy, sizeof copy);
  }
  w.raw(p.strings.data(), p.strings.size());
  w.align();
  for (uint32_t f : p.fast_regs) w.put(f);
  return std::move(w.out);
}

bool decode_program(const uint8_t* data, size_t n, FetchProgram* out) {
  Reader r{data, n};
  FetchProgram p;
  if (r.get<uint32_t>() != kProgramMagic) return false;
  p.nargs = r.get<uint32_t>();
  p.header_size = r.get<uint32_t>();
  p.fixed_size = r.get<uint32_t>();
  p.string_slots = r.get<uint32_t>();
  p.entry_args = r.get<uint32_t>();
  p.probe_offset = r.get<uint64_t>();
  uint8_t is_return = r.get<uint8_t>(), faults = r.get<uint8_t>();
  r.get<uint16_t>();
  uint32_t n_insns = r.get<uint32_t>(), n_strings = r.get<uint32_t>(),
           n_fast = r.get<uint32_t>();
  r.align();
  if (!r.ok || is_return > 1 || faults > 1) return false;
  if (n_insns > static_cast<uint32_t>(kMaxTraceArgs * kFetchInsnMax) ||
      n_fast > static_cast<uint32_t>(kMaxTraceArgs) || n_strings > n)
    return false;
  p.is_return = is_return;
  p.imm_string_faults = faults;
  p.insns.resize(n_insns);
  for (FetchInsn& in : p.insns) r.raw(&in, sizeof in);
  p.strings.resize(n_strings);
  r.raw(p.strings.data(), n_strings);
  r.align();
  p.fast_regs.resize(n_fast);
  for (uint32_t& f : p.fast_regs) f = r.get<uint32_t>();
  if (!r.ok || r.at != n || !validate_program(p)) return false;
  *out = std::move(p);
  return true;
}

std::vector<uint8_t> encode_filter(const CompiledFilter& f) {
  Writer w;
  w.put(kFilterMagic);
  w.put(static_cast<uint32_t>(f.insns.size()));
  w.put(static_cast<uint32_t>(f.patterns.size()));
  w.put(f.max_depth);
  w.put(static_cast<uint32_t>(f.text.size()));
  w.align();
  for (const FilterInsn& in : f.insns) {
    FilterInsn copy{};
    copy.kind = in.kind;
    copy.source = in.source;
    copy.op = in.op;
    copy.negate = in.negate;
    copy.is_signed = in.is_signed;
    copy.size = in.size;
    copy.offset = in.offset;
    copy.value = in.value;
    copy.pattern = in.pattern;
    copy.pattern_len = in.pattern_len;
    w.raw(&copy, sizeof copy);
  }
  w.raw(f.patterns.data(), f.patterns.size());
  w.raw(f.text.data(), f.text.size());
  return std::move(w.out);
}

bool decode_filter(const uint8_t* data, size_t n, CompiledFilter* out) {
  Reader r{data, n};
  CompiledFilter f;
  if (r.get<uint32_t>() != kFilterMagic) return false;
  uint32_t n_insns = r.get<uint32_t>(), n_patterns = r.get<uint32_t>();
  f.max_depth = r.get<uint32_t>();
  uint32_t n_text = r.get<uint32_t>();
  r.align();
  if (!r.ok || n_insns > n / sizeof(FilterInsn) || n_patterns > n || n_text > n) return false;
  f.insns.resize(n_insns);
  for (FilterInsn& in : f.insns) {
    r.raw(&in, sizeof in);
    // Enumerations are checked as bytes before anything reads them as enumerators.
    uint8_t kind, source, op, negate, is_signed;
    std::memcpy(&kind, &in.kind, 1);
    std::memcpy(&source, &in.source, 1);
    std::memcpy(&op, &in.op, 1);
    std::memcpy(&negate, &in.negate, 1);
    std::memcpy(&is_signed, &in.is_signed, 1);
    if (kind > FilterInsn::kNot || source > FilterInsn::kComm || op > 7 || negate > 1 ||
        is_signed > 1)
      return false;
  }
  f.patterns.resize(n_patterns);
  r.raw(f.patterns.data(), n_patterns);
  f.text.resize(n_text);
  r.raw(f.text.data(), n_text);
  if (!r.ok || r.at != n || !validate_filter(f)) return false;
  *out = std::move(f);
  return true;
}

}  // namespace probefs::events
