// Helper of the probecore tests.
#pragma once
