#define PF_NAME(x) x##_o2
#include "tests/probecore/exceptions.inc"
