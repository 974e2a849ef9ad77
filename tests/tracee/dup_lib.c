// Built twice: libprobefs_tracee_dup_a.so and libprobefs_tracee_dup_b.so.
#define PROBEFS_CAT2(a, b) a##b
#define PROBEFS_CAT(a, b) PROBEFS_CAT2(a, b)

int probefs_dup_fn(void) { return 0; }

// A symbol unique to each library, so both stay needed.
int PROBEFS_CAT(PROBEFS_CAT(probefs_dup_, PROBEFS_DUP_WHICH), _id)(void) { return 1; }

// A variable defined in both libraries, for data symbols (`@SYM`): the first one loaded
// wins here too. The test program never names it, so no copy relocation moves it into the
// executable.
int probefs_dup_data = 1;
