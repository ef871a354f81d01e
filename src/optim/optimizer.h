// Moved to include/fsdp/optim.h (public API); this forwarder keeps older includes compiling.
#pragma once

#include "fsdp/optim.h"
