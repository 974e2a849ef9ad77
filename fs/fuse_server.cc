#define FUSE_USE_VERSION 312
#include "fs/fuse_server.h"

#include <fcntl.h>
#include <fuse3/fuse_lowlevel.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <mutex>
#include <sstream>
#include <thread>

#include "fs/trace_files.h"
#include "fs/tracefs.h"

namespace probefs::fs {

namespace {

// What an open file is to the server: fi->fh points at one.
struct OpenFile {
  NodePtr node;
  std::unique_ptr<Handle> handle;
  bool writable = false;
  // The latest poll handle the kernel gave for this file, waiting for a wake-up.
  fuse_pollhandle* poll = nullptr;
};

// A directory listing, taken at opendir: readdir offsets index into it.
struct DirSnapshot {
  struct Entry {
    std::string name;
    uint64_t ino;
    bool dir;
  };
  std::vector<Entry> entries;
};

}  // namespace

struct FuseServer::Impl {
  Tracefs& fs;
  Options opts;
  fuse_session* se = nullptr;
  bool mounted = false;
  std::string dev;  // the mount's "MAJOR:MINOR", to see it leave /proc/self/mountinfo
  uid_t uid = getuid();
  gid_t gid = getgid();
  timespec mounted_at{};
  pthread_t loop_thread{};
  std::atomic<bool> loop_running{false};
  std::atomic<bool> stopping{false};
  std::atomic<bool> stop_requested{false};  // stop(), a signal, or the mount left
  // Reads being served: at the end, blocked readers get their answer (end of file)
  // before the session goes, rather than a connection abort.
  std::mutex reads_mu;
  std::condition_variable reads_cv;
  int reads_in_flight = 0;
  int open_files = 0;  // and their closes (flush, release) are answered too
  std::set<OpenFile*> opened;  // freed at the end if the kernel never released them
  std::thread watcher;
  int watcher_wake[2] = {-1, -1};  // ends the watcher
  int stop_pipe[2] = {-1, -1};      // asks for a graceful end (signals, stop())

  // What the files' wake-ups reach: cut off when the server goes, as the files (and the
  // threads that wake) may outlive it.
  struct WakeHub {
    std::mutex mu;
    Impl* server = nullptr;
  };
  std::shared_ptr<WakeHub> hub = std::make_shared<WakeHub>();

  std::mutex poll_mu;
  std::map<OpenFile*, std::shared_ptr<File>> pollers;  // open files with a poll handle
  std::map<File*, bool> hooked;                          // files whose wake-up is set

  explicit Impl(Tracefs& f) : fs(f) {}

  static Impl& of(fuse_req_t req) { return *static_cast<Impl*>(fuse_req_userdata(req)); }

  Request request(fuse_req_t req, int flags) {
    const fuse_ctx* c = fuse_req_ctx(req);
    Request rq;
    rq.pid = c->pid;
    rq.uid = c->uid;
    rq.gid = c->gid;
    rq.flags = flags;
    rq.interrupted = [this, req] { return fuse_req_interrupted(req) || fs.shutting_down(); };
    return rq;
  }

  void fill_attr(const Node& n, struct stat* st) const {
    memset(st, 0, sizeof(*st));
    st->st_ino = n.ino();
    st->st_mode = (n.is_dir() ? S_IFDIR : S_IFREG) | n.mode();
    st->st_nlink = n.is_dir() ? 2 : 1;
    st->st_uid = uid;
    st->st_gid = gid;
    st->st_size = 0;
    st->st_blksize = 4096;
    st->st_atim = st->st_mtim = st->st_ctim = mounted_at;
  }

  // Wakes the pollers of `file` whose reads would no longer block.
  void wake_pollers(File* file) {
    std::lock_guard l(poll_mu);
    for (auto it = pollers.begin(); it != pollers.end();) {
      OpenFile* of = it->first;
      if (it->second.get() == file && of->poll && of->handle->readable()) {
        fuse_lowlevel_notify_poll(of->poll);
        fuse_pollhandle_destroy(of->poll);
        of->poll = nullptr;
        it = pollers.erase(it);
      } else {
        ++it;
      }
    }
  }

  void drop_poller(OpenFile* of) {
    std::lock_guard l(poll_mu);
    pollers.erase(of);
    if (of->poll) fuse_pollhandle_destroy(of->poll);
    of->poll = nullptr;
  }

  // The mount left the mount table (a lazy unmount while files are open): readers return
  // at once and the loop ends, so no target stays probed for a mount nobody can reach.
  void watch_mounts();
  bool still_mounted() const;
  void end_loop();
};

// ---- requests ------------------------------------------------------------------------------

namespace {

using Impl = FuseServer::Impl;

constexpr double kTimeout = 0;  // nothing is cached: events come and go

void reply_entry(fuse_req_t req, Impl& s, const NodePtr& n) {
  fuse_entry_param e;
  memset(&e, 0, sizeof(e));
  e.ino = n->ino();
  e.generation = 1;
  s.fill_attr(*n, &e.attr);
  e.attr_timeout = kTimeout;
  e.entry_timeout = kTimeout;
  s.fs.tree().remember(n);
  if (fuse_reply_entry(req, &e) != 0) s.fs.tree().forget(n->ino(), 1);
}

void op_init(void* data, fuse_conn_info* conn) {
  (void)data;
  // O_TRUNC arrives with the open, so the open itself can fail (EBUSY).
  if (conn->capable & FUSE_CAP_ATOMIC_O_TRUNC) conn->want |= FUSE_CAP_ATOMIC_O_TRUNC;
  // No page cache for writes, no readahead: every read is the file's answer.
  conn->want &= ~FUSE_CAP_WRITEBACK_CACHE;
  conn->want &= ~FUSE_CAP_ASYNC_READ;
  conn->max_readahead = 0;
}

void op_lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Impl& s = Impl::of(req);
  NodePtr dir = s.fs.tree().find(parent);
  if (!dir) return (void)fuse_reply_err(req, ENOENT);
  NodePtr n = s.fs.tree().lookup(dir, name);
  if (!n) return (void)fuse_reply_err(req, ENOENT);
  reply_entry(req, s, n);
}

void op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup) {
  Impl::of(req).fs.tree().forget(ino, nlookup);
  fuse_reply_none(req);
}

void op_forget_multi(fuse_req_t req, size_t count, fuse_forget_data* forgets) {
  Impl& s = Impl::of(req);
  for (size_t i = 0; i < count; ++i) s.fs.tree().forget(forgets[i].ino, forgets[i].nlookup);
  fuse_reply_none(req);
}

void op_getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  Impl& s = Impl::of(req);
  NodePtr n = s.fs.tree().find(ino);
  if (!n) return (void)fuse_reply_err(req, ENOENT);
  struct stat st;
  s.fill_attr(*n, &st);
  fuse_reply_attr(req, &st, kTimeout);
}

void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set,
                fuse_file_info* fi) {
  Impl& s = Impl::of(req);
  NodePtr n = s.fs.tree().find(ino);
  if (!n) return (void)fuse_reply_err(req, ENOENT);
  if (to_set & FUSE_SET_ATTR_SIZE) {
    if (n->is_dir()) return (void)fuse_reply_err(req, EISDIR);
    if (attr->st_size != 0) return (void)fuse_reply_err(req, EINVAL);
    Request rq = s.request(req, fi ? fi->flags : O_WRONLY);
    int err = fi ? reinterpret_cast<OpenFile*>(fi->fh)->handle->truncate(rq)
                 : n->file()->truncate(rq);
    if (err < 0) return (void)fuse_reply_err(req, -err);
  }
  // Modes, owners and times stay what they are (as on tracefs, nothing is stored).
  struct stat st;
  s.fill_attr(*n, &st);
  fuse_reply_attr(req, &st, kTimeout);
}

void op_open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  Impl& s = Impl::of(req);
  NodePtr n = s.fs.tree().find(ino);
  if (!n) return (void)fuse_reply_err(req, ENOENT);
  if (n->is_dir()) return (void)fuse_reply_err(req, EISDIR);
  auto of = std::make_unique<OpenFile>();
  of->node = n;
  of->writable = (fi->flags & O_ACCMODE) != O_RDONLY;
  if (int err = n->file()->open(s.request(req, fi->flags), fi->flags, &of->handle); err < 0)
    return (void)fuse_reply_err(req, -err);
  fi->direct_io = 1;
  fi->keep_cache = 0;
  fi->nonseekable = n->file()->stream() ? 1 : 0;
  // Counted before the reply: its release may come at once, on another thread.
  OpenFile* raw = of.release();
  fi->fh = reinterpret_cast<uint64_t>(raw);
  {
    std::lock_guard l(s.reads_mu);
    s.opened.insert(raw);
    ++s.open_files;
  }
  if (fuse_reply_open(req, fi) != 0) {  // the opener is gone: no release will come
    {
      std::lock_guard l(s.reads_mu);
      s.opened.erase(raw);
      --s.open_files;
    }
    delete raw;
  }
}

void op_read(fuse_req_t req, fuse_ino_t, size_t size, off_t off, fuse_file_info* fi) {
  Impl& s = Impl::of(req);
  auto* of = reinterpret_cast<OpenFile*>(fi->fh);
  // A signal to the reader wakes its blocked read at once rather than at its next check.
  fuse_req_interrupt_func(
      req, [](fuse_req_t, void* d) { static_cast<Impl*>(d)->fs.wake_readers(); },
      &s);
  {
    std::lock_guard l(s.reads_mu);
    ++s.reads_in_flight;
  }
  bool replied = false;
  const int err = of->handle->read_to(s.request(req, fi->flags), static_cast<uint64_t>(off),
                                      size, [&](const char* data, size_t len) {
                                        fuse_reply_buf(req, data, len);
                                        replied = true;
                                      });
  if (err < 0 && !replied)
    fuse_reply_err(req, -err);
  else if (!replied)
    fuse_reply_buf(req, nullptr, 0);
  std::lock_guard l(s.reads_mu);
  if (--s.reads_in_flight == 0) s.reads_cv.notify_all();
}

void op_write(fuse_req_t req, fuse_ino_t, const char* buf, size_t size, off_t off,
              fuse_file_info* fi) {
  Impl& s = Impl::of(req);
  auto* of = reinterpret_cast<OpenFile*>(fi->fh);
  int64_t n = of->handle->write(s.request(req, fi->flags), static_cast<uint64_t>(off),
                                std::string_view(buf, size));
  if (n < 0) return (void)fuse_reply_err(req, static_cast<int>(-n));
  fuse_reply_write(req, static_cast<size_t>(n));
}

void op_flush(fuse_req_t req, fuse_ino_t, fuse_file_info*) { fuse_reply_err(req, 0); }

void op_release(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  Impl& s = Impl::of(req);
  auto* of = reinterpret_cast<OpenFile*>(fi->fh);
  s.drop_poller(of);
  {
    std::lock_guard l(s.reads_mu);
    s.opened.erase(of);
    if (--s.open_files == 0) s.reads_cv.notify_all();
  }
  delete of;
  fuse_reply_err(req, 0);
}

void op_poll(fuse_req_t req, fuse_ino_t, fuse_file_info* fi, fuse_pollhandle* ph) {
  Impl& s = Impl::of(req);
  auto* of = reinterpret_cast<OpenFile*>(fi->fh);
  std::shared_ptr<File> file = of->node->file();
  unsigned revents = of->writable ? POLLOUT | POLLWRNORM : 0;
  if (ph) {
    {
      std::lock_guard l(s.poll_mu);
      if (!s.hooked[file.get()]) {
        s.hooked[file.get()] = true;
        File* raw = file.get();
        std::shared_ptr<Impl::WakeHub> hub = s.hub;
        file->set_wakeup([hub, raw] {
          std::lock_guard l(hub->mu);
          if (hub->server) hub->server->wake_pollers(raw);
        });
      }
      if (of->poll) fuse_pollhandle_destroy(of->poll);
      of->poll = ph;
      s.pollers[of] = file;
    }
  }
  if (of->handle->readable()) {
    revents |= POLLIN | POLLRDNORM;
    if (ph) s.drop_poller(of);
  }
  fuse_reply_poll(req, revents);
}

void op_opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  Impl& s = Impl::of(req);
  NodePtr n = s.fs.tree().find(ino);
  if (!n) return (void)fuse_reply_err(req, ENOENT);
  if (!n->is_dir()) return (void)fuse_reply_err(req, ENOTDIR);
  auto snap = std::make_unique<DirSnapshot>();
  NodePtr parent = n->parent();
  snap->entries.push_back({".", n->ino(), true});
  snap->entries.push_back({"..", parent ? parent->ino() : n->ino(), true});
  for (const NodePtr& c : s.fs.tree().children(n))
    snap->entries.push_back({c->name(), c->ino(), c->is_dir()});
  fi->fh = reinterpret_cast<uint64_t>(snap.get());
  fi->cache_readdir = 0;
  if (fuse_reply_open(req, fi) == 0) snap.release();
}

void op_readdir(fuse_req_t req, fuse_ino_t, size_t size, off_t off, fuse_file_info* fi) {
  auto* snap = reinterpret_cast<DirSnapshot*>(fi->fh);
  std::string buf(size, '\0');
  size_t used = 0;
  for (size_t i = static_cast<size_t>(off); i < snap->entries.size(); ++i) {
    const auto& e = snap->entries[i];
    struct stat st;
    memset(&st, 0, sizeof(st));
    st.st_ino = e.ino;
    st.st_mode = e.dir ? S_IFDIR : S_IFREG;
    size_t need = fuse_add_direntry(req, buf.data() + used, size - used, e.name.c_str(), &st,
                                    static_cast<off_t>(i + 1));
    if (need > size - used) break;
    used += need;
  }
  fuse_reply_buf(req, buf.data(), used);
}

void op_releasedir(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  delete reinterpret_cast<DirSnapshot*>(fi->fh);
  fuse_reply_err(req, 0);
}

// tracefs makes no files of a user's choosing, and directories only where the directory
// says how (instances/: DirOps).
void op_mknod(fuse_req_t req, fuse_ino_t, const char*, mode_t, dev_t) {
  fuse_reply_err(req, EACCES);
}
void op_mkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t) {
  Impl& s = Impl::of(req);
  NodePtr dir = s.fs.tree().find(parent);
  if (!dir) return (void)fuse_reply_err(req, ENOENT);
  if (!dir->dir_ops()) return (void)fuse_reply_err(req, EACCES);
  if (int err = dir->dir_ops()->mkdir(s.request(req, 0), name); err < 0)
    return (void)fuse_reply_err(req, -err);
  NodePtr n = s.fs.tree().lookup(dir, name);
  if (!n) return (void)fuse_reply_err(req, ENOENT);  // removed again at once
  reply_entry(req, s, n);
}
void op_create(fuse_req_t req, fuse_ino_t, const char*, mode_t, fuse_file_info*) {
  fuse_reply_err(req, EACCES);
}
void op_unlink(fuse_req_t req, fuse_ino_t, const char*) { fuse_reply_err(req, EPERM); }
void op_rmdir(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Impl& s = Impl::of(req);
  NodePtr dir = s.fs.tree().find(parent);
  if (!dir) return (void)fuse_reply_err(req, ENOENT);
  if (!dir->dir_ops()) return (void)fuse_reply_err(req, EPERM);
  fuse_reply_err(req, -dir->dir_ops()->rmdir(s.request(req, 0), name));
}

const fuse_lowlevel_ops kOps = [] {
  fuse_lowlevel_ops o;
  memset(&o, 0, sizeof(o));
  o.init = op_init;
  o.lookup = op_lookup;
  o.forget = op_forget;
  o.forget_multi = op_forget_multi;
  o.getattr = op_getattr;
  o.setattr = op_setattr;
  o.open = op_open;
  o.read = op_read;
  o.write = op_write;
  o.flush = op_flush;
  o.release = op_release;
  o.poll = op_poll;
  o.opendir = op_opendir;
  o.readdir = op_readdir;
  o.releasedir = op_releasedir;
  o.mknod = op_mknod;
  o.mkdir = op_mkdir;
  o.create = op_create;
  o.unlink = op_unlink;
  o.rmdir = op_rmdir;
  return o;
}();

}  // namespace

// ---- the mount's life ------------------------------------------------------------------------

namespace {

// "ID PARENT MAJOR:MINOR ROOT MOUNTPOINT ..." lines of /proc/self/mountinfo. (Mount
// points with spaces are escaped there as \040; ours are compared as written.)
template <typename Fn>
void for_each_mount(Fn fn) {
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string id, parent, devno, root, point;
    f >> id >> parent >> devno >> root >> point;
    if (fn(devno, point)) return;
  }
}

// The device of the last mount on `point` ("MAJOR:MINOR").
std::string mount_device(const std::string& point) {
  std::string dev;
  for_each_mount([&](const std::string& d, const std::string& p) {
    if (p == point) dev = d;
    return false;
  });
  return dev;
}

}  // namespace

bool FuseServer::Impl::still_mounted() const {
  if (dev.empty()) return true;
  bool found = false;
  for_each_mount([&](const std::string& d, const std::string&) { return found = d == dev; });
  return found;
}

void FuseServer::Impl::watch_mounts() {
  int fd = open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  while (!stopping) {
    pollfd p[3] = {{fd, POLLPRI, 0}, {watcher_wake[0], POLLIN, 0}, {stop_pipe[0], POLLIN, 0}};
    int r = ::poll(p, 3, 1000);
    if (r < 0 && errno != EINTR) break;
    if (p[1].revents) break;
    if (p[2].revents || !still_mounted()) {
      stop_requested = true;
      fs.shutdown();
      {
        // Blocked readers see the shutdown within their next check, return end of file
        // and close; a file someone keeps open is not waited for beyond the bound.
        std::unique_lock l(reads_mu);
        reads_cv.wait_for(l, std::chrono::seconds(5), [this] { return reads_in_flight == 0; });
        reads_cv.wait_for(l, std::chrono::seconds(1), [this] { return open_files == 0; });
      }
      end_loop();
      break;
    }
  }
  close(fd);
}

void FuseServer::Impl::end_loop() {
  if (se) fuse_session_exit(se);
  // The loop's main thread waits on a semaphore that only a signal interrupts; our
  // handler for SIGHUP ends the session as well.
  if (loop_running) pthread_kill(loop_thread, SIGHUP);
}

namespace {

// SIGINT, SIGTERM and SIGHUP end the loop (the daemon then unmounts and lets its targets
// go). libfuse has handlers of its own, but its loop forgets why it ended.
std::atomic<FuseServer::Impl*> g_signalled_server{nullptr};

// Only a byte to the watcher, which ends the loop once blocked readers have returned.
// end_loop()'s own SIGHUP lands here too, harmlessly.
void on_exit_signal(int) {
  if (FuseServer::Impl* s = g_signalled_server.load()) {
    int saved = errno;
    (void)!write(s->stop_pipe[1], "s", 1);
    errno = saved;
  }
}

void install_exit_signals(FuseServer::Impl* s) {
  g_signalled_server = s;
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_exit_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

void remove_exit_signals() {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) signal(sig, SIG_DFL);
  g_signalled_server = nullptr;
}

}  // namespace

FuseServer::FuseServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

std::unique_ptr<FuseServer> FuseServer::mount(Tracefs& fs, const Options& opts,
                                              std::string* error) {
  auto impl = std::make_unique<Impl>(fs);
  impl->opts = opts;
  if (opts.gid) impl->gid = *opts.gid;
  impl->hub->server = impl.get();
  clock_gettime(CLOCK_REALTIME, &impl->mounted_at);

  std::vector<std::string> args = {"probefs"};
  if (opts.debug) args.push_back("-d");
  std::string o = "fsname=probefs,subtype=probefs,default_permissions";
  for (const std::string& m : opts.mount_options) o += "," + m;
  args.push_back("-o");
  args.push_back(o);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  fuse_args fargs = FUSE_ARGS_INIT(static_cast<int>(argv.size()), argv.data());
  impl->se = fuse_session_new(&fargs, &kOps, sizeof(kOps), impl.get());
  fuse_opt_free_args(&fargs);
  if (!impl->se) {
    if (error) *error = "cannot start a FUSE session (bad -o option?)";
    return nullptr;
  }
  if (fuse_session_mount(impl->se, opts.mountpoint.c_str()) != 0) {
    if (error) *error = "cannot mount on " + opts.mountpoint;
    fuse_session_destroy(impl->se);
    impl->se = nullptr;
    return nullptr;
  }
  impl->mounted = true;
  // Not stat(): that would be a request to this very server, which serves nothing yet.
  impl->dev = mount_device(opts.mountpoint);
  return std::unique_ptr<FuseServer>(new FuseServer(std::move(impl)));
}

int FuseServer::run() {
  Impl& s = *impl_;
  s.loop_thread = pthread_self();
  s.loop_running = true;
  if (pipe2(s.stop_pipe, O_CLOEXEC | O_NONBLOCK) != 0 || pipe2(s.watcher_wake, O_CLOEXEC) != 0)
    return -errno;
  install_exit_signals(&s);
  s.watcher = std::thread([&s] { s.watch_mounts(); });
  fuse_loop_config* cfg = fuse_loop_cfg_create();
  // Each blocked trace_pipe reader holds a thread; never let them starve the others.
  fuse_loop_cfg_set_max_threads(cfg, 1024);
  fuse_loop_cfg_set_idle_threads(cfg, 4);
  int rc = fuse_session_loop_mt(s.se, cfg);
  fuse_loop_cfg_destroy(cfg);
  s.loop_running = false;
  s.stopping = true;
  s.fs.shutdown();
  if (s.watcher.joinable()) {
    (void)!write(s.watcher_wake[1], "x", 1);
    s.watcher.join();
  }
  remove_exit_signals();
  // The kernel ending the connection (an unmount) and stop() are the normal ways out;
  // libfuse reports the former as an error of its own.
  if (rc != 0 && (!s.still_mounted() || s.stop_requested)) rc = 0;
  return rc < 0 ? rc : (rc > 0 ? -rc : 0);
}

void FuseServer::stop() { (void)!write(impl_->stop_pipe[1], "s", 1); }

FuseServer::~FuseServer() {
  Impl& s = *impl_;
  {
    std::lock_guard l(s.hub->mu);
    s.hub->server = nullptr;
  }
  s.stopping = true;
  if (s.watcher.joinable()) {
    (void)!write(s.watcher_wake[1], "x", 1);
    s.watcher.join();
  }
  for (int fd : {s.watcher_wake[0], s.watcher_wake[1], s.stop_pipe[0], s.stop_pipe[1]})
    if (fd >= 0) close(fd);
  {
    std::lock_guard l(s.poll_mu);
    for (auto& [of, file] : s.pollers)
      if (of->poll) fuse_pollhandle_destroy(of->poll);
    s.pollers.clear();
  }
  // Files the kernel never released (a lazy unmount ends the session first).
  for (OpenFile* of : s.opened) delete of;
  s.opened.clear();
  if (s.se) {
    if (s.mounted) {
      // Also when the mount is gone already (fusermount3 -u): the session frees its own
      // state there. libfuse's complaint that there was nothing to unmount is not news.
      if (!s.still_mounted())
        fuse_set_log_func([](enum fuse_log_level, const char*, va_list) {});
      fuse_session_unmount(s.se);
      fuse_set_log_func(nullptr);
    }
    fuse_session_destroy(s.se);
  }
}

}  // namespace probefs::fs
