#include "fs/dynamic_events.h"

#include "fs/tracefs.h"

namespace probefs::fs {

struct DynamicEvents::Impl {
  explicit Impl(Tracefs& f) : fs(f) {}
  Tracefs& fs;
};

DynamicEvents::DynamicEvents(Tracefs& fs) : impl_(std::make_unique<Impl>(fs)) {}
DynamicEvents::~DynamicEvents() = default;
void DynamicEvents::clear_all() {}

}  // namespace probefs::fs
