// Out-of-line helpers of throwing.inc, and a witness of where the C++ runtime lands: this
// executable's __gxx_personality_v0 forwards to libstdc++'s and records each landing pad
// the real one chose (the IP it installs) with the start of the FDE's code.
#include <dlfcn.h>
#include <unwind.h>

#include <mutex>
#include <utility>
#include <vector>

#include "tests/tracee/throwing.h"
#include "tests/tracee/unwinder_witness.h"

namespace probefs::tracee::throwing {

Cleanup::~Cleanup() { asm volatile("" ::: "memory"); }

void maybe_throw(int x) {
  if (x % 2) throw Thrown{x};
}

namespace {
uintptr_t g_noted = 0;
}

void note_return_address() {
  g_noted = reinterpret_cast<uintptr_t>(__builtin_extract_return_addr(__builtin_return_address(0)));
}

uintptr_t noted_return_address() { return g_noted; }

}  // namespace probefs::tracee::throwing

namespace probefs::tracee::test_support {
namespace {
std::mutex g_mu;
std::vector<LandingPadSeen>& seen() {
  static auto* v = new std::vector<LandingPadSeen>;
  return *v;
}
}  // namespace

std::vector<LandingPadSeen> landing_pads_seen() {
  std::lock_guard lock(g_mu);
  return seen();
}

void clear_landing_pads_seen() {
  std::lock_guard lock(g_mu);
  seen().clear();
}

}  // namespace probefs::tracee::test_support

extern "C" _Unwind_Reason_Code __gxx_personality_v0(int version, _Unwind_Action actions,
                                                    _Unwind_Exception_Class cls,
                                                    _Unwind_Exception* ue,
                                                    _Unwind_Context* ctx) {
  using Fn = _Unwind_Reason_Code (*)(int, _Unwind_Action, _Unwind_Exception_Class,
                                     _Unwind_Exception*, _Unwind_Context*);
  static const Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "__gxx_personality_v0"));
  const _Unwind_Reason_Code rc = real(version, actions, cls, ue, ctx);
  if (rc == _URC_INSTALL_CONTEXT) {
    using namespace probefs::tracee::test_support;
    std::lock_guard lock(g_mu);
    seen().push_back({static_cast<uintptr_t>(_Unwind_GetRegionStart(ctx)),
                      static_cast<uintptr_t>(_Unwind_GetIP(ctx))});
  }
  return rc;
}
