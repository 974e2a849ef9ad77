// A thread's ring is retired when the thread ends, so that its ring can be freed and taken
// over at once: the daemon and the next claimer then see kRingOwnerRetired instead of
// asking the kernel whether the owner lives (events/ring.h, "Owners").
//
// glibc tells a library that a thread ends through thread-specific data: the destructor of
// a pthread key runs on the ending thread, after its C++ thread_local destructors, for
// every key whose value is not null. A thread's first claim sets the value (the hit path,
// claim_slow); the destructor retires the ring. Only a key below glibc's first-level
// block (32 keys, inside the thread descriptor) is used: setting the value of a higher one
// may allocate, which the hit path must not. A program that took those 32 keys before the
// agent came has its threads' rings found gone the slower way.
//
// A hit on the ending thread after the destructor (a probe on free, in another key's
// destructor) claims a ring again, and sets the value again: glibc runs the destructors
// again, up to PTHREAD_DESTRUCTOR_ITERATIONS times.
#include <pthread.h>

#include <atomic>

#include "agent/agent.h"

namespace probefs::agent {

namespace {

// glibc's PTHREAD_KEY_2NDLEVEL_SIZE: keys below it keep their value in the descriptor.
constexpr pthread_key_t kFirstLevelKeys = 32;

pthread_key_t g_exit_key;
std::atomic<bool> g_exit_key_ok{false};

void on_thread_exit(void*) { retire_thread_ring(); }

void create_key() {
  pthread_key_t k;
  if (pthread_key_create(&k, on_thread_exit) != 0) return;
  if (k >= kFirstLevelKeys) {
    pthread_key_delete(k);
    return;
  }
  g_exit_key = k;
  g_exit_key_ok.store(true, std::memory_order_release);
}

}  // namespace

void init_thread_exit() {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, create_key);
}

void watch_thread_exit() {
  if (g_exit_key_ok.load(std::memory_order_acquire))
    pthread_setspecific(g_exit_key, reinterpret_cast<void*>(1));
}

}  // namespace probefs::agent
