// Moved to include/fsdp/nn/model.h (public API); this forwarder keeps older includes compiling.
#pragma once

#include "fsdp/nn/model.h"
