// What every test program's sources are compiled after (tests/CMakeLists.txt): gtest
// and the standard library headers most tests include, precompiled once per build. A
// test still includes what it uses.
#pragma once

#ifdef __cplusplus
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
#endif
