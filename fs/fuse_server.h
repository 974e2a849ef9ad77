// Serves a Tracefs over FUSE (libfuse3's low-level API): the kernel's requests become calls
// on the file tree (fs/vfs.h).
//
// What the kernel sees:
//   - every file has size 0 and is opened with direct I/O (no page cache, no writeback
//     cache), so `cat` of a size-0 file reads what the file produces; streams
//     (trace_pipe) are also non-seekable;
//   - O_TRUNC comes with the open (atomic O_TRUNC), so an open that truncates can fail as
//     the kernel's does (EBUSY on uprobe_events);
//   - poll/select work on every file; a file whose reads may block wakes its pollers;
//   - a blocked read returns when its caller is signalled (FUSE INTERRUPT) and when the
//     mount is going away (unmount, even a lazy one while a reader holds a file open);
//   - attributes and directory entries are not cached (timeouts 0): events come and go.
//
// Threads: run() serves on a pool of threads (a blocked reader holds one); stop() may be
// called from any thread or a signal-driven exit path.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace probefs::fs {

class Tracefs;

class FuseServer {
 public:
  struct Options {
    std::string mountpoint;
    // FUSE mount options (-o), e.g. "allow_other"; fsname and subtype are set here.
    std::vector<std::string> mount_options;
    bool debug = false;  // libfuse's request log on stderr
    // tracefs's gid=: the group of every file and directory (the daemon's own otherwise);
    // modes stay, so the group's bits in them apply (with allow_other, to other users).
    std::optional<gid_t> gid;
  };

  // Mounts. nullptr and *error (one line) on failure.
  static std::unique_ptr<FuseServer> mount(Tracefs& fs, const Options& opts,
                                           std::string* error);
  ~FuseServer();  // unmounts if still mounted
  FuseServer(const FuseServer&) = delete;
  FuseServer& operator=(const FuseServer&) = delete;

  // Serves until the mount goes away or stop(); installs handlers so that SIGINT, SIGTERM
  // and SIGHUP end the loop. 0, or a negative errno when the loop failed.
  int run();
  void stop();

  struct Impl;

 private:
  explicit FuseServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace probefs::fs
