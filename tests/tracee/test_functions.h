// Functions of the test executable whose addresses and bounds the resolver must find.
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

int probefs_test_fn_a(int x);
int probefs_test_fn_b(int x);

// A GNU_IFUNC symbol and its resolver: resolving the symbol must give the resolver.
int probefs_test_ifunc(void);
int (*probefs_test_ifunc_resolver(void))(void);

// Defined once in each of two libraries linked in the order a, b.
int probefs_dup_fn(void);
int probefs_dup_a_id(void);
int probefs_dup_b_id(void);

#ifdef __cplusplus
}
#endif
