// Two versions of one function, as glibc keeps pthread_cond_signal: the default one
// (PROBEFS_2, what a program linked today binds to) and a hidden compat one (PROBEFS_1).
// Built twice: with .symtab, whose names carry the versions, and stripped, where only
// .dynsym and its versioning sections tell them apart.

__attribute__((noinline)) int probefs_versioned_fn_v1(int x) { return x + 1; }
__attribute__((noinline)) int probefs_versioned_fn_v2(int x) { return x + 2; }
__asm__(".symver probefs_versioned_fn_v1, probefs_versioned_fn@PROBEFS_1");
__asm__(".symver probefs_versioned_fn_v2, probefs_versioned_fn@@PROBEFS_2");

// Unversioned beside them (the version script's global: * of PROBEFS_1 gives it a version;
// it is the one default version of its name).
int probefs_versioned_plain(int x) { return x * 3; }

// A variable in two versions, as glibc keeps sys_errlist.
int probefs_versioned_data_v1 = 1;
int probefs_versioned_data_v2 = 2;
__asm__(".symver probefs_versioned_data_v1, probefs_versioned_data@PROBEFS_1");
__asm__(".symver probefs_versioned_data_v2, probefs_versioned_data@@PROBEFS_2");
