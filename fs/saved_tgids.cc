#include "fs/saved_tgids.h"

#include <charconv>

namespace probefs::fs {

void SavedTgids::save(pid_t tid, pid_t tgid) {
  if (tid <= 0 || tgid <= 0) return;
  std::lock_guard l(mu_);
  auto [it, inserted] = tgids_.try_emplace(tid, tgid);
  if (!inserted) {
    it->second = tgid;
    return;
  }
  order_.push_back(tid);
  if (order_.size() > kCapacity) {
    tgids_.erase(order_.front());
    order_.pop_front();
  }
}

void SavedTgids::save_missing(std::string_view cmdlines_text,
                              const std::function<pid_t(pid_t)>& tgid_of) {
  while (!cmdlines_text.empty()) {
    const size_t nl = cmdlines_text.find('\n');
    const std::string_view line = cmdlines_text.substr(0, nl);
    cmdlines_text.remove_prefix(nl == std::string_view::npos ? cmdlines_text.size() : nl + 1);
    pid_t tid = 0;
    std::from_chars(line.data(), line.data() + line.size(), tid);
    if (tid <= 0) continue;
    {
      std::lock_guard l(mu_);
      if (tgids_.count(tid)) continue;
    }
    save(tid, tgid_of(tid));
  }
}

std::string SavedTgids::show() const {
  std::lock_guard l(mu_);
  std::string out;
  for (const auto& [tid, tgid] : tgids_)
    out += std::to_string(tid) + " " + std::to_string(tgid) + "\n";
  return out;
}

}  // namespace probefs::fs
