/*
 * pad.c -- the npu profile's request pad: torch_npu's AddPadSize()
 * (NPUCachingAllocator.cpp), decided once per allocator from what the
 * device runtime reports.
 *
 *   pad = 0   when the SoC is an Ascend950 (GetSocVersion() >= Ascend950:
 *             a name starting "Ascend950", NpuVariables.cpp SetSocVersion)
 *             and the CANN package version is >= 9.1.0
 *             (IsGteCANNVersion("9.1.0", "CANN"), GetCANNInfo.cpp);
 *   pad = 32  otherwise, including when the runtime cannot tell (no
 *             aclrtGetSocName / aclsysGetCANNVersion, a version string
 *             torch_npu cannot parse, the sim without
 *             MEMSNAP_SIM_SOC_NAME / MEMSNAP_SIM_CANN_VERSION).
 *
 * The version comparison is CompareVersionsByDispatch against "9.1.0":
 * current major > 8 compares the "V2" numbers (major.minor.patch with an
 * optional alpha/beta/rc suffix, VersionV2ToNum); any other current
 * version compares major, then minor (an 8.x version is older).  A
 * string with fewer than three '.'/'-' separated parts, or a non-numeric
 * major or minor, is "invalid" and counts as older, as in torch_npu.
 * (The "8.x below 8.5" branch of the dispatch never applies with a 9.x
 * target.)  torch_npu also warns once when it pads; memsnap does not.
 *
 * The pad is the same for every device of the allocator (AddPadSize is a
 * process-wide static).  Pure functions; no lock.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "alloc/alloc.h"

#define TOKENS_MAX 8

/* SplitVersionStr: split at '.' and '-' into at most TOKENS_MAX tokens
 * (more tokens: returns TOKENS_MAX + 1, which no branch accepts). */
static int split_version(const char *s, char tok[TOKENS_MAX][32]) {
  int n = 0;
  size_t k = 0;
  for (;; s++) {
    if (*s == '.' || *s == '-' || *s == '\0') {
      if (n < TOKENS_MAX) {
        tok[n][k < 31 ? k : 31] = '\0';
      }
      n++;
      k = 0;
      if (*s == '\0')
        break;
    } else {
      if (n < TOKENS_MAX && k < 31)
        tok[n][k] = *s;
      k++;
    }
  }
  return n;
}

static bool digits(const char *s) {
  if (*s == '\0')
    return false;
  for (; *s; s++)
    if (!isdigit((unsigned char)*s))
      return false;
  return true;
}

/* ExtractNumFromStr: -1 unless all digits (and small enough). */
static int64_t num(const char *s) {
  if (!digits(s) || strlen(s) > 15)
    return -1;
  return strtoll(s, NULL, 10);
}

static bool starts_with_ci(const char *s, const char *prefix) {
  return strncasecmp(s, prefix, strlen(prefix)) == 0;
}

/* VersionV2ToNum: major * 10^7 + minor * 10^5 + patch * 10^3 - weight +
 * prerelease; 0 when it cannot parse. */
static int64_t version_v2_num(const char *v) {
  char tok[TOKENS_MAX][32];
  int n = split_version(v, tok);
  if (n < 3 || n > 5)
    return 0;
  int64_t major = num(tok[0]), minor = num(tok[1]), patch = num(tok[2]);
  if (major < 0 || minor < 0 || patch < 0)
    return 0;
  int64_t weight = 0, pre = 0;
  if (n == 4) {
    const char *t = tok[3];
    if (strcmp(t, "alpha") == 0) {
      weight = 300;
    } else if (strcmp(t, "beta") == 0) {
      weight = 200;
    } else if (strcmp(t, "rc") == 0) {
      weight = 100;
    } else if (starts_with_ci(t, "alpha") && strlen(t) > 5) {
      weight = 300;
      if ((pre = num(t + 5)) < 0)
        return 0;
    } else if (starts_with_ci(t, "beta") && strlen(t) > 4) {
      weight = 200;
      if ((pre = num(t + 4)) < 0)
        return 0;
    } else if (starts_with_ci(t, "rc") && strlen(t) > 2) {
      weight = 100;
      if ((pre = num(t + 2)) < 0)
        return 0;
    } else {
      return 0;
    }
  } else if (n == 5) {
    if ((pre = num(tok[4])) < 0)
      return 0;
    if (strcmp(tok[3], "alpha") == 0)
      weight = 300;
    else if (strcmp(tok[3], "beta") == 0)
      weight = 200;
    else if (strcmp(tok[3], "rc") == 0)
      weight = 100;
    else
      return 0;
  }
  return major * 10000000 + minor * 100000 + patch * 1000 - weight + pre;
}

bool msnap__cann_version_at_least_9_1_0(const char *current) {
  static const char target[] = "9.1.0";
  char tok[TOKENS_MAX][32];
  if (current == NULL)
    return false;
  int n = split_version(current, tok);
  if (n <= 2 || !digits(tok[0]) || !digits(tok[1]))
    return false; /* invalid: torch_npu warns and answers false */
  /* Both majors > 8: the V2 numbers; otherwise the major decides (an
   * 8.x or older version is below 9). */
  if (num(tok[0]) > 8)
    return version_v2_num(current) >= version_v2_num(target);
  return false;
}

bool msnap__soc_is_ascend950(const char *soc) {
  return soc != NULL && strncmp(soc, "Ascend950", 9) == 0;
}

uint64_t msnap__npu_pad_from(const msnap_runtime_ops_t *rt, void *ctx) {
  char soc[64] = "", cann[128] = "";
  if (rt->soc_name == NULL || rt->soc_name(ctx, soc, sizeof soc) != 0 ||
      !msnap__soc_is_ascend950(soc))
    return MSNAP_NPU_PAD;
  if (rt->cann_version == NULL ||
      rt->cann_version(ctx, cann, sizeof cann) != 0 ||
      !msnap__cann_version_at_least_9_1_0(cann))
    return MSNAP_NPU_PAD;
  return 0;
}

uint64_t msnap__npu_pad(const msnap_allocator_t *a) {
  return a->profile == MSNAP_PROFILE_NPU ? a->npu_pad : 0;
}
