/*
 * msnap_py.h -- the index of the _memsnap extension module.
 *
 * The extension is a thin binding of include/memsnap.h for the pure-Python
 * package `memsnap` (memsnap.memory mirrors torch.cuda.memory).  It links
 * against libmemsnap.so (not a private copy of the core) so that the
 * allocator behind memsnap.memory is the very allocator that torch reaches
 * through the pluggable-allocator entry points (src/plugin.c).
 *
 * Files:
 *   module.c     module definition, multi-phase init, module state;
 *   errors.c     MSNAP_E* codes -> Python exceptions (one function);
 *   allocator.c  malloc/free/stats/settings/fraction/mempool type;
 *   history.c    memory history, snapshots, metadata, OOM observers;
 *   frames.c     the interpreter frame hook (msnap_set_frame_hook);
 *   host.c       pinned host memory (allocation, host_memory_stats).
 *
 * Rules kept by every file: no static globals hold Python objects (they
 * live in the module state); the GIL is released only around long C work
 * that never calls back into Python (snapshot pickling, dumps).
 */
#ifndef MSNAP_PY_H
#define MSNAP_PY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "memsnap.h"

#if PY_VERSION_HEX < 0x030A0000
static inline PyObject *Py_NewRef(PyObject *o) {
  Py_INCREF(o);
  return o;
}
#endif

/* Per-module state (PEP 489/573). */
typedef struct msnap_py_state_s {
  PyObject *oom_error;       /* memsnap OutOfMemoryError (MemoryError)   */
  PyObject *torch_oom_error; /* subclass of it and torch's, made lazily  */
  PyObject *torch_oom_base;  /* torch.OutOfMemoryError it was made from  */
  PyObject *mempool_type;    /* _memsnap.MemPool heap type               */
  PyObject *pickle_loads;    /* pickle.loads                             */
  PyObject *oom_observers;   /* list of callables                        */
  int oom_attached;          /* C observer registered with the allocator */
  int created;               /* msnap_default() returned an allocator    */
  PyObject *created_by;      /* str: the call that created it, or NULL    */
} msnap_py_state_t;

static inline msnap_py_state_t *msnap_py_state(PyObject *module) {
  return (msnap_py_state_t *)PyModule_GetState(module);
}

/* ---- module.c ----------------------------------------------------------- */
extern struct PyModuleDef msnap_py_moduledef;

/* ---- errors.c ----------------------------------------------------------- */
/* Set the Python exception for a negative MSNAP_E* code and return NULL.
 * The text is msnap_last_error() of this thread when it is non-empty, else
 * msnap_strerror(err); `what` (may be NULL) prefixes it.  EOOM/EREJECTED
 * raise memsnap's OutOfMemoryError (or, once torch is imported, a class
 * deriving from both it and torch.OutOfMemoryError); EBADPTR, EINVAL and
 * ECONF raise ValueError; ENOMEM MemoryError; EIO/ENOSPC OSError; ENOTSUP
 * NotImplementedError; the rest RuntimeError. */
PyObject *msnap_py_raise(PyObject *module, int err, const char *what);
PyObject *msnap_py_raise_path(PyObject *module, int err, const char *path);
/* The result of a call that returns nothing: None when rc >= 0, else
 * msnap_py_raise(module, rc, what). */
static inline PyObject *msnap_py_none_or_raise(PyObject *module, int rc,
                                               const char *what) {
  if (rc < 0)
    return msnap_py_raise(module, rc, what);
  Py_RETURN_NONE;
}
/* The OOM exception type to raise now (borrowed); NULL with an exception
 * set on failure. */
PyObject *msnap_py_oom_type(PyObject *module);
int msnap_py_errors_init(PyObject *module);

/* ---- allocator.c -------------------------------------------------------- */
/* The process-wide allocator (msnap_default()); NULL with an exception set
 * when it cannot be created (bad alloc conf -> ValueError naming the
 * token). */
msnap_allocator_t *msnap_py_allocator(PyObject *module);
/* Declare `a`, that allocator, in a method of `module`; the method returns
 * NULL (the exception set) when there is none. */
#define MSNAP_PY_GET_ALLOC(a)                                                 \
  msnap_allocator_t *a = msnap_py_allocator(module);                          \
  if (a == NULL)                                                              \
  return NULL
extern PyMethodDef msnap_py_allocator_methods[];
/* {"current", "peak", "allocated", "freed"} of one stat (torch's Stat). */
PyObject *msnap_py_stat_dict(const msnap_stat_t *s);
/* Add key -> value to d, stealing value (NULL: an error already set); -1 on
 * error. */
int msnap_py_put(PyObject *d, const char *key, PyObject *value);
int msnap_py_allocator_init(PyObject *module);

/* ---- host.c ------------------------------------------------------------- */
extern PyMethodDef msnap_py_host_methods[];

/* ---- history.c ---------------------------------------------------------- */
extern PyMethodDef msnap_py_history_methods[];
int msnap_py_history_init(PyObject *module);

/* ---- frames.c ----------------------------------------------------------- */
extern PyMethodDef msnap_py_frames_methods[];
/* Install the frame hook once per process. */
int msnap_py_frames_init(PyObject *module);

/* Parse helpers shared by the files (set an exception and return -1).
 * Pointers (u64) and sizes are ints, never bools (TypeError); a negative
 * size is ValueError "Invalid memory size: N; <what> requires a
 * non-negative size."; a stream is a handle in [0, MSNAP_PY_STREAM_LIMIT)
 * (ValueError otherwise): 0 is the default stream, anything else the
 * runtime's stream pointer, and no user-space address of a 64-bit Linux
 * process reaches 2^56 (x86-64 5-level paging; aarch64 uses 2^52). */
#define MSNAP_PY_STREAM_LIMIT (1ULL << 56)
int msnap_py_u64(PyObject *o, uint64_t *out, const char *what);
int msnap_py_size(PyObject *o, uint64_t *out, const char *what);
int msnap_py_stream(PyObject *o, uint64_t *out);
int msnap_py_device(PyObject *o, int *out);
/* (ptr, stream) positional arguments, format `fmt` ("OO:NAME"). */
int msnap_py_ptr_stream(PyObject *args, const char *fmt, uint64_t *ptr,
                        uint64_t *stream);

/*
 * msnap_py_check_device -- raise what torch raises for a device index the
 * allocator does not have and return -1; 0 when valid.  `any_ok`: -1
 * (every device) is accepted.  Allocator-state calls (stats, fraction,
 * pools, snapshot) raise RuntimeError "Invalid device argument N: did you
 * call init?" (torch's assertValidDevice); `ordinal` calls (malloc,
 * mem_get_info: torch switches to the device first) raise RuntimeError
 * "invalid device ordinal".
 */
int msnap_py_check_device(msnap_allocator_t *a, int device, int any_ok,
                          int ordinal);

#endif /* MSNAP_PY_H */
