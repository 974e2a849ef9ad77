// Where the direct branches of a mapping land, one bit per byte: what the optimizer asks
// before a jmp covers a region (a rel32 branch from anywhere in the object into the
// region's middle refuses it; arch/x86_64/optimize.cc). A set bit means that some
// position of the code, read as a call/jmp/jcc rel32, lands there: a superset of the real
// branch targets, which the optimizer narrows down by decoding when a region has one.
//
// Every process maps the same libc, and sweeping it costs each process start a few
// milliseconds, most of it page faults. So the daemon builds the table of a file's
// executable mapping once, from the file, and hands it to every traced process that maps
// it (events/link.h, BRANCHES) as a sealed memfd; the engine reads it instead of
// sweeping. The layout below is the contract between the two.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace probefs::arch {

// Words of the bit part of a table covering `bytes` bytes: bit (i & 63) of word i / 64 is
// byte i.
constexpr size_t branch_table_words(size_t bytes) { return (bytes + 63) / 64; }

// A mapping's table, in 64-bit words:
//   bits        branch_table_words(n) words, a bit set where some candidate lands
//   count       the number of candidates
//   candidates  count words, each (target << 32 | source), offsets from the mapping's
//               start, sorted: the candidates that land in a region, found by a search
// built from code[0, n) (n < 2^32). A candidate whose displacement runs past n is not one
// (the bytes after a mapping are not code). Empty when there are more than
// max_candidates (code chosen to be nothing but branches would make a table eight times
// its size).
std::vector<uint64_t> build_branch_table(const uint8_t* code, size_t n,
                                         size_t max_candidates = SIZE_MAX);

// An executable file mapping as /proc/self/maps names it.
struct MappingKey {
  uint32_t dev_major = 0, dev_minor = 0;
  uint64_t inode = 0;
  uint64_t offset = 0;  // file offset of the mapping's first byte
  uint64_t length = 0;  // bytes mapped

  bool operator==(const MappingKey&) const = default;
};

// Engine: the table of mapping `key` (`words` words, as build_branch_table() lays it
// out), built from the file's bytes at [offset, offset + length), zeros past its end. The
// optimizer uses it for a mapping of that key it has not swept yet. `table` must stay
// mapped and unchanged for the life of the process. false when the table's size does not
// match its count, or the engine keeps no more tables (it sweeps).
bool provide_branch_table(const MappingKey& key, const uint64_t* table, size_t words);

}  // namespace probefs::arch
