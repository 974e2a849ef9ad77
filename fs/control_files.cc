// README, targets and kprobes/ (the kernel's kprobes debugfs files).
#include "fs/tracefs.h"

namespace probefs::fs {

void add_control_files(Tracefs&) {}

}  // namespace probefs::fs
