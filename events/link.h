// The agent link: the private channel between the daemon and the agent inside one traced
// process (DESIGN.md §5). Shared by both ends: the daemon side (tracee/agent_link.h) and
// the agent (agent/); this file holds the message formats, their encoding and the strict
// decoding every received packet goes through: pure data. The sockets that carry them,
// one message per SOCK_SEQPACKET packet, are link/socket.h's.
//
// A packet is a 16-byte header followed by the payload, every field little-endian:
//
//   0  u32 magic         kMagic: "PFL" and the protocol version in the low byte
//   4  u16 type          MsgType
//   6  u16 flags         MsgFlags
//   8  u32 seq           the sender's sequence number; a REPLY carries the request's
//  12  u32 payload_len   bytes after the header: exactly the rest of the packet
//
// Payloads are packed (no padding): integers at their natural size, bool as one byte that
// is 0 or 1, strings and byte blocks as u32 length + bytes, lists as u32 count + items.
// A message's layout is written next to its struct below.
//
// Decoding is strict: a packet that is shorter or longer than its header says, an unknown
// type or flag, a payload with bytes left over or missing, an enum or bool out of range, a
// length past a limit, bounds that are not ordered, a fetch program or filter that
// events/wire.h refuses: each is an error (decode() returns -EBADMSG and says why), never
// undefined behaviour, whatever the bytes. The agent answers such a request with a REPLY
// carrying the error and changes nothing.
//
// Sequence numbers: each end numbers its own requests (the daemon: every daemon->agent
// message; the agent: HELLO and MAPPED), starting at 1. A REPLY's seq is the seq of the
// request it answers. Either end may have several requests in flight.
//
// Conversation:
//   launch/exec:  agent HELLO -> daemon SETUP, BRANCHES..., DEFINE..., GO   (each
//                 answered by REPLY)
//                 The program's main does not run before GO (or the agent's bounded wait
//                 for it ends, or the daemon goes away).
//   attach/fork:  agent HELLO -> daemon SETUP, DEFINE... (the program runs meanwhile; a
//                 fork child waits for GO like a launched program, its code already probed)
//   spare area:   daemon SPARE -> agent REPLY: a second ring area, held for the next fork
//   fork, spare:  the child records into its parent's spare at once and says HELLO naming
//                 it, waiting for nothing; the daemon then sends the parent the next SPARE
//   any time:     daemon DEFINE, REMOVE, ENABLE, DISABLE, SET_FILTER, ARM_ALL, DISARM_ALL,
//                 OPTIMIZATION, LIST, PROFILE, BLACKLIST -> agent REPLY
//   dlopen:       agent MAPPED (seq S) -> daemon DEFINE... with kFlagAnswer, then REPLY(S);
//                 the agent then answers each of those DEFINEs with a REPLY (see MAPPED)
//   optimizer:    agent LIST_CHANGED, a notice that nobody answers: the engine's optimizer
//                 thread changed what LIST would say, outside any request (a probe it
//                 optimized on a retry, or unoptimized); sent only once SETUP came
//   detach:       daemon DETACH -> agent removes every probe, REPLY, closes the link
//   tracer death: the agent reads EOF, removes every probe and goes idle
//
// Threads: every function here may be called from any thread; none keeps state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "arch/text_range.h"
#include "arch/unwind_table.h"
#include "events/compile.h"
#include "events/control_page.h"
#include "events/filter.h"
#include "events/hist.h"

namespace probefs::events::link {

inline constexpr uint32_t kVersion = 1;
inline constexpr uint32_t kMagic = 0x50464c00u | kVersion;  // "\x01LFP" in memory
// The agent's ABI version as HELLO reports it: bumped whenever what the agent understands
// changes in a way the daemon must know about.
inline constexpr uint32_t kAgentAbiVersion = 11;  // 2: LIST_CHANGED, 3: BRANCHES, 4: SPARE,
                                                  // 5: HIST_TABLE, SET_HIST,
                                                  // 6: variables, actions, synthetic
                                                  // 7: onmax, onchange, stack keys,
                                                  //    SET_HIST's stack flag
                                                  // 8: UNWIND
                                                  // 9: CONTROL, SET_HIST's triggers
                                                  //    and soft mode
                                                  // 10: buffers (instances): the
                                                  //    ring's buffer, SET_HIST's
                                                  //    instances
                                                  // 11: triggers and soft mode per
                                                  //    buffer (the control page's
                                                  //    u16 soft-disabled bits),
                                                  //    snapshot triggers, DEFINE's
                                                  //    reference counter

inline constexpr size_t kHeaderSize = 16;
// The largest packet either end sends or accepts. Below the default socket send buffer
// (net.core.wmem_default, 212992 bytes), which bounds a SOCK_SEQPACKET message.
inline constexpr size_t kMaxMessageSize = 192 * 1024;

// Limits that decoding enforces on top of the packet size.
inline constexpr size_t kMaxNameLen = 4096;        // symbol and module names in DEFINE
inline constexpr size_t kMaxLandingPads = 8192;
inline constexpr size_t kMaxRelatedRanges = 256;
inline constexpr size_t kMaxMessageText = kMaxMessageSize - 64;  // REPLY text per packet

enum class MsgType : uint16_t {
  // daemon -> agent
  kSetup = 1,         // Setup + the ring area's memfd (SCM_RIGHTS)
  kDefine = 2,        // Define
  kRemove = 3,        // ProbeRef
  kEnable = 4,        // ProbeRef
  kDisable = 5,       // ProbeRef
  kSetFilter = 6,     // SetFilter
  kArmAll = 7,        // no payload: kprobes/enabled 1
  kDisarmAll = 8,     // no payload: kprobes/enabled 0
  kOptimization = 9,  // Optimization
  kList = 10,         // no payload; the REPLY's text is probecore::kprobes_list()
  kProfile = 11,      // no payload; the REPLY carries one ProfileEntry per probe
  kGo = 12,           // no payload: let a launched (or exec'd, or fork) program run on
  kDetach = 13,       // no payload: remove everything, REPLY, close, go idle
  kBlacklist = 14,    // no payload; the REPLY's text: the engine's blacklist, one
                      // "0x%016lx-0x%016lx\n" line per range [start, end)
  kBranches = 15,     // Branches + the table's sealed memfd (SCM_RIGHTS)
  kSpare = 16,        // Spare + the spare ring area's memfd (SCM_RIGHTS)
  kHistTable = 17,    // HistTable [+ the tables' memfd (SCM_RIGHTS)]
  kSetHist = 18,      // SetHist
  kUnwind = 19,       // Unwind + the table's sealed memfd (SCM_RIGHTS)
  kControl = 20,      // no payload + the mount's control page memfd (SCM_RIGHTS)
  // agent -> daemon
  kHello = 0x100,     // Hello
  kMapped = 0x101,    // Mapped
  kListChanged = 0x102,  // no payload, no REPLY: the LIST text changed on its own
  // both ways
  kReply = 0x200,     // Reply
};

enum MsgFlags : uint16_t {
  // REPLY: more packets of the same reply follow (a long LIST text or PROFILE table);
  // the receiver concatenates texts and profiles until a packet without it.
  kFlagMore = 1u << 0,
  // DEFINE: part of the answer to the agent's MAPPED request that is in flight.
  kFlagAnswer = 1u << 1,
};
inline constexpr uint16_t kKnownFlags = kFlagMore | kFlagAnswer;

// SETUP: the ring area and the trace options. The area's memfd travels as SCM_RIGHTS
// ancillary data of this very packet (never by name), so no other process can open it.
// A second SETUP replaces the area (the agent stops writing into the old one first).
//   u64 area_size, u32 trace_clock, u32 options
struct Setup {
  uint64_t area_size = 0;  // bytes of the memfd the agent maps (shared)
  uint32_t trace_clock = 0;  // the area's clock as the ring layer numbers it
  uint32_t options = 0;      // kSetup* bits; unknown bits are refused
};
// Fetch arguments read target memory through the agent's SIGSEGV/SIGBUS fault fixup where
// its signal guard is in place (no system call per read), else through a system call per
// read. This option asks for system calls always (to tell the two apart when debugging).
inline constexpr uint32_t kSetupSyscallReads = 1u << 0;
inline constexpr uint32_t kKnownSetupOptions = kSetupSyscallReads;

// SPARE: a ring area held for one of the process's next fork children, as SETUP hands one
// (the memfd is this packet's SCM_RIGHTS), numbered by the daemon. The agent maps it and
// keeps it unused, with at most kMaxHeldSpares - 1 others, oldest first; a SPARE past that
// replaces the oldest, and a SETUP lets all go. At fork the child takes the oldest,
// records into it from its first instruction and names it in its HELLO
// (Hello::spare_id), so it runs on at once instead of waiting for a SETUP; the parent
// never uses it again. A process that forks while it holds none forks the way it would
// without.
//   u64 area_size, u32 trace_clock, u32 options, u32 id
// id != 0.
inline constexpr size_t kMaxHeldSpares = 2;
struct Spare {
  Setup setup;
  uint32_t id = 0;
};

// BRANCHES: where the direct branches of one executable file mapping land
// (arch/branch_targets.h), built by the daemon from the file: the table travels as a memfd
// sealed against writing, growing and shrinking, laid out as arch::build_branch_table()
// lays it out, as SCM_RIGHTS of this packet. The engine's
// optimizer reads it for the mapping with these numbers instead of sweeping the mapping.
// Sent before the DEFINEs of a process that starts (the optimizer's first use of libc is
// the agent's own guards, placed at GO), and only to an agent of ABI version 3 or later.
//   u32 dev_major, u32 dev_minor, u64 inode, u64 offset, u64 length
// 0 < length <= kMaxBranchesLength.
inline constexpr uint64_t kMaxBranchesLength = uint64_t{1} << 32;
struct Branches {
  uint32_t dev_major = 0;
  uint32_t dev_minor = 0;
  uint64_t inode = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// UNWIND: the unwind table (arch/unwind_table.h) of the executable file mapping at
// [start, end) of this process, built by the daemon from the file's .eh_frame: a memfd
// sealed against writing, growing and shrinking, as SCM_RIGHTS of this packet. The stack
// walks of the hit path (stack keys, kernel_stack records) read it for code of that
// range; a later table of the same range replaces it.
//   u64 start, u64 end
// start < end, end - start <= arch::kUnwindMaxLength.
struct Unwind {
  uint64_t start = 0;
  uint64_t end = 0;
};

enum class ProbeKind : uint8_t { kEntry = 0, kReturn = 1 };

// The function around a probe address, run-time addresses: probecore's FunctionBounds,
// which the agent hands the engine as it is (the engine cannot read ELF in the target).
//   u64 start, u64 end, u32 n, n x u64 landing pad, u32 m, m x (u64 start, u64 end)
// start <= end; pads sorted, unique, inside [start, end); related ranges start < end.
struct Bounds {
  uint64_t start = 0;
  uint64_t end = 0;
  std::vector<uint64_t> landing_pads;
  std::vector<arch::TextRange> related;
};

// DEFINE: one probe of one event in this process.
//   u32 probe_id, u32 counter_slot, u16 event_id, u8 kind, u8 enabled, u32 maxactive,
//   u64 address, Bounds, str symbol, u64 symbol_addr, str module,
//   bytes program (events::encode_program), u8 has_filter, [bytes filter (encode_filter)],
//   u64 ref_ctr (even)
struct Define {
  uint32_t probe_id = 0;      // daemon-wide unique; names the probe in later requests
  uint32_t counter_slot = 0;  // the ring area's per-probe counter slot (kprobe_profile hits)
  uint16_t event_id = 0;      // the record's common_type
  ProbeKind kind = ProbeKind::kEntry;
  bool enabled = false;       // registered enabled or disabled
  uint32_t maxactive = 0;     // return probes: instances in flight; 0: the engine's default
  uint64_t address = 0;       // run-time address of the probed instruction (entry of the
                              // function for a return probe)
  Bounds bounds;              // the function around address; start == end when unknown
  // For `kprobes/list` and the engine's knowledge of where it is: the symbol the address
  // belongs to (empty: none), its run-time address, and its object's basename (empty for
  // the executable).
  std::string symbol;
  uint64_t symbol_addr = 0;
  std::string module;
  FetchProgram program;                  // validated (events/wire.h) when decoded
  std::optional<CompiledFilter> filter;  // likewise
  // The probe's reference counter (an SDT semaphore, the kernel's ref_ctr_offset): the
  // address of a u16 the agent adds one to while the probe is enabled; 0: none.
  uint64_t ref_ctr = 0;
};

// REMOVE, ENABLE, DISABLE: u32 probe_id
struct ProbeRef {
  uint32_t probe_id = 0;
};

// SET_FILTER: u32 probe_id, u8 has_filter, [bytes filter]. No filter clears it.
struct SetFilter {
  uint32_t probe_id = 0;
  std::optional<CompiledFilter> filter;
};

// HIST_TABLE: the tables of one histogram for one ring area of this process
// (events/hist.h), as a memfd of geometry.memfd_bytes(rings) bytes that this packet
// carries (SCM_RIGHTS), mapped shared for as long as the area and the slot live; without
// a descriptor (release), the area's tables of the slot are let go. spare_id 0 names the
// area the process records into now, another a spare area (SPARE): a fork child that
// takes the spare counts into its tables from its first instruction.
//   u32 slot, u8 release, u8 with_comm, u8 nvars, u8 track, u8 nsave, u32 key_bytes,
//   u32 nvals, u32 capacity_bits, u32 rings, u32 spare_id
// slot < kHistMaxSlots; key_bytes a multiple of 8, 8..kHistMaxKeyBytes; nvals below
// kHistMaxVals; nvars at most kHistMaxVars; track a HistTrackKind, nsave at most
// kHistMaxParams and 0 without tracking; capacity_bits within kHistMinBits..
// kHistMaxBits; 0 < rings <= 65536.
struct HistTable {
  uint32_t slot = 0;
  bool release = false;
  HistGeometry geometry;
  uint32_t rings = 0;
  uint32_t spare_id = 0;
};

// SET_HIST: what the hits of one probe do besides recording: the histograms they count
// into, the event's triggers, whether they write ring records at all, and the buffers
// the event is in soft mode in (it then records into buffer b only while its bit of b in
// the control page, events/control_page.h, is clear). With synth_id set, the same for a synthetic event (no
// probe: hist actions write its records, of synth_size bytes, kept by synth_filter; no
// triggers).
//   u32 probe_id, u8 flags (1: record, 2: soft mode), u8 n, u16 synth_id,
//   u32 synth_size, u8 has_filter, [bytes filter], u64 clock anchor_tsc, u64 anchor_ns,
//   u64 mult,
//   n x (u32 slot, geometry as in HIST_TABLE, u8 nkeys, u8 nvals, u16 0,
//        nkeys x operand, nvals x operand, u8 has_filter, [bytes filter],
//        u8 nvars, u8 nrefs, u8 nparams, u8 track (kind | 0x80 when the action is the
//        handler's), u16 action synth_id, u8 tracked var, u8 nsave,
//        nvars x (u8 op, operand a, operand b), nrefs x (u32 slot, u32 var, geometry),
//        nparams x (operand, u32 field offset, u8 field size, u8 0, u16 0),
//        nsave x operand),
//   u8 t, t x (u8 action, u8 buffer, u16 target event id, u32 count slot, u8 has_filter,
//              [bytes filter]),
//   u32 instances, u8 f, f x (u8 buffer, u8 1, bytes filter), u32 soft instances
//   operand: u8 source, u8 transform, u8 size, u8 is_signed, u32 offset, u32 key_offset,
//            u32 key_size, u64 buckets, u64 value
// n <= kHistMaxPerEvent; every operand inside the key (keys) and of a known kind, a
// variable or reference index within its program; the record offsets are checked
// against the probe's (or synthetic event's) record by the agent. t <= kMaxHitTriggers,
// each of a known action, its buffer below kRingMaxBuffers, its count slot below
// kControlCountSlots or kNoCountSlot. Soft mode: flag 2 for buffer 0, `soft instances`
// (bit 0 clear) for the others.
// `instances`: the instances' buffers the probe's records go into besides the top level's
// (`record`), bit b for buffer b (events/ring.h, kRingMaxBuffers), bit 0 clear;
// `instance_filters`, by buffer, the event's filter in each instance that has one (the
// top level's is SET_FILTER's), each buffer once, none for buffer 0.
inline constexpr uint32_t kInstanceBuffers = ((1u << kRingMaxBuffers) - 1) & ~1u;
struct SetHist {
  uint32_t probe_id = 0;
  bool record = true;
  uint32_t soft = 0;  // bit b: soft mode in buffer b
  std::vector<HistProgram> programs;
  std::vector<HistGeometry> geometries;  // one per program: its slot's
  uint16_t synth_id = 0;
  uint32_t synth_size = 0;
  std::optional<CompiledFilter> synth_filter;
  HistClock clock;
  std::vector<TriggerSpec> triggers;
  uint32_t instances = 0;
  std::vector<std::optional<CompiledFilter>> instance_filters;  // by buffer
};

// OPTIMIZATION: u8 on (debug.kprobes_optimization)
struct Optimization {
  bool on = true;
};

enum class HelloReason : uint8_t {
  kLaunch = 1,  // started by the daemon with the agent preloaded; waits for GO
  kAttach = 2,  // loaded into a running process (probefs_agent_attach)
  kFork = 3,    // a fork child of a traced process; probes inherited; waits for GO unless
                // it records into its parent's spare area (Hello::spare_id)
  kExec = 4,    // a traced process exec'd a new image (same pid); waits for GO
};

// HELLO: the agent's first message on a new connection.
//   u32 abi_version, s32 pid, s32 ppid, u8 reason, u8 0, u16 0, u32 spare_id,
//   u32 n, n x u32 probe_id
struct Hello {
  uint32_t abi_version = kAgentAbiVersion;
  int32_t pid = 0;   // must equal the connection's SO_PEERCRED pid
  int32_t ppid = 0;  // a fork child's parent (checked against /proc by the daemon)
  HelloReason reason = HelloReason::kLaunch;
  // A fork child's probes, as its parent's agent had them when it forked (their ids):
  // what the daemon holds in the child, known without asking. Empty otherwise.
  std::vector<uint32_t> probe_ids;
  // A fork child that took its parent's spare area (SPARE): its id. It records there
  // already and waits for nothing. 0 otherwise (and always for other reasons).
  uint32_t spare_id = 0;
};

// MAPPED: the dynamic linker changed the set of loaded objects (r_brk with r_state
// RT_CONSISTENT). Sent by the thread that runs dlopen or dlclose, at the point where a new
// object is mapped and in the link map but not yet relocated and none of its code has run.
// That thread waits (bounded) for the daemon's answer: the DEFINEs (kFlagAnswer) of the
// probes that now resolve, then a REPLY with MAPPED's seq. It applies them itself, answers
// each DEFINE with a REPLY, and only then lets the dynamic linker go on.
//   u8 kind, u8 0, u16 0
enum class MappedKind : uint8_t {
  kMapped = 1,    // objects were added (after RT_ADD)
  kUnmapped = 2,  // objects were removed (after RT_DELETE); their probes are [GONE]
};
struct Mapped {
  MappedKind kind = MappedKind::kMapped;
};

// REPLY: the answer to a request.
//   s32 error, str message, u32 n, n x (u32 probe_id, u64 nmissed)
// error is 0 or a negative errno as the kernel returns it from the operation (-EINVAL,
// -ENOENT, -EEXIST, -EBADMSG for a message that did not decode, -EOPNOTSUPP for a type
// the receiver does not serve, -EBUSY, -ENOMEM, ...). message is human-readable text: a
// failure's reason, or the requested text (LIST). A REPLY longer than one packet is split
// with kFlagMore.
struct ProfileEntry {
  uint32_t probe_id = 0;
  uint64_t nmissed = 0;  // the kprobe's nmissed + the kretprobe's nmissed
};
struct Reply {
  int32_t error = 0;
  std::string message;
  std::vector<ProfileEntry> profile;  // PROFILE only
};

using Body = std::variant<std::monostate, Setup, Define, ProbeRef, SetFilter, Optimization,
                          Hello, Mapped, Reply, Branches, Spare, HistTable, SetHist,
                          Unwind>;

struct Message {
  MsgType type = MsgType::kReply;
  uint16_t flags = 0;
  uint32_t seq = 0;
  Body body;  // the alternative type's payload calls for; monostate for none
};

// The payload alternative a type carries (the index into Body).
size_t body_index(MsgType type);
// "SETUP", "DEFINE", ... for logs; "?" for an unknown type.
const char* type_name(MsgType type);

// Encodes one message into packets of at most kMaxMessageSize. Every message is one
// packet except a REPLY whose text or profile does not fit one, which is split (kFlagMore
// on all but the last). Empty when the body does not match the type, a field exceeds a
// limit above, or a DEFINE's program (or a filter) does not validate.
std::vector<std::vector<uint8_t>> encode(const Message& m);

// Encodes a HELLO into out[0, cap) without allocating: a fork child's, in its fork handler,
// where every heap page it writes is a copy. h's probe_ids are ignored; `ids` (n of them)
// go in their place. The bytes encode() makes of the same message, and their count; 0
// when they do not fit or the fields are not valid.
size_t encode_hello(uint8_t* out, size_t cap, uint32_t seq, const Hello& h, const uint32_t* ids,
                    size_t n);

// Decodes one packet. 0, or -EBADMSG with *why (when not null) saying what is wrong.
// When the header itself was sound, *out's type, flags and seq are set even on failure,
// so the receiver can address its error reply.
[[nodiscard]] int decode(const uint8_t* data, size_t n, Message* out,
                         std::string* why = nullptr);

// The most a reply split over packets may add up to: its text plus 12 bytes per profile
// entry. The agent caps a text at 1 MiB and sends one entry per probe, so only a peer
// that means harm reaches it; the receiver keeps no more than this of one reply.
inline constexpr size_t kMaxReplySize = size_t{8} << 20;

// Collects the packets of one REPLY (kFlagMore). add() returns 1 when the reply is
// complete; -EBADMSG when a packet of another seq arrives in the middle; -E2BIG when the
// reply grows past kMaxReplySize (what was collected is dropped).
class ReplyAssembler {
 public:
  // 1: complete, 0: more to come, -EBADMSG: not a continuation of the reply in progress,
  // -E2BIG: longer than kMaxReplySize.
  int add(const Message& m);
  uint32_t seq() const { return seq_; }
  Reply take();

 private:
  bool active_ = false;
  uint32_t seq_ = 0;
  Reply reply_;
};

// The agent's entry point for attach, exported by libprobefs-agent.so:
//   extern "C" int probefs_agent_attach(const char* link_name);
// Called (once the injector has dlopen'ed the agent) on a thread of the target that the
// daemon ptrace-controls. It connects to link_name, checks that the listening process is
// this process's tracer (TracerPid) with the uid of root or of this process, sends HELLO
// kAttach, starts the agent's control thread and returns 0, or a negative errno at once
// (-EBUSY: the agent is linked to a daemon already; -EPERM: the peer is not the tracer;
// -EINVAL: not a link name). It does not wait for the daemon's requests.
inline constexpr const char* kAttachSymbol = "probefs_agent_attach";

}  // namespace probefs::events::link
