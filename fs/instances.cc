#include "fs/instances.h"

#include <cerrno>

#include "events/raw_page.h"
#include "events/ring.h"
#include "fs/dynamic_events.h"
#include "fs/trace_files.h"
#include "fs/tracefs.h"

namespace probefs::fs {

Instances::Instances(Tracefs& fs) : fs_(fs) {}

Instances::~Instances() = default;

void Instances::attach(const NodePtr& dir) { dir_ = dir; }

int Instances::mkdir(const Request&, std::string_view name) {
  // The kernel's tracefs takes any name a directory may have.
  if (name.empty() || name.size() > 255 || name.find('/') != std::string_view::npos)
    return -EINVAL;
  std::lock_guard l(mu_);
  const NodePtr top = dir();
  if (!top) return -ENOENT;
  if (by_name_.count(name) || fs_.tree().lookup(top, name)) return -EEXIST;
  uint32_t buffer = 1;
  while (buffer < events::kRingMaxBuffers && ((buffers_used_ >> buffer) & 1)) ++buffer;
  if (buffer == events::kRingMaxBuffers) return -ENOSPC;
  // A buffer an instance had before starts empty and on.
  fs_.tracer().clear_records(buffer);
  (void)fs_.tracer().set_tracing_on(true, buffer);
  fs_.set_subbuf_bytes(buffer, events::kRawPageSize);
  NodePtr dir = fs_.tree().mkdir(top, name, kModeDirPrivate);
  if (!dir) return -EEXIST;
  Instance in;
  in.buffer = buffer;
  in.files = std::make_shared<TraceFiles>(fs_, buffer, dir, fs_.trace_files());
  fs_.dynamic_events().add_instance(buffer, dir);
  buffers_used_ |= 1u << buffer;
  by_name_.emplace(std::string(name), std::move(in));
  return 0;
}

int Instances::rmdir(const Request&, std::string_view name) {
  std::lock_guard l(mu_);
  const NodePtr top = dir();
  if (!top) return -ENOENT;
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return fs_.tree().lookup(top, name) ? -EPERM : -ENOENT;
  const Instance in = it->second;
  by_name_.erase(it);
  // Its events first: nothing records into its buffer from here.
  fs_.dynamic_events().remove_instance(in.buffer);
  fs_.tree().remove(top, name);
  in.files->stop_readers();
  fs_.tracer().release_buffer(in.buffer);
  (void)fs_.tracer().set_tracing_on(true, in.buffer);
  buffers_used_ &= ~(1u << in.buffer);
  return 0;
}

std::vector<std::shared_ptr<TraceFiles>> Instances::trace_files() const {
  std::lock_guard l(mu_);
  std::map<uint32_t, std::shared_ptr<TraceFiles>> by_buffer;
  for (const auto& [name, in] : by_name_) by_buffer[in.buffer] = in.files;
  std::vector<std::shared_ptr<TraceFiles>> out;
  for (auto& [b, f] : by_buffer) out.push_back(f);
  return out;
}

}  // namespace probefs::fs
