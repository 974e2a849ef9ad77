// Helper of the events tests.
#pragma once
