#define PF_NAME(x) x##_o2
#include "tests/tracee/throwing.inc"
