/* A library that the tests load, probe and unload. */
long pf_gone_twice(long x) { return x * 2; }
