// A test sees what its layer may, and its own folder, not another test's.
#include "events/bad.h"
#include "tests/events/helper.h"
#include "tests/probecore/probe_test_util.h"
