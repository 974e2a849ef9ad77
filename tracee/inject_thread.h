// The block of the thread that attach starts in a target (tracee/inject.cc): where its
// routine (tracee/inject_thread.S) finds what it calls and puts what it reports. Shared by
// the routine and the C++ that fills and reads the block, which checks each offset.
#pragma once

#define PROBEFS_BLOCK_DLOPEN 0
#define PROBEFS_BLOCK_DLERROR 8
#define PROBEFS_BLOCK_SELF 16
#define PROBEFS_BLOCK_DETACH 24
#define PROBEFS_BLOCK_MUNMAP 32
#define PROBEFS_BLOCK_MODE 40
#define PROBEFS_BLOCK_HANDLE 48
#define PROBEFS_BLOCK_ERROR 56
#define PROBEFS_BLOCK_REPORTED 64
#define PROBEFS_BLOCK_FINISH 72
#define PROBEFS_BLOCK_TIMEOUT 80
#define PROBEFS_BLOCK_RSP 96
#define PROBEFS_BLOCK_PATH 104
