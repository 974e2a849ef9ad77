// The objects code lives in, for [GONE]: a probe whose library was unloaded is marked
// and its bytes are never touched again. Looked for only when the dynamic linker's count
// of unloads moved, so a control operation does not pay for every probe.
#include <link.h>

#include <cstddef>

#include "probecore/engine_state.h"

namespace probefs::probecore::detail {

namespace {

int find_object_cb(dl_phdr_info* info, size_t, void* data) {
  auto* q = static_cast<ObjectQuery*>(data);
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD) continue;
    const uintptr_t lo = info->dlpi_addr + ph.p_vaddr, hi = lo + ph.p_memsz;
    if (q->addr >= lo && q->addr < hi) {
      q->base = info->dlpi_addr;
      q->name = info->dlpi_name ? info->dlpi_name : "";
      q->found = true;
      return 1;
    }
  }
  return 0;
}

}  // namespace

ObjectQuery object_containing(uintptr_t addr) {
  ObjectQuery q{addr, 0, {}, false};
  dl_iterate_phdr(find_object_cb, &q);
  return q;
}

namespace {

// The dynamic linker's count of objects unloaded so far (dl_iterate_phdr's dlpi_subs), or
// ~0 when this libc does not tell.
int unloads_cb(dl_phdr_info* info, size_t size, void* data) {
  if (size >= offsetof(dl_phdr_info, dlpi_subs) + sizeof info->dlpi_subs)
    *static_cast<unsigned long long*>(data) = info->dlpi_subs;
  return 1;  // every entry carries it; the first is enough
}

unsigned long long g_unloads_seen = ~0ull;  // g_mu: dlpi_subs when refresh_gone last looked

}  // namespace

// Marks probes whose library was unloaded: their bytes are never touched again. Looks only
// when the dynamic linker unloaded something since it last looked.
void refresh_gone() {
  unsigned long long unloads = ~0ull;
  dl_iterate_phdr(unloads_cb, &unloads);
  if (unloads != ~0ull && unloads == g_unloads_seen) return;
  g_unloads_seen = unloads;
  for (Aggregate* ag : g_aggrs) {
    if (ag->gone || ag->object_name.empty()) continue;
    ObjectQuery q = object_containing(ag->addr);
    if (q.found && q.base == ag->object_base && q.name == ag->object_name) continue;
    ag->gone = true;
    ag->armed = false;
    arch::mark_gone(ag->site);
    arch::set_optimized_context(ag->site, nullptr);
    dequeue_optimizer(ag);
    set_optimized_flag(ag, false);
    for (Kprobe* p : children_of(ag)) __atomic_or_fetch(&p->flags, KPROBE_FLAG_GONE, __ATOMIC_RELAXED);
    ++g_list_changes;
    table_remove(ag);
  }
}

}  // namespace probefs::probecore::detail
