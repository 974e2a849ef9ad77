// per_cpu/cpuN/trace_pipe_raw without a mount: a Tracer with the real agent, traced_prog
// run under it, and every page read back through libtraceevent's kbuffer, the decoder
// trace-cmd uses on the kernel's raw buffers.
#include "fs/raw_pipe.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <pthread.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>
#include <cstdio>
#include <cstring>
#include <future>
#include <string>
#include <vector>

#include "events/raw_page.h"
#include "fs/tracefs.h"
#include "tests/fs/trace_files_test_util.h"
#include "tracee/probe_places.h"
#include "tracee/tracer.h"

extern "C" {
#include <traceevent/kbuffer.h>
}

namespace probefs::fs {
namespace {

// One event of a page: its stamp and payload (the event's `format` layout).
struct RawEvent {
  uint64_t ts = 0;
  std::vector<uint8_t> data;
  uint16_t type() const { return load<uint16_t>(0); }
  int32_t pid() const { return load<int32_t>(4); }
  template <typename T>
  T load(size_t off) const {
    T v{};
    if (off + sizeof v <= data.size()) std::memcpy(&v, data.data() + off, sizeof v);
    return v;
  }
};

struct RawPage {
  std::vector<RawEvent> events;
  int missed = 0;
};

RawPage decode(const std::string& bytes, size_t page_size = events::kRawPageSize) {
  RawPage out;
  EXPECT_EQ(bytes.size(), page_size);
  std::vector<uint8_t> page(bytes.begin(), bytes.end());
  page.resize(page_size);
  kbuffer* kb = kbuffer_alloc(KBUFFER_LSIZE_8, KBUFFER_ENDIAN_LITTLE);
  EXPECT_EQ(kbuffer_load_subbuffer(kb, page.data()), 0);
  out.missed = kbuffer_missed_events(kb);
  unsigned long long ts = 0;
  for (void* d = kbuffer_read_event(kb, &ts); d; d = kbuffer_next_event(kb, &ts)) {
    const auto* p = static_cast<const uint8_t*>(d);
    out.events.push_back({ts, std::vector<uint8_t>(p, p + kbuffer_event_size(kb))});
  }
  kbuffer_free(kb);
  return out;
}

class RawPipeTest : public testing::TracedProgramTest {
 protected:
  static std::string raw_path(int cpu) {
    return "per_cpu/cpu" + std::to_string(cpu) + "/trace_pipe_raw";
  }

  // Every page of CPU `cpu` until EAGAIN, a page a read.
  std::vector<std::string> drain(int cpu) {
    return TracedProgramTest::drain(raw_path(cpu), events::kRawPageSize);
  }

  // Every page of every CPU, decoded; events of each CPU in page order.
  std::vector<RawPage> drain_all() {
    std::vector<RawPage> pages;
    for (int cpu = 0; cpu < fs_->cpus(); ++cpu)
      for (const std::string& p : drain(cpu)) pages.push_back(decode(p));
    return pages;
  }

  // A text file's contents (one read).
  std::string read_text(const std::string& path) {
    auto h = open(path, O_RDONLY);
    std::string text;
    if (h) {
      EXPECT_EQ(h->read(request(O_RDONLY), 0, 65536, &text), 0);
    }
    return text;
  }

  // Keeps the program on CPU 0, where a test waits for its records.
  void pin_to_cpu0() {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(0, &set);
    ASSERT_EQ(sched_setaffinity(pid_, sizeof set, &set), 0);
  }
};

// Each CPU's pages hold that CPU's records, every one of them, laid out as the event's
// format says (common_type, common_pid, __probe_ip, a, b), stamps never going back.
TEST_F(RawPipeTest, EveryRecordComesBackInPagesLaidOutAsTheFormatSays) {
  const uint16_t id = define_add();
  ASSERT_TRUE(launch());
  call(600);
  std::vector<bool> seen(600, false);
  size_t n = 0;
  for (int cpu = 0; cpu < fs_->cpus(); ++cpu) {
    uint64_t last = 0;
    for (const std::string& bytes : drain(cpu)) {
      const RawPage page = decode(bytes);
      EXPECT_EQ(page.missed, 0);
      for (const RawEvent& e : page.events) {
        ASSERT_EQ(e.data.size(), 32u);  // 8 common + ip + a + b
        EXPECT_EQ(e.type(), id);
        EXPECT_EQ(e.pid(), pid_);
        EXPECT_NE(e.load<uint64_t>(8), 0u);  // __probe_ip
        const uint64_t a = e.load<uint64_t>(16);
        EXPECT_EQ(e.load<uint64_t>(24), 2 * a);
        ASSERT_LT(a, 600u);
        EXPECT_FALSE(seen[a]) << a;
        seen[a] = true;
        EXPECT_GE(e.ts, last);
        last = e.ts;
        ++n;
      }
    }
  }
  EXPECT_EQ(n, 600u);
}

// buffer_subbuf_size_kb: rounded up to a power of two of pages, one to 128; the pages
// are of that size, header_page says so, and each holds as many records as fit.
TEST_F(RawPipeTest, PagesAreOfTheSubBufferSize) {
  EXPECT_EQ(read_text("buffer_subbuf_size_kb"), "4\n");
  for (const auto& [in, out] : std::vector<std::pair<std::string, std::string>>{
           {"3", "4\n"}, {"5", "8\n"}, {"512", "512\n"}, {"16", "16\n"}}) {
    ASSERT_EQ(write("buffer_subbuf_size_kb", in), static_cast<int64_t>(in.size())) << in;
    EXPECT_EQ(read_text("buffer_subbuf_size_kb"), out) << in;
  }
  EXPECT_EQ(write("buffer_subbuf_size_kb", "0"), -EINVAL);
  EXPECT_EQ(write("buffer_subbuf_size_kb", "513"), -EINVAL);
  EXPECT_NE(read_text("events/header_page").find("\tfield: char data;\toffset:16;\tsize:16368;"),
            std::string::npos);
  constexpr size_t kPage = 16384;
  define_add();
  ASSERT_TRUE(launch());
  pin_to_cpu0();
  call(600);
  size_t n = 0, most = 0;
  for (const std::string& bytes : TracedProgramTest::drain(raw_path(0), kPage)) {
    const RawPage page = decode(bytes, kPage);
    n += page.events.size();
    most = std::max(most, page.events.size());
  }
  EXPECT_EQ(n, 600u);
  EXPECT_GT(most, events::kRawPageData / 36);  // more than a 4 KiB page holds
}

// A read smaller than a page gets that much; the next read gets the rest of the page.
TEST_F(RawPipeTest, ASmallReadLeavesTheRestOfThePageForTheNext) {
  define_add();
  ASSERT_TRUE(launch());
  pin_to_cpu0();
  call(5);
  auto h = open(raw_path(0), O_RDONLY | O_NONBLOCK);
  Request rq;
  rq.flags = O_RDONLY | O_NONBLOCK;
  std::string first, rest, none;
  ASSERT_EQ(h->read(rq, 0, 100, &first), 0);
  EXPECT_EQ(first.size(), 100u);
  ASSERT_EQ(h->read(rq, 0, 1 << 20, &rest), 0);
  EXPECT_EQ(rest.size(), events::kRawPageSize - 100);
  const RawPage page = decode(first + rest);
  EXPECT_EQ(page.events.size(), 5u);
  EXPECT_EQ(h->read(rq, 0, 4096, &none), -EAGAIN);
}

// A blocked read returns with the page once a record comes, and -EINTR on a signal.
TEST_F(RawPipeTest, ABlockedReadWakesForARecordAndForASignal) {
  define_add();
  ASSERT_TRUE(launch());
  pin_to_cpu0();
  auto h = open(raw_path(0), O_RDONLY);
  std::promise<void> blocked;
  std::atomic<bool> told{false}, interrupt{false};
  auto read_blocking = [&](std::string* out) {
    Request rq;
    rq.flags = O_RDONLY;
    rq.interrupted = [&] {
      if (!told.exchange(true)) blocked.set_value();
      return interrupt.load();
    };
    return h->read(rq, 0, events::kRawPageSize, out);
  };
  std::string page;
  auto r = std::async(std::launch::async, read_blocking, &page);
  ASSERT_EQ(blocked.get_future().wait_for(std::chrono::seconds(20)), std::future_status::ready);
  call(3);
  ASSERT_EQ(r.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  ASSERT_EQ(r.get(), 0);
  // The reader may wake before the last records are written: they come on later pages.
  size_t got = decode(page).events.size();
  while (got > 0 && got < 3) {
    auto more = std::async(std::launch::async, read_blocking, &page);
    ASSERT_EQ(more.wait_for(std::chrono::seconds(20)), std::future_status::ready);
    ASSERT_EQ(more.get(), 0);
    got += decode(page).events.size();
  }
  EXPECT_EQ(got, 3u);

  blocked = std::promise<void>();
  told = false;
  std::string none;
  auto r2 = std::async(std::launch::async, read_blocking, &none);
  ASSERT_EQ(blocked.get_future().wait_for(std::chrono::seconds(20)), std::future_status::ready);
  interrupt = true;
  ASSERT_EQ(r2.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  EXPECT_EQ(r2.get(), -EINTR);
  EXPECT_TRUE(none.empty());
}

namespace {

// Runs `fn` on a thread of its own, on CPU `cpu`.
void on_cpu(int cpu, const std::function<void()>& fn) {
  std::thread t([&] {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
    fn();
  });
  t.join();
}

}  // namespace

// A read whose look at the rings found only records it does not show looks again: the
// daemon's ring full of records of no event, and a marker that fits only once the read
// has taken them (so it comes after the look), followed by tracing turned off. The read
// gives the marker, not the end of the file (which tracing off means once the file gave
// a page and nothing is left).
TEST_F(RawPipeTest, ALookOfRecordsNotShownIsFollowedByAnother) {
  const int reader_cpu = fs_->cpus() > 1 ? 1 : 0;  // beside the writer, where there is room
  auto h = open(raw_path(0), O_RDONLY);
  on_cpu(0, [&] { ASSERT_EQ(write("trace_marker", "first"), 5); });
  std::string page;
  ASSERT_EQ(h->read(request(O_RDONLY), 0, events::kRawPageSize, &page), 0);
  ASSERT_NE(page.find("first"), std::string::npos);
  on_cpu(0, [&] {
    uint8_t junk[16] = {};
    const uint16_t no_event = 999;
    std::memcpy(junk, &no_event, sizeof no_event);
    while (tracer_->write_record(junk, sizeof junk) == 0) {
    }
  });
  std::atomic<bool> written{false};
  std::thread late([&] {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(0, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      if (write("trace_marker", "late") == 4) {
        written = true;
        break;
      }
    }
    fs_->set_tracing_on(false);
  });
  std::string out;
  int rc = 0;
  on_cpu(reader_cpu,
         [&] { rc = h->read(request(O_RDONLY), 0, 32 * events::kRawPageSize, &out); });
  late.join();
  ASSERT_TRUE(written.load());
  EXPECT_EQ(rc, 0);
  EXPECT_NE(out.find("late"), std::string::npos) << out.size() << " bytes";
  fs_->set_tracing_on(true);
}

// Many-page blocking reads, as trace-cmd's splice makes them, of a program calling a
// probed function in bursts (a read that finds few pages may wait for the rest and look
// again: raw_gather_wait): every record comes once, in order, stamps never going back.
// The rings hold every record of the run, so none may be missing.
TEST_F(RawPipeTest, ManyPageReadsOfABusyProgramGiveEveryRecordInOrder) {
  ASSERT_TRUE(make(0, 16384));  // every record of the run fits (12 MB)
  // Reads that find few pages wait for more even at this program's pace (its calls come
  // in bursts, a round trip on its pipes apart): most reads gather.
  fs_.reset();
  Tracefs::Options fo;
  fo.agent_path = PROBEFS_AGENT_PATH;
  fo.raw_gather_max = std::chrono::milliseconds(20);
  fs_ = std::make_unique<Tracefs>(*tracer_, fo);
  const uint16_t id = define_add();
  ASSERT_TRUE(launch());
  pin_to_cpu0();
  constexpr long kCalls = 1000, kRounds = 300;
  auto h = open(raw_path(0), O_RDONLY);
  std::atomic<bool> done{false};
  std::thread producer([&] {
    for (long r = 0; r < kRounds; ++r) call(kCalls);
    done = true;
  });
  Request blocking = request(O_RDONLY);
  blocking.interrupted = [&] { return done.load(); };  // a read left waiting ends
  std::vector<std::string> reads;
  for (;;) {
    std::string out;
    const int rc = h->read(blocking, 0, 32 * events::kRawPageSize, &out);
    if (rc == -EINTR) break;
    ASSERT_EQ(rc, 0);
    reads.push_back(std::move(out));
  }
  producer.join();
  for (;;) {
    std::string out;
    const int rc = h->read(request(O_RDONLY | O_NONBLOCK), 0, 32 * events::kRawPageSize, &out);
    if (rc == -EAGAIN) break;
    ASSERT_EQ(rc, 0);
    reads.push_back(std::move(out));
  }
  long n = 0, out_of_order = 0, back = 0;
  int missed = 0;
  uint64_t last_ts = 0;
  for (const std::string& r : reads) {
    ASSERT_EQ(r.size() % events::kRawPageSize, 0u);
    for (size_t off = 0; off < r.size(); off += events::kRawPageSize) {
      const RawPage p = decode(r.substr(off, events::kRawPageSize));
      missed += p.missed;
      for (const RawEvent& e : p.events) {
        if (e.type() != id) continue;
        if (e.load<uint64_t>(16) != static_cast<uint64_t>(n % kCalls)) ++out_of_order;
        if (e.ts < last_ts) ++back;
        last_ts = e.ts;
        ++n;
      }
    }
  }
  EXPECT_EQ(n, kCalls * kRounds);
  EXPECT_EQ(out_of_order, 0);
  EXPECT_EQ(back, 0);
  EXPECT_EQ(missed, 0);
}

// Records dropped because the ring was full: the page of the next record says how many,
// as the kernel's commit flags and stored count do.
TEST_F(RawPipeTest, LostRecordsAreCountedOnTheNextPage) {
  ASSERT_EQ(write("buffer_size_kb", "4"), 1);
  define_add();
  ASSERT_TRUE(launch());
  call(2000);
  size_t kept = 0;
  for (const RawPage& p : drain_all()) {
    EXPECT_EQ(p.missed, 0);
    kept += p.events.size();
  }
  ASSERT_GT(kept, 0u);
  ASSERT_LT(kept, 2000u);
  call(1);
  const std::vector<RawPage> pages = drain_all();
  ASSERT_EQ(pages.size(), 1u);
  ASSERT_EQ(pages[0].events.size(), 1u);
  EXPECT_EQ(pages[0].missed, static_cast<int>(2000 - kept));
}

// The address /proc/kallsyms gives kernel function `name` (0 when it hides addresses).
uint64_t kernel_symbol(const std::string& name) {
  FILE* f = fopen("/proc/kallsyms", "r");
  if (!f) return 0;
  char sym[256], type;
  unsigned long long addr;
  uint64_t found = 0;
  while (fscanf(f, "%llx %c %255s%*[^\n]", &addr, &type, sym) == 3)
    if (name == sym) {
      found = addr;
      break;
    }
  fclose(f);
  return found;
}

// trace_marker's text is the kernel's ftrace print event: id 5, the writer's pid, the
// address of the kernel's tracing_mark_write (which trace-cmd names it by, from the
// kallsyms it saves), the text with its newline and a NUL.
TEST_F(RawPipeTest, MarkersAreTheKernelsPrintEvent) {
  ASSERT_EQ(write("trace_marker", "hello raw"), 9);
  std::vector<RawEvent> all;
  for (const RawPage& p : drain_all()) all.insert(all.end(), p.events.begin(), p.events.end());
  ASSERT_EQ(all.size(), 1u);
  const RawEvent& e = all[0];
  EXPECT_EQ(e.type(), kPrintEventId);
  EXPECT_EQ(e.pid(), static_cast<int32_t>(gettid()));
  EXPECT_EQ(e.load<uint64_t>(8), kernel_symbol("tracing_mark_write"));
  ASSERT_GE(e.data.size(), 16u + 11u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(e.data.data() + 16), 11),
            std::string("hello raw\n\0", 11));
}

// trace_marker_raw's write is the kernel's ftrace raw_data event: id 19, the writer's pid,
// the u32 id, the data; trace_pipe shows the kernel's "# ID buf: .." line.
TEST_F(RawPipeTest, RawMarkersAreTheKernelsRawDataEvent) {
  const std::string written("\x2a\0\0\0hello", 9);
  ASSERT_EQ(write("trace_marker_raw", written), 9);
  std::vector<RawEvent> all;
  for (const RawPage& p : drain_all()) all.insert(all.end(), p.events.begin(), p.events.end());
  ASSERT_EQ(all.size(), 1u);
  const RawEvent& e = all[0];
  EXPECT_EQ(e.type(), kRawDataEventId);
  EXPECT_EQ(e.pid(), static_cast<int32_t>(gettid()));
  EXPECT_EQ(e.load<uint32_t>(8), 0x2au);
  ASSERT_GE(e.data.size(), 17u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(e.data.data() + 12), 5), "hello");
  ASSERT_EQ(write("trace_marker_raw", written), 9);
  auto h = open("trace_pipe", O_RDONLY | O_NONBLOCK);
  Request rq;
  rq.flags = O_RDONLY | O_NONBLOCK;
  std::string text;
  ASSERT_EQ(h->read(rq, 0, 8192, &text), 0);
  EXPECT_NE(text.find(": # 2a buf: 68 65 6c 6c 6f 00 00 00\n"), std::string::npos) << text;
  // What a page cannot hold is refused as the kernel refuses it.
  EXPECT_EQ(write("trace_marker_raw", std::string(4061, 'x')), -EBADF);
  EXPECT_EQ(write("trace_marker_raw", std::string(4060, 'x')), 4060);
}

// The records of a process that is gone (a fork child, exited and reaped) are read as any
// others, and its name is learnt for saved_cmdlines: from the name it left in its ring,
// which the reader looks up once the records are taken, not while it holds the tracer.
TEST_F(RawPipeTest, AGoneProcessesRecordsAreReadAndItsNameKept) {
  const uint16_t id = define_add();
  ASSERT_TRUE(launch());
  const std::string reply = pipes_.ask("fork 40");
  int child = 0, status = -1;
  ASSERT_EQ(sscanf(reply.c_str(), "ok %d %d", &child, &status), 2) << reply;
  ASSERT_EQ(status, 0);
  size_t n = 0;
  for (const RawPage& p : drain_all())
    for (const RawEvent& e : p.events)
      if (e.type() == id && e.pid() == child) ++n;
  EXPECT_EQ(n, 40u);
  auto h = open("saved_cmdlines", O_RDONLY);
  ASSERT_TRUE(h);
  std::string names;
  ASSERT_EQ(h->read(request(O_RDONLY), 0, 1 << 20, &names), 0);
  EXPECT_NE(names.find(std::to_string(child) + " traced_prog\n"), std::string::npos) << names;
}

// The gathering rule of a many-page read that found few: it waits only for records that
// come fast enough to fill the rest within the longest wait, as long as that takes at
// that rate; never for a read of a page or few, one that found half or more, one that
// found none, or the first read of a file.
TEST(RawGatherWait, WaitsBrieflyOnlyForAFastProducer) {
  using std::chrono::microseconds;
  const microseconds kMax = Tracefs::Options{}.raw_gather_max;
  EXPECT_EQ(kMax, microseconds(200));
  // 32 pages asked, 8 made in the 100 us since the last read: 24 more in 300 us, too long.
  EXPECT_EQ(raw_gather_wait(8, 32, microseconds(100), kMax), microseconds(0));
  // 8 made in 40 us: the other 24 in 120 us.
  EXPECT_EQ(raw_gather_wait(8, 32, microseconds(40), kMax), microseconds(120));
  EXPECT_EQ(raw_gather_wait(1, 32, microseconds(6), kMax), microseconds(186));
  EXPECT_EQ(raw_gather_wait(15, 32, microseconds(1), kMax), microseconds(1));
  EXPECT_EQ(raw_gather_wait(16, 32, microseconds(1), kMax), microseconds(0));  // half: enough
  EXPECT_EQ(raw_gather_wait(0, 32, microseconds(1), kMax), microseconds(0));   // none: block
  EXPECT_EQ(raw_gather_wait(1, 3, microseconds(1), kMax), microseconds(0));    // a few pages
  EXPECT_EQ(raw_gather_wait(1, 32, microseconds(0), kMax), microseconds(0));
  EXPECT_EQ(raw_gather_wait(1, 32, std::chrono::steady_clock::duration::max(), kMax),
            microseconds(0));  // no read before
}

}  // namespace
}  // namespace probefs::fs
