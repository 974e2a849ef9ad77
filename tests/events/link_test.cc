// The agent link's messages (events/link.h): every message round-trips, every malformed
// packet is refused with a reason, long replies split and reassemble.
#include "events/link.h"

#include <cerrno>
#include <cstring>

#include <gtest/gtest.h>

#include <functional>

#include "events/compile.h"
#include "events/filter.h"
#include "events/parse.h"

namespace probefs::events::link {
namespace {

// Inside a TEST body, `Setup` would name gtest's misspelling trap.
using SetupMsg = Setup;

CompiledEvent compiled(const std::string& line) {
  ParseResult pr = parse_kprobe_command(line);
  EXPECT_EQ(pr.status, ParseStatus::kDefine) << line;
  CompiledEvent ev;
  Diagnostic d;
  EXPECT_TRUE(compile(pr.def, {}, &ev, &d));
  return ev;
}

Define sample_define() {
  const CompiledEvent ev = compiled("r:g/e f ret=$retval:s32 s=+0($arg1):string");
  Define d;
  d.probe_id = 42;
  d.counter_slot = 7;
  d.event_id = 1234;
  d.kind = ProbeKind::kReturn;
  d.enabled = true;
  d.maxactive = 16;
  d.address = 0x401000;
  d.bounds.start = 0x401000;
  d.bounds.end = 0x401100;
  d.bounds.landing_pads = {0x401020, 0x401080};
  d.bounds.related = {{0x402000, 0x402040}};
  d.symbol = "f";
  d.symbol_addr = 0x401000;
  d.module = "libx.so.1";
  d.ref_ctr = 0x404038;
  d.program = ev.program;
  CompiledFilter f;
  Diagnostic diag;
  EXPECT_TRUE(compile_filter("ret > 3 && s ~ \"a*\"", ev, &f, &diag));
  d.filter = f;
  return d;
}

Message roundtrip(const Message& m) {
  auto packets = encode(m);
  EXPECT_EQ(packets.size(), 1u);
  Message out;
  std::string why;
  EXPECT_EQ(decode(packets[0].data(), packets[0].size(), &out, &why), 0) << why;
  EXPECT_EQ(out.type, m.type);
  EXPECT_EQ(out.flags, m.flags);
  EXPECT_EQ(out.seq, m.seq);
  return out;
}

TEST(Link, EveryMessageRoundTrips) {
  Message m;
  m.seq = 9;

  m.type = MsgType::kSetup;
  m.body = SetupMsg{1 << 20, 2, kSetupSyscallReads};
  SetupMsg s = std::get<SetupMsg>(roundtrip(m).body);
  EXPECT_EQ(s.area_size, 1u << 20);
  EXPECT_EQ(s.trace_clock, 2u);
  EXPECT_EQ(s.options, kSetupSyscallReads);

  m.type = MsgType::kDefine;
  m.flags = kFlagAnswer;
  const Define d0 = sample_define();
  m.body = d0;
  const Define d = std::get<Define>(roundtrip(m).body);
  m.flags = 0;
  EXPECT_EQ(d.probe_id, d0.probe_id);
  EXPECT_EQ(d.counter_slot, d0.counter_slot);
  EXPECT_EQ(d.event_id, d0.event_id);
  EXPECT_EQ(d.kind, d0.kind);
  EXPECT_EQ(d.enabled, d0.enabled);
  EXPECT_EQ(d.maxactive, d0.maxactive);
  EXPECT_EQ(d.address, d0.address);
  EXPECT_EQ(d.bounds.start, d0.bounds.start);
  EXPECT_EQ(d.bounds.end, d0.bounds.end);
  EXPECT_EQ(d.bounds.landing_pads, d0.bounds.landing_pads);
  ASSERT_EQ(d.bounds.related.size(), 1u);
  EXPECT_EQ(d.bounds.related[0].start, 0x402000u);
  EXPECT_EQ(d.symbol, "f");
  EXPECT_EQ(d.module, "libx.so.1");
  EXPECT_EQ(d.program.insns.size(), d0.program.insns.size());
  EXPECT_EQ(d.program.fixed_size, d0.program.fixed_size);
  EXPECT_EQ(d.program.entry_args, 1u);
  ASSERT_TRUE(d.filter.has_value());
  EXPECT_EQ(d.filter->text, d0.filter->text);
  EXPECT_EQ(d.filter->insns.size(), d0.filter->insns.size());
  EXPECT_EQ(d.ref_ctr, 0x404038u);
  // A reference counter is a u16: an odd address is refused.
  {
    Define odd = d0;
    odd.ref_ctr = 0x404039;
    Message mo = m;
    mo.body = odd;
    std::vector<std::vector<uint8_t>> pk = encode(mo);
    ASSERT_EQ(pk.size(), 1u);
    Message out;
    EXPECT_NE(decode(pk[0].data(), pk[0].size(), &out), 0);
  }

  for (MsgType t : {MsgType::kRemove, MsgType::kEnable, MsgType::kDisable}) {
    m.type = t;
    m.body = ProbeRef{77};
    EXPECT_EQ(std::get<ProbeRef>(roundtrip(m).body).probe_id, 77u);
  }

  m.type = MsgType::kSetFilter;
  m.body = SetFilter{3, std::nullopt};
  EXPECT_FALSE(std::get<SetFilter>(roundtrip(m).body).filter.has_value());
  m.body = SetFilter{3, d0.filter};
  EXPECT_EQ(std::get<SetFilter>(roundtrip(m).body).filter->text, d0.filter->text);

  m.type = MsgType::kOptimization;
  m.body = Optimization{false};
  EXPECT_FALSE(std::get<Optimization>(roundtrip(m).body).on);

  for (MsgType t : {MsgType::kArmAll, MsgType::kDisarmAll, MsgType::kList, MsgType::kProfile,
                    MsgType::kGo, MsgType::kDetach, MsgType::kBlacklist,
                    MsgType::kListChanged}) {
    m.type = t;
    m.body = std::monostate{};
    EXPECT_EQ(roundtrip(m).body.index(), 0u);
  }

  m.type = MsgType::kHello;
  m.body = Hello{kAgentAbiVersion, 123, 45, HelloReason::kFork, {7, 9, 4000000000u}};
  Hello h = std::get<Hello>(roundtrip(m).body);
  EXPECT_EQ(h.pid, 123);
  EXPECT_EQ(h.ppid, 45);
  EXPECT_EQ(h.reason, HelloReason::kFork);
  EXPECT_EQ(h.probe_ids, (std::vector<uint32_t>{7, 9, 4000000000u}));

  m.type = MsgType::kBranches;
  m.body = Branches{259, 3, 1234567, 0x28000, 0x160000};
  Branches b = std::get<Branches>(roundtrip(m).body);
  EXPECT_EQ(b.dev_major, 259u);
  EXPECT_EQ(b.dev_minor, 3u);
  EXPECT_EQ(b.inode, 1234567u);
  EXPECT_EQ(b.offset, 0x28000u);
  EXPECT_EQ(b.length, 0x160000u);
  m.body = Branches{1, 2, 3, 4, 0};
  EXPECT_TRUE(encode(m).empty());  // an empty mapping has no table

  m.type = MsgType::kUnwind;
  m.body = Unwind{0x7f0000001000, 0x7f0000180000};
  Unwind u = std::get<Unwind>(roundtrip(m).body);
  EXPECT_EQ(u.start, 0x7f0000001000u);
  EXPECT_EQ(u.end, 0x7f0000180000u);
  m.body = Unwind{0x2000, 0x2000};
  EXPECT_TRUE(encode(m).empty());  // an empty range
  m.body = Unwind{0x1000, 0x1000 + arch::kUnwindMaxLength + 1};
  EXPECT_TRUE(encode(m).empty());  // longer than a table describes

  m.type = MsgType::kMapped;
  m.body = Mapped{MappedKind::kUnmapped};
  EXPECT_EQ(std::get<Mapped>(roundtrip(m).body).kind, MappedKind::kUnmapped);

  m.type = MsgType::kReply;
  m.body = Reply{-ENOENT, "no such probe", {{1, 2}, {3, 4}}};
  Reply r = std::get<Reply>(roundtrip(m).body);
  EXPECT_EQ(r.error, -ENOENT);
  EXPECT_EQ(r.message, "no such probe");
  ASSERT_EQ(r.profile.size(), 2u);
  EXPECT_EQ(r.profile[1].nmissed, 4u);
}

TEST(Link, HistMessagesRoundTripAndAreChecked) {
  Message m;
  m.seq = 4;
  m.type = MsgType::kHistTable;
  HistTable t;
  t.slot = 5;
  t.geometry.key_bytes = 24;
  t.geometry.nvals = 2;
  t.geometry.capacity_bits = 9;
  t.geometry.with_comm = true;
  t.rings = 64;
  m.body = t;
  HistTable t2 = std::get<HistTable>(roundtrip(m).body);
  EXPECT_EQ(t2.slot, 5u);
  EXPECT_FALSE(t2.release);
  EXPECT_EQ(t2.geometry.signature(), t.geometry.signature());
  EXPECT_EQ(t2.rings, 64u);
  for (void (*bad)(HistTable*) : {+[](HistTable* h) { h->slot = kHistMaxSlots; },
                                  +[](HistTable* h) { h->rings = 0; }}) {
    HistTable b = t;
    bad(&b);
    m.body = b;
    EXPECT_TRUE(encode(m).empty());
  }

  m.type = MsgType::kSetHist;
  SetHist sh;
  sh.probe_id = 8;
  sh.record = false;
  HistProgram p;
  p.slot = 5;
  p.nkeys = 2;
  p.keys[0].offset = 16;
  p.keys[0].size = 4;
  p.keys[0].is_signed = true;
  p.keys[1].source = HistSource::kString;
  p.keys[1].offset = 20;
  p.keys[1].key_offset = 8;
  p.keys[1].key_size = 16;
  p.nvals = 2;
  p.vals[0].offset = 24;
  p.vals[1].source = HistSource::kCpu;
  p.vals[1].transform = HistTransform::kBuckets;
  p.vals[1].buckets = 4;
  p.filter = sample_define().filter;
  sh.programs.push_back(p);
  sh.geometries.push_back(t.geometry);
  m.body = sh;
  SetHist s2 = std::get<SetHist>(roundtrip(m).body);
  EXPECT_EQ(s2.probe_id, 8u);
  EXPECT_FALSE(s2.record);
  ASSERT_EQ(s2.programs.size(), 1u);
  EXPECT_EQ(s2.programs[0].keys[1].source, HistSource::kString);
  EXPECT_EQ(s2.programs[0].keys[1].key_size, 16u);
  EXPECT_TRUE(s2.programs[0].keys[0].is_signed);
  EXPECT_EQ(s2.programs[0].vals[1].buckets, 4u);
  ASSERT_TRUE(s2.programs[0].filter.has_value());
  // Every bound the agent relies on is checked when decoding.
  auto decodes_from = [&](const SetHist& base, const std::function<void(SetHist*)>& change) {
    SetHist b = base;
    change(&b);
    Message mm = m;
    mm.body = b;
    std::vector<std::vector<uint8_t>> pk = encode(mm);
    if (pk.empty()) return false;
    Message out;
    return decode(pk[0].data(), pk[0].size(), &out) == 0;
  };
  auto decodes = [&](const std::function<void(SetHist*)>& change) { return decodes_from(sh, change); };
  EXPECT_TRUE(decodes([](SetHist*) {}));
  EXPECT_FALSE(decodes([](SetHist* b) { b->programs[0].keys[1].key_offset = 16; }));
  EXPECT_FALSE(decodes([](SetHist* b) { b->programs[0].keys[1].key_size = 12; }));
  EXPECT_FALSE(decodes([](SetHist* b) { b->programs[0].keys[0].size = 3; }));
  EXPECT_FALSE(decodes([](SetHist* b) { b->programs[0].vals[1].buckets = 0; }));
  EXPECT_FALSE(decodes([](SetHist* b) { b->programs[0].vals[0].source = HistSource::kString; }));
  EXPECT_FALSE(decodes([](SetHist* b) { b->programs[0].nkeys = 0; }));
  EXPECT_FALSE(decodes([](SetHist* b) { b->geometries[0].capacity_bits = kHistMaxBits + 1; }));
  EXPECT_FALSE(decodes([](SetHist* b) { b->programs[0].slot = kHistMaxSlots; }));
  EXPECT_FALSE(decodes([](SetHist* b) { b->programs[0].nkeys = 1; }));  // a gap in the key

  // Inter-event parts: variables, references, an action; a synthetic event's own form.
  SetHist inter = sh;
  inter.geometries[0].nvars = 2;
  HistProgram& q = inter.programs[0];
  q.nvars = 2;
  q.vars[0].a.source = HistSource::kTimestamp;
  q.vars[0].a.transform = HistTransform::kUsecs;
  q.vars[1].op = HistOp::kSub;
  q.vars[1].a.offset = 24;
  q.vars[1].b.source = HistSource::kVarRef;
  q.vars[1].b.offset = 0;
  q.nrefs = 1;
  q.refs[0].slot = 9;
  q.refs[0].var = 1;
  q.refs[0].geometry = inter.geometries[0];
  q.action.synth_id = 77;
  q.action.nparams = 2;
  q.action.params[0].source = HistSource::kVar;
  q.action.params[0].offset = 1;
  q.action.params[1].source = HistSource::kConst;
  q.action.params[1].value = 123456789;
  q.action.param_offset[0] = 8;
  q.action.param_size[0] = 8;
  q.action.param_offset[1] = 16;
  q.action.param_size[1] = 4;
  inter.clock = {11, 22, 33};
  m.body = inter;
  SetHist i2 = std::get<SetHist>(roundtrip(m).body);
  ASSERT_EQ(i2.programs.size(), 1u);
  const HistProgram& q2 = i2.programs[0];
  EXPECT_EQ(q2.nvars, 2u);
  EXPECT_EQ(q2.vars[0].a.transform, HistTransform::kUsecs);
  EXPECT_EQ(q2.vars[1].op, HistOp::kSub);
  EXPECT_EQ(q2.vars[1].b.source, HistSource::kVarRef);
  EXPECT_EQ(q2.refs[0].slot, 9u);
  EXPECT_EQ(q2.refs[0].geometry.nvars, 2u);
  EXPECT_EQ(q2.action.synth_id, 77u);
  EXPECT_EQ(q2.action.params[1].value, 123456789u);
  EXPECT_EQ(q2.action.param_size[1], 4u);
  EXPECT_EQ(i2.clock.mult, 33u);
  auto inter_decodes = [&](const std::function<void(SetHist*)>& change) {
    return decodes_from(inter, change);
  };
  EXPECT_TRUE(inter_decodes([](SetHist*) {}));
  EXPECT_TRUE(inter_decodes([](SetHist* b) { b->programs[0].vars[1].op = HistOp::kDiv; }));
  EXPECT_FALSE(inter_decodes(
      [](SetHist* b) { b->programs[0].vars[1].op = static_cast<HistOp>(5); }));
  // The instances' buffers and filters: bit 0 is the top level's (`record`), and an
  // instance filter names a buffer of an instance, once.
  const std::optional<CompiledFilter> filter = sample_define().filter;
  EXPECT_TRUE(inter_decodes([&](SetHist* b) {
    b->instances = 0b110;
    b->instance_filters.resize(3);
    b->instance_filters[2] = filter;
  }));
  SetHist with_filter = inter;
  with_filter.instances = 0b100;
  with_filter.instance_filters.resize(3);
  with_filter.instance_filters[2] = filter;
  m.body = with_filter;
  const SetHist f2 = std::get<SetHist>(roundtrip(m).body);
  EXPECT_EQ(f2.instances, 0b100u);
  ASSERT_EQ(f2.instance_filters.size(), 3u);
  EXPECT_FALSE(f2.instance_filters[1].has_value());
  EXPECT_TRUE(f2.instance_filters[2].has_value());
  EXPECT_FALSE(inter_decodes([](SetHist* b) { b->instances = 1; }));
  EXPECT_FALSE(inter_decodes([](SetHist* b) { b->instances = 1u << kRingMaxBuffers; }));
  // Triggers and soft mode per buffer: an instance's trigger acts on its buffer.
  SetHist per_buffer = inter;
  per_buffer.soft = 0b101;
  TriggerSpec ts;
  ts.action = TriggerAction::kDisableEvent;
  ts.target_event = 0x7001;
  ts.buffer = 2;
  per_buffer.triggers.push_back(ts);
  m.body = per_buffer;
  const SetHist pb = std::get<SetHist>(roundtrip(m).body);
  EXPECT_EQ(pb.soft, 0b101u);
  ASSERT_EQ(pb.triggers.size(), 1u);
  EXPECT_EQ(pb.triggers[0].buffer, 2u);
  EXPECT_EQ(pb.triggers[0].target_event, 0x7001u);
  EXPECT_FALSE(decodes_from(per_buffer, [](SetHist* b) { b->triggers[0].buffer = kRingMaxBuffers; }));
  EXPECT_FALSE(decodes_from(per_buffer, [](SetHist* b) { b->soft = 1u << kRingMaxBuffers; }));
  EXPECT_FALSE(inter_decodes([&](SetHist* b) {
    b->instance_filters.resize(1);
    b->instance_filters[0] = filter;
  }));
  EXPECT_FALSE(inter_decodes([](SetHist* b) { b->programs[0].refs[0].var = 2; }));
  EXPECT_FALSE(inter_decodes([](SetHist* b) { b->programs[0].refs[0].geometry.key_bytes = 8; }));
  EXPECT_FALSE(inter_decodes([](SetHist* b) { b->programs[0].vars[1].b.offset = kHistMaxVarRefs; }));
  EXPECT_FALSE(inter_decodes([](SetHist* b) { b->programs[0].action.param_size[0] = 3; }));
  EXPECT_FALSE(inter_decodes([](SetHist* b) { b->programs[0].action.param_offset[0] = 4; }));
  EXPECT_FALSE(inter_decodes([](SetHist* b) { b->geometries[0].nvars = 1; }));  // 2 vars
  EXPECT_FALSE(inter_decodes([](SetHist* b) { b->programs[0].keys[0].source = HistSource::kTimestamp; }));
  // onmax($var).save(fields): the slot's kind and saved count, the program's variable.
  SetHist track = inter;
  track.geometries[0].track = HistTrackKind::kMax;
  track.geometries[0].nsave = 2;
  HistProgram& tp = track.programs[0];
  tp.track.kind = HistTrackKind::kMax;
  tp.track.var = 1;
  tp.track.nsave = 2;
  tp.track.save[0] = tp.vars[1].a;
  tp.track.save[1].source = HistSource::kCpu;
  tp.track.fires = true;
  m.body = track;
  SetHist tr2 = std::get<SetHist>(roundtrip(m).body);
  ASSERT_EQ(tr2.programs.size(), 1u);
  EXPECT_EQ(tr2.geometries[0].track, HistTrackKind::kMax);
  EXPECT_EQ(tr2.geometries[0].nsave, 2u);
  EXPECT_EQ(tr2.geometries[0].signature(), track.geometries[0].signature());
  EXPECT_EQ(tr2.programs[0].track.kind, HistTrackKind::kMax);
  EXPECT_EQ(tr2.programs[0].track.var, 1u);
  EXPECT_TRUE(tr2.programs[0].track.fires);
  EXPECT_EQ(tr2.programs[0].track.save[0].offset, 24u);
  EXPECT_EQ(tr2.programs[0].track.save[1].source, HistSource::kCpu);
  auto track_decodes = [&](const std::function<void(SetHist*)>& change) {
    return decodes_from(track, change);
  };
  EXPECT_TRUE(track_decodes([](SetHist*) {}));
  EXPECT_FALSE(track_decodes([](SetHist* b) { b->programs[0].track.var = 2; }));  // 2 vars
  EXPECT_FALSE(track_decodes([](SetHist* b) { b->programs[0].track.nsave = 3; }));
  EXPECT_FALSE(track_decodes([](SetHist* b) { b->programs[0].track.kind = HistTrackKind::kChange; }));
  EXPECT_FALSE(track_decodes([](SetHist* b) { b->programs[0].action.synth_id = 0; b->programs[0].action.nparams = 0; }));
  EXPECT_FALSE(track_decodes([](SetHist* b) { b->geometries[0].nsave = kHistMaxParams + 1; }));
  EXPECT_FALSE(track_decodes([](SetHist* b) { b->programs[0].track.save[0].source = HistSource::kString; }));
  EXPECT_FALSE(track_decodes([](SetHist* b) { b->programs[0].track.save[0].source = HistSource::kStack; }));
  // A stack key takes kHistStackBytes of the key, and only a key.
  SetHist stacks = sh;
  stacks.geometries[0].key_bytes = kHistStackBytes + 16;  // and the string key after it
  stacks.programs[0].keys[0].source = HistSource::kStack;
  stacks.programs[0].keys[0].key_size = kHistStackBytes;
  stacks.programs[0].keys[1].key_offset = kHistStackBytes;
  m.body = stacks;
  SetHist st2 = std::get<SetHist>(roundtrip(m).body);
  ASSERT_EQ(st2.programs.size(), 1u);
  EXPECT_EQ(st2.programs[0].keys[0].source, HistSource::kStack);
  EXPECT_TRUE(st2.programs[0].wants_stack());
  EXPECT_TRUE(decodes_from(stacks, [](SetHist*) {}));
  EXPECT_FALSE(decodes_from(stacks, [](SetHist* b) { b->programs[0].keys[0].key_size = 64; }));
  EXPECT_FALSE(decodes_from(stacks, [](SetHist* b) { b->programs[0].vals[0].source = HistSource::kStack; }));
  SetHist synth;
  synth.synth_id = 77;
  synth.synth_size = 24;
  synth.record = true;
  synth.synth_filter = sample_define().filter;
  m.body = synth;
  SetHist sy2 = std::get<SetHist>(roundtrip(m).body);
  EXPECT_EQ(sy2.synth_id, 77u);
  EXPECT_EQ(sy2.synth_size, 24u);
  EXPECT_TRUE(sy2.synth_filter.has_value());
  synth.synth_size = 4;
  m.body = synth;
  std::vector<std::vector<uint8_t>> pk = encode(m);
  ASSERT_FALSE(pk.empty());
  Message out;
  EXPECT_NE(decode(pk[0].data(), pk[0].size(), &out), 0);
}

TEST(Link, EncodeRefusesWhatCannotBeSent) {
  Message m;
  m.type = MsgType::kDefine;
  m.body = ProbeRef{1};  // not a DEFINE's body
  EXPECT_TRUE(encode(m).empty());
  Define d = sample_define();
  d.program.fixed_size = 1;  // does not validate
  m.body = d;
  EXPECT_TRUE(encode(m).empty());
  d = sample_define();
  d.symbol.assign(kMaxNameLen + 1, 'x');
  m.body = d;
  EXPECT_TRUE(encode(m).empty());
  m.type = MsgType::kSetup;
  m.body = SetupMsg{4096, 0, 0x80};  // unknown option
  EXPECT_TRUE(encode(m).empty());
  m.type = MsgType::kGo;
  m.flags = 0x40;
  m.body = std::monostate{};
  EXPECT_TRUE(encode(m).empty());
}

// LIST_CHANGED, the agent's notice: a header and nothing else, no flag.
TEST(Link, ListChangedIsABareHeader) {
  Message m;
  m.type = MsgType::kListChanged;
  m.seq = 9;
  const auto packets = encode(m);
  ASSERT_EQ(packets.size(), 1u);
  ASSERT_EQ(packets[0].size(), kHeaderSize);
  EXPECT_STREQ(type_name(MsgType::kListChanged), "LIST_CHANGED");
  Message out;
  ASSERT_EQ(decode(packets[0].data(), packets[0].size(), &out), 0);
  EXPECT_EQ(out.type, MsgType::kListChanged);
  EXPECT_EQ(out.seq, 9u);
  EXPECT_EQ(out.body.index(), 0u);
  // A payload, even one byte, or a flag: refused.
  std::vector<uint8_t> p = packets[0];
  p.push_back(0);
  const uint32_t one = 1;
  std::memcpy(&p[12], &one, 4);
  std::string why;
  EXPECT_EQ(decode(p.data(), p.size(), &out, &why), -EBADMSG);
  EXPECT_EQ(why, "bytes after the payload");
  for (uint16_t flag : {uint16_t{kFlagMore}, uint16_t{kFlagAnswer}}) {
    p = packets[0];
    std::memcpy(&p[6], &flag, 2);
    EXPECT_EQ(decode(p.data(), p.size(), &out), -EBADMSG) << flag;
  }
}

// A fork child's HELLO, encoded without allocating, is byte for byte what encode() makes;
// what does not fit, or could not be sent, is 0.
TEST(Link, HelloEncodedInPlaceIsEncodes) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{37}}) {
    Hello h;
    h.pid = 4242;
    h.ppid = 4241;
    h.reason = HelloReason::kFork;
    h.spare_id = n == 0 ? 0 : 9;
    std::vector<uint32_t> ids;
    for (size_t i = 0; i < n; ++i) ids.push_back(static_cast<uint32_t>(1000 + 7 * i));
    Message m;
    m.type = MsgType::kHello;
    m.seq = 77;
    Hello with = h;
    with.probe_ids = ids;
    m.body = with;
    const auto packets = encode(m);
    ASSERT_EQ(packets.size(), 1u);
    std::vector<uint8_t> buf(packets[0].size() + 8, 0xee);
    ASSERT_EQ(encode_hello(buf.data(), buf.size(), 77, h, ids.data(), n), packets[0].size()) << n;
    EXPECT_TRUE(std::equal(packets[0].begin(), packets[0].end(), buf.begin())) << n;
    EXPECT_EQ(buf[packets[0].size()], 0xee);  // nothing past it
    // One byte short: nothing.
    EXPECT_EQ(encode_hello(buf.data(), packets[0].size() - 1, 77, h, ids.data(), n), 0u);
  }
  std::vector<uint8_t> buf(256);
  Hello h;
  h.reason = HelloReason::kLaunch;
  h.spare_id = 3;  // only a fork child names a spare
  EXPECT_EQ(encode_hello(buf.data(), buf.size(), 1, h, nullptr, 0), 0u);
  h.spare_id = 0;
  h.reason = static_cast<HelloReason>(9);
  EXPECT_EQ(encode_hello(buf.data(), buf.size(), 1, h, nullptr, 0), 0u);
  h.reason = HelloReason::kExec;
  EXPECT_EQ(encode_hello(buf.data(), buf.size(), 1, h, nullptr, 0), kHeaderSize + 24);
}

// Each case: a mutation of a valid packet, and the fact that it must not decode.
TEST(Link, DecodeRefusesMalformedPackets) {
  Message m;
  m.type = MsgType::kDefine;
  m.seq = 5;
  m.body = sample_define();
  const std::vector<uint8_t> good = encode(m)[0];
  Message out;
  ASSERT_EQ(decode(good.data(), good.size(), &out), 0);

  auto refused = [](std::vector<uint8_t> p, const char* what) {
    Message o;
    std::string why;
    EXPECT_EQ(decode(p.data(), p.size(), &o, &why), -EBADMSG) << what;
    EXPECT_FALSE(why.empty()) << what;
  };
  // Every truncation.
  for (size_t n = 0; n < good.size(); ++n)
    refused(std::vector<uint8_t>(good.begin(), good.begin() + n), "truncated");
  // A byte more (the header's length left as it was, and adjusted).
  {
    auto p = good;
    p.push_back(0);
    refused(p, "longer than its header says");
    uint32_t len;
    std::memcpy(&len, &p[12], 4);
    ++len;
    std::memcpy(&p[12], &len, 4);
    refused(p, "a byte after the payload");
  }
  auto with = [&](size_t at, uint8_t v) {
    auto p = good;
    p[at] = v;
    return p;
  };
  refused(with(0, 0x02), "another version");
  refused(with(3, 0x51), "another magic");
  refused(with(4, 0x7f), "unknown type");
  refused(with(6, 0x10), "unknown flag");
  refused(with(16 + 10, 9), "unknown probe kind");
  refused(with(16 + 11, 2), "bool out of range");
  {
    Message b;
    b.type = MsgType::kBranches;
    b.seq = 6;
    b.body = Branches{8, 1, 99, 0, 4096};
    const std::vector<uint8_t> table = encode(b)[0];
    ASSERT_EQ(table.size(), 16u + 32u);
    std::vector<uint8_t> p = table;
    std::memset(&p[16 + 24], 0, 8);
    refused(p, "a branch table of an empty mapping");
    p[16 + 24 + 4] = 2;  // 2^33 bytes
    refused(p, "a branch table of a mapping past 4 GiB");
  }
  // Every single-byte corruption either decodes to a message that encodes again (the
  // byte was a value, not structure) or is refused: never a crash or an over-read.
  for (size_t at = 0; at < good.size(); ++at) {
    for (uint8_t v : {uint8_t{0}, uint8_t{0xff}, uint8_t{0x80}}) {
      auto p = with(at, v);
      Message o;
      if (decode(p.data(), p.size(), &o) == 0) {
        EXPECT_FALSE(encode(o).empty()) << at;
      }
    }
  }
  // Bounds out of order, pads outside, an address outside its bounds.
  Define d = sample_define();
  d.bounds.landing_pads = {0x401080, 0x401020};
  m.body = d;
  auto p = encode(m);
  ASSERT_EQ(p.size(), 1u);
  refused(p[0], "pads not sorted");
  d = sample_define();
  d.bounds.landing_pads = {0x409000};
  m.body = d;
  refused(encode(m)[0], "pad outside");
  d = sample_define();
  d.address = 0x500000;
  m.body = d;
  refused(encode(m)[0], "address outside its bounds");
  d = sample_define();
  d.kind = ProbeKind::kEntry;  // the program is a return probe's
  d.maxactive = 0;
  m.body = d;
  refused(encode(m)[0], "program kind");
  // A REPLY with a positive error.
  m.type = MsgType::kReply;
  m.body = Reply{5, "", {}};
  refused(encode(m)[0], "positive errno");
  // A HELLO with a pid of 0.
  m.type = MsgType::kHello;
  m.body = Hello{kAgentAbiVersion, 0, 1, HelloReason::kLaunch, {}};
  refused(encode(m)[0], "pid 0");
  // A HELLO that counts more probe ids than it carries.
  m.body = Hello{kAgentAbiVersion, 7, 1, HelloReason::kFork, {1, 2}};
  std::vector<uint8_t> cut = encode(m)[0];
  cut.resize(cut.size() - 4);
  refused(cut, "probe ids cut short");
}

TEST(Link, DecodeSurvivesRandomBytes) {
  uint64_t x = 88172645463325252ull;
  auto next = [&] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> p(next() % 300);
    for (uint8_t& b : p) b = static_cast<uint8_t>(next());
    if (p.size() >= 16 && (i & 1)) {  // a sound header more often than chance gives
      const uint32_t magic = kMagic;
      std::memcpy(&p[0], &magic, 4);
      const uint16_t type = static_cast<uint16_t>(1 + next() % 13);
      std::memcpy(&p[4], &type, 2);
      p[6] = p[7] = 0;
      const uint32_t len = static_cast<uint32_t>(p.size() - 16);
      std::memcpy(&p[12], &len, 4);
    }
    Message o;
    if (decode(p.data(), p.size(), &o) == 0) {
      EXPECT_FALSE(encode(o).empty());
    }
  }
}

TEST(Link, LongRepliesSplitAndReassemble) {
  Message m;
  m.type = MsgType::kReply;
  m.seq = 17;
  Reply r;
  r.message.assign(kMaxMessageSize * 2 + 123, 'l');
  for (uint32_t i = 0; i < 40000; ++i) r.profile.push_back({i, i * 3ull});
  m.body = r;
  const auto packets = encode(m);
  ASSERT_GT(packets.size(), 2u);
  ReplyAssembler as;
  int done = 0;
  for (size_t i = 0; i < packets.size(); ++i) {
    EXPECT_LE(packets[i].size(), kMaxMessageSize);
    Message o;
    ASSERT_EQ(decode(packets[i].data(), packets[i].size(), &o), 0);
    EXPECT_EQ((o.flags & kFlagMore) != 0, i + 1 < packets.size());
    done = as.add(o);
  }
  ASSERT_EQ(done, 1);
  EXPECT_EQ(as.seq(), 17u);
  Reply got = as.take();
  EXPECT_EQ(got.message, r.message);
  ASSERT_EQ(got.profile.size(), r.profile.size());
  EXPECT_EQ(got.profile.back().nmissed, r.profile.back().nmissed);
  // A packet of another reply in the middle is refused.
  Message first, other;
  ASSERT_EQ(decode(packets[0].data(), packets[0].size(), &first), 0);
  other.type = MsgType::kReply;
  other.seq = 18;
  other.body = Reply{};
  ReplyAssembler as2;
  EXPECT_EQ(as2.add(first), 0);
  EXPECT_EQ(as2.add(other), -EBADMSG);
}

// A reply that never ends is cut at kMaxReplySize, text and profile counted together,
// and the assembler is ready for the next one.
TEST(Link, RepliesAreCappedInAssembly) {
  Message m;
  m.type = MsgType::kReply;
  m.flags = kFlagMore;
  m.seq = 5;
  m.body = Reply{0, std::string(kMaxMessageText - 16, 't'), {}};
  ReplyAssembler as;
  size_t added = 0;
  int rc = 0;
  while ((rc = as.add(m)) == 0) added += kMaxMessageText - 16;
  EXPECT_EQ(rc, -E2BIG);
  EXPECT_LE(added, kMaxReplySize);
  EXPECT_GT(added + 2 * (kMaxMessageText - 16), kMaxReplySize);
  // Profile entries count 12 bytes each.
  Message p;
  p.type = MsgType::kReply;
  p.flags = kFlagMore;
  p.seq = 6;
  Reply pr;
  pr.profile.resize((kMaxMessageText - 16) / 12);
  p.body = pr;
  size_t entries = 0;
  while ((rc = as.add(p)) == 0) entries += pr.profile.size();
  EXPECT_EQ(rc, -E2BIG);
  EXPECT_LE(entries * 12, kMaxReplySize);
  // A whole reply below the cap still assembles.
  m.flags = 0;
  EXPECT_EQ(as.add(m), 1);
  EXPECT_EQ(as.take().message.size(), kMaxMessageText - 16);
}

}  // namespace
}  // namespace probefs::events::link
