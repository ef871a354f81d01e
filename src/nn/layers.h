// Moved to include/fsdp/nn/layers.h (public API); this forwarder keeps older includes compiling.
#pragma once

#include "fsdp/nn/layers.h"
