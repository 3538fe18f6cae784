/*
 * host.c -- pinned host memory (src/alloc/host.c): allocation for tests
 * and users, and the statistics of torch.cuda.memory.host_memory_stats.
 *
 * Like allocator.c, every function works on the process-wide allocator
 * msnap_default() and holds the GIL throughout (the calls are short; the
 * allocator may capture Python frames while recording).
 */
#include "msnap_py.h"

#include <string.h>

/* host_malloc(size) -> int: a pinned block of at least size bytes (0 for
 * size 0). */
static PyObject *py_host_malloc(PyObject *module, PyObject *arg) {
  uint64_t size;
  if (msnap_py_size(arg, &size, "pinned host allocation") < 0)
    return NULL;
  MSNAP_PY_GET_ALLOC(a);
  uint64_t ptr = 0;
  int rc = msnap_host_malloc(a, (size_t)size, &ptr);
  if (rc < 0)
    return msnap_py_raise(module, rc, NULL);
  return PyLong_FromUnsignedLongLong(ptr);
}

static PyObject *py_host_free(PyObject *module, PyObject *arg) {
  uint64_t ptr;
  if (msnap_py_u64(arg, &ptr, "ptr") < 0)
    return NULL;
  MSNAP_PY_GET_ALLOC(a);
  int rc = msnap_host_free(a, ptr);
  return msnap_py_none_or_raise(module, rc, NULL);
}

static PyObject *py_host_record_stream(PyObject *module, PyObject *args) {
  uint64_t ptr, stream;
  if (msnap_py_ptr_stream(args, "OO:host_record_stream", &ptr, &stream) < 0)
    return NULL;
  MSNAP_PY_GET_ALLOC(a);
  int rc = msnap_host_record_stream(a, ptr, stream);
  return msnap_py_none_or_raise(module, rc, NULL);
}

static PyObject *py_host_empty_cache(PyObject *module, PyObject *unused) {
  (void)unused;
  MSNAP_PY_GET_ALLOC(a);
  int rc = msnap_host_empty_cache(a);
  return msnap_py_none_or_raise(module, rc, NULL);
}

static PyObject *duration_dict(const msnap_duration_stat_t *d) {
  long long avg = d->count ? (long long)(d->total / d->count) : 0;
  return Py_BuildValue("{s:L,s:L,s:L,s:L,s:L}", "total", (long long)d->total,
                       "max", (long long)d->max, "min", (long long)d->min,
                       "count", (long long)d->count, "avg", avg);
}

/* host_memory_stats() -> the nested dict of torch's
 * host_memory_stats_as_nested_dict: allocations / allocated_bytes (blocks
 * owned, active or cached), active_requests / active_bytes (blocks not yet
 * reusable), num_host_alloc / num_host_free, host_alloc_time /
 * host_free_time (microseconds). */
static PyObject *py_host_memory_stats(PyObject *module, PyObject *unused) {
  (void)unused;
  MSNAP_PY_GET_ALLOC(a);
  msnap_stats_t s;
  memset(&s, 0, sizeof s);
  s.size = sizeof s;
  s.version = MSNAP_STATS_VERSION;
  msnap_duration_stat_t at, ft;
  int rc = msnap_host_stats_get(a, &s);
  if (rc == 0)
    rc = msnap_host_timing_get(a, &at, &ft);
  if (rc < 0)
    return msnap_py_raise(module, rc, NULL);
  PyObject *d = PyDict_New();
  if (d == NULL)
    return NULL;
  if (msnap_py_put(d, "num_host_alloc",
                   PyLong_FromLongLong(s.num_device_alloc)) < 0 ||
      msnap_py_put(d, "num_host_free",
                   PyLong_FromLongLong(s.num_device_free)) < 0 ||
      msnap_py_put(d, "allocations",
                   msnap_py_stat_dict(&s.segment[MSNAP_STAT_ALL])) < 0 ||
      msnap_py_put(d, "allocated_bytes",
                   msnap_py_stat_dict(&s.reserved_bytes[MSNAP_STAT_ALL])) < 0 ||
      msnap_py_put(d, "active_requests",
                   msnap_py_stat_dict(&s.active[MSNAP_STAT_ALL])) < 0 ||
      msnap_py_put(d, "active_bytes",
                   msnap_py_stat_dict(&s.active_bytes[MSNAP_STAT_ALL])) < 0 ||
      msnap_py_put(d, "host_alloc_time", duration_dict(&at)) < 0 ||
      msnap_py_put(d, "host_free_time", duration_dict(&ft)) < 0) {
    Py_DECREF(d);
    return NULL;
  }
  return d;
}

static PyObject *py_host_reset_peak_stats(PyObject *module, PyObject *unused) {
  (void)unused;
  MSNAP_PY_GET_ALLOC(a);
  int rc = msnap_host_reset_peak_stats(a);
  return msnap_py_none_or_raise(module, rc, NULL);
}

static PyObject *py_host_reset_accumulated_stats(PyObject *module,
                                                 PyObject *unused) {
  (void)unused;
  MSNAP_PY_GET_ALLOC(a);
  int rc = msnap_host_reset_accumulated_stats(a);
  return msnap_py_none_or_raise(module, rc, NULL);
}

PyMethodDef msnap_py_host_methods[] = {
    {"host_malloc", py_host_malloc, METH_O,
     "host_malloc(size) -> int: pinned host block (0 for size 0)."},
    {"host_free", py_host_free, METH_O,
     "host_free(ptr): give a pinned host block back (ValueError if unknown)."},
    {"host_record_stream", py_host_record_stream, METH_VARARGS,
     "host_record_stream(ptr, stream): the block is used on stream."},
    {"host_empty_cache", py_host_empty_cache, METH_NOARGS,
     "host_empty_cache(): return cached pinned blocks to the runtime."},
    {"host_memory_stats", py_host_memory_stats, METH_NOARGS,
     "host_memory_stats() -> nested dict as torch's "
     "host_memory_stats_as_nested_dict."},
    {"host_reset_peak_stats", py_host_reset_peak_stats, METH_NOARGS,
     "host_reset_peak_stats()."},
    {"host_reset_accumulated_stats", py_host_reset_accumulated_stats,
     METH_NOARGS, "host_reset_accumulated_stats()."},
    {NULL, NULL, 0, NULL}};
