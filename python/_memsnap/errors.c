/*
 * errors.c -- the one place where MSNAP_E* codes become Python exceptions.
 *
 * Mapping (the exception types torch raises for the same situations):
 *   MSNAP_EOOM, MSNAP_EREJECTED  -> OutOfMemoryError (MemoryError subclass;
 *                                   once `torch` is in sys.modules, a class
 *                                   deriving from it and from
 *                                   torch.OutOfMemoryError, made on first
 *                                   use and kept in the module state)
 *   MSNAP_EBADPTR, MSNAP_EINVAL,
 *   MSNAP_ECONF                  -> ValueError
 *   MSNAP_ENOMEM                 -> MemoryError
 *   MSNAP_EIO, MSNAP_ENOSPC      -> OSError
 *   MSNAP_ENOTSUP                -> NotImplementedError
 *   anything else                -> RuntimeError
 * The message is the library's last error text of this thread (it names
 * the pointer, token or size), else msnap_strerror().  For file errors
 * (msnap_py_raise_path) the system errno the library kept
 * (msnap_last_errno()) becomes OSError(errno, text, filename), so Python
 * picks the subclass (IsADirectoryError, PermissionError, ...) and
 * .errno/.filename are set; text then leaves the path out (str() adds
 * it).
 */
#include "msnap_py.h"

#include <errno.h>
#include <string.h>

/*
 * msnap_py_oom_type -- the exception type for an out-of-memory error.
 * Caller holds the GIL.  Returns a borrowed reference, or NULL with an
 * exception set if the combined class could not be made.
 */
PyObject *msnap_py_oom_type(PyObject *module) {
  msnap_py_state_t *st = msnap_py_state(module);
  PyObject *mods = PySys_GetObject("modules"); /* borrowed */
  PyObject *torch = mods ? PyDict_GetItemString(mods, "torch") : NULL;
  if (torch == NULL)
    return st->oom_error;
  PyObject *base = PyObject_GetAttrString(torch, "OutOfMemoryError");
  if (base == NULL || !PyExceptionClass_Check(base)) {
    /* A partly imported or stand-in torch: fall back to our own type. */
    Py_XDECREF(base);
    PyErr_Clear();
    return st->oom_error;
  }
  if (st->torch_oom_error != NULL && st->torch_oom_base == base) {
    Py_DECREF(base);
    return st->torch_oom_error;
  }
  PyObject *bases = PyTuple_Pack(2, st->oom_error, base);
  if (bases == NULL) {
    Py_DECREF(base);
    return NULL;
  }
  PyObject *dict = Py_BuildValue(
      "{s:s}", "__doc__",
      "Device out of memory: memsnap's OutOfMemoryError that is also "
      "torch.OutOfMemoryError, so `except torch.OutOfMemoryError` works.");
  PyObject *cls =
      dict ? PyErr_NewException("memsnap.memory.TorchOutOfMemoryError", bases,
                                dict)
           : NULL;
  Py_XDECREF(dict);
  Py_DECREF(bases);
  if (cls == NULL) {
    Py_DECREF(base);
    return NULL;
  }
  Py_XSETREF(st->torch_oom_error, cls);
  Py_XSETREF(st->torch_oom_base, base);
  return cls;
}

/*
 * msnap_py_raise -- set the exception for err (< 0) and return NULL.
 * Caller holds the GIL and calls this right after the failing library
 * call on the same thread (msnap_last_error() is thread-local).
 */
PyObject *msnap_py_raise(PyObject *module, int err, const char *what) {
  const char *text = msnap_last_error();
  if (text == NULL || text[0] == '\0')
    text = msnap_strerror(err);
  /* The C API prefixes some messages with its function name
   * ("msnap_stats_get: ..."); a Python user never called that: drop it. */
  if (strncmp(text, "msnap_", 6) == 0) {
    const char *t = text + 6;
    while ((*t >= 'a' && *t <= 'z') || (*t >= '0' && *t <= '9') || *t == '_')
      t++;
    if (t[0] == ':' && t[1] == ' ')
      text = t + 2;
  }
  PyObject *type;
  switch (err) {
  case MSNAP_EOOM:
  case MSNAP_EREJECTED:
    type = msnap_py_oom_type(module);
    if (type == NULL)
      return NULL;
    break;
  case MSNAP_EBADPTR:
  case MSNAP_EINVAL:
  case MSNAP_ECONF:
    type = PyExc_ValueError;
    break;
  case MSNAP_ENOMEM:
    type = PyExc_MemoryError;
    break;
  case MSNAP_EIO:
  case MSNAP_ENOSPC:
    type = PyExc_OSError;
    break;
  case MSNAP_ENOTSUP:
    type = PyExc_NotImplementedError;
    break;
  default:
    type = PyExc_RuntimeError;
    break;
  }
  if (what != NULL && what[0] != '\0')
    PyErr_Format(type, "%s: %s", what, text);
  else
    PyErr_SetString(type, text);
  return NULL;
}

/*
 * msnap_py_raise_path -- as msnap_py_raise for an operation on `path`; an
 * MSNAP_EIO/MSNAP_ENOSPC with a saved errno is raised as
 * OSError(errno, message, path) (the errno's subclass).  Returns NULL.
 */
PyObject *msnap_py_raise_path(PyObject *module, int err, const char *path) {
  int e = msnap_last_errno();
  if ((err != MSNAP_EIO && err != MSNAP_ENOSPC) || path == NULL)
    return msnap_py_raise(module, err, path);
  if (e == 0 && err == MSNAP_ENOSPC)
    e = ENOSPC;
  if (e == 0)
    return msnap_py_raise(module, err, path);
  const char *text = msnap_last_error();
  if (text == NULL || text[0] == '\0')
    text = strerror(e);
  /* OSError's str() appends ": 'path'": the library's message names the
   * path too ("cannot write 'P': ..."), so it loses its " 'P'" here
   * ("[Errno 9] cannot write: the descriptor is not open for writing:
   * '/dev/fd/3'"), naming the path once */
  char once[2048 + 64]; /* the library's messages are at most 2048 */
  char quoted[4096 + 4];
  int ql = snprintf(quoted, sizeof quoted, " '%s'", path);
  const char *at = ql > 0 && (size_t)ql < sizeof quoted ? strstr(text, quoted)
                                                        : NULL;
  if (at != NULL) {
    snprintf(once, sizeof once, "%.*s%s", (int)(at - text), text,
             at + ql);
    text = once;
  }
  PyObject *fn = PyUnicode_DecodeFSDefault(path);
  if (fn == NULL)
    return NULL;
  PyObject *exc = PyObject_CallFunction(PyExc_OSError, "isO", e, text, fn);
  Py_DECREF(fn);
  if (exc != NULL) {
    PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
    Py_DECREF(exc);
  }
  return NULL;
}

/* Create the exception types of the module state. */
int msnap_py_errors_init(PyObject *module) {
  msnap_py_state_t *st = msnap_py_state(module);
  PyObject *dict = Py_BuildValue(
      "{s:s}", "__doc__",
      "Device out of memory (mirrors torch.OutOfMemoryError).  Raised by "
      "memsnap when an allocation fails after the allocator's full OOM "
      "sequence (cached blocks released, retry failed).");
  if (dict == NULL)
    return -1;
  st->oom_error =
      PyErr_NewException("memsnap.memory.OutOfMemoryError", PyExc_MemoryError,
                         dict);
  Py_DECREF(dict);
  if (st->oom_error == NULL)
    return -1;
  Py_INCREF(st->oom_error);
  if (PyModule_AddObject(module, "OutOfMemoryError", st->oom_error) < 0) {
    Py_DECREF(st->oom_error);
    return -1;
  }
  return 0;
}
