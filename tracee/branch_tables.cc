#include "tracee/branch_tables.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "arch/branch_targets.h"

namespace probefs::tracee {

namespace {

// Reads [offset, offset + length) of fd into code (zeros past the end of the file, as the
// mapping shows them). false on a read error.
bool read_range(int fd, uint64_t offset, std::vector<uint8_t>* code) {
  size_t at = 0;
  while (at < code->size()) {
    const ssize_t n = ::pread(fd, code->data() + at, code->size() - at,
                              static_cast<off_t>(offset + at));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    if (n == 0) break;  // the file ends inside the mapping
    at += static_cast<size_t>(n);
  }
  return true;
}

int build(int file, const Mapping& m, std::vector<uint8_t>* table) {
  std::vector<uint8_t> code(m.end - m.start, 0);
  if (!read_range(file, m.offset, &code)) return -EIO;
  const std::vector<uint64_t> words =
      arch::build_branch_table(code.data(), code.size(), BranchTables::kMaxCandidates);
  if (words.empty()) return -EFBIG;
  table->resize(words.size() * sizeof(uint64_t));
  std::memcpy(table->data(), words.data(), table->size());
  return 0;
}

}  // namespace

BranchTables::BranchTables()
    : MappingTables("probefs-branches", {kMaxMappingBytes, kMaxTables, kMaxCachedBytes}, build) {}

}  // namespace probefs::tracee
