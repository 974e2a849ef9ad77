// The file tree probefs serves, apart from FUSE: directories and files, the behaviour of
// each file (File), and the state of one open file (Handle). fs/fuse_server.cc turns FUSE
// requests into calls on this tree; the tracefs model (fs/tracefs.h) builds it; tests
// drive it directly through Tree::open(), without a mount.
//
// Semantics follow the kernel's tracefs:
//   - every file reports size 0 and is served with direct I/O: a read returns what the
//     file's handle produces for that offset, nothing is cached;
//   - a Handle is created by open() and lives until release, so a file can keep per-open
//     state (a snapshot of its text, trace_pipe's partial line, a transaction's answer);
//   - O_TRUNC reaches File::open() in `flags` (an open that truncates may fail, as
//     uprobe_events does with EBUSY), and truncate() serves ftruncate/SETATTR size 0;
//   - a read may block (trace_pipe): it waits through Request::wait_until(), which returns
//     early when the caller is signalled or the mount is going away.
//
// Threads: FUSE calls arrive on several threads at once. The tree's shape is guarded by
// its own lock; each File guards its own state. Nodes are shared_ptr: a node removed from
// the tree stays valid for the handles and lookups that still hold it.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace probefs::fs {

// Who asks, and how: what a file operation knows about the request.
struct Request {
  pid_t pid = 0;  // the calling thread (0 when unknown)
  uid_t uid = 0;
  gid_t gid = 0;
  int flags = 0;  // the open file's flags as of this request (O_NONBLOCK, O_APPEND, ...)

  // A blocking read checks this between its bounded waits: true once the caller was
  // signalled (FUSE INTERRUPT) or the mount is ending; the read then returns what it has
  // (or -EINTR). Unset: never interrupted.
  std::function<bool()> interrupted;

  bool nonblocking() const;
  bool is_interrupted() const { return interrupted && interrupted(); }
};

class Handle {
 public:
  virtual ~Handle() = default;
  // Up to `size` bytes at `off` into *out. 0 (with *out empty: end of file), or a negative
  // errno. May block (see Request).
  virtual int read(const Request& rq, uint64_t off, size_t size, std::string* out) = 0;
  // read() as the server does it: on success the bytes go to `send`, once, and may lie
  // in the handle's own buffer for the time of that call (a reader of pages spares a
  // copy of each). The default reads into a string.
  using Send = std::function<void(const char* data, size_t len)>;
  virtual int read_to(const Request& rq, uint64_t off, size_t size, const Send& send);
  // Consumes `data` (one write() of the caller): bytes taken, or a negative errno.
  virtual int64_t write(const Request& rq, uint64_t off, std::string_view data);
  // ftruncate(fd, 0) (and SETATTR size 0 on an open file): 0 or a negative errno.
  virtual int truncate(const Request& rq);
  // For poll/select: whether a read would not block now. Files that never block keep
  // the default (always readable).
  virtual bool readable();
};

class File {
 public:
  virtual ~File() = default;
  // A new open file. `flags` are open(2)'s (O_ACCMODE, O_TRUNC, O_APPEND, O_NONBLOCK).
  // 0, or a negative errno (and nothing is opened).
  virtual int open(const Request& rq, int flags, std::unique_ptr<Handle>* out) = 0;
  // truncate(path, 0) without an open file (SETATTR size 0 by path).
  virtual int truncate(const Request& rq);
  // Files whose readers may block get waiters that poll() must wake: the server calls
  // this once, with a function to call whenever readable() may have turned true.
  virtual void set_wakeup(std::function<void()> wake);
  // true: reads never seek (trace_pipe); the server opens it non-seekable.
  virtual bool stream() const { return false; }
};

// A file whose text is made whole when a read starts at offset 0 and served from that
// snapshot for the reads that follow on the same open file (the kernel's seq_file, as a
// `cat` sees it). Writes go to `store` one write() at a time.
class TextFile : public File {
 public:
  using Show = std::function<std::string()>;
  // Returns bytes taken (data.size() on success) or a negative errno.
  using Store = std::function<int64_t(const Request& rq, std::string_view data)>;
  // Called for O_TRUNC at open and for truncate(): 0 or a negative errno (EBUSY refuses
  // the open itself).
  using Truncate = std::function<int(const Request& rq)>;

  explicit TextFile(Show show, Store store = {}, Truncate trunc = {});
  int open(const Request& rq, int flags, std::unique_ptr<Handle>* out) override;
  int truncate(const Request& rq) override;

 private:
  class OpenText;
  Show show_;
  Store store_;
  Truncate trunc_;
};

// "0\n"/"1\n"-style value files and other one-line files: show, and a store that gets
// one write() at a time.
std::shared_ptr<TextFile> make_text_file(TextFile::Show show, TextFile::Store store = {},
                                         TextFile::Truncate trunc = {});

// The kernel's modes for tracefs files.
inline constexpr mode_t kModeRead = 0440;       // -r--r-----
inline constexpr mode_t kModeReadWrite = 0640;  // -rw-r-----
inline constexpr mode_t kModeWrite = 0220;      // --w--w----  (trace_marker)
inline constexpr mode_t kModeWriteOwner = 0200; // --w-------  (free_buffer)
inline constexpr mode_t kModeDir = 0755;        // drwxr-xr-x
inline constexpr mode_t kModeDirPrivate = 0750; // drwxr-x---  (options, per_cpu, instances)

// What mkdir and rmdir do in a directory that takes them (instances/): the directory's
// owner makes or removes the child itself, in the tree. 0 or a negative errno.
class DirOps {
 public:
  virtual ~DirOps() = default;
  virtual int mkdir(const Request& rq, std::string_view name) = 0;
  virtual int rmdir(const Request& rq, std::string_view name) = 0;
};

class Node : public std::enable_shared_from_this<Node> {
 public:
  uint64_t ino() const { return ino_; }
  const std::string& name() const { return name_; }
  bool is_dir() const { return is_dir_; }
  mode_t mode() const { return mode_; }  // permission bits only
  const std::shared_ptr<File>& file() const { return file_; }
  // A directory's mkdir and rmdir; nullptr where they are refused (EACCES, EPERM).
  const std::shared_ptr<DirOps>& dir_ops() const { return dir_ops_; }
  // The parent directory; nullptr for the root and for nodes removed from the tree.
  std::shared_ptr<Node> parent() const;

 private:
  friend class Tree;
  uint64_t ino_ = 0;
  std::string name_;
  bool is_dir_ = false;
  mode_t mode_ = 0;
  std::shared_ptr<File> file_;
  std::shared_ptr<DirOps> dir_ops_;
  std::weak_ptr<Node> parent_;
  std::vector<std::shared_ptr<Node>> children_;  // readdir order: insertion order
};

using NodePtr = std::shared_ptr<Node>;

class Tree {
 public:
  Tree();
  Tree(const Tree&) = delete;
  Tree& operator=(const Tree&) = delete;

  NodePtr root() const { return root_; }

  // Adds a directory or file under `dir`; `before` (a child's name) places it ahead of
  // that child in readdir order, else it goes last. Returns the existing node when a
  // directory of that name is there already; nullptr when a file of that name is.
  NodePtr mkdir(const NodePtr& dir, std::string_view name, mode_t mode = kModeDir);
  // A directory whose mkdir and rmdir `ops` serve (set before the mount serves it).
  NodePtr mkdir_with_ops(const NodePtr& dir, std::string_view name, mode_t mode,
                         std::shared_ptr<DirOps> ops);
  NodePtr add_file(const NodePtr& dir, std::string_view name, mode_t mode,
                   std::shared_ptr<File> file, std::string_view before = {});
  // Removes `name` (and what is under it) from `dir`. false when it was not there.
  bool remove(const NodePtr& dir, std::string_view name);

  NodePtr lookup(const NodePtr& dir, std::string_view name) const;
  NodePtr find(uint64_t ino) const;  // any node still referenced by the tree or a holder
  // A path relative to the root ("events/uprobes/enable"); nullptr when absent.
  NodePtr walk(std::string_view path) const;
  std::vector<NodePtr> children(const NodePtr& dir) const;

  // For tests and tools that drive the tree without a mount: opens a path.
  int open(std::string_view path, const Request& rq, int flags,
           std::unique_ptr<Handle>* out) const;

  // The server keeps nodes the kernel knows (lookup counts) alive through these.
  void remember(const NodePtr& n);
  void forget(uint64_t ino, uint64_t count);

 private:
  mutable std::mutex mu_;
  NodePtr root_;
  std::atomic<uint64_t> next_ino_{2};  // FUSE's root is 1
  struct Known {
    std::weak_ptr<Node> node;
    NodePtr pinned;  // held while the kernel may still use the inode number
    uint64_t lookups = 0;
  };
  std::vector<std::pair<uint64_t, Known>> known_;  // sorted by ino
  Known* known_slot(uint64_t ino);
  const Known* known_slot(uint64_t ino) const;
};

}  // namespace probefs::fs
