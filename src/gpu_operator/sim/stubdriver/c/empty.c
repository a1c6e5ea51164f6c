/*
 * gpu-operator SIMULATED stub driver: an empty library standing in for one of the driver's
 * libraries that nothing here calls. It has the right soname and the stub marker only.
 */
#define STUB_MARKER_ONLY
#include "stubdriver.h"
