/* IFUNCs of a library of our own, one for each way resolve() can learn the implementation
 * (tracee/elf_symbols.h, IfuncChoice). Built twice (libprobefs_ifunc_a, _b) and linked
 * with -z now, so that what the dynamic linker binds is bound when the library is loaded.
 * Never sanitized: the resolvers run while the dynamic linker relocates the library.
 *
 *   probefs_ifunc_bound     exported, called by the library itself through its own PLT
 *                           slot (an exported function is preemptible): a JUMP_SLOT
 *   probefs_ifunc_hidden    hidden (in .symtab only), called by the library: its PLT slot
 *                           is an IRELATIVE relocation
 *   probefs_ifunc_unbound   exported, called by nobody: no slot holds its implementation
 *
 * Each implementation returns its argument plus a number of its own, so that a call through
 * a resolved address says which one it reached.
 */

__attribute__((noinline)) static int probefs_ifunc_bound_impl(int x) { return x + 1; }
__attribute__((noinline)) static int probefs_ifunc_hidden_impl(int x) { return x + 2; }
__attribute__((noinline)) static int probefs_ifunc_unbound_impl(int x) { return x + 3; }

/* Local functions of their own (`used`: only the ifunc attributes name them). */
__attribute__((used)) static int (*probefs_ifunc_bound_resolver(void))(int) {
  return probefs_ifunc_bound_impl;
}
__attribute__((used)) static int (*probefs_ifunc_hidden_resolver(void))(int) {
  return probefs_ifunc_hidden_impl;
}
__attribute__((used)) static int (*probefs_ifunc_unbound_resolver(void))(int) {
  return probefs_ifunc_unbound_impl;
}

int probefs_ifunc_bound(int) __attribute__((ifunc("probefs_ifunc_bound_resolver")));
__attribute__((visibility("hidden"))) int probefs_ifunc_hidden(int)
    __attribute__((ifunc("probefs_ifunc_hidden_resolver")));
int probefs_ifunc_unbound(int) __attribute__((ifunc("probefs_ifunc_unbound_resolver")));

/* The library's own calls, which make the first two bound. */
int probefs_ifunc_call_bound(int x) { return probefs_ifunc_bound(x); }
int probefs_ifunc_call_hidden(int x) { return probefs_ifunc_hidden(x); }
