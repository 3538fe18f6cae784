/*
 * history.c -- memory history, snapshots, metadata and OOM observers.
 *
 * Argument checks follow torch's C++ bindings (memory_snapshot.cpp,
 * Module.cpp) so that the same bad argument raises the same exception with
 * the same text (cuda-reference §5.1, §5.4).  Snapshots are pickled by the
 * C library with the GIL released (the library resolves Python frames
 * through frames.c without the GIL) and unpickled here with pickle.loads.
 *
 * OOM observers: the library calls one C function per allocator; it takes
 * the GIL (the failing malloc may come from a thread without it), calls
 * every registered Python observer as fn(device, alloc_bytes,
 * device_total, device_free) and reports an observer's exception through
 * sys.unraisablehook, so that the OutOfMemoryError itself always reaches
 * the caller.  The module object is the C callback's argument and is kept
 * alive for the life of the process once an observer is attached.
 */
#include "msnap_py.h"

#include <stdio.h>
#include <string.h>

/* Parse skip_actions (a list/tuple of str) into action bits. */
static int parse_skip(PyObject *seq, uint32_t *bits) {
  *bits = 0;
  if (seq == Py_None)
    return 0;
  if (PyUnicode_Check(seq) || PyBytes_Check(seq)) { /* pybind11 refuses */
    PyErr_SetString(PyExc_TypeError, "skip_actions must be a list of str");
    return -1;
  }
  PyObject *fast = PySequence_Fast(seq, "skip_actions must be a list of str");
  if (fast == NULL)
    return -1;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); i++) {
    PyObject *s = PySequence_Fast_GET_ITEM(fast, i);
    const char *name = PyUnicode_Check(s) ? PyUnicode_AsUTF8(s) : NULL;
    if (name == NULL) {
      if (!PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "skip_actions must be a list of str");
      Py_DECREF(fast);
      return -1;
    }
    msnap_action_t act;
    if (msnap_action_parse(name, &act) < 0) {
      PyErr_Format(PyExc_RuntimeError, "Unknown TraceEntry action: %s", name);
      Py_DECREF(fast);
      return -1;
    }
    *bits |= 1u << act;
  }
  Py_DECREF(fast);
  return 0;
}

/* max_entries as size_t: negative -> TypeError as pybind's size_t cast. */
static int parse_max_entries(PyObject *o, uint64_t *out) {
  if (!PyLong_Check(o) || PyBool_Check(o)) {
    PyErr_Format(PyExc_TypeError,
                 "max_entries must be a non-negative int, not %.100s",
                 Py_TYPE(o)->tp_name);
    return -1;
  }
  unsigned long long v = PyLong_AsUnsignedLongLong(o);
  if (v == (unsigned long long)-1 && PyErr_Occurred()) {
    PyErr_Clear();
    PyErr_SetString(PyExc_TypeError,
                    "max_entries must be a non-negative int (size_t)");
    return -1;
  }
  *out = v;
  return 0;
}

/* Optional str argument: NULL for None. */
static int opt_str(PyObject *o, const char **out, const char *what) {
  if (o == Py_None) {
    *out = NULL;
    return 0;
  }
  if (!PyUnicode_Check(o)) {
    PyErr_Format(PyExc_TypeError, "%s must be a str or None, not %.100s", what,
                 Py_TYPE(o)->tp_name);
    return -1;
  }
  *out = PyUnicode_AsUTF8(o);
  return *out ? 0 : -1;
}

/* o: the defaults, then the arguments both APIs take alike: max_entries
 * (0 keeps one entry) and skip_actions.  -1 with an exception set. */
static int parse_entries(PyObject *maxe, PyObject *skip,
                         msnap_history_options_t *o) {
  msnap_history_options_init(o);
  if (parse_max_entries(maxe, &o->max_entries) < 0 ||
      parse_skip(skip, &o->skip_actions) < 0)
    return -1;
  if (o->max_entries == 0)
    o->max_entries = 1;
  return 0;
}

/* Both APIs refuse record_pinned_host_memory without history recording. */
static PyObject *host_without_history(void) {
  PyErr_SetString(PyExc_RuntimeError, "record_pinned_host_memory requires "
                                      "memory history recording to be "
                                      "enabled");
  return NULL;
}

static PyObject *apply_history(PyObject *module, msnap_history_options_t *o) {
  MSNAP_PY_GET_ALLOC(a);
  int rc = msnap_record_history(a, o);
  return msnap_py_none_or_raise(module, rc, "_record_memory_history");
}

/*
 * record_history(enabled, context, stacks, max_entries, clear_history,
 *                compile_context, global_record_annotations, skip_actions,
 *                record_pinned_host_memory, record_cuda)
 * The new API of _record_memory_history_impl (cuda-reference §4.2, §5.1).
 */
static PyObject *py_record_history(PyObject *module, PyObject *args) {
  PyObject *en, *ctx, *st, *maxe, *skip;
  int clear, cc, glob, host, dev;
  if (!PyArg_ParseTuple(args, "OOOOpppOpp:record_history", &en, &ctx, &st,
                        &maxe, &clear, &cc, &glob, &skip, &host, &dev))
    return NULL;
  const char *enabled, *context, *stacks;
  if (opt_str(en, &enabled, "enabled") < 0 ||
      opt_str(ctx, &context, "context") < 0 ||
      opt_str(st, &stacks, "stacks") < 0)
    return NULL;
  if (host && enabled == NULL)
    return host_without_history();
  if (enabled && strcmp(enabled, "state") != 0 && strcmp(enabled, "all") != 0) {
    PyErr_SetString(PyExc_RuntimeError,
                    "expected state to be 'state', 'all', or None");
    return NULL;
  }
  if (context && strcmp(context, "state") != 0 &&
      strcmp(context, "alloc") != 0 && strcmp(context, "all") != 0) {
    PyErr_SetString(PyExc_RuntimeError,
                    "expected context to be 'state', 'alloc', 'all', or None");
    return NULL;
  }
  if (stacks == NULL ||
      (strcmp(stacks, "python") != 0 && strcmp(stacks, "all") != 0)) {
    PyErr_SetString(PyExc_RuntimeError,
                    "expected stacks to be 'python', or 'all'");
    return NULL;
  }
  msnap_history_options_t o;
  if (parse_entries(maxe, skip, &o) < 0)
    return NULL;
  /* record_device carries record_cuda; msnap_record_history turns device
   * recording on only when both are set (host recording needs enabled). */
  o.enabled = enabled != NULL;
  if (enabled != NULL && strcmp(enabled, "state") == 0)
    o.max_entries = 1;
  if (context == NULL)
    o.context = MSNAP_CONTEXT_NEVER;
  else if (strcmp(context, "state") == 0)
    o.context = MSNAP_CONTEXT_STATE;
  else if (strcmp(context, "alloc") == 0)
    o.context = MSNAP_CONTEXT_ALLOC;
  else
    o.context = MSNAP_CONTEXT_ALL;
  o.stacks = MSNAP_STACKS_PYTHON;
  if (strcmp(stacks, "all") == 0 && enabled != NULL && context != NULL)
    o.stacks |= MSNAP_STACKS_CPP;
  o.clear_history = clear != 0;
  o.compile_context = cc != 0;
  o.global_record_annotations = glob != 0;
  o.record_device = dev != 0;
  o.record_host = host != 0 && enabled != NULL;
  if (!o.enabled && !o.record_host)
    o.context = MSNAP_CONTEXT_NEVER;
  return apply_history(module, &o);
}

/*
 * record_history_legacy(enabled, record_context, trace_alloc_max_entries,
 *     trace_alloc_record_context, record_context_cpp, clear_history,
 *     compile_context, global_record_annotations, skip_actions,
 *     record_pinned_host_memory, record_cuda)
 */
static PyObject *py_record_history_legacy(PyObject *module, PyObject *args) {
  int enabled, rec_ctx, alloc_ctx, cpp, clear, cc, glob, host, dev;
  PyObject *maxe, *skip;
  if (!PyArg_ParseTuple(args, "ppOpppppOpp:record_history_legacy", &enabled,
                        &rec_ctx, &maxe, &alloc_ctx, &cpp, &clear, &cc, &glob,
                        &skip, &host, &dev))
    return NULL;
  if (host && !enabled)
    return host_without_history();
  msnap_history_options_t o;
  if (parse_entries(maxe, skip, &o) < 0)
    return NULL;
  o.enabled = enabled; /* record_device carries record_cuda */
  o.context = alloc_ctx ? MSNAP_CONTEXT_ALLOC
                        : (rec_ctx ? MSNAP_CONTEXT_STATE : MSNAP_CONTEXT_NEVER);
  o.stacks = MSNAP_STACKS_PYTHON;
  if (cpp && enabled && (alloc_ctx || rec_ctx))
    o.stacks |= MSNAP_STACKS_CPP;
  if (!enabled)
    o.context = MSNAP_CONTEXT_NEVER;
  o.clear_history = clear != 0;
  o.compile_context = cc != 0;
  o.global_record_annotations = glob != 0;
  o.record_device = dev != 0;
  o.record_host = host != 0 && enabled;
  return apply_history(module, &o);
}

static PyObject *py_history_enabled(PyObject *module, PyObject *unused) {
  MSNAP_PY_GET_ALLOC(a);
  return PyBool_FromLong(msnap_history_enabled(a));
}

/* Parse (device, pool_first, pool_second, include_traces, segments_only). */
static int parse_snap(PyObject *args, msnap_snapshot_options_t *o,
                      const char *fmt) {
  int device, traces, segs;
  unsigned long long p0, p1;
  if (!PyArg_ParseTuple(args, fmt, &device, &p0, &p1, &traces, &segs))
    return -1;
  msnap_snapshot_options_init(o);
  o->device = device;
  o->mempool.first = p0;
  o->mempool.second = p1;
  o->include_traces = traces != 0;
  o->segments_only = segs != 0;
  return 0;
}

/* Unpickle a buffer returned by the library (and free it). */
/* pickle.loads makes the snapshot's objects: a dict per trace entry,
 * block and frame, none of them garbage, but every one counts toward the
 * cyclic collector's thresholds, and its full collections then traverse
 * every object of the process, again and again (600 K trace entries:
 * 1.28 s of CPU with the collector on, 0.46 s with it off).  The
 * collector is off during the call, as timeit keeps it, and on again
 * after if it was (3.10+: PyGC_Disable). */
static PyObject *loads(PyObject *module, char *buf, size_t len) {
  PyObject *bytes = PyBytes_FromStringAndSize(buf, (Py_ssize_t)len);
  msnap_free_string(buf);
  if (bytes == NULL)
    return NULL;
#if PY_VERSION_HEX >= 0x030A0000
  int gc_was_on = PyGC_Disable();
#endif
  PyObject *r =
      PyObject_CallOneArg(msnap_py_state(module)->pickle_loads, bytes);
#if PY_VERSION_HEX >= 0x030A0000
  if (gc_was_on)
    PyGC_Enable();
#endif
  Py_DECREF(bytes);
  return r;
}

/*
 * snapshot(device, pool_first, pool_second, include_traces, segments_only)
 * -> the snapshot dict (cuda-reference §2).  device -1: every device.
 */
static PyObject *py_snapshot(PyObject *module, PyObject *args) {
  msnap_snapshot_options_t o;
  if (parse_snap(args, &o, "iKKpp:snapshot") < 0)
    return NULL;
  MSNAP_PY_GET_ALLOC(a);
  if (msnap_py_check_device(a, o.device, 1, 0) < 0)
    return NULL;
  char *buf = NULL;
  size_t len = 0;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = msnap_snapshot_pickle(a, &o, &buf, &len);
  Py_END_ALLOW_THREADS
  if (rc < 0)
    return msnap_py_raise(module, rc, "_snapshot");
  return loads(module, buf, len);
}

/*
 * dump_snapshot(path, device, pool_first, pool_second, include_traces,
 * segments_only): written by the library via a temporary file and
 * rename(2), with the GIL released.
 */
static PyObject *py_dump_snapshot(PyObject *module, PyObject *args) {
  PyObject *path_obj = NULL;
  if (PyTuple_GET_SIZE(args) < 1) {
    PyErr_SetString(PyExc_TypeError, "dump_snapshot(path, device, ...)");
    return NULL;
  }
  if (!PyUnicode_FSConverter(PyTuple_GET_ITEM(args, 0), &path_obj))
    return NULL;
  PyObject *rest = PyTuple_GetSlice(args, 1, PyTuple_GET_SIZE(args));
  msnap_snapshot_options_t o;
  int bad = rest == NULL || parse_snap(rest, &o, "iKKpp:dump_snapshot") < 0;
  Py_XDECREF(rest);
  if (bad) {
    Py_DECREF(path_obj);
    return NULL;
  }
  msnap_allocator_t *a = msnap_py_allocator(module);
  if (a == NULL) {
    Py_DECREF(path_obj);
    return NULL;
  }
  const char *path = PyBytes_AS_STRING(path_obj);
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = msnap_dump_snapshot(a, &o, path);
  Py_END_ALLOW_THREADS
  PyObject *r = NULL;
  if (rc < 0)
    msnap_py_raise_path(module, rc, path);
  else
    r = Py_NewRef(Py_None);
  Py_DECREF(path_obj);
  return r;
}

static PyObject *py_write_usage_report(PyObject *module, PyObject *arg) {
  PyObject *path_obj = NULL;
  if (!PyUnicode_FSConverter(arg, &path_obj))
    return NULL;
  msnap_allocator_t *a = msnap_py_allocator(module);
  if (a == NULL) {
    Py_DECREF(path_obj);
    return NULL;
  }
  int rc;
  const char *path = PyBytes_AS_STRING(path_obj);
  Py_BEGIN_ALLOW_THREADS
  rc = msnap_write_usage_report(a, path);
  Py_END_ALLOW_THREADS
  PyObject *r = rc < 0 ? msnap_py_raise_path(module, rc, path) : Py_NewRef(Py_None);
  Py_DECREF(path_obj);
  return r;
}

/* write_file(path, data): bytes written as every dump is (the link rule,
 * temporary + rename, the replaced file's mode), with the GIL released. */
static PyObject *py_write_file(PyObject *module, PyObject *args) {
  PyObject *path_obj = NULL;
  Py_buffer data;
  if (!PyArg_ParseTuple(args, "O&y*:write_file", PyUnicode_FSConverter,
                        &path_obj, &data))
    return NULL;
  int rc;
  const char *path = PyBytes_AS_STRING(path_obj);
  Py_BEGIN_ALLOW_THREADS
  rc = msnap_write_file(path, data.buf, (size_t)data.len);
  Py_END_ALLOW_THREADS
  PyBuffer_Release(&data);
  PyObject *r =
      rc < 0 ? msnap_py_raise_path(module, rc, path) : Py_NewRef(Py_None);
  Py_DECREF(path_obj);
  return r;
}

/* check_output(path): refuse, before any work, what write_file would
 * refuse (msnap_check_output: the link rule, a dangling link, a directory,
 * a directory that is not writable); nothing is created. */
static PyObject *py_check_output(PyObject *module, PyObject *args) {
  PyObject *path_obj = NULL;
  if (!PyArg_ParseTuple(args, "O&:check_output", PyUnicode_FSConverter,
                        &path_obj))
    return NULL;
  int rc;
  const char *path = PyBytes_AS_STRING(path_obj);
  Py_BEGIN_ALLOW_THREADS
  rc = msnap_check_output(path);
  Py_END_ALLOW_THREADS
  PyObject *r =
      rc < 0 ? msnap_py_raise_path(module, rc, path) : Py_NewRef(Py_None);
  Py_DECREF(path_obj);
  return r;
}

/* ---- metadata, annotations, tracebacks ----------------------------------- */

static PyObject *py_set_memory_metadata(PyObject *module, PyObject *arg) {
  if (!PyUnicode_Check(arg)) {
    PyErr_Format(PyExc_TypeError, "metadata must be a str, not %.100s",
                 Py_TYPE(arg)->tp_name);
    return NULL;
  }
  const char *s = PyUnicode_AsUTF8(arg);
  if (s == NULL)
    return NULL;
  int rc = msnap_set_memory_metadata(s);
  return msnap_py_none_or_raise(module, rc, "_set_memory_metadata");
}

static PyObject *py_get_memory_metadata(PyObject *module, PyObject *unused) {
  const char *s = msnap_get_memory_metadata();
  return PyUnicode_FromString(s ? s : "");
}

static PyObject *py_annotate_memory(PyObject *module, PyObject *args) {
  PyObject *p;
  const char *text;
  uint64_t ptr;
  if (!PyArg_ParseTuple(args, "Os:annotate_memory", &p, &text) ||
      msnap_py_u64(p, &ptr, "data_ptr") < 0)
    return NULL;
  MSNAP_PY_GET_ALLOC(a);
  int rc = msnap_annotate_memory(a, ptr, text);
  if (rc == MSNAP_EBADPTR) {
    char msg[96];
    snprintf(msg, sizeof msg,
             "annotateMemory: no live allocation found at pointer 0x%llx",
             (unsigned long long)ptr);
    PyErr_SetString(PyExc_RuntimeError, msg);
    return NULL;
  }
  return msnap_py_none_or_raise(module, rc, "_annotate_memory");
}

static PyObject *py_record_annotation(PyObject *module, PyObject *args) {
  int device, is_start;
  const char *name;
  if (!PyArg_ParseTuple(args, "isp:record_annotation", &device, &name,
                        &is_start))
    return NULL;
  MSNAP_PY_GET_ALLOC(a);
  if (msnap_py_check_device(a, device, 1, 0) < 0)
    return NULL;
  int rc = msnap_record_annotation(a, device, name, is_start != 0);
  return msnap_py_none_or_raise(module, rc, "record_annotation");
}

/* set_process_rank(rank, world_size, local_rank): -1 = unknown. */
static PyObject *py_set_process_rank(PyObject *module, PyObject *args) {
  int rank, world, local;
  if (!PyArg_ParseTuple(args, "iii:set_process_rank", &rank, &world, &local))
    return NULL;
  int rc = msnap_set_process_rank(rank, world, local);
  return msnap_py_none_or_raise(module, rc, "set_process_rank");
}

static PyObject *py_compile_context_push(PyObject *module, PyObject *arg) {
  const char *s = PyUnicode_Check(arg) ? PyUnicode_AsUTF8(arg) : NULL;
  if (s == NULL) {
    if (!PyErr_Occurred())
      PyErr_SetString(PyExc_TypeError, "name must be a str");
    return NULL;
  }
  int rc = msnap_compile_context_push(s);
  return msnap_py_none_or_raise(module, rc, "compile_context_push");
}

static PyObject *py_compile_context_pop(PyObject *module, PyObject *unused) {
  int rc = msnap_compile_context_pop();
  return msnap_py_none_or_raise(module, rc, "compile_context_pop");
}

/* allocation_traceback(ptr) -> list of frame dicts, or None. */
static PyObject *py_allocation_traceback(PyObject *module, PyObject *arg) {
  uint64_t ptr;
  if (msnap_py_u64(arg, &ptr, "data_ptr") < 0)
    return NULL;
  MSNAP_PY_GET_ALLOC(a);
  char *buf = NULL;
  size_t len = 0;
  int rc = msnap_allocation_traceback(a, ptr, &buf, &len);
  if (rc == MSNAP_EBADPTR || rc == MSNAP_ENOENT)
    Py_RETURN_NONE;
  if (rc < 0)
    return msnap_py_raise(module, rc, "_allocation_traceback");
  if (buf == NULL || len == 0) {
    msnap_free_string(buf);
    Py_RETURN_NONE;
  }
  return loads(module, buf, len);
}

/* ---- OOM observers ------------------------------------------------------- */

#if PY_VERSION_HEX >= 0x030D0000
#define IS_FINALIZING() Py_IsFinalizing()
#else
#define IS_FINALIZING() _Py_IsFinalizing()
#endif

static void oom_callback(int device, uint64_t alloc_size, uint64_t total,
                         uint64_t free_bytes, void *arg) {
  if (!Py_IsInitialized() || (!PyGILState_Check() && IS_FINALIZING()))
    return;
  PyGILState_STATE g = PyGILState_Ensure();
  PyObject *module = (PyObject *)arg;
  PyObject *et, *ev, *tb;
  PyErr_Fetch(&et, &ev, &tb);
  PyObject *obs = PySequence_List(msnap_py_state(module)->oom_observers);
  if (obs == NULL) {
    PyErr_WriteUnraisable(module);
  } else {
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(obs); i++) {
      PyObject *fn = PyList_GET_ITEM(obs, i);
      PyObject *r = PyObject_CallFunction(
          fn, "iKKK", device, (unsigned long long)alloc_size,
          (unsigned long long)total, (unsigned long long)free_bytes);
      if (r == NULL)
        PyErr_WriteUnraisable(fn);
      Py_XDECREF(r);
    }
    Py_DECREF(obs);
  }
  PyErr_Restore(et, ev, tb);
  PyGILState_Release(g);
}

static PyObject *py_attach_oom_observer(PyObject *module, PyObject *fn) {
  if (!PyCallable_Check(fn)) {
    PyErr_Format(PyExc_TypeError, "observer must be callable, not %.100s",
                 Py_TYPE(fn)->tp_name);
    return NULL;
  }
  msnap_py_state_t *st = msnap_py_state(module);
  MSNAP_PY_GET_ALLOC(a);
  if (!st->oom_attached) {
    int rc = msnap_attach_oom_observer(a, oom_callback, module);
    if (rc < 0)
      return msnap_py_raise(module, rc, "_attach_out_of_memory_observer");
    /* The allocator outlives the module: keep the module alive. */
    Py_INCREF(module);
    st->oom_attached = 1;
  }
  if (PyList_Append(st->oom_observers, fn) < 0)
    return NULL;
  Py_RETURN_NONE;
}

PyMethodDef msnap_py_history_methods[] = {
    {"record_history", py_record_history, METH_VARARGS,
     "record_history(enabled, context, stacks, max_entries, clear_history, "
     "compile_context, global_record_annotations, skip_actions, "
     "record_pinned_host_memory, record_cuda)"},
    {"record_history_legacy", py_record_history_legacy, METH_VARARGS,
     "record_history_legacy(enabled, record_context, "
     "trace_alloc_max_entries, trace_alloc_record_context, "
     "record_context_cpp, clear_history, compile_context, "
     "global_record_annotations, skip_actions, record_pinned_host_memory, "
     "record_cuda)"},
    {"history_enabled", py_history_enabled, METH_NOARGS,
     "history_enabled() -> bool"},
    {"snapshot", py_snapshot, METH_VARARGS,
     "snapshot(device, pool_first, pool_second, include_traces, "
     "segments_only) -> dict"},
    {"dump_snapshot", py_dump_snapshot, METH_VARARGS,
     "dump_snapshot(path, device, pool_first, pool_second, include_traces, "
     "segments_only): atomic write (temporary file + rename)"},
    {"write_usage_report", py_write_usage_report, METH_O,
     "write_usage_report(path): the CSV device memory-usage report"},
    {"write_file", py_write_file, METH_VARARGS,
     "write_file(path, data): bytes written as a dump is (atomically)"},
    {"check_output", py_check_output, METH_VARARGS,
     "check_output(path): refuse, before any work, a path write_file would "
     "refuse"},
    {"set_memory_metadata", py_set_memory_metadata, METH_O,
     "set_memory_metadata(str)"},
    {"get_memory_metadata", py_get_memory_metadata, METH_NOARGS,
     "get_memory_metadata() -> str"},
    {"annotate_memory", py_annotate_memory, METH_VARARGS,
     "annotate_memory(ptr, text)"},
    {"set_process_rank", py_set_process_rank, METH_VARARGS,
     "set_process_rank(rank, world_size, local_rank): -1 = unknown; "
     "recorded in snapshots' process_info and OOM dump names."},
    {"record_annotation", py_record_annotation, METH_VARARGS,
     "record_annotation(device, name, is_start)"},
    {"compile_context_push", py_compile_context_push, METH_O,
     "compile_context_push(name)"},
    {"compile_context_pop", py_compile_context_pop, METH_NOARGS,
     "compile_context_pop()"},
    {"allocation_traceback", py_allocation_traceback, METH_O,
     "allocation_traceback(ptr) -> list[dict] | None"},
    {"attach_oom_observer", py_attach_oom_observer, METH_O,
     "attach_oom_observer(fn): fn(device, alloc, device_total, device_free)"},
    {NULL, NULL, 0, NULL}};

int msnap_py_history_init(PyObject *module) {
  msnap_py_state_t *st = msnap_py_state(module);
  st->oom_observers = PyList_New(0);
  if (st->oom_observers == NULL)
    return -1;
  PyObject *pickle = PyImport_ImportModule("pickle");
  if (pickle == NULL)
    return -1;
  st->pickle_loads = PyObject_GetAttrString(pickle, "loads");
  Py_DECREF(pickle);
  return st->pickle_loads ? 0 : -1;
}
