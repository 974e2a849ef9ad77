// events/ftrace/: the kernel's own ftrace events that tools expect in every tracefs.
// trace-cmd record copies every events/ftrace/*/format into its output and cannot run
// without at least one, and a raw buffer's trace_marker records are the `print` event
// (id kPrintEventId), so that its format must be the kernel's, id included.
//
// These are not dynamic events: they are not in available_events, set_event or the
// events/enable aggregate, have no enable or filter file, and cannot be removed. print's
// trigger and hist files are fs/marker_event.cc's (trace_marker's triggers). As in
// the kernel, the ftrace group has no group enable or filter file, and a dynamic event
// may still be defined in it (events/ftrace/NAME comes and goes with it; a name taken
// here is EEXIST, as any name in use).
#include <cerrno>
#include <functional>
#include <string>
#include <string_view>

#include "events/ring.h"
#include "fs/tracefs.h"
#include "fs/vfs.h"

namespace probefs::fs {
namespace {

// The fields every event starts with, as the kernel's format files print them.
constexpr std::string_view kCommonFields =
    "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
    "\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n"
    "\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n"
    "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n";

// The stack records' print fmt (the records a target writes after an event's with
// options/stacktrace and userstacktrace, events/ring.h).
constexpr std::string_view kStackPrintFmt =
    "\"\\t=> %ps\\n\\t=> %ps\\n\\t=> %ps\\n\" \"\\t=> %ps\\n\\t=> %ps\\n\\t=> %ps\\n\" "
    "\"\\t=> %ps\\n\\t=> %ps\\n\", (void *)REC->caller[0], (void *)REC->caller[1], "
    "(void *)REC->caller[2], (void *)REC->caller[3], (void *)REC->caller[4], "
    "(void *)REC->caller[5], (void *)REC->caller[6], (void *)REC->caller[7]";

struct FtraceEvent {
  std::string_view name;
  int id;
  std::string_view fields;     // after the common fields
  std::string_view print_fmt;  // the text after "print fmt: "
  bool id_file;                // the kernel gives these an id file
};

// In the kernel's readdir order (newest first).
constexpr FtraceEvent kEvents[] = {
    {"bputs", 15,
     "\tfield:unsigned long ip;\toffset:8;\tsize:8;\tsigned:0;\n"
     "\tfield:const char * str;\toffset:16;\tsize:8;\tsigned:0;\n",
     "\"%ps: %s\", (void *)REC->ip, REC->str", false},
    {"raw_data", kRawDataEventId,
     "\tfield:unsigned int id;\toffset:8;\tsize:4;\tsigned:0;\n"
     "\tfield:char buf[];\toffset:12;\tsize:0;\tsigned:0;\n",
     "\"id:%04x %08x\", REC->id, (int)REC->buf[0]", false},
    {"print", kPrintEventId,
     "\tfield:unsigned long ip;\toffset:8;\tsize:8;\tsigned:0;\n"
     "\tfield:char buf[];\toffset:16;\tsize:0;\tsigned:0;\n",
     "\"%ps: %s\", (void *)REC->ip, REC->buf", true},
    {"bprint", 6,
     "\tfield:unsigned long ip;\toffset:8;\tsize:8;\tsigned:0;\n"
     "\tfield:const char * fmt;\toffset:16;\tsize:8;\tsigned:0;\n"
     "\tfield:u32 buf[];\toffset:24;\tsize:0;\tsigned:0;\n",
     "\"%ps: %s\", (void *)REC->ip, REC->fmt", false},
    {"user_stack", events::kUserStackEventId,
     "\tfield:unsigned int tgid;\toffset:8;\tsize:4;\tsigned:0;\n"
     "\tfield:unsigned long caller[8];\toffset:16;\tsize:64;\tsigned:0;\n",
     kStackPrintFmt, false},
    {"kernel_stack", events::kKernelStackEventId,
     "\tfield:int size;\toffset:8;\tsize:4;\tsigned:1;\n"
     "\tfield:unsigned long caller[8];\toffset:16;\tsize:64;\tsigned:0;\n",
     kStackPrintFmt, false},
    {"function", 1,
     "\tfield:unsigned long ip;\toffset:8;\tsize:8;\tsigned:0;\n"
     "\tfield:unsigned long parent_ip;\toffset:16;\tsize:8;\tsigned:0;\n"
     "\tfield:unsigned long args[];\toffset:24;\tsize:0;\tsigned:0;\n",
     "\" %ps <-- %ps\", (void *)REC->ip, (void *)REC->parent_ip", true},
};

std::string format_text(const FtraceEvent& ev) {
  std::string s =
      "name: " + std::string(ev.name) + "\nID: " + std::to_string(ev.id) + "\nformat:\n";
  s += kCommonFields;
  s += "\n";
  s += ev.fields;
  s += "\nprint fmt: ";
  s += ev.print_fmt;
  s += "\n";
  return s;
}

void add_event(Tree& tree, const NodePtr& group, const FtraceEvent& ev,
               const std::function<void(const NodePtr&)>& print_files) {
  NodePtr dir = tree.mkdir(group, ev.name, kModeDir);
  if (ev.id == kPrintEventId && print_files) print_files(dir);
  tree.add_file(dir, "format", kModeRead,
                make_text_file([text = format_text(ev)] { return text; }));
  if (ev.id_file)
    tree.add_file(dir, "id", kModeRead,
                  make_text_file([id = ev.id] { return std::to_string(id) + "\n"; }));
}

}  // namespace

void add_ftrace_events(Tree& tree, const NodePtr& events_dir,
                       const std::function<void(const NodePtr&)>& print_files) {
  NodePtr group = tree.mkdir(events_dir, "ftrace", kModeDir);
  for (const FtraceEvent& ev : kEvents) add_event(tree, group, ev, print_files);
}

}  // namespace probefs::fs
