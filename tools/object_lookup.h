// Objects by name and defined probes back to their source, for the command line: -m's
// library search, and -l's "(on FUNC:RLN@SRC in PATH)".
#pragma once

#include <string>
#include <vector>

#include "tools/result.h"

namespace probefs::tools {

// A library named as a user would name it to the dynamic linker: "libc", "libc.so.6",
// "probefs_probe_lib" or a path. Searched in $LD_LIBRARY_PATH, the ld.so cache's
// directories (/etc/ld.so.conf*) and the default ones, matching NAME, libNAME, NAME.so*,
// libNAME.so*. -ENOENT "Failed to find the library NAME." when none.
Result<std::string> find_library(const std::string& name);

// The library named NAME (as find_library names it, or a path) among the files process
// PID maps, from /proc/PID/maps. -ENOENT "Failed to find the library NAME in process PID."
// when it maps none; -ESRCH when there is no such process.
Result<std::string> mapped_library(int pid, const std::string& name);

// A read-back location ("/path:0x00000000000011e7" for a uprobe, "MOD:SYM+OFF" for a
// kprobe) as perf probe -l shows it: "price_order:1@tools/probe_prog.c in /path". Where the
// object or its DWARF cannot be read, the location as it is.
std::string describe_location(const std::string& location, bool uprobe, bool retprobe,
                              const std::vector<std::string>& debuginfo_dirs);

}  // namespace probefs::tools
