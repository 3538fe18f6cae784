/*
 * module.c -- the _memsnap extension module: definition, multi-phase
 * initialisation (PEP 489) and per-module state (PEP 573).
 *
 * The functions come from four tables (allocator.c, history.c,
 * frames.c, host.c); the module links against libmemsnap.so, found next to it
 * ($ORIGIN) once installed.
 */
#include "msnap_py.h"

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
  return PyModule_AddStringConstant(module, "VERSION", MSNAP_VERSION_STRING);
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
  Py_VISIT(st->created_by);
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
  Py_CLEAR(st->created_by);
  Py_CLEAR(st->oom_observers);
  return 0;
}

static void memsnap_free(void *module) { memsnap_clear((PyObject *)module); }

/* Capabilities, declared only as far as they are true: the frame hook is
 * process-wide and takes the GIL through PyGILState (main interpreter
 * only), so subinterpreters are not supported; no Py_mod_gil: the module
 * relies on the GIL. */
static PyModuleDef_Slot memsnap_slots[] = {
    {Py_mod_exec, (void *)memsnap_exec},
#if PY_VERSION_HEX >= 0x030C0000
    {Py_mod_multiple_interpreters, Py_MOD_MULTIPLE_INTERPRETERS_NOT_SUPPORTED},
#endif
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
