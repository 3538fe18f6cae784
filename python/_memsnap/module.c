/*
 * module.c -- the _memsnap extension module: definition, multi-phase
 * initialisation (PEP 489) and per-module state (PEP 573).
 *
 * The functions come from four tables (allocator.c, history.c,
 * frames.c, host.c).  A function whose libmemsnap entry point is missing from the
 * library this module was built against (see weak.h) is left out and its
 * name is listed in _memsnap.MISSING, so callers can test hasattr().
 */
#include "msnap_py.h"
#include "weak.h"

#include <string.h>

/* Python function name -> the library function it cannot work without. */
typedef struct requirement_s {
  const char *name;
  const void *symbol;
} requirement_t;

#define REQ(n, f) {n, (const void *)(f)}
static const requirement_t reqs[] = {
    REQ("malloc", msnap_malloc),
    REQ("free", msnap_free),
    REQ("record_stream", msnap_record_stream),
    REQ("allocation_size", msnap_allocation_size),
    REQ("empty_cache", msnap_empty_cache),
    REQ("set_allocator_settings", msnap_set_allocator_settings),
    REQ("allocator_settings", msnap_allocator_settings),
    REQ("set_memory_fraction", msnap_set_memory_fraction),
    REQ("get_memory_fraction", msnap_get_memory_fraction),
    REQ("set_caching_enabled", msnap_set_caching_enabled),
    REQ("caching_enabled", msnap_caching_enabled),
    REQ("mem_get_info", msnap_mem_get_info),
    REQ("device_count", msnap_device_count),
    REQ("profile", msnap_profile),
    REQ("runtime_name", msnap_runtime),
    REQ("memory_stats", msnap_stats_get),
    REQ("reset_peak_stats", msnap_reset_peak_stats),
    REQ("reset_accumulated_stats", msnap_reset_accumulated_stats),
    REQ("memory_summary", msnap_memory_summary),
    REQ("check_invariants", msnap_check_invariants),
    REQ("sim_fail_nth", msnap_sim_fail_nth),
    REQ("MemPool", msnap_mempool_create),
    REQ("record_history", msnap_record_history),
    REQ("record_history_legacy", msnap_record_history),
    REQ("history_enabled", msnap_history_enabled),
    REQ("snapshot", msnap_snapshot_pickle),
    REQ("dump_snapshot", msnap_dump_snapshot),
    REQ("write_usage_report", msnap_write_usage_report),
    REQ("set_memory_metadata", msnap_set_memory_metadata),
    REQ("get_memory_metadata", msnap_get_memory_metadata),
    REQ("annotate_memory", msnap_annotate_memory),
    REQ("record_annotation", msnap_record_annotation),
    REQ("compile_context_push", msnap_compile_context_push),
    REQ("compile_context_pop", msnap_compile_context_pop),
    REQ("allocation_traceback", msnap_allocation_traceback),
    REQ("attach_oom_observer", msnap_attach_oom_observer),
    REQ("host_malloc", msnap_host_malloc),
    REQ("host_free", msnap_host_free),
    REQ("host_record_stream", msnap_host_record_stream),
    REQ("host_empty_cache", msnap_host_empty_cache),
    REQ("host_memory_stats", msnap_host_stats_get),
    REQ("host_reset_peak_stats", msnap_host_reset_peak_stats),
    REQ("host_reset_accumulated_stats", msnap_host_reset_accumulated_stats),
};
#undef REQ
#define NREQS (sizeof reqs / sizeof reqs[0])

/* Every function also needs the allocator itself. */
static int core_present(void) {
  return msnap_default != NULL && msnap_options_init != NULL &&
         msnap_allocator_create != NULL && msnap_strerror != NULL &&
         msnap_last_error != NULL && msnap_free_string != NULL;
}

/* Remove functions whose library entry point is missing; list them. */
static int prune_missing(PyObject *module) {
  PyObject *missing = PyList_New(0);
  if (missing == NULL)
    return -1;
  int all = core_present();
  for (size_t i = 0; i < NREQS; i++) {
    if (all && reqs[i].symbol != NULL)
      continue;
    PyObject *name = PyUnicode_FromString(reqs[i].name);
    if (name == NULL || PyList_Append(missing, name) < 0) {
      Py_XDECREF(name);
      Py_DECREF(missing);
      return -1;
    }
    if (PyObject_HasAttr(module, name) && PyObject_DelAttr(module, name) < 0) {
      Py_DECREF(name);
      Py_DECREF(missing);
      return -1;
    }
    Py_DECREF(name);
  }
  PyObject *t = PyList_AsTuple(missing);
  Py_DECREF(missing);
  if (t == NULL)
    return -1;
  return PyModule_AddObject(module, "MISSING", t) < 0 ? (Py_DECREF(t), -1) : 0;
}

static int memsnap_exec(PyObject *module) {
  if (PyModule_AddFunctions(module, msnap_py_allocator_methods) < 0 ||
      PyModule_AddFunctions(module, msnap_py_history_methods) < 0 ||
      PyModule_AddFunctions(module, msnap_py_frames_methods) < 0 ||
      PyModule_AddFunctions(module, msnap_py_host_methods) < 0)
    return -1;
  if (msnap_py_errors_init(module) < 0 || msnap_py_allocator_init(module) < 0 ||
      msnap_py_history_init(module) < 0)
    return -1;
  if (msnap_py_frames_init(module) < 0)
    return -1;
  if (PyModule_AddStringConstant(module, "VERSION", MSNAP_VERSION_STRING) < 0)
    return -1;
  return prune_missing(module);
}

static int memsnap_traverse(PyObject *module, visitproc visit, void *arg) {
  msnap_py_state_t *st = msnap_py_state(module);
  if (st == NULL)
    return 0;
  Py_VISIT(st->oom_error);
  Py_VISIT(st->torch_oom_error);
  Py_VISIT(st->torch_oom_base);
  Py_VISIT(st->mempool_type);
  Py_VISIT(st->pickle_loads);
  Py_VISIT(st->oom_observers);
  return 0;
}

static int memsnap_clear(PyObject *module) {
  msnap_py_state_t *st = msnap_py_state(module);
  if (st == NULL)
    return 0;
  Py_CLEAR(st->oom_error);
  Py_CLEAR(st->torch_oom_error);
  Py_CLEAR(st->torch_oom_base);
  Py_CLEAR(st->mempool_type);
  Py_CLEAR(st->pickle_loads);
  Py_CLEAR(st->oom_observers);
  return 0;
}

static void memsnap_free(void *module) { memsnap_clear((PyObject *)module); }

static PyModuleDef_Slot memsnap_slots[] = {
    {Py_mod_exec, (void *)memsnap_exec},
    {0, NULL}};

struct PyModuleDef msnap_py_moduledef = {
    PyModuleDef_HEAD_INIT,
    "_memsnap",
    "C binding of libmemsnap for the memsnap package (use memsnap.memory).",
    sizeof(msnap_py_state_t),
    NULL,
    memsnap_slots,
    memsnap_traverse,
    memsnap_clear,
    memsnap_free};

PyMODINIT_FUNC PyInit__memsnap(void) {
  return PyModuleDef_Init(&msnap_py_moduledef);
}
