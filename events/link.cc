#include "events/link.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "events/wire.h"

namespace probefs::events::link {

namespace {

// Little-endian byte writer for one payload. The host is little-endian (x86-64), so the
// integers are copied as they are; the static_assert keeps that assumption visible.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the link is little-endian");

struct Out {
  std::vector<uint8_t> b;
  bool ok = true;
  template <class T>
  void put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof v);
  }
  void u8(uint8_t v) { put(v); }
  void u16(uint16_t v) { put(v); }
  void u32(uint32_t v) { put(v); }
  void s32(int32_t v) { put(v); }
  void u64(uint64_t v) { put(v); }
  void bytes(const void* p, size_t n, size_t limit) {
    if (n > limit) {
      ok = false;
      return;
    }
    u32(static_cast<uint32_t>(n));
    const auto* s = static_cast<const uint8_t*>(p);
    b.insert(b.end(), s, s + n);
  }
  void str(std::string_view s, size_t limit) { bytes(s.data(), s.size(), limit); }
};

// Out's writes into a buffer of fixed size (encode_hello: no allocation); a write past
// its end is refused and sticks.
struct FixedOut {
  uint8_t* p;
  size_t cap;
  size_t at = 0;
  bool ok = true;
  template <class T>
  void put(T v) {
    if (!ok || cap - at < sizeof v) {
      ok = false;
      return;
    }
    std::memcpy(p + at, &v, sizeof v);
    at += sizeof v;
  }
  void u8(uint8_t v) { put(v); }
  void u16(uint16_t v) { put(v); }
  void u32(uint32_t v) { put(v); }
  void s32(int32_t v) { put(v); }
};

// The 16-byte header, into either writer.
template <class W>
void put_header(W& w, MsgType type, uint16_t flags, uint32_t seq, uint32_t payload_len) {
  w.u32(kMagic);
  w.u16(static_cast<uint16_t>(type));
  w.u16(flags);
  w.u32(seq);
  w.u32(payload_len);
}

// HELLO's payload, with `n` probe ids from `ids`, into either writer.
template <class W>
void put_hello(W& w, const Hello& h, const uint32_t* ids, size_t n) {
  w.u32(h.abi_version);
  w.s32(h.pid);
  w.s32(h.ppid);
  w.u8(static_cast<uint8_t>(h.reason));
  w.u8(0);
  w.u16(0);
  if (h.spare_id != 0 && h.reason != HelloReason::kFork) w.ok = false;
  w.u32(h.spare_id);
  w.u32(static_cast<uint32_t>(n));
  for (size_t i = 0; i < n; ++i) w.u32(ids[i]);
}

// The strict reader: every get checks the remaining length; the first failure sticks and
// says why.
struct In {
  const uint8_t* p;
  size_t n;
  size_t at = 0;
  const char* why = nullptr;
  bool fail(const char* w) {
    if (!why) why = w;
    return false;
  }
  bool ok() const { return why == nullptr; }
  template <class T>
  bool get(T* v, const char* what) {
    if (!ok()) return false;
    if (sizeof(T) > n - at) return fail(what);
    std::memcpy(v, p + at, sizeof(T));
    at += sizeof(T);
    return true;
  }
  bool boolean(bool* v, const char* what) {
    uint8_t x = 0;
    if (!get(&x, what)) return false;
    if (x > 1) return fail(what);
    *v = x != 0;
    return true;
  }
  bool zero16(const char* what) {
    uint16_t z = 1;
    if (!get(&z, what)) return false;
    return z == 0 || fail(what);
  }
  bool zero8(const char* what) {
    uint8_t z = 1;
    if (!get(&z, what)) return false;
    return z == 0 || fail(what);
  }
  // A length-prefixed block: *data points into the packet.
  bool block(const uint8_t** data, size_t* len, size_t limit, const char* what) {
    uint32_t l = 0;
    if (!get(&l, what)) return false;
    if (l > limit || l > n - at) return fail(what);
    *data = p + at;
    *len = l;
    at += l;
    return true;
  }
  bool str(std::string* s, size_t limit, const char* what) {
    const uint8_t* d = nullptr;
    size_t l = 0;
    if (!block(&d, &l, limit, what)) return false;
    s->assign(reinterpret_cast<const char*>(d), l);
    return true;
  }
  // A count of items of `item` bytes each, bounded by `limit` and by what is left.
  bool count(uint32_t* c, size_t item, size_t limit, const char* what) {
    if (!get(c, what)) return false;
    if (*c > limit || static_cast<uint64_t>(*c) * item > n - at) return fail(what);
    return true;
  }
};

void put_bounds(Out& o, const Bounds& b) {
  o.u64(b.start);
  o.u64(b.end);
  if (b.landing_pads.size() > kMaxLandingPads || b.related.size() > kMaxRelatedRanges) {
    o.ok = false;
    return;
  }
  o.u32(static_cast<uint32_t>(b.landing_pads.size()));
  for (uint64_t pad : b.landing_pads) o.u64(pad);
  o.u32(static_cast<uint32_t>(b.related.size()));
  for (const arch::TextRange& r : b.related) {
    o.u64(r.start);
    o.u64(r.end);
  }
}

bool get_bounds(In& in, Bounds* b) {
  if (!in.get(&b->start, "bounds") || !in.get(&b->end, "bounds")) return false;
  if (b->start > b->end) return in.fail("bounds: start after end");
  uint32_t n = 0;
  if (!in.count(&n, 8, kMaxLandingPads, "bounds: landing pads")) return false;
  b->landing_pads.resize(n);
  for (uint32_t i = 0; i < n; ++i) {
    uint64_t pad = 0;
    in.get(&pad, "bounds: landing pads");
    if (pad < b->start || pad >= b->end) return in.fail("bounds: landing pad outside");
    if (i > 0 && pad <= b->landing_pads[i - 1])
      return in.fail("bounds: landing pads not sorted");
    b->landing_pads[i] = pad;
  }
  uint32_t m = 0;
  if (!in.count(&m, 16, kMaxRelatedRanges, "bounds: related")) return false;
  b->related.resize(m);
  for (uint32_t i = 0; i < m; ++i) {
    uint64_t s = 0, e = 0;
    in.get(&s, "bounds: related");
    in.get(&e, "bounds: related");
    if (s >= e) return in.fail("bounds: empty related range");
    b->related[i] = {static_cast<uintptr_t>(s), static_cast<uintptr_t>(e)};
  }
  return in.ok();
}

void put_filter(Out& o, const std::optional<CompiledFilter>& f) {
  o.u8(f ? 1 : 0);
  if (!f) return;
  if (!validate_filter(*f)) {
    o.ok = false;
    return;
  }
  std::vector<uint8_t> bytes = encode_filter(*f);
  o.bytes(bytes.data(), bytes.size(), kMaxMessageSize);
}

bool get_filter(In& in, std::optional<CompiledFilter>* f) {
  bool has = false;
  if (!in.boolean(&has, "filter flag")) return false;
  if (!has) {
    f->reset();
    return true;
  }
  const uint8_t* d = nullptr;
  size_t l = 0;
  if (!in.block(&d, &l, kMaxMessageSize, "filter")) return false;
  CompiledFilter cf;
  if (!decode_filter(d, l, &cf)) return in.fail("filter does not decode");
  *f = std::move(cf);
  return true;
}

void put_setup(Out& o, const Setup& s) {
  if (s.options & ~kKnownSetupOptions) o.ok = false;
  o.u64(s.area_size);
  o.u32(s.trace_clock);
  o.u32(s.options);
}

bool get_setup(In& in, Setup* s) {
  in.get(&s->area_size, "setup");
  in.get(&s->trace_clock, "setup");
  in.get(&s->options, "setup");
  if (in.ok() && (s->options & ~kKnownSetupOptions)) return in.fail("setup: unknown options");
  if (in.ok() && s->area_size == 0) return in.fail("setup: empty area");
  return in.ok();
}

void put_geometry(Out& o, const HistGeometry& g) {
  o.u8(g.with_comm ? 1 : 0);
  o.u8(static_cast<uint8_t>(g.nvars));
  o.u8(static_cast<uint8_t>(g.track));
  o.u8(static_cast<uint8_t>(g.nsave));
  o.u32(g.key_bytes);
  o.u32(g.nvals);
  o.u32(g.capacity_bits);
}

bool get_geometry(In& in, HistGeometry* g) {
  in.boolean(&g->with_comm, "hist: with_comm");
  uint8_t nvars = 0, track = 0, nsave = 0;
  in.get(&nvars, "hist");
  in.get(&track, "hist");
  in.get(&nsave, "hist");
  g->nvars = nvars;
  g->nsave = nsave;
  if (in.ok() && (track > static_cast<uint8_t>(HistTrackKind::kChange) || nsave > kHistMaxParams ||
                  (track == 0 && nsave != 0)))
    return in.fail("hist: tracking");
  g->track = static_cast<HistTrackKind>(track);
  in.get(&g->key_bytes, "hist");
  in.get(&g->nvals, "hist");
  in.get(&g->capacity_bits, "hist");
  if (!in.ok()) return false;
  if (g->key_bytes < 8 || g->key_bytes > kHistMaxKeyBytes || g->key_bytes % 8 != 0)
    return in.fail("hist: key size out of range");
  if (g->nvals >= kHistMaxVals) return in.fail("hist: too many values");
  if (g->nvars > kHistMaxVars) return in.fail("hist: too many variables");
  if (g->capacity_bits < kHistMinBits || g->capacity_bits > kHistMaxBits)
    return in.fail("hist: size out of range");
  return true;
}

void put_operand(Out& o, const HistOperand& x) {
  o.u8(static_cast<uint8_t>(x.source));
  o.u8(static_cast<uint8_t>(x.transform));
  o.u8(x.size);
  o.u8(x.is_signed ? 1 : 0);
  o.u32(x.offset);
  o.u32(x.key_offset);
  o.u32(x.key_size);
  o.u64(x.buckets);
  o.u64(x.value);
}

bool get_operand(In& in, HistOperand* x, bool key, uint32_t key_bytes) {
  uint8_t source = 0, transform = 0;
  in.get(&source, "hist operand");
  in.get(&transform, "hist operand");
  in.get(&x->size, "hist operand");
  in.boolean(&x->is_signed, "hist operand");
  in.get(&x->offset, "hist operand");
  in.get(&x->key_offset, "hist operand");
  in.get(&x->key_size, "hist operand");
  in.get(&x->buckets, "hist operand");
  in.get(&x->value, "hist operand");
  if (!in.ok()) return false;
  if (source > static_cast<uint8_t>(HistSource::kStack) ||
      transform > static_cast<uint8_t>(HistTransform::kUsecs))
    return in.fail("hist operand: unknown kind");
  x->source = static_cast<HistSource>(source);
  x->transform = static_cast<HistTransform>(transform);
  if (x->size != 1 && x->size != 2 && x->size != 4 && x->size != 8)
    return in.fail("hist operand: size");
  if (x->transform == HistTransform::kBuckets && x->buckets == 0)
    return in.fail("hist operand: no buckets");
  if (x->offset > kMaxMessageSize) return in.fail("hist operand: offset");
  if ((x->source == HistSource::kString || x->source == HistSource::kStack) && !key)
    return in.fail("hist operand: a string or stack value");
  if (x->source == HistSource::kVar && x->offset >= kHistMaxVars)
    return in.fail("hist operand: no such variable");
  if (x->source == HistSource::kVarRef && x->offset >= kHistMaxVarRefs)
    return in.fail("hist operand: no such reference");
  if (key) {
    if ((x->source > HistSource::kCpu && x->source != HistSource::kStack) ||
        x->transform == HistTransform::kUsecs)
      return in.fail("hist operand: not a key");
    const uint32_t want = x->source == HistSource::kString  ? x->key_size
                          : x->source == HistSource::kStack ? kHistStackBytes
                                                            : 8;
    if (x->key_size != want || want < 8 || want > kHistMaxStringKey || want % 8 != 0 ||
        x->key_offset % 8 != 0 || x->key_offset > key_bytes || want > key_bytes - x->key_offset)
      return in.fail("hist operand: outside the key");
  }
  return true;
}

void put_set_hist(Out& o, const SetHist& s) {
  if (s.programs.size() > kHistMaxPerEvent || s.geometries.size() != s.programs.size()) {
    o.ok = false;
    return;
  }
  if (s.triggers.size() > kMaxHitTriggers) {
    o.ok = false;
    return;
  }
  o.u32(s.probe_id);
  if (s.soft & ~(kInstanceBuffers | 1u)) {
    o.ok = false;
    return;
  }
  o.u8(static_cast<uint8_t>((s.record ? 1 : 0) | ((s.soft & 1) ? 2 : 0)));
  o.u8(static_cast<uint8_t>(s.programs.size()));
  o.u16(s.synth_id);
  o.u32(s.synth_size);
  put_filter(o, s.synth_filter);
  o.u64(s.clock.anchor_tsc);
  o.u64(s.clock.anchor_ns);
  o.u64(s.clock.mult);
  for (size_t i = 0; i < s.programs.size(); ++i) {
    const HistProgram& p = s.programs[i];
    if (p.slot >= kHistMaxSlots || p.nkeys == 0 || p.nkeys > kHistMaxKeys ||
        p.nvals >= kHistMaxVals || p.nvals != s.geometries[i].nvals ||
        p.nvars > kHistMaxVars || p.nrefs > kHistMaxVarRefs ||
        p.action.nparams > kHistMaxParams || p.track.nsave > kHistMaxParams) {
      o.ok = false;
      return;
    }
    o.u32(p.slot);
    put_geometry(o, s.geometries[i]);
    o.u8(static_cast<uint8_t>(p.nkeys));
    o.u8(static_cast<uint8_t>(p.nvals));
    o.u16(0);
    for (uint32_t k = 0; k < p.nkeys; ++k) put_operand(o, p.keys[k]);
    for (uint32_t v = 0; v < p.nvals; ++v) put_operand(o, p.vals[v]);
    put_filter(o, p.filter);
    o.u8(static_cast<uint8_t>(p.nvars));
    o.u8(static_cast<uint8_t>(p.nrefs));
    o.u8(static_cast<uint8_t>(p.action.nparams));
    o.u8(static_cast<uint8_t>(static_cast<uint8_t>(p.track.kind) | (p.track.fires ? 0x80 : 0)));
    o.u16(p.action.synth_id);
    o.u8(static_cast<uint8_t>(p.track.var));
    o.u8(static_cast<uint8_t>(p.track.nsave));
    for (uint32_t v = 0; v < p.nvars; ++v) {
      o.u8(static_cast<uint8_t>(p.vars[v].op));
      put_operand(o, p.vars[v].a);
      put_operand(o, p.vars[v].b);
    }
    for (uint32_t r = 0; r < p.nrefs; ++r) {
      o.u32(p.refs[r].slot);
      o.u32(p.refs[r].var);
      put_geometry(o, p.refs[r].geometry);
    }
    for (uint32_t a = 0; a < p.action.nparams; ++a) {
      put_operand(o, p.action.params[a]);
      o.u32(p.action.param_offset[a]);
      o.u8(p.action.param_size[a]);
      o.u8(0);
      o.u16(0);
    }
    for (uint32_t i = 0; i < p.track.nsave; ++i) put_operand(o, p.track.save[i]);
  }
  o.u8(static_cast<uint8_t>(s.triggers.size()));
  for (const TriggerSpec& t : s.triggers) {
    if (t.action < TriggerAction::kTraceOn || t.action > TriggerAction::kSnapshot ||
        (t.count_slot >= kControlCountSlots && t.count_slot != kNoCountSlot) ||
        t.buffer >= kRingMaxBuffers) {
      o.ok = false;
      return;
    }
    o.u8(static_cast<uint8_t>(t.action));
    o.u8(t.buffer);
    o.u16(t.target_event);
    o.u32(t.count_slot);
    put_filter(o, t.filter);
  }
  if (s.instances & ~kInstanceBuffers) {
    o.ok = false;
    return;
  }
  o.u32(s.instances);
  uint8_t n = 0;
  for (const auto& f : s.instance_filters) n += f.has_value() ? 1 : 0;
  if (s.instance_filters.size() > kRingMaxBuffers) {
    o.ok = false;
    return;
  }
  o.u8(n);
  for (uint32_t b = 0; b < s.instance_filters.size(); ++b) {
    if (!s.instance_filters[b]) continue;
    if (b == 0) {
      o.ok = false;
      return;
    }
    o.u8(static_cast<uint8_t>(b));
    put_filter(o, s.instance_filters[b]);
  }
  o.u32(s.soft & kInstanceBuffers);
}

bool get_set_hist(In& in, SetHist* s) {
  uint8_t n = 0;
  uint16_t pad = 0;
  in.get(&s->probe_id, "set_hist");
  uint8_t flags = 0;
  in.get(&flags, "set_hist");
  if (in.ok() && (flags & ~3u) != 0) return in.fail("set_hist: flags");
  s->record = (flags & 1) != 0;
  s->soft = (flags & 2) != 0 ? 1u : 0u;
  in.get(&n, "set_hist");
  in.get(&s->synth_id, "set_hist");
  in.get(&s->synth_size, "set_hist");
  if (!in.ok()) return false;
  if (!get_filter(in, &s->synth_filter)) return false;
  in.get(&s->clock.anchor_tsc, "set_hist");
  in.get(&s->clock.anchor_ns, "set_hist");
  in.get(&s->clock.mult, "set_hist");
  if (!in.ok()) return false;
  if (s->synth_id != 0 && (s->synth_size < 8 || s->synth_size > kMaxMessageSize))
    return in.fail("set_hist: synthetic record size");
  if (n > kHistMaxPerEvent) return in.fail("set_hist: too many histograms");
  for (uint8_t i = 0; i < n; ++i) {
    HistProgram p;
    HistGeometry g;
    uint8_t nkeys = 0, nvals = 0;
    in.get(&p.slot, "set_hist");
    if (!in.ok()) return false;
    if (p.slot >= kHistMaxSlots) return in.fail("set_hist: slot out of range");
    if (!get_geometry(in, &g)) return false;
    in.get(&nkeys, "set_hist");
    in.get(&nvals, "set_hist");
    in.get(&pad, "set_hist");
    if (!in.ok()) return false;
    if (nkeys == 0 || nkeys > kHistMaxKeys || nvals != g.nvals)
      return in.fail("set_hist: key or value count");
    p.nkeys = nkeys;
    p.nvals = nvals;
    uint32_t key_at = 0;
    for (uint32_t k = 0; k < p.nkeys; ++k) {
      if (!get_operand(in, &p.keys[k], true, g.key_bytes)) return false;
      if (p.keys[k].key_offset != key_at) return in.fail("set_hist: keys not side by side");
      key_at += p.keys[k].key_size;
    }
    if (key_at != g.key_bytes) return in.fail("set_hist: keys do not fill the key");
    for (uint32_t v = 0; v < p.nvals; ++v)
      if (!get_operand(in, &p.vals[v], false, g.key_bytes)) return false;
    if (!get_filter(in, &p.filter)) return false;
    uint8_t nvars = 0, nrefs = 0, nparams = 0, track = 0, track_var = 0, nsave = 0;
    in.get(&nvars, "set_hist");
    in.get(&nrefs, "set_hist");
    in.get(&nparams, "set_hist");
    in.get(&track, "set_hist");
    in.get(&p.action.synth_id, "set_hist");
    in.get(&track_var, "set_hist");
    in.get(&nsave, "set_hist");
    if (!in.ok()) return false;
    if (nvars > kHistMaxVars || nvars > g.nvars || nrefs > kHistMaxVarRefs ||
        nparams > kHistMaxParams || (nparams && !p.action.synth_id))
      return in.fail("set_hist: variable, reference or parameter count");
    // onmax/onchange: the slot's kind, one of the program's variables, no more saved
    // fields than the entries keep; firing needs an action.
    const uint8_t kind = track & 0x7f;
    p.track.fires = (track & 0x80) != 0;
    if (kind != static_cast<uint8_t>(g.track) || nsave > g.nsave ||
        (kind != 0 && track_var >= nvars) || (kind == 0 && (nsave || p.track.fires)) ||
        (p.track.fires && !p.action.synth_id))
      return in.fail("set_hist: tracking");
    p.track.kind = static_cast<HistTrackKind>(kind);
    p.track.var = track_var;
    p.track.nsave = nsave;
    p.nvars = nvars;
    p.nrefs = nrefs;
    p.action.nparams = nparams;
    for (uint32_t v = 0; v < p.nvars; ++v) {
      uint8_t op = 0;
      in.get(&op, "set_hist");
      if (!in.ok()) return false;
      if (op > static_cast<uint8_t>(HistOp::kDiv)) return in.fail("set_hist: operator");
      p.vars[v].op = static_cast<HistOp>(op);
      if (!get_operand(in, &p.vars[v].a, false, g.key_bytes) ||
          !get_operand(in, &p.vars[v].b, false, g.key_bytes))
        return false;
    }
    for (uint32_t r = 0; r < p.nrefs; ++r) {
      in.get(&p.refs[r].slot, "set_hist");
      in.get(&p.refs[r].var, "set_hist");
      if (!in.ok()) return false;
      if (p.refs[r].slot >= kHistMaxSlots) return in.fail("set_hist: slot out of range");
      if (!get_geometry(in, &p.refs[r].geometry)) return false;
      if (p.refs[r].var >= p.refs[r].geometry.nvars || p.refs[r].geometry.key_bytes != g.key_bytes)
        return in.fail("set_hist: reference outside its histogram");
    }
    for (uint32_t a = 0; a < p.action.nparams; ++a) {
      if (!get_operand(in, &p.action.params[a], false, g.key_bytes)) return false;
      uint8_t size = 0, pad_a = 0;
      in.get(&p.action.param_offset[a], "set_hist");
      in.get(&size, "set_hist");
      in.get(&pad_a, "set_hist");
      in.get(&pad, "set_hist");
      if (!in.ok()) return false;
      if (size != 1 && size != 2 && size != 4 && size != 8) return in.fail("set_hist: parameter size");
      if (p.action.param_offset[a] < 8 || p.action.param_offset[a] > kMaxMessageSize)
        return in.fail("set_hist: parameter offset");
      p.action.param_size[a] = size;
    }
    for (uint32_t i = 0; i < p.track.nsave; ++i)
      if (!get_operand(in, &p.track.save[i], false, g.key_bytes)) return false;
    s->programs.push_back(std::move(p));
    s->geometries.push_back(g);
  }
  uint8_t t = 0;
  in.get(&t, "set_hist: triggers");
  if (!in.ok()) return false;
  if (t > kMaxHitTriggers) return in.fail("set_hist: too many triggers");
  for (uint8_t i = 0; i < t; ++i) {
    TriggerSpec spec;
    uint8_t action = 0;
    in.get(&action, "set_hist: trigger");
    in.get(&spec.buffer, "set_hist: trigger");
    in.get(&spec.target_event, "set_hist: trigger");
    in.get(&spec.count_slot, "set_hist: trigger");
    if (!in.ok()) return false;
    if (action < static_cast<uint8_t>(TriggerAction::kTraceOn) ||
        action > static_cast<uint8_t>(TriggerAction::kSnapshot))
      return in.fail("set_hist: trigger action");
    if (spec.buffer >= kRingMaxBuffers) return in.fail("set_hist: trigger buffer");
    if (spec.count_slot >= kControlCountSlots && spec.count_slot != kNoCountSlot)
      return in.fail("set_hist: trigger count slot");
    spec.action = static_cast<TriggerAction>(action);
    if (!get_filter(in, &spec.filter)) return false;
    s->triggers.push_back(std::move(spec));
  }
  in.get(&s->instances, "set_hist: instances");
  if (in.ok() && (s->instances & ~kInstanceBuffers) != 0) return in.fail("set_hist: instances");
  uint8_t nf = 0;
  in.get(&nf, "set_hist: instance filters");
  if (!in.ok()) return false;
  if (nf >= kRingMaxBuffers) return in.fail("set_hist: instance filters");
  s->instance_filters.clear();
  for (uint8_t i = 0; i < nf; ++i) {
    uint8_t b = 0;
    in.get(&b, "set_hist: instance filter");
    if (!in.ok()) return false;
    if (b == 0 || b >= kRingMaxBuffers) return in.fail("set_hist: instance filter buffer");
    if (s->instance_filters.size() <= b) s->instance_filters.resize(b + 1u);
    if (s->instance_filters[b]) return in.fail("set_hist: instance filter twice");
    if (!get_filter(in, &s->instance_filters[b])) return false;
    if (!s->instance_filters[b]) return in.fail("set_hist: instance filter missing");
  }
  uint32_t soft = 0;
  in.get(&soft, "set_hist: soft instances");
  if (in.ok() && (soft & ~kInstanceBuffers) != 0) return in.fail("set_hist: soft instances");
  s->soft |= soft;
  return in.ok();
}

bool valid_unwind(const Unwind& u) {
  return u.start < u.end && u.end - u.start <= arch::kUnwindMaxLength;
}

void encode_body(Out& o, const Message& m) {
  switch (m.type) {
    case MsgType::kUnwind: {
      const auto& u = std::get<Unwind>(m.body);
      if (!valid_unwind(u)) o.ok = false;
      o.u64(u.start);
      o.u64(u.end);
      break;
    }
    case MsgType::kBranches: {
      const auto& b = std::get<Branches>(m.body);
      if (b.length == 0 || b.length > kMaxBranchesLength) o.ok = false;
      o.u32(b.dev_major);
      o.u32(b.dev_minor);
      o.u64(b.inode);
      o.u64(b.offset);
      o.u64(b.length);
      break;
    }
    case MsgType::kSetup:
      put_setup(o, std::get<Setup>(m.body));
      break;
    case MsgType::kHistTable: {
      const auto& h = std::get<HistTable>(m.body);
      if (h.slot >= kHistMaxSlots || h.rings == 0 || h.rings > 65536) o.ok = false;
      o.u32(h.slot);
      o.u8(h.release ? 1 : 0);
      put_geometry(o, h.geometry);
      o.u32(h.rings);
      o.u32(h.spare_id);
      break;
    }
    case MsgType::kSetHist:
      put_set_hist(o, std::get<SetHist>(m.body));
      break;
    case MsgType::kSpare: {
      const auto& sp = std::get<Spare>(m.body);
      if (sp.id == 0) o.ok = false;
      put_setup(o, sp.setup);
      o.u32(sp.id);
      break;
    }

    case MsgType::kDefine: {
      const auto& d = std::get<Define>(m.body);
      o.u32(d.probe_id);
      o.u32(d.counter_slot);
      o.u16(d.event_id);
      o.u8(static_cast<uint8_t>(d.kind));
      o.u8(d.enabled ? 1 : 0);
      o.u32(d.maxactive);
      o.u64(d.address);
      put_bounds(o, d.bounds);
      o.str(d.symbol, kMaxNameLen);
      o.u64(d.symbol_addr);
      o.str(d.module, kMaxNameLen);
      if (!validate_program(d.program)) {
        o.ok = false;
        break;
      }
      std::vector<uint8_t> prog = encode_program(d.program);
      o.bytes(prog.data(), prog.size(), kMaxMessageSize);
      put_filter(o, d.filter);
      o.u64(d.ref_ctr);
      break;
    }
    case MsgType::kRemove:
    case MsgType::kEnable:
    case MsgType::kDisable:
      o.u32(std::get<ProbeRef>(m.body).probe_id);
      break;
    case MsgType::kSetFilter: {
      const auto& s = std::get<SetFilter>(m.body);
      o.u32(s.probe_id);
      put_filter(o, s.filter);
      break;
    }
    case MsgType::kOptimization:
      o.u8(std::get<Optimization>(m.body).on ? 1 : 0);
      break;
    case MsgType::kHello: {
      const auto& h = std::get<Hello>(m.body);
      put_hello(o, h, h.probe_ids.data(), h.probe_ids.size());
      break;
    }
    case MsgType::kMapped:
      o.u8(static_cast<uint8_t>(std::get<Mapped>(m.body).kind));
      o.u8(0);
      o.u16(0);
      break;
    case MsgType::kReply: {
      const auto& r = std::get<Reply>(m.body);
      o.s32(r.error);
      o.str(r.message, kMaxMessageText);
      o.u32(static_cast<uint32_t>(r.profile.size()));
      for (const ProfileEntry& e : r.profile) {
        o.u32(e.probe_id);
        o.u64(e.nmissed);
      }
      break;
    }
    default:
      break;  // no payload
  }
}

bool valid_type(uint16_t t) {
  return (t >= static_cast<uint16_t>(MsgType::kSetup) && t <= static_cast<uint16_t>(MsgType::kControl)) ||
         t == static_cast<uint16_t>(MsgType::kHello) || t == static_cast<uint16_t>(MsgType::kMapped) ||
         t == static_cast<uint16_t>(MsgType::kListChanged) ||
         t == static_cast<uint16_t>(MsgType::kReply);
}

bool decode_body(In& in, Message* m) {
  switch (m->type) {
    case MsgType::kUnwind: {
      Unwind u;
      in.get(&u.start, "unwind");
      in.get(&u.end, "unwind");
      if (in.ok() && !valid_unwind(u)) return in.fail("unwind: range out of bounds");
      m->body = u;
      break;
    }
    case MsgType::kBranches: {
      Branches b;
      in.get(&b.dev_major, "branches");
      in.get(&b.dev_minor, "branches");
      in.get(&b.inode, "branches");
      in.get(&b.offset, "branches");
      in.get(&b.length, "branches");
      if (in.ok() && (b.length == 0 || b.length > kMaxBranchesLength))
        return in.fail("branches: length out of range");
      m->body = b;
      break;
    }
    case MsgType::kSetup: {
      Setup s;
      if (!get_setup(in, &s)) return false;
      m->body = s;
      break;
    }
    case MsgType::kHistTable: {
      HistTable h;
      in.get(&h.slot, "hist_table");
      in.boolean(&h.release, "hist_table: release flag");
      if (!in.ok()) return false;
      if (h.slot >= kHistMaxSlots) return in.fail("hist_table: slot out of range");
      if (!get_geometry(in, &h.geometry)) return false;
      in.get(&h.rings, "hist_table");
      in.get(&h.spare_id, "hist_table");
      if (in.ok() && (h.rings == 0 || h.rings > 65536)) return in.fail("hist_table: rings");
      m->body = h;
      break;
    }
    case MsgType::kSetHist: {
      SetHist s;
      if (!get_set_hist(in, &s)) return false;
      m->body = std::move(s);
      break;
    }
    case MsgType::kSpare: {
      Spare sp;
      if (!get_setup(in, &sp.setup)) return false;
      in.get(&sp.id, "spare");
      if (in.ok() && sp.id == 0) return in.fail("spare: id 0");
      m->body = sp;
      break;
    }

    case MsgType::kDefine: {
      Define d;
      uint8_t kind = 0;
      in.get(&d.probe_id, "define");
      in.get(&d.counter_slot, "define");
      in.get(&d.event_id, "define");
      in.get(&kind, "define");
      if (in.ok() && kind > static_cast<uint8_t>(ProbeKind::kReturn))
        return in.fail("define: unknown probe kind");
      d.kind = static_cast<ProbeKind>(kind);
      in.boolean(&d.enabled, "define: enabled flag");
      in.get(&d.maxactive, "define");
      in.get(&d.address, "define");
      if (in.ok() && d.address == 0) return in.fail("define: address 0");
      if (!in.ok() || !get_bounds(in, &d.bounds)) return false;
      if (d.bounds.start < d.bounds.end &&
          (d.address < d.bounds.start || d.address >= d.bounds.end))
        return in.fail("define: address outside its bounds");
      in.str(&d.symbol, kMaxNameLen, "define: symbol");
      in.get(&d.symbol_addr, "define");
      in.str(&d.module, kMaxNameLen, "define: module");
      if (!in.ok()) return false;
      if (d.symbol.find('\0') != std::string::npos || d.module.find('\0') != std::string::npos)
        return in.fail("define: NUL in a name");
      if (!d.symbol.empty() && d.symbol_addr > d.address)
        return in.fail("define: symbol after the address");
      const uint8_t* prog = nullptr;
      size_t plen = 0;
      if (!in.block(&prog, &plen, kMaxMessageSize, "define: program")) return false;
      if (!decode_program(prog, plen, &d.program)) return in.fail("define: program does not decode");
      if ((d.kind == ProbeKind::kReturn) != d.program.is_return)
        return in.fail("define: program kind differs from the probe's");
      if (d.maxactive > static_cast<uint32_t>(kMaxActiveMax))
        return in.fail("define: maxactive too big");
      if (d.kind == ProbeKind::kEntry && d.maxactive != 0)
        return in.fail("define: maxactive on an entry probe");
      if (!get_filter(in, &d.filter)) return false;
      in.get(&d.ref_ctr, "define: reference counter");
      if (in.ok() && d.ref_ctr % 2 != 0) return in.fail("define: reference counter unaligned");
      m->body = std::move(d);
      break;
    }
    case MsgType::kRemove:
    case MsgType::kEnable:
    case MsgType::kDisable: {
      ProbeRef r;
      in.get(&r.probe_id, "probe id");
      m->body = r;
      break;
    }
    case MsgType::kSetFilter: {
      SetFilter s;
      in.get(&s.probe_id, "set_filter");
      if (!in.ok() || !get_filter(in, &s.filter)) return false;
      m->body = std::move(s);
      break;
    }
    case MsgType::kOptimization: {
      Optimization o;
      in.boolean(&o.on, "optimization flag");
      m->body = o;
      break;
    }
    case MsgType::kHello: {
      Hello h;
      uint8_t reason = 0;
      in.get(&h.abi_version, "hello");
      in.get(&h.pid, "hello");
      in.get(&h.ppid, "hello");
      in.get(&reason, "hello");
      in.zero8("hello: reserved");
      in.zero16("hello: reserved");
      in.get(&h.spare_id, "hello");
      uint32_t n = 0;
      if (!in.count(&n, 4, kMaxMessageSize / 4, "hello: probes")) return false;
      h.probe_ids.resize(n);
      for (uint32_t& id : h.probe_ids) in.get(&id, "hello: probes");
      if (!in.ok()) return false;
      if (reason < static_cast<uint8_t>(HelloReason::kLaunch) ||
          reason > static_cast<uint8_t>(HelloReason::kExec))
        return in.fail("hello: unknown reason");
      if (h.pid <= 0 || h.ppid < 0) return in.fail("hello: bad pid");
      if (h.spare_id != 0 && reason != static_cast<uint8_t>(HelloReason::kFork))
        return in.fail("hello: a spare area outside fork");
      h.reason = static_cast<HelloReason>(reason);
      m->body = h;
      break;
    }
    case MsgType::kMapped: {
      Mapped mp;
      uint8_t kind = 0;
      in.get(&kind, "mapped");
      in.zero8("mapped: reserved");
      in.zero16("mapped: reserved");
      if (!in.ok()) return false;
      if (kind < static_cast<uint8_t>(MappedKind::kMapped) ||
          kind > static_cast<uint8_t>(MappedKind::kUnmapped))
        return in.fail("mapped: unknown kind");
      mp.kind = static_cast<MappedKind>(kind);
      m->body = mp;
      break;
    }
    case MsgType::kReply: {
      Reply r;
      in.get(&r.error, "reply");
      if (in.ok() && (r.error > 0 || r.error < -4095)) return in.fail("reply: error not -errno");
      in.str(&r.message, kMaxMessageText, "reply: message");
      uint32_t n = 0;
      if (!in.count(&n, 12, kMaxMessageSize / 12, "reply: profile")) return false;
      r.profile.resize(n);
      for (ProfileEntry& e : r.profile) {
        in.get(&e.probe_id, "reply: profile");
        in.get(&e.nmissed, "reply: profile");
      }
      m->body = std::move(r);
      break;
    }
    default:
      m->body = std::monostate{};
      break;
  }
  if (!in.ok()) return false;
  if (in.at != in.n) return in.fail("bytes after the payload");
  return true;
}

std::vector<uint8_t> packet(MsgType type, uint16_t flags, uint32_t seq, const Out& body) {
  std::vector<uint8_t> out;
  out.reserve(kHeaderSize + body.b.size());
  Out h;
  put_header(h, type, flags, seq, static_cast<uint32_t>(body.b.size()));
  out = std::move(h.b);
  out.insert(out.end(), body.b.begin(), body.b.end());
  return out;
}

}  // namespace

size_t body_index(MsgType type) {
  switch (type) {
    case MsgType::kSetup: return 1;
    case MsgType::kDefine: return 2;
    case MsgType::kRemove:
    case MsgType::kEnable:
    case MsgType::kDisable: return 3;
    case MsgType::kSetFilter: return 4;
    case MsgType::kOptimization: return 5;
    case MsgType::kHello: return 6;
    case MsgType::kMapped: return 7;
    case MsgType::kReply: return 8;
    case MsgType::kBranches: return 9;
    case MsgType::kSpare: return 10;
    case MsgType::kHistTable: return 11;
    case MsgType::kSetHist: return 12;
    case MsgType::kUnwind: return 13;
    default: return 0;
  }
}

const char* type_name(MsgType type) {
  switch (type) {
    case MsgType::kSetup: return "SETUP";
    case MsgType::kDefine: return "DEFINE";
    case MsgType::kRemove: return "REMOVE";
    case MsgType::kEnable: return "ENABLE";
    case MsgType::kDisable: return "DISABLE";
    case MsgType::kSetFilter: return "SET_FILTER";
    case MsgType::kArmAll: return "ARM_ALL";
    case MsgType::kDisarmAll: return "DISARM_ALL";
    case MsgType::kOptimization: return "OPTIMIZATION";
    case MsgType::kList: return "LIST";
    case MsgType::kProfile: return "PROFILE";
    case MsgType::kGo: return "GO";
    case MsgType::kDetach: return "DETACH";
    case MsgType::kBlacklist: return "BLACKLIST";
    case MsgType::kBranches: return "BRANCHES";
    case MsgType::kSpare: return "SPARE";
    case MsgType::kHistTable: return "HIST_TABLE";
    case MsgType::kSetHist: return "SET_HIST";
    case MsgType::kUnwind: return "UNWIND";
    case MsgType::kControl: return "CONTROL";
    case MsgType::kHello: return "HELLO";
    case MsgType::kMapped: return "MAPPED";
    case MsgType::kListChanged: return "LIST_CHANGED";
    case MsgType::kReply: return "REPLY";
  }
  return "?";
}

std::vector<std::vector<uint8_t>> encode(const Message& m) {
  if (!valid_type(static_cast<uint16_t>(m.type)) || (m.flags & ~kKnownFlags)) return {};
  if (m.body.index() != body_index(m.type)) return {};
  if (m.type == MsgType::kReply) {
    // Split a long text or profile: each packet carries a slice of both.
    const auto& r = std::get<Reply>(m.body);
    constexpr size_t kRoom = kMaxMessageText;  // text and profile of one packet
    std::vector<std::vector<uint8_t>> out;
    size_t text_at = 0, prof_at = 0;
    do {
      Out o;
      size_t text_n = std::min(r.message.size() - text_at, kRoom);
      size_t left = kRoom - text_n;
      size_t prof_n = std::min(r.profile.size() - prof_at, left / 12);
      o.s32(r.error);
      o.str(std::string_view(r.message).substr(text_at, text_n), kMaxMessageText);
      o.u32(static_cast<uint32_t>(prof_n));
      for (size_t i = 0; i < prof_n; ++i) {
        o.u32(r.profile[prof_at + i].probe_id);
        o.u64(r.profile[prof_at + i].nmissed);
      }
      text_at += text_n;
      prof_at += prof_n;
      if (!o.ok) return {};
      const bool more = text_at < r.message.size() || prof_at < r.profile.size();
      out.push_back(packet(m.type, static_cast<uint16_t>(m.flags | (more ? kFlagMore : 0)),
                           m.seq, o));
    } while (text_at < r.message.size() || prof_at < r.profile.size());
    return out;
  }
  Out o;
  encode_body(o, m);
  if (!o.ok || kHeaderSize + o.b.size() > kMaxMessageSize) return {};
  std::vector<std::vector<uint8_t>> out;
  out.push_back(packet(m.type, m.flags, m.seq, o));
  return out;
}

size_t encode_hello(uint8_t* out, size_t cap, uint32_t seq, const Hello& h, const uint32_t* ids,
                    size_t n) {
  if (h.reason < HelloReason::kLaunch || h.reason > HelloReason::kExec) return 0;
  constexpr size_t kFixed = 4 + 4 + 4 + 1 + 1 + 2 + 4 + 4;
  if (!out || n > (kMaxMessageSize - kHeaderSize - kFixed) / 4) return 0;
  FixedOut w{out, cap};
  put_header(w, MsgType::kHello, 0, seq, static_cast<uint32_t>(kFixed + 4 * n));
  put_hello(w, h, ids, n);
  return w.ok ? w.at : 0;
}

int decode(const uint8_t* data, size_t n, Message* out, std::string* why) {
  auto bad = [&](const char* w) {
    if (why) *why = w;
    return -EBADMSG;
  };
  if (n < kHeaderSize) return bad("shorter than a header");
  if (n > kMaxMessageSize) return bad("longer than the largest message");
  In h{data, n};
  uint32_t magic = 0, seq = 0, len = 0;
  uint16_t type = 0, flags = 0;
  h.get(&magic, "");
  h.get(&type, "");
  h.get(&flags, "");
  h.get(&seq, "");
  h.get(&len, "");
  if (magic != kMagic) {
    if ((magic & 0xffffff00u) == (kMagic & 0xffffff00u)) return bad("another protocol version");
    return bad("not a probefs link message");
  }
  out->type = static_cast<MsgType>(type);
  out->flags = flags;
  out->seq = seq;
  out->body = std::monostate{};
  if (!valid_type(type)) return bad("unknown message type");
  if (flags & ~kKnownFlags) return bad("unknown flags");
  if ((flags & kFlagMore) && out->type != MsgType::kReply) return bad("'more' on a request");
  if ((flags & kFlagAnswer) && out->type != MsgType::kDefine) return bad("'answer' on a non-DEFINE");
  if (len != n - kHeaderSize) return bad("payload length differs from the packet's");
  In in{data + kHeaderSize, len};
  if (!decode_body(in, out)) {
    out->body = std::monostate{};
    return bad(in.why ? in.why : "malformed payload");
  }
  return 0;
}

int ReplyAssembler::add(const Message& m) {
  if (m.type != MsgType::kReply || m.body.index() != body_index(MsgType::kReply))
    return -EBADMSG;
  const auto& r = std::get<Reply>(m.body);
  if (active_ && m.seq != seq_) return -EBADMSG;
  if (active_ && r.error != reply_.error) return -EBADMSG;
  if (!active_) {
    active_ = true;
    seq_ = m.seq;
    reply_ = Reply{};
    reply_.error = r.error;
  }
  // Counted before anything is appended: a peer's flood never gets past the cap.
  const size_t size = reply_.message.size() + 12 * reply_.profile.size();
  if (r.message.size() + 12 * r.profile.size() > kMaxReplySize - size) {
    active_ = false;
    reply_ = Reply{};
    return -E2BIG;
  }
  reply_.message += r.message;
  reply_.profile.insert(reply_.profile.end(), r.profile.begin(), r.profile.end());
  if (m.flags & kFlagMore) return 0;
  active_ = false;
  return 1;
}

Reply ReplyAssembler::take() {
  active_ = false;
  return std::move(reply_);
}

}  // namespace probefs::events::link
