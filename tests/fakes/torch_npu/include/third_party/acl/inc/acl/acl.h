/* Stand-in for CANN's acl/acl.h (tests only): the ACL types the stand-in
 * torch_npu headers name.  The real header declares them in acl_base.h
 * as opaque pointers and a 32-bit error code. */
#pragma once
#include <stddef.h>
#include <stdint.h>
typedef void *aclrtStream;
typedef void *aclrtEvent;
typedef void *aclrtContext;
typedef int aclError;
#define ACL_ERROR_NONE 0
