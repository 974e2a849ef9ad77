// What ties the rooms of Tracer::Impl together (tracee/tracer_impl.h): creating the
// tracer (the agents' listener, the clock, the daemon's own ring area, the service
// thread) and taking it down. The rooms are tracer_targets.cc, tracer_placement.cc and
// tracer_records.cc; which lock guards what is written at the top of tracer_impl.h.

#include <sys/resource.h>

#include <cstring>
#include <thread>

#include "tracee/tracer_impl.h"

namespace probefs::tracee {

Tracer::Tracer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

std::unique_ptr<Tracer> Tracer::create(const Options& opts, std::string* error) {
  auto impl = std::make_unique<Impl>();
  impl->opts = opts;
  impl->buffer_kb = opts.buffer_size_kb;
  impl->buffers.resize(events::kRingMaxBuffers);
  impl->buffers[0].merger = events::RingMerger(true, 0);
  impl->buffers[0].peeker = events::RingMerger(false, 0);
  impl->buffers[0].active = true;
  if (rlimit rl; getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    impl->nofile_soft = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max;
    (void)setrlimit(RLIMIT_NOFILE, &rl);
  }
  if (int e = impl->control.create(); e != 0) {
    if (error) *error = "cannot create the control page: " + std::string(strerror(-e));
    return nullptr;
  }
  int err = 0;
  impl->listener = AgentListener::create(&err);
  if (!impl->listener) {
    if (error) *error = "cannot listen for agents: " + std::string(strerror(-err));
    return nullptr;
  }
  if (int e = impl->boot_conv.calibrate(events::TraceClock::kBoot); e != 0) {
    if (error) *error = "cannot read the boot clock: " + std::string(strerror(-e));
    return nullptr;
  }
  if (int e = impl->conv.calibrate(impl->clock); e != 0) {
    if (error) *error = "cannot read the trace clock: " + std::string(strerror(-e));
    return nullptr;
  }
  if (int e = impl->new_own_rings(); e != 0) {
    if (error) *error = "cannot create the daemon's ring area: " + std::string(strerror(-e));
    return nullptr;
  }
  Impl* raw = impl.get();
  impl->service = std::thread([raw] { raw->service_loop(); });
  return std::unique_ptr<Tracer>(new Tracer(std::move(impl)));
}

Tracer::~Tracer() {
  {
    std::lock_guard l(impl_->mu);
    for (auto& [pid, t] : impl_->targets)
      if (t->link && !t->link->closed()) (void)t->link->detach();
  }
  impl_->stop = true;
  if (impl_->service.joinable()) impl_->service.join();
  impl_->targets.clear();
  impl_->listener.reset();
}

uint64_t Tracer::refused_links() const {
  return impl_->listener ? impl_->listener->stats().refused : 0;
}

}  // namespace probefs::tracee
