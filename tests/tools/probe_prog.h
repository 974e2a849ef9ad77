// The program probefs-probe's tests probe: built with -g at -O0 and at -O2 (tests/tools/
// CMakeLists.txt), with parameters, locals, struct members through values and pointers,
// arrays, bitfields, a string, globals, a static function, an always-inlined function with
// several call sites, and a library function. It prints what it computed, one line per
// call, so a test can compare the values a trace shows with the program's own.
#pragma once

struct address {
  short zone;
  long postcode;
};

struct order {
  int id;
  char item[16];
  unsigned priority : 3;
  unsigned rush : 1;
  unsigned weight : 9;
  int qty[4];
  struct address ship;
  struct address *bill;
  const char *note;
};

// In libprobefs_probe_lib.so.
int lib_checksum(const char *s, int n);
