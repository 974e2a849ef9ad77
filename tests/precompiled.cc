// The source probefs_test_pch builds the tests' precompiled header with
// (tests/CMakeLists.txt); it has no code of its own.
