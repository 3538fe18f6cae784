/* runtime_sim.c -- to be written. */
#include "msnap_internal.h"
