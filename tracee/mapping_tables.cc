#include "tracee/mapping_tables.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>
#include <vector>

namespace probefs::tracee {

namespace {

bool same_time(const timespec& a, const timespec& b) {
  return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}

// A sealed memfd holding `bytes`, named `name`; a negative errno.
int sealed_table(const char* name, const std::vector<uint8_t>& bytes) {
  const int fd = ::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return -errno;
  const uint8_t* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? -errno : -EIO;
      ::close(fd);
      return err;
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0) {
    const int err = -errno;
    ::close(fd);
    return err;
  }
  return fd;
}

int dup_of(int fd) {
  const int d = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  return d < 0 ? -errno : d;
}

}  // namespace

MappingTables::MappingTables(const char* name, Limits limits, Build build)
    : name_(name), limits_(limits), build_(std::move(build)) {}

MappingTables::~MappingTables() {
  for (Entry& e : entries_) ::close(e.fd);
}

int MappingTables::fd_for(pid_t pid, const Mapping& m) {
  const uint64_t length = m.end - m.start;
  if (!m.exec || m.end <= m.start) return -EINVAL;
  if (length > limits_.max_mapping_bytes) return -EFBIG;
  const int file = open_mapped_file(pid, m);
  if (file < 0) return file;
  struct stat st;
  if (::fstat(file, &st) != 0) {
    const int err = -errno;
    ::close(file);
    return err;
  }
  std::lock_guard l(mu_);
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->dev == st.st_dev && it->inode == st.st_ino && it->offset == m.offset &&
        it->length == length && it->size == st.st_size && same_time(it->mtime, st.st_mtim) &&
        same_time(it->ctime, st.st_ctim)) {
      ::close(file);
      entries_.splice(entries_.begin(), entries_, it);
      return dup_of(entries_.front().fd);
    }
  }
  std::vector<uint8_t> table;
  const int built = build_(file, m, &table);
  ::close(file);
  if (built < 0) return built;
  if (table.empty()) return -EFBIG;
  const uint64_t bytes = table.size();
  const int fd = sealed_table(name_, table);
  if (fd < 0) return fd;
  while (!entries_.empty() && (entries_.size() >= limits_.max_tables ||
                               cached_bytes_ + bytes > limits_.max_cached_bytes)) {
    ::close(entries_.back().fd);
    cached_bytes_ -= entries_.back().bytes;
    entries_.pop_back();
  }
  Entry e;
  e.dev = st.st_dev;
  e.inode = st.st_ino;
  e.offset = m.offset;
  e.length = length;
  e.size = st.st_size;
  e.mtime = st.st_mtim;
  e.ctime = st.st_ctim;
  e.fd = fd;
  e.bytes = bytes;
  cached_bytes_ += bytes;
  entries_.push_front(e);
  return dup_of(fd);
}

}  // namespace probefs::tracee
