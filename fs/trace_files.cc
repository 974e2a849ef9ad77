#include "fs/trace_files.h"

#include "fs/tracefs.h"

namespace probefs::fs {

struct TraceFiles::Impl {
  explicit Impl(Tracefs& f) : fs(f) {}
  Tracefs& fs;
};

TraceFiles::TraceFiles(Tracefs& fs) : impl_(std::make_unique<Impl>(fs)) {}
TraceFiles::~TraceFiles() = default;
void TraceFiles::wake_readers() {}

}  // namespace probefs::fs
