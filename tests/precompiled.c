/* The C twin of precompiled.cc, for the test programs' C sources; no code of its own. */
