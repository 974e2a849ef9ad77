// per_cpu/cpuN/trace_pipe_raw: the records of CPU N in the kernel's binary ring-buffer
// pages (events/raw_page.h), as trace-cmd, libtracefs and KernelShark read them.
//
// Records are taken from the tracer as trace_pipe takes them (consuming, each decided
// once: set_event_pid, tracing_cpumask) and laid out in a
// page as their event's `format` file says; trace_marker's records become the kernel's
// ftrace `print` event (id 5: common fields, the ip of the kernel's tracing_mark_write
// as /proc/kallsyms gives it, then the text with its NUL), and
// trace_marker_raw's its `raw_data` event (id 19: common fields, the u32 id, the data). A page holds
// the records that fit, oldest first; records lost before one (its ring was full) end the
// page before it, and the next page carries their count in its commit word as the
// kernel's does. While no reader setting refuses any record, records go from the rings
// straight into the page, copied once and checked there (TraceReader::consume_direct), in
// batches: a thread's records in a row come as a run that the merger hands out behind
// the first (RingMerger::next_run) and the tracer admits by its verdict on the first, and
// a batch's room goes back to the producer once the batch is copied. On that path a fill
// takes what the rings held when it looked (tracee::Tracer::ReadPass), not what comes
// while it lays that out: following a busy producer a few records at a time would read
// each cache line of its ring while the producer still writes it, slowing both. (A look
// whose records were all unshown is followed by another; a gathering read, below, looks
// twice.)
//
// Reads as the kernel's: each read returns the rest of the current page (a whole page,
// of the buffer's sub-buffer size when the file was opened, buffer_subbuf_size_kb: 4096
// bytes by default, unless the caller asked for less; the rest stays for the next read on the
// same open file), blocks while the CPU has no record (O_NONBLOCK: EAGAIN; a signal:
// EINTR; tracing turned off after this file returned a page, or the mount going away:
// end of file), and poll() says readable once a record is there. One difference: a read
// with room for more pages gets, after the first, the whole pages ready at once, as the
// kernel's splice() does. A FUSE splice is a read of the pipe's size, and each read is a
// round trip to the daemon: one page per read would cost a round trip per 4 KiB. When
// fewer than half the pages are ready and the records come fast, such a read waits a
// little for the rest (raw_gather_wait). A reader of one page per read (trace-cmd
// --nosplice, libtracefs) sees the kernel's rule.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>

namespace probefs::fs {

class File;
class Tracefs;
class TraceReader;

// A blocking read with room for `want` pages that found records for `made` of them (fewer
// than half), written in the `since` from the file's last look at the rings to this one:
// how long to wait for the rest before taking them too, when records come fast enough
// to fill it within `max` (Tracefs::Options::raw_gather_max, 200 us); else 0 (return
// what there is). Fewer, fuller reads: each is a round trip
// through the kernel and the daemon, and the pages are read after the producer has left
// their cache lines. The kernel's splice() of trace_pipe_raw waits for a buffer_percent
// of the buffer in the same spirit; this waits only for a fast producer, and briefly.
std::chrono::microseconds raw_gather_wait(size_t made, size_t want,
                                          std::chrono::steady_clock::duration since,
                                          std::chrono::microseconds max);

std::shared_ptr<File> make_raw_pipe_file(Tracefs& fs, std::shared_ptr<TraceReader> reader,
                                         int cpu);

}  // namespace probefs::fs
