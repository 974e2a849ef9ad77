# Stand-ins for the scheduler's events, in test.d/functions of run_ftracetest's copy of
# the selftests: the cases that require events of the scheduler (events/sched/ in their
# requires: trigger and hist cases on sched_process_fork) get probefs dynamic events of
# the same group and names, with the fields the cases use. They run as a probefs target
# (run_ftracetest's sched lane), where the shell's fork()s hit the probes.
#
# sched_process_fork: the parent's return from libc's _Fork, as the kernel's event fires
# once a fork, in the parent: common_pid and parent_pid the parent, $comm its comm (the
# child's is the same at the fork), child_pid the child, $retval. parent_pid is the
# parent's tid, which _Fork gave the clone call as its child-tid address (&THREAD_SELF->tid)
# in %r10, which the syscall keeps and nothing after it changes on the parent's path
# (glibc 2.36 on x86-64: Debian 12's).
# sched_process_exit: libc's exit. sched_switch and sched_wakeup, which the cases that run
# here only enable and disable (enable_event, disable_event) or set triggers on: probes on
# libc's sched_yield, which the shell does not call, with the kernel's events' fields
# that the cases name (their values mean nothing).
#
# check_requires, which runs before initialize_ftrace, defines them when the case's
# requirements name events/sched/ (all of them, on the top directory: an instance run has no
# dynamic_events), and initialize_ftrace again after it clears the dynamic and probe events.
/^check_requires() {/i\
sched_stand_ins() { # the scheduler events the cases use, as probefs dynamic events\
    local top=${TRACING_DIR%/instances/*}\
    [ -d $top/events/sched/sched_process_fork ] ||\
	echo 'r:sched/sched_process_fork libc:_Fork parent_comm=$comm:string parent_pid=+0(%r10):s32 child_comm=$comm:string child_pid=$retval:s32' >> $top/dynamic_events\
    [ -d $top/events/sched/sched_process_exit ] ||\
	echo 'p:sched/sched_process_exit libc:exit comm=$comm:string' >> $top/dynamic_events\
    [ -d $top/events/sched/sched_switch ] ||\
	echo 'p:sched/sched_switch libc:sched_yield prev_comm=$comm:string prev_pid=$arg1:s32 next_comm=$comm:string next_pid=$arg2:s32' >> $top/dynamic_events\
    [ -d $top/events/sched/sched_wakeup ] ||\
	echo 'p:sched/sched_wakeup libc:sched_yield comm=$comm:string pid=$arg1:s32' >> $top/dynamic_events\
}\

/^check_requires() {/a\
    case " $* " in *" events/sched/"*) SCHED_STAND_INS=1; sched_stand_ins;; esac
/^    \[ -f snapshot \] && echo 0 > snapshot$/a\
    [ -z "${SCHED_STAND_INS:-}" ] || sched_stand_ins
