// Memory readers for the fetch interpreter (fetch.h).
//
// A reader has two operations:
//   bool read(uint64_t addr, void* dst, size_t n)          all n bytes, or false
//   long read_string(uint64_t addr, char* dst, size_t cap) bytes stored with the NUL
//                                                           (at most cap), -1 on a fault
// LiveMemoryReader runs on the hit path inside a traced process: it reads through a system
// call (arch/self_memory.h: no libc function runs, errno is not touched), and a bad pointer
// comes back as a failed read instead of SIGSEGV. FaultTolerantReader is the faster one
// (no system call) for a process whose SIGSEGV/SIGBUS handler calls arch::safe_copy_fixup()
// (arch/safe_copy.h); without such a handler a bad pointer kills the process, so it is
// opt-in. FakeMemoryReader serves tests: a few byte ranges at chosen addresses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "arch/safe_copy.h"
#include "arch/self_memory.h"

namespace probefs::events {

class LiveMemoryReader {
 public:
  // `pid` is this process (a fork child makes its own reader: the pid changes).
  explicit LiveMemoryReader(long pid) : pid_(pid) {}
  static LiveMemoryReader for_self() { return LiveMemoryReader(arch::self_pid()); }

  // Bytes copied, or a negative errno (nothing is copied past an unmapped page).
  [[nodiscard]] long copy(uint64_t addr, void* dst, size_t n) const {
    return arch::read_self_memory(pid_, addr, dst, n);
  }

  bool read(uint64_t addr, void* dst, size_t n) const {
    return copy(addr, dst, n) == static_cast<long>(n);
  }

  // Reads in growing chunks that never cross a page boundary, so a string that ends just
  // before an unmapped page is still read whole; a fault before the NUL is a fault, as in
  // the kernel's strncpy_from_user.
  long read_string(uint64_t addr, char* dst, size_t cap) const {
    if (cap == 0) return -1;
    size_t got = 0;
    size_t chunk = 64;
    while (got < cap) {
      uint64_t a = addr + got;
      size_t to_page = kPage - (a & (kPage - 1));
      size_t n = cap - got;
      if (n > to_page) n = to_page;
      if (n > chunk) n = chunk;
      long r = copy(a, dst + got, n);
      if (r <= 0) return -1;
      for (long i = 0; i < r; ++i)
        if (dst[got + static_cast<size_t>(i)] == '\0') return static_cast<long>(got) + i + 1;
      got += static_cast<size_t>(r);
      if (static_cast<size_t>(r) < n) return -1;
      chunk = chunk < 1024 ? chunk * 4 : kPage;
    }
    dst[cap - 1] = '\0';  // truncated to the room there is, still a C string
    return static_cast<long>(cap);
  }

 private:
  static constexpr size_t kPage = 4096;
  long pid_;
};

// Copies that may fault, made safe by the process's SIGSEGV/SIGBUS handler (see above).
class FaultTolerantReader {
 public:
  bool read(uint64_t addr, void* dst, size_t n) const {
    return probefs_arch_safe_copy(dst, reinterpret_cast<const void*>(addr), n) == 0;
  }
  long read_string(uint64_t addr, char* dst, size_t cap) const {
    if (cap == 0) return -1;
    return probefs_arch_safe_strncpy(dst, reinterpret_cast<const char*>(addr), cap);
  }
};

// Test double: memory is whatever was mapped with map(); everything else faults.
class FakeMemoryReader {
 public:
  void map(uint64_t addr, const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    regions_.push_back({addr, std::vector<uint8_t>(p, p + n)});
  }
  void map_string(uint64_t addr, const char* s) {
    size_t n = 0;
    while (s[n]) ++n;
    map(addr, s, n + 1);
  }

  bool read(uint64_t addr, void* dst, size_t n) const {
    auto* out = static_cast<uint8_t*>(dst);
    for (size_t i = 0; i < n; ++i)
      if (!byte(addr + i, &out[i])) return false;
    return true;
  }

  long read_string(uint64_t addr, char* dst, size_t cap) const {
    if (cap == 0) return -1;
    for (size_t i = 0; i < cap; ++i) {
      uint8_t b;
      if (!byte(addr + i, &b)) return -1;
      dst[i] = static_cast<char>(b);
      if (b == 0) return static_cast<long>(i) + 1;
    }
    dst[cap - 1] = '\0';
    return static_cast<long>(cap);
  }

 private:
  struct Region {
    uint64_t addr;
    std::vector<uint8_t> bytes;
  };
  bool byte(uint64_t a, uint8_t* out) const {
    for (const Region& r : regions_) {
      if (a >= r.addr && a - r.addr < r.bytes.size()) {
        *out = r.bytes[a - r.addr];
        return true;
      }
    }
    return false;
  }
  std::vector<Region> regions_;
};

}  // namespace probefs::events
