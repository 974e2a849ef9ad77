#define PF_NAME(x) x##_o0
#include "tests/tracee/throwing.inc"
