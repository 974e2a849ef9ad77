// The control page room of Tracer (events/control_page.h): tracing_on, the events'
// soft-disabled bytes and the triggers' counts, which every target reads at its hits and
// whose triggers change at the hit. The daemon writes here what a user writes to
// tracing_on or an enable file; it reads back what the targets' triggers made of it.
// Every word is read as a plain number: any target may have written any of them.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include "tracee/tracer_impl.h"

namespace probefs::tracee {

ControlPageOwner::~ControlPageOwner() {
  if (page != nullptr) ::munmap(page, events::kControlPageBytes);
  if (fd >= 0) ::close(fd);
}

int ControlPageOwner::create() {
  fd = ::memfd_create("probefs-control", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return -errno;
  // No target may shrink it under the daemon's mapping (a read there would be SIGBUS).
  if (::ftruncate(fd, static_cast<off_t>(events::kControlPageBytes)) != 0 ||
      ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    return -errno;
  void* mem = ::mmap(nullptr, events::kControlPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (mem == MAP_FAILED) return -errno;
  page = static_cast<events::ControlPage*>(mem);
  __atomic_store_n(&page->magic, events::kControlMagic, __ATOMIC_RELAXED);
  count_used.assign(events::kControlCountSlots, false);
  return 0;
}

int Tracer::set_tracing_on(bool on, uint32_t buffer) {
  if (buffer >= events::kRingMaxBuffers) return -EINVAL;
  __atomic_store_n(&impl_->control.page->tracing_off[buffer], on ? 0u : 1u, __ATOMIC_RELAXED);
  return 0;
}

bool Tracer::tracing_on(uint32_t buffer) const {
  return buffer < events::kRingMaxBuffers &&
         !events::control_tracing_off(impl_->control.page, buffer);
}

bool Tracer::soft_disabled(uint16_t event_id, uint32_t buffer) const {
  return events::control_soft_disabled(impl_->control.page, event_id, buffer);
}

void Tracer::set_soft_disabled(uint16_t event_id, bool disabled, uint32_t buffer) {
  if (buffer >= events::kRingMaxBuffers) return;
  (void)events::control_switch_soft(impl_->control.page, event_id, disabled, buffer);
}

void Tracer::clear_soft_disabled(uint16_t event_id) {
  __atomic_store_n(&impl_->control.page->soft_disabled[event_id], uint16_t{0}, __ATOMIC_RELAXED);
}

int Tracer::create_trigger_count(int64_t count, uint32_t* slot) {
  ControlPageOwner& c = impl_->control;
  std::lock_guard l(c.mu);
  for (uint32_t i = 0; i < c.count_used.size(); ++i) {
    if (c.count_used[i]) continue;
    c.count_used[i] = true;
    __atomic_store_n(&c.page->counts[i], count, __ATOMIC_RELAXED);
    *slot = i;
    return 0;
  }
  return -ENOSPC;
}

int64_t Tracer::trigger_count(uint32_t slot) const {
  if (slot >= events::kControlCountSlots) return -1;
  const int64_t v = __atomic_load_n(&impl_->control.page->counts[slot], __ATOMIC_RELAXED);
  return v < 0 ? 0 : v;  // a target may have written anything: never "unlimited"
}

uint32_t Tracer::snapshot_requests(uint32_t buffer) const {
  return events::control_snapshot_requests(impl_->control.page, buffer);
}

bool Tracer::take_trigger_count(uint32_t slot) {
  return events::control_take_count(impl_->control.page, slot);
}

void Tracer::destroy_trigger_count(uint32_t slot) {
  ControlPageOwner& c = impl_->control;
  std::lock_guard l(c.mu);
  if (slot < c.count_used.size()) c.count_used[slot] = false;
}

}  // namespace probefs::tracee
