#include "fs/vfs.h"

#include <fcntl.h>

#include <algorithm>
#include <cerrno>

namespace probefs::fs {

bool Request::nonblocking() const { return (flags & O_NONBLOCK) != 0; }

// ---- Handle and File defaults ----------------------------------------------------------

int Handle::read_to(const Request& rq, uint64_t off, size_t size, const Send& send) {
  std::string out;
  const int err = read(rq, off, size, &out);
  if (err >= 0) send(out.data(), out.size());
  return err;
}

int64_t Handle::write(const Request&, uint64_t, std::string_view) { return -EINVAL; }
int Handle::truncate(const Request&) { return 0; }
bool Handle::readable() { return true; }

int File::truncate(const Request&) { return 0; }
void File::set_wakeup(std::function<void()>) {}

// ---- TextFile ----------------------------------------------------------------------------

class TextFile::OpenText : public Handle {
 public:
  explicit OpenText(const TextFile& f) : file_(f) {}

  int read(const Request&, uint64_t off, size_t size, std::string* out) override {
    std::lock_guard l(mu_);
    // A read from the start makes the text anew (cat, or a reader that seeks back);
    // later offsets are served from that snapshot, as seq_file keeps its buffer.
    if (off == 0 || !have_) {
      text_ = file_.show_ ? file_.show_() : std::string();
      have_ = true;
    }
    out->clear();
    if (off < text_.size()) out->assign(text_, off, std::min(size, text_.size() - off));
    return 0;
  }

  int64_t write(const Request& rq, uint64_t, std::string_view data) override {
    if (!file_.store_) return -EINVAL;
    return file_.store_(rq, data);
  }

  int truncate(const Request& rq) override {
    return file_.trunc_ ? file_.trunc_(rq) : 0;
  }

 private:
  const TextFile& file_;
  std::mutex mu_;
  std::string text_;
  bool have_ = false;
};

TextFile::TextFile(Show show, Store store, Truncate trunc)
    : show_(std::move(show)), store_(std::move(store)), trunc_(std::move(trunc)) {}

int TextFile::open(const Request& rq, int flags, std::unique_ptr<Handle>* out) {
  if ((flags & O_TRUNC) && (flags & O_ACCMODE) != O_RDONLY && trunc_) {
    if (int err = trunc_(rq); err != 0) return err;
  }
  *out = std::make_unique<OpenText>(*this);
  return 0;
}

int TextFile::truncate(const Request& rq) { return trunc_ ? trunc_(rq) : 0; }

std::shared_ptr<TextFile> make_text_file(TextFile::Show show, TextFile::Store store,
                                         TextFile::Truncate trunc) {
  return std::make_shared<TextFile>(std::move(show), std::move(store), std::move(trunc));
}

// ---- Node and Tree -------------------------------------------------------------------------

std::shared_ptr<Node> Node::parent() const { return parent_.lock(); }

Tree::Tree() {
  root_ = std::make_shared<Node>();
  root_->ino_ = 1;
  root_->is_dir_ = true;
  root_->mode_ = 0700;  // tracefs: drwx------
  known_.push_back({1, Known{root_, root_, 1}});
}

Tree::Known* Tree::known_slot(uint64_t ino) {
  auto it = std::lower_bound(known_.begin(), known_.end(), ino,
                             [](const auto& e, uint64_t i) { return e.first < i; });
  return it != known_.end() && it->first == ino ? &it->second : nullptr;
}

const Tree::Known* Tree::known_slot(uint64_t ino) const {
  return const_cast<Tree*>(this)->known_slot(ino);
}

NodePtr Tree::mkdir(const NodePtr& dir, std::string_view name, mode_t mode) {
  std::lock_guard l(mu_);
  for (const NodePtr& c : dir->children_)
    if (c->name_ == name) return c->is_dir_ ? c : nullptr;
  auto n = std::make_shared<Node>();
  n->ino_ = next_ino_++;
  n->name_ = std::string(name);
  n->is_dir_ = true;
  n->mode_ = mode;
  n->parent_ = dir;
  dir->children_.push_back(n);
  known_.push_back({n->ino_, Known{n, nullptr, 0}});
  return n;
}

NodePtr Tree::mkdir_with_ops(const NodePtr& dir, std::string_view name, mode_t mode,
                             std::shared_ptr<DirOps> ops) {
  NodePtr n = mkdir(dir, name, mode);
  if (n) {
    std::lock_guard l(mu_);
    n->dir_ops_ = std::move(ops);
  }
  return n;
}

NodePtr Tree::add_file(const NodePtr& dir, std::string_view name, mode_t mode,
                       std::shared_ptr<File> file, std::string_view before) {
  std::lock_guard l(mu_);
  for (const NodePtr& c : dir->children_)
    if (c->name_ == name) return nullptr;
  auto n = std::make_shared<Node>();
  n->ino_ = next_ino_++;
  n->name_ = std::string(name);
  n->mode_ = mode;
  n->file_ = std::move(file);
  n->parent_ = dir;
  auto pos = dir->children_.end();
  if (!before.empty())
    pos = std::find_if(dir->children_.begin(), dir->children_.end(),
                       [&](const NodePtr& c) { return c->name_ == before; });
  dir->children_.insert(pos, n);
  known_.push_back({n->ino_, Known{n, nullptr, 0}});
  return n;
}

bool Tree::remove(const NodePtr& dir, std::string_view name) {
  std::lock_guard l(mu_);
  auto it = std::find_if(dir->children_.begin(), dir->children_.end(),
                         [&](const NodePtr& c) { return c->name_ == name; });
  if (it == dir->children_.end()) return false;
  (*it)->parent_.reset();
  dir->children_.erase(it);
  // Slots of nodes nobody holds any more go now; the rest go at their last forget.
  std::erase_if(known_, [](const auto& e) { return e.second.node.expired(); });
  return true;
}

NodePtr Tree::lookup(const NodePtr& dir, std::string_view name) const {
  std::lock_guard l(mu_);
  if (!dir || !dir->is_dir_) return nullptr;
  for (const NodePtr& c : dir->children_)
    if (c->name_ == name) return c;
  return nullptr;
}

NodePtr Tree::find(uint64_t ino) const {
  std::lock_guard l(mu_);
  const Known* k = known_slot(ino);
  return k ? k->node.lock() : nullptr;
}

NodePtr Tree::walk(std::string_view path) const {
  NodePtr n = root_;
  while (n && !path.empty()) {
    size_t slash = path.find('/');
    std::string_view part = path.substr(0, slash);
    path = slash == std::string_view::npos ? std::string_view() : path.substr(slash + 1);
    if (part.empty() || part == ".") continue;
    n = lookup(n, part);
  }
  return n;
}

std::vector<NodePtr> Tree::children(const NodePtr& dir) const {
  std::lock_guard l(mu_);
  return dir->children_;
}

int Tree::open(std::string_view path, const Request& rq, int flags,
               std::unique_ptr<Handle>* out) const {
  NodePtr n = walk(path);
  if (!n) return -ENOENT;
  if (n->is_dir()) return -EISDIR;
  return n->file()->open(rq, flags, out);
}

void Tree::remember(const NodePtr& n) {
  std::lock_guard l(mu_);
  Known* k = known_slot(n->ino_);
  if (!k) return;
  k->pinned = n;
  ++k->lookups;
}

void Tree::forget(uint64_t ino, uint64_t count) {
  std::lock_guard l(mu_);
  Known* k = known_slot(ino);
  if (!k || ino == 1) return;
  k->lookups = count >= k->lookups ? 0 : k->lookups - count;
  if (k->lookups == 0) {
    k->pinned.reset();
    std::erase_if(known_, [](const auto& e) { return e.second.node.expired(); });
  }
}

}  // namespace probefs::fs
