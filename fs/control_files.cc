// README, targets and kprobes/: the files that are about probefs itself rather than
// about events or the trace buffer.
//
//   README            the kernel's mini-HOWTO, for a tracefs of user-space processes; perf
//                     probe reads it for features, so the lines it looks for are kept
//   targets           the traced processes, one per line: PID COMM ORIGIN STATE (STATE
//                     untraced:REASON for a process refused as a target,
//                     untraceable:STATE for one probefs cannot enter), then
//                     pending=N for a stopped one with N changes to make when it runs
//                     again, not_placed=N for one that could not take N probes defined
//                     earlier (error_log says why); written to by the probefs command
//                     (attach PID, detach PID, exec, untraceable STATE PATH)
//   kprobes/list      every probe in every target, as the kernel's debugfs file prints them
//   kprobes/enabled   the global arm switch (kstrtobool, as the kernel's)
//   kprobes/blacklist code no probe may go on, in every target
//   kprobes/optimization  the kernel's debug.kprobes-optimization sysctl (0 or 1)
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <sstream>

#include "events/kstrto.h"
#include "fs/tracefs.h"
#include "tracee/proc_info.h"
#include "tracee/untraceable.h"

namespace probefs::fs {

namespace {

constexpr const char* kReadme = R"(probefs: tracing mini-HOWTO for user-space processes

probefs is tracefs for ordinary processes: the programs started with
`probefs exec MOUNTPOINT -- CMD` and the ones added with `probefs attach
MOUNTPOINT PID`. Probes go into those processes only; nothing here reaches
the kernel. The mount is private to its user unless mounted with -o allow_other.

# echo 0 > tracing_on : quick way to disable tracing
# echo 1 > tracing_on : quick way to re-enable tracing

 Important files:
  trace			- The static contents of the buffer
			  To clear the buffer write into this file: echo > trace
  trace_pipe		- A consuming read to see the contents of the buffer
  current_tracer	- function and latency tracers (probefs has nop)
  available_tracers	- list of configured tracers for current_tracer
  error_log	- error log for failed commands (that support it)
  buffer_size_kb	- view and modify size of each thread's buffer
  buffer_total_size_kb  - view total size of all buffers
  targets		- the traced processes: PID COMM ORIGIN STATE

  trace_clock		- change the clock used to order events
       local:   The TSC, converted to nanoseconds (synced across CPUs)
      global:   The same as local here
     counter:   Not a clock, but just an increment (per process)
      uptime:   Jiffy counter from time of boot
        perf:   Same clock that perf events use
     x86-tsc:   TSC cycle counter

  trace_marker		- Writes into this file writes into the trace buffer
  saved_cmdlines	- the comm of every thread seen in the buffer
  options/		- Set format or modify how tracing happens

  kprobes/		- The kprobes debug files of the targets:
      list		- every probe: address, type, symbol, module, state
      enabled		- the global arm switch (write 0 or 1)
      blacklist		- code that can not be probed
      optimization	- 1: jump-optimize probes where it is safe (write 0 or 1)

  kprobe_events		- Create/append/remove/show the kernel dynamic events
			  (in the targets: symbols of their executables and libraries)
			  Write into this file to define/undefine new trace events.
  uprobe_events		- Create/append/remove/show the userspace dynamic events
			  Write into this file to define/undefine new trace events.
  dynamic_events		- Create/append/remove/show the generic dynamic events
			  Write into this file to define/undefine new trace events.
	  accepts: event-definitions (one definition per line)
	   Format: p[:[<group>/][<event>]] <place> [<args>]
	           r[maxactive][:[<group>/][<event>]] <place> [<args>]
	           f[:[<group>/][<event>]] <func-name>[%return] [<args>]
	           s:[synthetic/]<event> <field> [<field>]
	           -:[<group>/][<event>]
	    place: [<module>:]<symbol>[+<offset>]|<memaddr>
   place (kretprobe): [<module>:]<symbol>[+<offset>]%return|<memaddr>
   place (uprobe): <path>:<offset>[%return][(ref_ctr_offset)]
	     args: <name>=fetcharg[:type]
	 fetcharg: (%<register>|$<efield>), @<address>, @<symbol>[+|-<offset>],
	           $stack<index>, $stack, $retval, $comm, $arg<N>,
	           +|-[u]<offset>(<fetcharg>), \imm-value, \"imm-string"
	     kernel return probes support: $retval, $arg<N>, $comm
	     type: s8/16/32/64, u8/16/32/64, x8/16/32/64, char, string, symbol,
	           b<bit-width>@<bit-offset>/<container-size>, ustring,
	           symstr, <type>\[<array-size>\]
	    field: <stype> <name>;
	    stype: u8/u16/u32/u64, s8/s16/s32/s64, pid_t,
	           [unsigned] char/int/long
	   <module> is an object's basename, with or without its version
	   suffix (libc, libc.so.6, the executable's name); a probe on a
	   module that is not loaded yet waits for it.
	   A place may be a USDT point, [<module>:]%<provider>:<name>: every
	   place of that SDT note, counted in its semaphore, $arg<N> its
	   operands there.
  kprobe_profile	- hits and misses of every kprobe-style probe
  uprobe_profile	- hits of every uprobe-style probe
  set_event		- Enables events by name written into it
  available_events	- list of the events that can be enabled
  events/		- Directory containing all trace event subsystems:
      enable		- Write 0/1 to enable/disable tracing of all events
  events/<system>/	- Directory containing all trace events for <system>:
      enable		- Write 0/1 to enable/disable tracing of all <system>
			  events
      filter		- If set, only events passing filter are traced
  events/<system>/<event>/	- Directory containing control files for
			  <event>:
      enable		- Write 0/1 to enable/disable tracing of <event>
      filter		- If set, only events passing filter are traced
      trigger		- If set, a command to perform when event is hit
	    Format: <trigger>[:count][if <filter>]
	   trigger: traceon, traceoff
	            enable_event:<system>:<event>
	            disable_event:<system>:<event>
	            stacktrace
	            hist (below)
	   example: echo traceoff > events/uprobes/myprobe/trigger
	            echo traceoff:3 > events/uprobes/myprobe/trigger
	            echo 'enable_event:uprobes:other:3 if len > 1' > \
	                  events/uprobes/myprobe/trigger
	   Like function triggers, the counter is only decremented if it
	    enabled or disabled tracing.
	   To remove a trigger without a count:
	     echo '!<trigger> > <system>/<event>/trigger
	   To remove a trigger with a count:
	     echo '!<trigger>:0 > <system>/<event>/trigger
	   Filters can be ignored when removing a trigger.
      hist trigger	- Counts the event's hits in a table in the targets, shown
			  by the event's hist file
	    Format: hist:keys=<field1[,field2,...]>
	            [:<var1>=<field|var_ref|numeric_literal>[,<var2>=...]]
	            [:values=<field1[,field2,...]>]
	            [:sort=<field1[,field2,...]>]
	            [:size=#entries]
	            [:pause][:continue][:clear]
	            [:name=histname1]
	            [:<handler>.<action>]
	            [if <filter>]
	    Keys can be any field, or the special string 'common_stacktrace';
	    common_timestamp and common_cpu are fields too. A variable's
	    expression takes +, -, * and / between fields, variable
	    references ($var) and numbers.
	    handlers: onmatch(matching.event), onmax(var), onchange(var)
	    actions:  trace(<synthetic_event>,param list), save(field,...)
  snapshot		- Take a snapshot of the buffer: echo 1 > snapshot
  instances/		- mkdir a name here for a buffer of its own
  events/synthetic_events	- Create/append/remove/show synthetic events
	  Write into this file to define/undefine new synthetic events.
	     example: echo 'myevent u64 lat; char name[]; long[] stack' >> synthetic_events
)";

// kstrtobool: 1/y/Y/t/T/on and 0/n/N/f/F/off, then anything (the kernel looks at the
// first one or two characters only).
bool parse_bool(std::string_view s, bool* out) {
  if (s.empty()) return false;
  switch (s[0]) {
    case '1': case 'y': case 'Y': case 't': case 'T': *out = true; return true;
    case '0': case 'n': case 'N': case 'f': case 'F': *out = false; return true;
    case 'o': case 'O':
      if (s.size() >= 2 && (s[1] == 'n' || s[1] == 'N')) { *out = true; return true; }
      if (s.size() >= 2 && (s[1] == 'f' || s[1] == 'F')) { *out = false; return true; }
      return false;
    default: return false;
  }
}

std::string proc_state(pid_t pid) {
  switch (tracee::proc_state(pid)) {
    case 0: return "gone";
    case 'R': return "running";
    case 'S': return "sleeping";
    case 'D': return "disk-sleep";
    case 'T': return "stopped";
    case 't': return "tracing-stop";
    case 'Z': return "zombie";
    default: return "other";
  }
}

const char* origin_name(tracee::TargetOrigin o) {
  switch (o) {
    case tracee::TargetOrigin::kLaunched: return "launched";
    case tracee::TargetOrigin::kAttached: return "attached";
    case tracee::TargetOrigin::kForked: return "forked";
  }
  return "?";
}

// The thread group of a thread (FUSE requests carry the calling thread's id).
pid_t tgid_of(pid_t tid) {
  const pid_t tgid = tracee::proc_tgid(tid);
  return tgid > 0 ? tgid : tid;
}

// The real uid of a process (/proc/PID/status "Uid:", its first number).
uid_t uid_of(pid_t pid, bool* ok) {
  tracee::ProcStatus status;
  uint64_t real = 0;
  *ok = status.read(pid) == 0 && status.number("Uid", &real, 0);
  return *ok ? static_cast<uid_t>(real) : 0;
}

// targets: reading lists the traced processes; writing is the probefs command's channel
// to the daemon, one command per write:
//   attach PID     inject the agent into PID (the writer must own PID, or be root)
//   detach PID     remove every probe from PID and let it go
//   exec           the writer is about to exec a program as a target: a read on the same
//                  open file then gives "LINK AGENT_PATH\n" for its environment
// After a failed command, a read on the same open file gives its reason (one line).
class TargetsFile : public File {
 public:
  explicit TargetsFile(Tracefs& fs) : fs_(fs) {}

  int open(const Request&, int, std::unique_ptr<Handle>* out) override {
    *out = std::make_unique<OpenTargets>(fs_);
    return 0;
  }

 private:
  class OpenTargets : public Handle {
   public:
    explicit OpenTargets(Tracefs& fs) : fs_(fs) {}

    int read(const Request&, uint64_t off, size_t size, std::string* out) override {
      std::lock_guard l(mu_);
      if (off == 0 || !have_text_) {
        text_ = answer_.empty() ? list() : answer_;
        have_text_ = true;
      }
      out->clear();
      if (off < text_.size()) out->assign(text_, off, std::min(size, text_.size() - off));
      return 0;
    }

    int64_t write(const Request& rq, uint64_t, std::string_view data) override {
      std::string cmd(data);
      while (!cmd.empty() && (cmd.back() == '\n' || cmd.back() == ' ')) cmd.pop_back();
      std::istringstream words(cmd);
      std::string verb;
      words >> verb;
      std::string why;
      int err = 0;
      if (verb == "attach" || verb == "detach") {
        std::string p;
        if (!(words >> p)) return fail(-EINVAL, "usage: " + verb + " PID");
        uint64_t pid = 0;
        if (!events::kstrtoull(p, 10, &pid) || pid == 0 || pid > 0x3fffffff)
          return fail(-EINVAL, "not a pid: " + p);
        err = verb == "attach" ? attach(rq, static_cast<pid_t>(pid), &why)
                               : detach(static_cast<pid_t>(pid), &why);
      } else if (verb == "exec") {
        std::string link;
        pid_t self = tgid_of(rq.pid);
        err = fs_.tracer().prepare_exec(self, rq.uid, 10000, &link);
        if (err == 0) {
          std::lock_guard l(mu_);
          answer_ = link + " " + fs_.tracer().agent_path() + "\n";
          have_text_ = false;
          return static_cast<int64_t>(data.size());
        }
        why = err == -ENOSPC ? "cannot prepare the launch: the target limit is reached"
                             : "cannot prepare the launch: " + std::string(strerror(-err));
      } else if (verb == "untraceable") {
        // `probefs exec` of a program it found it cannot enter, said of itself (the
        // writer's own process) before it execs that program untraced.
        std::string state, path;
        words >> state;
        std::getline(words >> std::ws, path);
        const std::string line = tracee::untraceable_text(state, path);
        if (line.empty()) return fail(-EINVAL, "usage: untraceable static|secure-exec|foreign PATH");
        fs_.tracer().note_untraceable(tgid_of(rq.pid), state, line);
      } else {
        return fail(-EINVAL, "unknown command: " + verb);
      }
      if (err < 0) return fail(err, why);
      return static_cast<int64_t>(data.size());
    }

   private:
    int fail(int err, const std::string& why) {
      std::lock_guard l(mu_);
      answer_ = why.empty() ? std::string(strerror(-err)) + "\n" : why + "\n";
      have_text_ = false;
      return err;
    }

    int attach(const Request& rq, pid_t pid, std::string* why) {
      bool ok = false;
      uid_t owner = uid_of(pid, &ok);
      if (!ok) {
        *why = "no such process";
        return -ESRCH;
      }
      // A daemon mounted with allow_other must not lend its own rights to other users.
      if (rq.uid != 0 && rq.uid != owner) {
        *why = "pid " + std::to_string(pid) + " belongs to another user";
        return -EPERM;
      }
      return fs_.tracer().attach(pid, why);
    }

    int detach(pid_t pid, std::string* why) {
      int err = fs_.tracer().detach(pid);
      if (err == -ESRCH) *why = "pid " + std::to_string(pid) + " is not a target";
      return err;
    }

    std::string list() {
      std::string out;
      for (const tracee::TargetInfo& t : fs_.tracer().targets()) {
        // A process refused as a target runs on untraced: its state says why.
        const std::string state = t.untraced.empty() ? proc_state(t.pid)
                                  : t.untraceable   ? "untraceable:" + t.untraced
                                                    : "untraced:" + t.untraced;
        out += std::to_string(t.pid) + " " + (t.comm.empty() ? "<...>" : t.comm) + " " +
               origin_name(t.origin) + " " + state;
        // Changes a stopped process will make when it runs again.
        if (t.deferred) out += " pending=" + std::to_string(t.deferred);
        // Probes defined earlier that it could not take (error_log says why).
        if (t.not_placed) out += " not_placed=" + std::to_string(t.not_placed);
        out += "\n";
      }
      return out;
    }

    Tracefs& fs_;
    std::mutex mu_;
    std::string text_;
    bool have_text_ = false;
    std::string answer_;
  };

  Tracefs& fs_;
};

// The kernel's debugfs modes: list and blacklist 0400, enabled 0600; the sysctl 0644.
void add_kprobes_dir(Tracefs& fs) {
  Tree& t = fs.tree();
  NodePtr dir = t.mkdir(t.root(), "kprobes");
  tracee::Tracer& tracer = fs.tracer();
  t.add_file(dir, "list", 0400, make_text_file([&tracer] { return tracer.kprobes_list(); }));
  t.add_file(dir, "enabled", 0600,
             make_text_file([&tracer] { return std::string(tracer.all_armed() ? "1\n" : "0\n"); },
                            [&tracer](const Request&, std::string_view d) -> int64_t {
                              bool on = false;
                              if (!parse_bool(d, &on)) return -EINVAL;
                              if (int err = tracer.set_all_armed(on); err < 0) return err;
                              return static_cast<int64_t>(d.size());
                            }));
  t.add_file(dir, "blacklist", 0400,
             make_text_file([&tracer] { return tracer.kprobes_blacklist(); }));
  // The sysctl: an integer in [0, 1].
  auto optimization = std::make_shared<std::atomic<bool>>(true);
  t.add_file(dir, "optimization", 0644,
             make_text_file([optimization] { return std::string(*optimization ? "1\n" : "0\n"); },
                            [&tracer, optimization](const Request&,
                                                    std::string_view d) -> int64_t {
                              uint64_t v = 0;
                              std::string_view s = d;
                              while (!s.empty() && (s.front() == ' ' || s.front() == '\t'))
                                s.remove_prefix(1);
                              if (!events::kstrtoull(s, 10, &v) || v > 1) return -EINVAL;
                              if (int err = tracer.set_optimization(v == 1); err < 0) return err;
                              *optimization = v == 1;
                              return static_cast<int64_t>(d.size());
                            }));
}

}  // namespace

void add_control_files(Tracefs& fs) {
  Tree& t = fs.tree();
  t.add_file(t.root(), "README", kModeRead, make_text_file([] { return std::string(kReadme); }));
  t.add_file(t.root(), "targets", kModeReadWrite, std::make_shared<TargetsFile>(fs));
  add_kprobes_dir(fs);
}

}  // namespace probefs::fs
