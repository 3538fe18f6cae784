/* plugin.c -- to be written. */
#include "msnap_internal.h"
