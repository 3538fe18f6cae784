/*
 * allocator.c -- allocation, statistics, settings and memory pools.
 *
 * Every function works on the process-wide allocator msnap_default(), the
 * one the pluggable-allocator entry points of libmemsnap.so use, so that
 * memory torch allocates through memsnap shows up here.  Arguments arrive
 * already normalised by memsnap/memory.py (device indices as ints, streams
 * as ints); the functions here check types and ranges again and raise what
 * the torch C++ bindings raise.  The GIL is held throughout: these calls
 * are short, and the allocator may capture Python frames during them.
 */
#include "msnap_py.h"

#include <stdio.h>
#include <string.h>

/* PyFrame_GetBack (note_creator) is declared by Python.h from 3.11 on
 * (cpython/pyframe.h); on 3.9 and 3.10 only by frameobject.h, which
 * Python.h does not include.  Without it the call was implicitly declared
 * as returning int: the frame pointer came back truncated to 32 bits and
 * sign-extended, and the next PyFrame_GetCode crashed (meson.build now
 * makes an implicit declaration an error). */
#if PY_VERSION_HEX < 0x030B0000
#include <frameobject.h>
#endif

/* ---- argument helpers ---------------------------------------------------- */

/* Unsigned 64-bit integer argument (addresses). */
int msnap_py_u64(PyObject *o, uint64_t *out, const char *what) {
  if (!PyLong_Check(o) || PyBool_Check(o)) {
    PyErr_Format(PyExc_TypeError, "%s must be an int, not %.100s", what,
                 Py_TYPE(o)->tp_name);
    return -1;
  }
  unsigned long long v = PyLong_AsUnsignedLongLong(o);
  if (v == (unsigned long long)-1 && PyErr_Occurred()) {
    if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
      PyErr_Clear();
      /* Streams and pointers arrive as signed int64 from torch. */
      long long s = PyLong_AsLongLong(o);
      if (s == -1 && PyErr_Occurred())
        return -1;
      v = (unsigned long long)s;
    } else {
      return -1;
    }
  }
  *out = (uint64_t)v;
  return 0;
}

/* A size in bytes: a non-bool int or numpy integer >= 0 (torch's caching_allocator_alloc
 * takes the size through PyLong_AsSsize_t; a bool is refused here). */
/* o is a numpy integer scalar (numpy.integer: numpy.int64, numpy.uint32,
 * ...; not numpy.bool_, not an array): torch::utils::is_numpy_int.  No
 * numpy imported: no numpy integer can exist. */
static bool is_numpy_int(PyObject *o) {
  PyObject *name = PyUnicode_FromString("numpy");
  if (!name) {
    PyErr_Clear();
    return false;
  }
  PyObject *np = PyImport_GetModule(name); /* (imported already, or NULL) */
  Py_DECREF(name);
  if (!np) {
    PyErr_Clear();
    return false;
  }
  PyObject *integer = PyObject_GetAttrString(np, "integer");
  Py_DECREF(np);
  if (!integer) {
    PyErr_Clear();
    return false;
  }
  int r = PyObject_IsInstance(o, integer);
  Py_DECREF(integer);
  if (r < 0)
    PyErr_Clear();
  return r > 0;
}

int msnap_py_size(PyObject *o, uint64_t *out, const char *what) {
  /* An int or a numpy integer, as torch's THPUtils_checkLong; never a
   * bool. */
  if (PyBool_Check(o) || (!PyLong_Check(o) && !is_numpy_int(o))) {
    PyErr_Format(PyExc_TypeError, "%s: size must be an int (bytes), not "
                 "%.100s", what, Py_TYPE(o)->tp_name);
    return -1;
  }
  PyObject *n = PyNumber_Index(o);
  if (!n)
    return -1;
  int overflow = 0;
  long long size = PyLong_AsLongLongAndOverflow(n, &overflow);
  Py_DECREF(n);
  if (overflow) {
    /* (torch reads the size as a C ssize_t: OverflowError as well) */
    PyErr_Format(PyExc_OverflowError, "%s: size %R does not fit in a signed "
                 "64-bit byte count (at most 2**63 - 1)", what, o);
    return -1;
  }
  if (size == -1 && PyErr_Occurred())
    return -1;
  if (size < 0) {
    PyErr_Format(PyExc_ValueError,
                 "Invalid memory size: %lld; %s requires a non-negative "
                 "size.", size, what);
    return -1;
  }
  *out = (uint64_t)size;
  return 0;
}

/* A stream handle: a non-bool int in [0, MSNAP_PY_STREAM_LIMIT).  Stream
 * objects (torch.Stream, npu_stream / cuda_stream) are converted by
 * memsnap/memory.py's _stream_handle, the one place that does it and
 * words the user's error; here only the handle it passes is checked. */
int msnap_py_stream(PyObject *o, uint64_t *out) {
  if (!PyLong_Check(o) || PyBool_Check(o)) {
    PyErr_Format(PyExc_TypeError,
                 "stream must be an int stream handle (memsnap.memory "
                 "converts stream objects), not %.100s", Py_TYPE(o)->tp_name);
    return -1;
  }
  int overflow = 0;
  long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
  if (v == -1 && PyErr_Occurred())
    return -1;
  if (overflow != 0 || v < 0 || (unsigned long long)v >= MSNAP_PY_STREAM_LIMIT) {
    PyErr_Format(PyExc_ValueError,
                 "Invalid stream handle %R: a stream is 0 (the default "
                 "stream) or the runtime's stream handle, an int in "
                 "[0, 2**56)", o);
    return -1;
  }
  *out = (uint64_t)v;
  return 0;
}

/* (ptr, stream) arguments parsed by `fmt` ("OO:NAME"). */
int msnap_py_ptr_stream(PyObject *args, const char *fmt, uint64_t *ptr,
                        uint64_t *stream) {
  PyObject *p, *s;
  if (!PyArg_ParseTuple(args, fmt, &p, &s) ||
      msnap_py_u64(p, ptr, "ptr") < 0 || msnap_py_stream(s, stream) < 0)
    return -1;
  return 0;
}

/* Device index argument: a non-negative int. */
int msnap_py_device(PyObject *o, int *out) {
  if (!PyLong_Check(o)) {
    PyErr_Format(PyExc_TypeError, "device must be an int, not %.100s",
                 Py_TYPE(o)->tp_name);
    return -1;
  }
  long v = PyLong_AsLong(o);
  if (v == -1 && PyErr_Occurred())
    return -1;
  if (v < 0 || v > 65535) {
    PyErr_Format(PyExc_ValueError, "Invalid device index %ld", v);
    return -1;
  }
  *out = (int)v;
  return 0;
}

int msnap_py_check_device(msnap_allocator_t *a, int device, int any_ok,
                          int ordinal) {
  int n = msnap_device_count(a);
  if ((device >= 0 && device < n) || (any_ok && device == -1))
    return 0;
  if (ordinal)
    PyErr_Format(PyExc_RuntimeError,
                 "%s error: invalid device ordinal %d (%d device%s visible)",
                 msnap_profile(a) == MSNAP_PROFILE_NPU ? "NPU" : "CUDA",
                 device, n, n == 1 ? "" : "s");
  else
    /* torch's message (CUDACachingAllocator.cpp, assertValidDevice),
     * then what is there */
    PyErr_Format(PyExc_RuntimeError,
                 "Invalid device argument %d: did you call init? "
                 "(%d device%s visible)",
                 device, n, n == 1 ? "" : "s");
  return -1;
}

/*
 * msnap_py_allocator -- the default allocator, created on first use from
 * the environment (MEMSNAP_RUNTIME, MEMSNAP_PROFILE, the alloc-conf
 * variables).  When creation fails, the same options are tried once more
 * with an error buffer to learn the code and the message naming the
 * offending token, so that a bad configuration raises ValueError.
 */
/*
 * Note which Python call made msnap_default() create the allocator
 * (memsnap.torch.register_device names it when that allocator is not the
 * one it needs): the outermost frame inside memsnap's package (the public
 * function called) and the frame that called it.  Once per process, so
 * no cost on later calls; any failure leaves created_by NULL.
 */
static void note_creator(PyObject *module, msnap_py_state_t *st) {
  PyObject *file = PyModule_GetFilenameObject(module); /* memsnap/_memsnap.so */
  if (file == NULL) {
    PyErr_Clear();
    return;
  }
  Py_ssize_t len = PyUnicode_GetLength(file), cut = -1;
  for (Py_ssize_t i = 0; i < len; i++)
    if (PyUnicode_READ_CHAR(file, i) == '/') cut = i + 1;
  PyObject *pkg = cut > 0 ? PyUnicode_Substring(file, 0, cut) : NULL;
  Py_DECREF(file);
  if (pkg == NULL) {
    PyErr_Clear();
    return;
  }
  PyObject *name = NULL, *mod = NULL, *site = NULL;
  PyFrameObject *f = PyEval_GetFrame(); /* borrowed */
  Py_XINCREF(f);
  while (f != NULL && site == NULL) {
    PyCodeObject *co = PyFrame_GetCode(f); /* new reference */
    PyObject *fn = PyObject_GetAttrString((PyObject *)co, "co_filename");
    if (fn != NULL && PyUnicode_Check(fn) &&
        PyUnicode_Tailmatch(fn, pkg, 0, PY_SSIZE_T_MAX, -1) == 1) {
      Py_XSETREF(name, PyObject_GetAttrString((PyObject *)co, "co_name"));
      Py_XSETREF(mod, PyUnicode_Substring(fn, PyUnicode_GetLength(pkg),
                                          PyUnicode_GetLength(fn)));
    } else if (fn != NULL) {
      site = PyUnicode_FromFormat("%U:%d", fn, PyFrame_GetLineNumber(f));
    }
    Py_XDECREF(fn);
    Py_DECREF(co);
    PyFrameObject *back = PyFrame_GetBack(f); /* new reference */
    Py_DECREF(f);
    f = back;
  }
  Py_XDECREF(f);
  Py_DECREF(pkg);
  PyErr_Clear();
  if (name != NULL && mod != NULL && site != NULL) {
    /* (module file relative to the package, function, "file:line") */
    st->created_by = PyTuple_Pack(3, mod, name, site);
    if (st->created_by == NULL) PyErr_Clear();
  }
  Py_XDECREF(name);
  Py_XDECREF(mod);
  Py_XDECREF(site);
}

msnap_allocator_t *msnap_py_allocator(PyObject *module) {
  msnap_py_state_t *st = msnap_py_state(module);
  bool existed = st->created || msnap_default_exists();
  msnap_allocator_t *a = msnap_default();
  if (a != NULL) {
    if (!existed)
      note_creator(module, st);
    st->created = 1;
    return a;
  }
  char buf[512] = "";
  msnap_options_t o;
  msnap_options_init(&o);
  o.error_buf = buf;
  o.error_buf_len = sizeof buf;
  msnap_allocator_t *tmp = NULL;
  int rc = msnap_allocator_create(&o, &tmp);
  if (rc == 0) {
    msnap_allocator_destroy(tmp);
    const char *e = msnap_default_error();
    PyErr_Format(PyExc_RuntimeError, "memsnap allocator unavailable: %s",
                 e ? e : "unknown error");
    return NULL;
  }
  const char *e = buf[0] ? buf : msnap_default_error();
  if (e == NULL || e[0] == '\0')
    e = msnap_strerror(rc);
  PyErr_Format(rc == MSNAP_ECONF || rc == MSNAP_EINVAL ? PyExc_ValueError
                                                       : PyExc_RuntimeError,
               "memsnap allocator could not be created: %s", e);
  return NULL;
}

/* ---- allocation (hot paths: METH_FASTCALL) ------------------------------- */

/* malloc(size, device, stream) -> int address */
static PyObject *py_malloc(PyObject *module, PyObject *const *args,
                           Py_ssize_t nargs) {
  if (nargs != 3) {
    PyErr_SetString(PyExc_TypeError, "malloc(size, device, stream)");
    return NULL;
  }
  uint64_t size;
  if (msnap_py_size(args[0], &size, "caching_allocator_alloc") < 0)
    return NULL;
  int device;
  uint64_t stream, ptr = 0;
  if (msnap_py_device(args[1], &device) < 0 ||
      msnap_py_stream(args[2], &stream) < 0)
    return NULL;
  MSNAP_PY_GET_ALLOC(a);
  if (msnap_py_check_device(a, device, 0, 1) < 0)
    return NULL;
  int rc = msnap_malloc(a, device, (size_t)size, stream, &ptr);
  if (rc < 0)
    return msnap_py_raise(module, rc, NULL);
  return PyLong_FromUnsignedLongLong(ptr);
}

/* free(ptr) */
static PyObject *py_free(PyObject *module, PyObject *const *args,
                         Py_ssize_t nargs) {
  if (nargs != 1) {
    PyErr_SetString(PyExc_TypeError, "free(ptr)");
    return NULL;
  }
  uint64_t ptr;
  if (msnap_py_u64(args[0], &ptr, "mem_ptr") < 0)
    return NULL;
  MSNAP_PY_GET_ALLOC(a);
  int rc = msnap_free(a, ptr);
  return msnap_py_none_or_raise(module, rc, NULL);
}

static PyObject *py_record_stream(PyObject *module, PyObject *args) {
  uint64_t ptr, stream;
  if (msnap_py_ptr_stream(args, "OO:record_stream", &ptr, &stream) < 0)
    return NULL;
  MSNAP_PY_GET_ALLOC(a);
  int rc = msnap_record_stream(a, ptr, stream);
  return msnap_py_none_or_raise(module, rc, NULL);
}

static PyObject *py_allocation_size(PyObject *module, PyObject *arg) {
  uint64_t ptr;
  size_t size = 0;
  if (msnap_py_u64(arg, &ptr, "ptr") < 0)
    return NULL;
  MSNAP_PY_GET_ALLOC(a);
  int rc = msnap_allocation_size(a, ptr, &size);
  if (rc < 0)
    return msnap_py_raise(module, rc, NULL);
  return PyLong_FromSize_t(size);
}

/* empty_cache(device=-1): -1 = every device. */
static PyObject *py_empty_cache(PyObject *module, PyObject *args) {
  int device = -1;
  if (!PyArg_ParseTuple(args, "|i:empty_cache", &device))
    return NULL;
  MSNAP_PY_GET_ALLOC(a);
  if (msnap_py_check_device(a, device, 1, 0) < 0)
    return NULL;
  int rc = msnap_empty_cache(a, device);
  return msnap_py_none_or_raise(module, rc, NULL);
}

/* ---- settings ------------------------------------------------------------ */

static PyObject *py_set_allocator_settings(PyObject *module, PyObject *arg) {
  if (!PyUnicode_Check(arg)) {
    PyErr_Format(PyExc_TypeError, "env must be a str, not %.100s",
                 Py_TYPE(arg)->tp_name);
    return NULL;
  }
  /* The C parser sees a NUL-terminated string: refuse an embedded NUL
   * (naming its character position) rather than silently dropping what
   * follows it. */
  Py_ssize_t nul = PyUnicode_FindChar(arg, 0, 0, PyUnicode_GetLength(arg), 1);
  if (nul == -2)
    return NULL;
  if (nul >= 0) {
    PyErr_Format(PyExc_ValueError,
                 "allocator settings: embedded null character at position "
                 "%zd of %R",
                 nul, arg);
    return NULL;
  }
  const char *conf = PyUnicode_AsUTF8(arg);
  if (conf == NULL)
    return NULL;
  MSNAP_PY_GET_ALLOC(a);
  int rc = msnap_set_allocator_settings(a, conf);
  return msnap_py_none_or_raise(module, rc, NULL);
}

static PyObject *py_allocator_settings(PyObject *module, PyObject *unused) {
  MSNAP_PY_GET_ALLOC(a);
  const char *s = msnap_allocator_settings(a);
  return PyUnicode_FromString(s ? s : "");
}

static PyObject *py_set_memory_fraction(PyObject *module, PyObject *args) {
  double fraction;
  int device;
  if (!PyArg_ParseTuple(args, "di:set_memory_fraction", &fraction, &device))
    return NULL;
  MSNAP_PY_GET_ALLOC(a);
  if (msnap_py_check_device(a, device, 0, 0) < 0)
    return NULL;
  int rc = msnap_set_memory_fraction(a, device, fraction);
  return msnap_py_none_or_raise(module, rc, NULL);
}

static PyObject *py_get_memory_fraction(PyObject *module, PyObject *args) {
  int device;
  double fraction = 1.0;
  if (!PyArg_ParseTuple(args, "i:get_memory_fraction", &device))
    return NULL;
  MSNAP_PY_GET_ALLOC(a);
  if (msnap_py_check_device(a, device, 0, 0) < 0)
    return NULL;
  int rc = msnap_get_memory_fraction(a, device, &fraction);
  if (rc < 0)
    return msnap_py_raise(module, rc, NULL);
  return PyFloat_FromDouble(fraction);
}

static PyObject *py_set_caching_enabled(PyObject *module, PyObject *arg) {
  if (!PyBool_Check(arg)) {
    PyErr_Format(PyExc_RuntimeError,
                 "cudaCachingAllocator_enable expects a bool, but got %.100s",
                 Py_TYPE(arg)->tp_name);
    return NULL;
  }
  MSNAP_PY_GET_ALLOC(a);
  int rc = msnap_set_caching_enabled(a, arg == Py_True);
  return msnap_py_none_or_raise(module, rc, NULL);
}

static PyObject *py_caching_enabled(PyObject *module, PyObject *unused) {
  MSNAP_PY_GET_ALLOC(a);
  return PyBool_FromLong(msnap_caching_enabled(a));
}

static PyObject *py_mem_get_info(PyObject *module, PyObject *args) {
  int device;
  size_t free_b = 0, total_b = 0;
  if (!PyArg_ParseTuple(args, "i:mem_get_info", &device))
    return NULL;
  MSNAP_PY_GET_ALLOC(a);
  if (msnap_py_check_device(a, device, 0, 1) < 0)
    return NULL;
  int rc = msnap_mem_get_info(a, device, &free_b, &total_b);
  if (rc < 0)
    return msnap_py_raise(module, rc, NULL);
  return Py_BuildValue("(nn)", (Py_ssize_t)free_b, (Py_ssize_t)total_b);
}

/*
 * plugin_entry_points() -> {name: address} of the pluggable-allocator entry
 * points as this module sees them.  A ctypes/dlopen of libmemsnap.so in
 * the same process must find the same addresses: one library, one
 * allocator.
 */
static PyObject *py_plugin_entry_points(PyObject *module, PyObject *unused) {
  return Py_BuildValue(
      "{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "msnap_plugin_malloc",
      (unsigned long long)(uintptr_t)&msnap_plugin_malloc, "msnap_plugin_free",
      (unsigned long long)(uintptr_t)&msnap_plugin_free, "msnap_plugin_init",
      (unsigned long long)(uintptr_t)&msnap_plugin_init,
      "msnap_plugin_empty_cache",
      (unsigned long long)(uintptr_t)&msnap_plugin_empty_cache,
      "msnap_plugin_memory_fraction",
      (unsigned long long)(uintptr_t)&msnap_plugin_memory_fraction,
      "msnap_plugin_record_stream",
      (unsigned long long)(uintptr_t)&msnap_plugin_record_stream,
      "msnap_plugin_reset", (unsigned long long)(uintptr_t)&msnap_plugin_reset,
      "msnap_plugin_erase_stream",
      (unsigned long long)(uintptr_t)&msnap_plugin_erase_stream,
      "msnap_plugin_get_base_allocation",
      (unsigned long long)(uintptr_t)&msnap_plugin_get_base_allocation);
}

/* initialized() -> bool: whether the process-wide allocator exists
 * (created by this module, or by the pluggable-allocator entry points when
 * torch allocated through memsnap); memsnap.configure() must come before.
 * It is memsnap's "device initialized" (torch.cuda.is_initialized). */
/* created_by() -> (module file, function, "file:line") | None: the call
 * of memsnap's package that created the allocator (note_creator). */
static PyObject *py_created_by(PyObject *module, PyObject *unused) {
  (void)unused;
  PyObject *c = msnap_py_state(module)->created_by;
  if (c == NULL) c = Py_None;
  Py_INCREF(c);
  return c;
}

static PyObject *py_initialized(PyObject *module, PyObject *unused) {
  return PyBool_FromLong(msnap_py_state(module)->created ||
                         msnap_default_exists());
}

/* oom_type() -> the class an out-of-memory error raises now: OutOfMemoryError,
 * or, once torch is imported, TorchOutOfMemoryError (errors.c), which
 * memsnap.memory names as its attribute so that the exception pickles. */
static PyObject *py_oom_type(PyObject *module, PyObject *unused) {
  PyObject *t = msnap_py_oom_type(module);
  return t ? Py_NewRef(t) : NULL;
}

/* mark_capture_begin(device, stream) / mark_capture_end(device, stream):
 * a graph capture on stream begins / ends (markCaptureBegin/End). */
static PyObject *capture_mark(PyObject *module, PyObject *args, bool begin) {
  int device;
  PyObject *s;
  uint64_t stream;
  if (!PyArg_ParseTuple(args, "iO", &device, &s) ||
      msnap_py_u64(s, &stream, "stream") < 0)
    return NULL;
  MSNAP_PY_GET_ALLOC(a);
  if (msnap_py_check_device(a, device, 0, 0) < 0)
    return NULL;
  int rc = begin ? msnap_mark_capture_begin(a, device, stream)
                 : msnap_mark_capture_end(a, device, stream);
  if (rc < 0)
    return msnap_py_raise(module, rc,
                          begin ? "markCaptureBegin" : "markCaptureEnd");
  Py_RETURN_NONE;
}

static PyObject *py_mark_capture_begin(PyObject *module, PyObject *args) {
  return capture_mark(module, args, true);
}

static PyObject *py_mark_capture_end(PyObject *module, PyObject *args) {
  return capture_mark(module, args, false);
}

/* set_expandable_segment_reserve_class(stream, name). */
static PyObject *py_set_reserve_class(PyObject *module, PyObject *args) {
  PyObject *s;
  const char *name;
  uint64_t stream;
  if (!PyArg_ParseTuple(args, "Os", &s, &name) ||
      msnap_py_u64(s, &stream, "stream") < 0)
    return NULL;
  MSNAP_PY_GET_ALLOC(a);
  int rc = msnap_set_expandable_segment_reserve_class(a, stream, name);
  return msnap_py_none_or_raise(module, rc, "setExpandableSegmentReserveClass");
}

/* notify_device_error(device, message) -> bool: CANN OOM text? (then the
 * OOM_SNAPSHOT dump ran). */
static PyObject *py_notify_device_error(PyObject *module, PyObject *args) {
  int device;
  const char *msg;
  if (!PyArg_ParseTuple(args, "is", &device, &msg))
    return NULL;
  MSNAP_PY_GET_ALLOC(a);
  if (msnap_py_check_device(a, device, 0, 1) < 0)
    return NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = msnap_notify_device_error(a, device, msg);
  Py_END_ALLOW_THREADS
  if (rc < 0)
    return msnap_py_raise(module, rc, "notify_device_error");
  return PyBool_FromLong(rc == 1);
}

/* A usage-CSV call on one device with the GIL released: True when it
 * wrote what was wanted. */
/* fn(a, device) for the device argument: True when it succeeded; False
 * when it failed, unless `raise` and the failure is other than
 * MSNAP_ENOTSUP (the runtime cannot give the report): then the error. */
static PyObject *usage_call(PyObject *module, PyObject *arg,
                            int (*fn)(msnap_allocator_t *, int), bool raise) {
  int device;
  if (msnap_py_device(arg, &device) < 0)
    return NULL;
  MSNAP_PY_GET_ALLOC(a);
  if (msnap_py_check_device(a, device, 0, 1) < 0)
    return NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = fn(a, device);
  Py_END_ALLOW_THREADS
  if (raise && rc != 0 && rc != MSNAP_ENOTSUP)
    return msnap_py_raise(module, rc, NULL);
  return PyBool_FromLong(rc == 0);
}

static int save_usage(msnap_allocator_t *a, int device) {
  return msnap_save_dev_mem_usage_info(a, device, NULL, NULL);
}

static int dump_usage(msnap_allocator_t *a, int device) {
  return msnap_dump_usage_reports(a, device, NULL);
}

/* save_dev_mem_usage_info(device) -> bool (torch_npu
 * _npu_saveDevMemUsageInfo): CANN's usage CSV in OOM_SNAPSHOT_PATH or ".";
 * False when the runtime cannot give it or the file cannot be written. */
static PyObject *py_save_dev_mem_usage_info(PyObject *module, PyObject *arg) {
  return usage_call(module, arg, save_usage, false);
}

/* dump_usage_reports(device) -> bool: the usage CSV files of a dump
 * (MEMSNAP_USAGE_REPORT); False when CANN's report was wanted and the
 * runtime cannot give it (torch_npu then runs its profiler); OSError when
 * a file could not be written or the directory is unusable. */
static PyObject *py_dump_usage_reports(PyObject *module, PyObject *arg) {
  return usage_call(module, arg, dump_usage, true);
}

static PyObject *py_device_count(PyObject *module, PyObject *unused) {
  MSNAP_PY_GET_ALLOC(a);
  return PyLong_FromLong(msnap_device_count(a));
}

static PyObject *py_profile(PyObject *module, PyObject *unused) {
  MSNAP_PY_GET_ALLOC(a);
  return PyUnicode_FromString(msnap_profile(a) == MSNAP_PROFILE_CUDA ? "cuda"
                                                                     : "npu");
}

static PyObject *py_runtime_name(PyObject *module, PyObject *unused) {
  MSNAP_PY_GET_ALLOC(a);
  const msnap_runtime_ops_t *ops = msnap_runtime(a);
  return PyUnicode_FromString(ops && ops->name ? ops->name : "?");
}

static PyObject *py_sim_host_backed(PyObject *module, PyObject *unused) {
  MSNAP_PY_GET_ALLOC(a);
  return PyBool_FromLong(msnap_sim_host_backed(msnap_runtime_ctx(a)));
}

static PyObject *py_in_bad_fork(PyObject *module, PyObject *unused) {
  MSNAP_PY_GET_ALLOC(a);
  return PyBool_FromLong(msnap_in_bad_fork(a));
}

/* ---- statistics ---------------------------------------------------------- */

/* {"current": c, "peak": p, "allocated": a, "freed": f} */
PyObject *msnap_py_stat_dict(const msnap_stat_t *s) {
  return Py_BuildValue("{s:L,s:L,s:L,s:L}", "current", (long long)s->current,
                       "peak", (long long)s->peak, "allocated",
                       (long long)s->allocated, "freed", (long long)s->freed);
}

/* Add key -> value to d, stealing value; -1 on error. */
int msnap_py_put(PyObject *d, const char *key, PyObject *value) {
  if (value == NULL)
    return -1;
  int rc = PyDict_SetItemString(d, key, value);
  Py_DECREF(value);
  return rc;
}

/* {(first, second): {"all": {...}, "small_pool": {...}, "large_pool": {...}}}
 * for every private pool with an entry (msnap_pool_stats_get).  New
 * reference, NULL with an exception set. */
static PyObject *private_pool_stats(PyObject *module, msnap_allocator_t *a,
                                    int device, const char *const types[]) {
  size_t n = 0;
  int rc = msnap_pool_stats_get(a, device, NULL, 0, &n);
  msnap_pool_stats_t *v = NULL;
  /* Pools may appear between the two calls: retry with the new size. */
  while (rc == 0) {
    size_t cap = n + 4;
    msnap_pool_stats_t *nv = PyMem_Realloc(v, cap * sizeof *nv);
    if (nv == NULL) {
      PyMem_Free(v);
      return PyErr_NoMemory();
    }
    v = nv;
    rc = msnap_pool_stats_get(a, device, v, cap, &n);
    if (rc == 0 && n <= cap)
      break;
  }
  if (rc < 0) {
    PyMem_Free(v);
    return msnap_py_raise(module, rc, NULL);
  }
  PyObject *pools = PyDict_New();
  for (size_t i = 0; pools != NULL && i < n; i++) {
    PyObject *arr = PyDict_New();
    PyObject *key = Py_BuildValue("(KK)", (unsigned long long)v[i].id.first,
                                  (unsigned long long)v[i].id.second);
    bool ok = arr != NULL && key != NULL;
    for (int t = 0; ok && t < MSNAP_STAT_TYPES; t++)
      ok = msnap_py_put(arr, types[t],
                        msnap_py_stat_dict(&v[i].reserved_bytes[t])) == 0;
    ok = ok && PyDict_SetItem(pools, key, arr) == 0;
    Py_XDECREF(arr);
    Py_XDECREF(key);
    if (!ok)
      Py_CLEAR(pools);
  }
  PyMem_Free(v);
  return pools;
}

/* memory_stats(device) -> the nested dict of
 * torch.cuda.memory.memory_stats_as_nested_dict (cuda-reference §5.10). */
static PyObject *py_memory_stats(PyObject *module, PyObject *args) {
  int device;
  if (!PyArg_ParseTuple(args, "i:memory_stats", &device))
    return NULL;
  MSNAP_PY_GET_ALLOC(a);
  if (msnap_py_check_device(a, device, 0, 0) < 0)
    return NULL;
  msnap_stats_t s;
  memset(&s, 0, sizeof s);
  s.size = sizeof s;
  s.version = MSNAP_STATS_VERSION;
  int rc = msnap_stats_get(a, device, &s);
  if (rc < 0)
    return msnap_py_raise(module, rc, NULL);
  PyObject *d = PyDict_New();
  if (d == NULL)
    return NULL;
  static const char *const types[MSNAP_STAT_TYPES] = {"all", "small_pool",
                                                      "large_pool"};
#define ARRAY_(n)                                                             \
  {                                                                           \
    PyObject *arr = PyDict_New();                                             \
    if (arr == NULL)                                                          \
      goto fail;                                                              \
    for (int t = 0; t < MSNAP_STAT_TYPES; t++)                                \
      if (msnap_py_put(arr, types[t], msnap_py_stat_dict(&s.n[t])) < 0) {     \
        Py_DECREF(arr);                                                       \
        goto fail;                                                            \
      }                                                                       \
    if (msnap_py_put(d, #n, arr) < 0)                                         \
      goto fail;                                                              \
  }
  MSNAP_STAT_ARRAY_FIELDS(ARRAY_)
#undef ARRAY_
#define ONE_(n)                                                               \
  if (msnap_py_put(d, #n, msnap_py_stat_dict(&s.n)) < 0)                     \
    goto fail;
  MSNAP_STAT_FIELDS(ONE_)
#undef ONE_
#define COUNTER_(n)                                                           \
  if (msnap_py_put(d, #n, PyLong_FromLongLong(s.n)) < 0)                     \
    goto fail;
  MSNAP_COUNTER_FIELDS(COUNTER_)
#undef COUNTER_
  /* torch 2.13 (CUDA): reserved_bytes_by_private_pools, keyed by the pool
   * id tuple, each value shaped as reserved_bytes.  torch_npu has no such
   * key (torch-npu-today §1), so the npu profile leaves it out. */
  if (msnap_profile(a) == MSNAP_PROFILE_CUDA) {
    PyObject *pools = private_pool_stats(module, a, device, types);
    if (msnap_py_put(d, "reserved_bytes_by_private_pools", pools) < 0)
      goto fail;
  }
  return d;
fail:
  Py_DECREF(d);
  return NULL;
}

/* reset(device) for a reset of one device's statistics; `fmt` is "i:NAME"
 * (NAME for the argument errors). */
static PyObject *reset_stats(PyObject *module, PyObject *args, const char *fmt,
                             int (*reset)(msnap_allocator_t *, int)) {
  int device;
  if (!PyArg_ParseTuple(args, fmt, &device))
    return NULL;
  MSNAP_PY_GET_ALLOC(a);
  if (msnap_py_check_device(a, device, 0, 0) < 0)
    return NULL;
  return msnap_py_none_or_raise(module, reset(a, device), NULL);
}

static PyObject *py_reset_peak_stats(PyObject *module, PyObject *args) {
  return reset_stats(module, args, "i:reset_peak_stats",
                     msnap_reset_peak_stats);
}

static PyObject *py_reset_accumulated_stats(PyObject *module, PyObject *args) {
  return reset_stats(module, args, "i:reset_accumulated_stats",
                     msnap_reset_accumulated_stats);
}

static PyObject *py_memory_summary(PyObject *module, PyObject *args) {
  int device, abbreviated;
  if (!PyArg_ParseTuple(args, "ip:memory_summary", &device, &abbreviated))
    return NULL;
  MSNAP_PY_GET_ALLOC(a);
  if (msnap_py_check_device(a, device, 0, 0) < 0)
    return NULL;
  char *out = NULL;
  int rc = msnap_memory_summary(a, device, abbreviated != 0, &out);
  if (rc < 0)
    return msnap_py_raise(module, rc, NULL);
  PyObject *r = PyUnicode_FromString(out ? out : "");
  msnap_free_string(out);
  return r;
}

/* check_invariants() -> None; RuntimeError naming the first violation. */
static PyObject *py_check_invariants(PyObject *module, PyObject *unused) {
  MSNAP_PY_GET_ALLOC(a);
  char msg[1024] = "";
  int rc = msnap_check_invariants(a, msg, sizeof msg);
  if (rc < 0) {
    PyErr_Format(PyExc_RuntimeError, "allocator invariant violated: %s",
                 msg[0] ? msg : msnap_strerror(rc));
    return NULL;
  }
  Py_RETURN_NONE;
}

/* sim_fail_nth(call_or_None, nth): arm the sim runtime's fault switch. */
static PyObject *py_sim_fail_nth(PyObject *module, PyObject *args) {
  const char *call = NULL;
  unsigned long long nth;
  if (!PyArg_ParseTuple(args, "zK:sim_fail_nth", &call, &nth))
    return NULL;
  MSNAP_PY_GET_ALLOC(a);
  const msnap_runtime_ops_t *ops = msnap_runtime(a);
  if (ops == NULL || ops->name == NULL || strcmp(ops->name, "sim") != 0) {
    PyErr_SetString(PyExc_RuntimeError,
                    "sim_fail_nth needs the sim runtime (MEMSNAP_RUNTIME=sim)");
    return NULL;
  }
  msnap_sim_fail_nth(msnap_runtime_ctx(a), call, nth);
  Py_RETURN_NONE;
}

PyMethodDef msnap_py_allocator_methods[] = {
    {"malloc", (PyCFunction)(void (*)(void))py_malloc, METH_FASTCALL,
     "malloc(size, device, stream) -> int: allocate size bytes (address)."},
    {"free", (PyCFunction)(void (*)(void))py_free, METH_FASTCALL,
     "free(ptr): free an address returned by malloc (ValueError if unknown)."},
    {"record_stream", py_record_stream, METH_VARARGS,
     "record_stream(ptr, stream): the allocation is used on stream."},
    {"allocation_size", py_allocation_size, METH_O,
     "allocation_size(ptr) -> int: rounded block size of a live allocation."},
    {"empty_cache", py_empty_cache, METH_VARARGS,
     "empty_cache(device=-1): release cached segments (-1: all devices)."},
    {"set_allocator_settings", py_set_allocator_settings, METH_O,
     "set_allocator_settings(conf): apply an alloc-conf string."},
    {"allocator_settings", py_allocator_settings, METH_NOARGS,
     "allocator_settings() -> str: the alloc-conf string last applied."},
    {"set_memory_fraction", py_set_memory_fraction, METH_VARARGS,
     "set_memory_fraction(fraction, device)."},
    {"get_memory_fraction", py_get_memory_fraction, METH_VARARGS,
     "get_memory_fraction(device) -> float."},
    {"set_caching_enabled", py_set_caching_enabled, METH_O,
     "set_caching_enabled(bool)."},
    {"caching_enabled", py_caching_enabled, METH_NOARGS,
     "caching_enabled() -> bool."},
    {"mem_get_info", py_mem_get_info, METH_VARARGS,
     "mem_get_info(device) -> (free_bytes, total_bytes)."},
    {"plugin_entry_points", py_plugin_entry_points, METH_NOARGS,
     "plugin_entry_points() -> {name: address} of the msnap_plugin_* "
     "functions."},
    {"created_by", py_created_by, METH_NOARGS,
     "created_by() -> (module file, function, \"file:line\") | None: the "
     "call of memsnap's package that created the allocator."},
    {"initialized", py_initialized, METH_NOARGS,
     "initialized() -> bool: the process-wide allocator exists."},
    {"oom_type", py_oom_type, METH_NOARGS,
     "oom_type() -> the exception class an out-of-memory error raises "
     "(TorchOutOfMemoryError once torch is imported)."},
    {"mark_capture_begin", py_mark_capture_begin, METH_VARARGS,
     "mark_capture_begin(device, stream): a graph capture begins."},
    {"mark_capture_end", py_mark_capture_end, METH_VARARGS,
     "mark_capture_end(device, stream): the graph capture ends."},
    {"set_expandable_segment_reserve_class", py_set_reserve_class,
     METH_VARARGS,
     "set_expandable_segment_reserve_class(stream, name): '' clears."},
    {"notify_device_error", py_notify_device_error, METH_VARARGS,
     "notify_device_error(device, message) -> bool: CANN OOM (dumped)."},
    {"save_dev_mem_usage_info", py_save_dev_mem_usage_info, METH_O,
     "save_dev_mem_usage_info(device) -> bool: CANN's usage CSV written."},
    {"dump_usage_reports", py_dump_usage_reports, METH_O,
     "dump_usage_reports(device) -> bool: False if CANN's CSV failed."},
    {"device_count", py_device_count, METH_NOARGS, "device_count() -> int."},
    {"profile", py_profile, METH_NOARGS, "profile() -> 'npu' | 'cuda'."},
    {"runtime_name", py_runtime_name, METH_NOARGS,
     "runtime_name() -> 'sim' | 'acl' | 'cuda'."},
    {"sim_host_backed", py_sim_host_backed, METH_NOARGS,
     "sim_host_backed() -> True on the host-backed sim runtime."},
    {"in_bad_fork", py_in_bad_fork, METH_NOARGS,
     "in_bad_fork() -> True in a child forked from a process that used a "
     "real device runtime."},
    {"memory_stats", py_memory_stats, METH_VARARGS,
     "memory_stats(device) -> nested dict of allocator statistics."},
    {"reset_peak_stats", py_reset_peak_stats, METH_VARARGS,
     "reset_peak_stats(device)."},
    {"reset_accumulated_stats", py_reset_accumulated_stats, METH_VARARGS,
     "reset_accumulated_stats(device)."},
    {"memory_summary", py_memory_summary, METH_VARARGS,
     "memory_summary(device, abbreviated) -> str."},
    {"check_invariants", py_check_invariants, METH_NOARGS,
     "check_invariants(): RuntimeError naming the first violation."},
    {"sim_fail_nth", py_sim_fail_nth, METH_VARARGS,
     "sim_fail_nth(call, nth): make the nth sim runtime call fail."},
    {NULL, NULL, 0, NULL}};

/* ---- MemPool: a private pool, released when the object dies -------------- */

typedef struct mempool_s {
  PyObject_HEAD
  int device;
  int live; /* created and not yet released */
  msnap_mempool_id_t id;
} mempool_t;

static PyObject *mempool_new(PyTypeObject *type, PyObject *args,
                             PyObject *kwds) {
  /* Arguments are taken by _create() (called from memsnap.memory.MemPool
   * __init__), so that the Python subclass can keep torch's signature. */
  mempool_t *self = (mempool_t *)type->tp_alloc(type, 0);
  if (self == NULL)
    return NULL;
  self->device = 0;
  self->live = 0;
  self->id.first = self->id.second = 0;
  return (PyObject *)self;
}

/* The _memsnap module of a MemPool: the module of the first type in the
 * MRO that was created from this module's definition (memsnap.memory's
 * MemPool is a Python subclass, which has no module of its own).  Borrowed;
 * NULL with TypeError if none. */
static PyObject *mempool_module(PyObject *self) {
  PyObject *mro = Py_TYPE(self)->tp_mro;
  for (Py_ssize_t i = 0; mro != NULL && i < PyTuple_GET_SIZE(mro); i++) {
    PyTypeObject *t = (PyTypeObject *)PyTuple_GET_ITEM(mro, i);
    if (!PyType_HasFeature(t, Py_TPFLAGS_HEAPTYPE))
      continue;
    PyObject *m = PyType_GetModule(t);
    if (m == NULL) {
      PyErr_Clear();
      continue;
    }
    if (PyModule_GetDef(m) == &msnap_py_moduledef)
      return m;
  }
  PyErr_SetString(PyExc_TypeError, "MemPool: no _memsnap module in its MRO");
  return NULL;
}

static void mempool_dealloc(PyObject *o) {
  mempool_t *self = (mempool_t *)o;
  PyTypeObject *tp = Py_TYPE(o);
  PyObject_GC_UnTrack(o);
  if (self->live) {
    msnap_allocator_t *a = msnap_default();
    if (a != NULL)
      (void)msnap_mempool_release(a, self->device, self->id);
    self->live = 0;
  }
  tp->tp_free(o);
  Py_DECREF(tp);
}

static int mempool_traverse(PyObject *o, visitproc visit, void *arg) {
  Py_VISIT(Py_TYPE(o));
  return 0;
}

/* _create(device, use_on_oom, no_split) */
static PyObject *mempool_create(PyObject *o, PyObject *args) {
  mempool_t *self = (mempool_t *)o;
  int device, use_on_oom, no_split;
  if (!PyArg_ParseTuple(args, "ipp:_create", &device, &use_on_oom, &no_split))
    return NULL;
  if (self->live) {
    PyErr_SetString(PyExc_RuntimeError, "MemPool already created");
    return NULL;
  }
  PyObject *module = mempool_module(o);
  if (module == NULL)
    return NULL;
  MSNAP_PY_GET_ALLOC(a);
  if (msnap_py_check_device(a, device, 0, 0) < 0)
    return NULL;
  int rc = msnap_mempool_create(a, device, use_on_oom != 0, no_split != 0,
                                &self->id);
  if (rc < 0)
    return msnap_py_raise(module, rc, "MemPool");
  self->device = device;
  self->live = 1;
  Py_RETURN_NONE;
}

static PyObject *mempool_id(PyObject *o, void *unused) {
  mempool_t *self = (mempool_t *)o;
  return Py_BuildValue("(KK)", (unsigned long long)self->id.first,
                       (unsigned long long)self->id.second);
}

static PyObject *mempool_device(PyObject *o, void *unused) {
  return PyLong_FromLong(((mempool_t *)o)->device);
}

static PyObject *mempool_use_count(PyObject *o, PyObject *unused) {
  mempool_t *self = (mempool_t *)o;
  PyObject *module = mempool_module(o);
  if (module == NULL)
    return NULL;
  MSNAP_PY_GET_ALLOC(a);
  int count = 0;
  int rc = msnap_mempool_use_count(a, self->device, self->id, &count);
  if (rc < 0)
    return msnap_py_raise(module, rc, "MemPool.use_count");
  return PyLong_FromLong(count);
}

/* The shared prologue of the pool-routing methods: the module, its
 * allocator and a checked device.  Returns the allocator or NULL with an
 * exception set. */
static msnap_allocator_t *mempool_target(PyObject *o, int device,
                                         PyObject **module) {
  *module = mempool_module(o);
  if (*module == NULL)
    return NULL;
  msnap_allocator_t *a = msnap_py_allocator(*module);
  if (a == NULL || msnap_py_check_device(a, device, 0, 0) < 0)
    return NULL;
  return a;
}

/* The pool methods that take only a device: parse it ("i:<name>"), call
 * fn on the pool, raise with `what` on error. */
static PyObject *pool_device_call(PyObject *o, PyObject *args,
                                  const char *fmt, const char *what,
                                  int (*fn)(msnap_allocator_t *, int,
                                            msnap_mempool_id_t)) {
  mempool_t *self = (mempool_t *)o;
  int device;
  PyObject *module;
  if (!PyArg_ParseTuple(args, fmt, &device))
    return NULL;
  msnap_allocator_t *a = mempool_target(o, device, &module);
  if (a == NULL)
    return NULL;
  int rc = fn(a, device, self->id);
  return msnap_py_none_or_raise(module, rc, what);
}

/* _begin_current_thread(device): route this thread's allocations to the
 * pool (_cuda_beginAllocateCurrentThreadToPool, use_mem_pool). */
static PyObject *mempool_begin_current_thread(PyObject *o, PyObject *args) {
  return pool_device_call(o, args, "i:_begin_current_thread",
                          "beginAllocateCurrentThreadToPool",
                          msnap_begin_allocate_current_thread_to_pool);
}

/* _begin(device, stream, all_streams): route allocations to the pool. */
static PyObject *mempool_begin(PyObject *o, PyObject *args) {
  mempool_t *self = (mempool_t *)o;
  int device, all_streams;
  PyObject *s, *module;
  uint64_t stream;
  if (!PyArg_ParseTuple(args, "iOp:_begin", &device, &s, &all_streams) ||
      msnap_py_stream(s, &stream) < 0)
    return NULL;
  msnap_allocator_t *a = mempool_target(o, device, &module);
  if (a == NULL)
    return NULL;
  int rc = msnap_begin_allocate_to_pool(a, device, self->id, stream,
                                        all_streams != 0);
  return msnap_py_none_or_raise(module, rc, "beginAllocateToPool");
}

static PyObject *mempool_end(PyObject *o, PyObject *args) {
  return pool_device_call(o, args, "i:_end", "endAllocateToPool",
                          msnap_end_allocate_to_pool);
}

/* _release(device): drop one reference (releasePool), e.g. the one that
 * _begin took.  The pool's own reference is dropped when the object dies;
 * at use_count 0 the pool's cached segments are released. */
static PyObject *mempool_release(PyObject *o, PyObject *args) {
  return pool_device_call(o, args, "i:_release", "releasePool",
                          msnap_mempool_release);
}

static PyMethodDef mempool_methods[] = {
    {"_create", mempool_create, METH_VARARGS,
     "_create(device, use_on_oom, no_split): make the private pool."},
    {"use_count", mempool_use_count, METH_NOARGS,
     "use_count() -> int: the pool's reference count."},
    {"_begin", mempool_begin, METH_VARARGS,
     "_begin(device, stream, all_streams): route allocations here."},
    {"_begin_current_thread", mempool_begin_current_thread, METH_VARARGS,
     "_begin_current_thread(device): route this thread's allocations here."},
    {"_end", mempool_end, METH_VARARGS, "_end(device): stop routing."},
    {"_release", mempool_release, METH_VARARGS,
     "_release(device): drop the reference _begin took (releasePool)."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef mempool_getset[] = {
    {"id", mempool_id, NULL, "the pool id, a tuple of two ints", NULL},
    {"device", mempool_device, NULL, "the device of the pool", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyType_Slot mempool_slots[] = {
    {Py_tp_new, mempool_new},
    {Py_tp_dealloc, mempool_dealloc},
    {Py_tp_traverse, mempool_traverse},
    {Py_tp_methods, mempool_methods},
    {Py_tp_getset, mempool_getset},
    {Py_tp_doc, "A private memory pool of the memsnap allocator "
                "(torch.cuda.MemPool's C part)."},
    {0, NULL}};

#if PY_VERSION_HEX >= 0x030A0000
#define MEMPOOL_IMMUTABLE Py_TPFLAGS_IMMUTABLETYPE
#else
#define MEMPOOL_IMMUTABLE 0
#endif

static PyType_Spec mempool_spec = {
    "memsnap._memsnap.MemPool", sizeof(mempool_t), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC |
        MEMPOOL_IMMUTABLE,
    mempool_slots};

int msnap_py_allocator_init(PyObject *module) {
  msnap_py_state_t *st = msnap_py_state(module);
  st->mempool_type = PyType_FromModuleAndSpec(module, &mempool_spec, NULL);
  if (st->mempool_type == NULL)
    return -1;
  Py_INCREF(st->mempool_type);
  if (PyModule_AddObject(module, "MemPool", st->mempool_type) < 0) {
    Py_DECREF(st->mempool_type);
    return -1;
  }
  return 0;
}
