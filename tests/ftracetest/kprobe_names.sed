# User-space names for the kernel's, in the kprobe cases of ftracetest: run_ftracetest
# applies this script to test.d/functions, test.d/kprobe/*.tc and test.d/dynevent/*.tc of
# its copy of the selftests (and names the files it changed).
#
# The cases run in dash, ftracetest's shell, as a probefs target: the shell and its C
# library stand for the kernel. A bare SYMBOL is looked up in each target's executable
# and then its libraries, as a kernel kprobe's is in vmlinux; dash's functions are libc's.

# /proc/kallsyms is the shell's libc: `ADDRESS TYPE NAME`, sorted, at the addresses the
# shell has them (run_ftracetest writes it into the copy; from libc's debug file when
# libc6-dbg is installed, so local functions such as foo.isra.0 are there too).
s|/proc/kallsyms|$TOP_DIR/kallsyms|g

# The kprobes debug files are the mount's (kprobes/list, kprobes/optimization), not
# debugfs's and sysctl's; the cases run in the tracing directory.
s|/sys/kernel/debug/kprobes/list|kprobes/list|g
s|\.\./kprobes/list|kprobes/list|g
s|/proc/sys/debug/kprobes-optimization|kprobes/optimization|g

# kernel_clone (_do_fork before 5.10), $FUNCTION_FORK: libc's fork, which the shell calls
# for every subshell, `( echo "forked" )` included.
s/\bkernel_clone\b/fork/g
s/'_do_fork'/fork/g

# kprobe_eventname takes the last " [tT] .*vfs_read$" of kallsyms, vfs_read itself: here
# read itself, not the last function whose name ends in "read".
s/ \[tT\] \.\*vfs_read\$/ [tT] read$/
# vfs_read, the function of the syntax and error-log checks (their caret positions are
# computed from the command): read. vfs_open: open.
s/\bvfs_read\b/read/g
s/\bvfs_open\b/open/g
# do_exit: exit.
s/\bdo_exit\b/exit/g
# kfree: free.
s/\bkfree\b/free/g
# inet_csk_accept (kretprobe_maxactive): accept.
s/\binet_csk_accept\b/accept/g

# kprobe_args_user: `echo > /dev/null` opens /dev/null. do_sys_open(dfd, filename, ...)
# becomes open(filename, ...), where the path is the first argument; do_sys_openat2(dfd,
# filename, ...) becomes openat(dfd, filename, ...).
s/do_sys_open path=+0(\$arg2):ustring path2=+u0(\$arg2):string/open path=+0($arg1):ustring path2=+u0($arg1):string/
s/\bdo_sys_openat2\b/openat/g
# Its second part reads user memory at what is no user address, and expects (fault):
# vfs_symlink's $arg3 is a kernel dentry; `ln -s foo $TMPDIR/bar` calls
# symlinkat(target, newdirfd, linkpath), whose $arg2 is a file descriptor (AT_FDCWD).
s/vfs_symlink path=+0(\$arg3):ustring path2=+u0(\$arg3):string/symlinkat path=+0($arg2):ustring path2=+u0($arg2):string/

# kprobe_args_symbol reads the string at a data symbol, linux_proc_banner, and compares it
# with what /proc/version prints from it (the two parenthesized parts, which leave the
# trace's quotes out): libc's __nptl_version, "2.36", which getconf prints as
# GNU_LIBPTHREAD_VERSION, NPTL 2.36 (quoted here as the trace quotes it).
s/\blinux_proc_banner\b/__nptl_version/g
s|cat /proc/version|getconf GNU_LIBPTHREAD_VERSION \| awk '{ printf "\\"%s\\"", $2 }'|

# kprobe_non_uniq_symbol: name_show, a name many kernel functions have, must be refused:
# internal_getent, a static function of ten files of libc.
s/\bname_show\b/internal_getent/g

# probepoint probes tracefs_create_dir by name, by address, and at the offset of the next
# symbol of kallsyms, which it finds with grep -A1 -B1: a function whose name is in no
# other name and which has no alias at its address, killpg.
s/\btracefs_create_dir\b/killpg/g

# multiple_kprobes puts 256 probes at +5 on x86, past the kernel's fentry call, which
# user-space functions do not have: at +0.
s/x86_64|i\[3456\]86) OFFS=5;;/x86_64|i[3456]86) OFFS=0;;/
