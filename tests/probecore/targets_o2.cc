#define PF_NAME(x) x##_o2
#include "targets.inc"
