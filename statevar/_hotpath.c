/* statevar._hotpath: the eager updates' hot path (assign, assign_add, assign_sub) in C.
 *
 * An `Update` does what the pure-Python update of `statevar._variable.python_update` does on
 * its hot path, with the same checks, under the same lock, and otherwise calls that Python
 * update, which handles every other case. In C an update adds about half the work the
 * Python one adds to JAX's own call (benchmarks/README.md), and it needs no trick to be
 * atomic with respect to signals: Python runs signal handlers only between bytecodes, and
 * none run between the donating call's return and the store of its result.
 *
 * `Lock` is statevar's update lock (`_state.update_lock`): a reentrant lock that the
 * updates here take without a Python call.
 *
 * The module relies on the GIL (the lock's owner and count, the configuration): built for
 * a free-threaded Python, importing it turns the GIL back on, as CPython does for any
 * extension that does not declare otherwise.
 *
 * Built as an optional extension: where it cannot be compiled, statevar uses the Python
 * update, which gives the same results.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>

/* Set once by `configure`, from statevar._state: the update lock (a `Lock`, taken without a
 * Python call, or any object with acquire and release methods), the one-item `donating`
 * list and the module itself (for `hot_epoch`); and the type of a concrete array
 * (`set_array_type`: recorded when a hot path first opens, so that importing statevar
 * starts no JAX backend). */
static PyObject *update_lock, *donating_flag, *state_module, *array_type;
/* Names, interned once. */
static PyObject *str_acquire, *str_release, *str_value, *str_aval, *str_committed, *str_hot_avals, *str_hot_epoch,
    *str_variable_epoch, *str_donating, *str_copying, *str_failed_update, *str_refuse_traced,
    *str_doc, *str_name, *str_qualname, *str_module;

/* ------------------------------------------------------------------ the update lock */

/* A reentrant lock, as threading.RLock (without timeouts): statevar's update lock
 * (`_state.update_lock`). Its acquire and release take no arguments to parse, and the
 * updates here take it without a Python call. The GIL guards `owner` and `count`. */
typedef struct {
    PyObject_HEAD
    PyThread_type_lock lock;
    unsigned long owner; /* the thread holding it, while count > 0 */
    unsigned long count;
} Lock;

static PyTypeObject LockType;

/* 0 once acquired, -1 with an exception set if a signal handler raised while waiting
 * (nothing acquired then), as threading.RLock's acquire. */
static int
lock_enter(Lock *lock)
{
    unsigned long me = PyThread_get_thread_ident();
    if (lock->count > 0 && lock->owner == me) {
        lock->count++;
        return 0;
    }
    if (!PyThread_acquire_lock(lock->lock, NOWAIT_LOCK)) {
        PyLockStatus status;
        do {
            Py_BEGIN_ALLOW_THREADS
            status = PyThread_acquire_lock_timed(lock->lock, -1, 1);
            Py_END_ALLOW_THREADS
            if (status == PY_LOCK_INTR && Py_MakePendingCalls() < 0) {
                return -1;
            }
        } while (status != PY_LOCK_ACQUIRED);
    }
    lock->owner = me;
    lock->count = 1;
    return 0;
}

static int
lock_exit(Lock *lock)
{
    if (lock->count == 0 || lock->owner != PyThread_get_thread_ident()) {
        PyErr_SetString(PyExc_RuntimeError, "cannot release un-acquired lock");
        return -1;
    }
    if (--lock->count == 0) {
        lock->owner = 0;
        PyThread_release_lock(lock->lock);
    }
    return 0;
}

static PyObject *
lock_acquire_method(Lock *lock, PyObject *unused)
{
    if (lock_enter(lock) < 0) {
        return NULL;
    }
    Py_RETURN_TRUE;
}

static PyObject *
lock_release_method(Lock *lock, PyObject *unused)
{
    if (lock_exit(lock) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
lock_exit_method(Lock *lock, PyObject *const *args, Py_ssize_t nargs)
{
    return lock_release_method(lock, NULL);
}

static PyObject *
lock_is_owned(Lock *lock, PyObject *unused)
{
    return PyBool_FromLong(lock->count > 0 && lock->owner == PyThread_get_thread_ident());
}

/* In a child process after os.fork: a fresh lock, free unless the thread that forked held
 * it (that thread goes on in the child, and releases it as often as it acquired it); every
 * other thread is gone. The old one is not freed: another thread may have held it. */
static PyObject *
lock_at_fork_reinit(Lock *lock, PyObject *unused)
{
    PyThread_type_lock fresh = PyThread_allocate_lock();
    if (fresh == NULL) {
        return PyErr_NoMemory();
    }
    lock->lock = fresh;
    if (lock->count > 0 && lock->owner == PyThread_get_thread_ident()) {
        PyThread_acquire_lock(fresh, NOWAIT_LOCK);
    }
    else {
        lock->owner = 0;
        lock->count = 0;
    }
    Py_RETURN_NONE;
}

static PyObject *
lock_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    if (PyTuple_GET_SIZE(args) > 0 || (kwargs != NULL && PyDict_GET_SIZE(kwargs) > 0)) {
        PyErr_SetString(PyExc_TypeError, "Lock() takes no arguments");
        return NULL;
    }
    Lock *lock = (Lock *)type->tp_alloc(type, 0);
    if (lock == NULL) {
        return NULL;
    }
    lock->lock = PyThread_allocate_lock();
    if (lock->lock == NULL) {
        Py_DECREF(lock);
        return PyErr_NoMemory();
    }
    return (PyObject *)lock;
}

static void
lock_dealloc(Lock *lock)
{
    if (lock->lock != NULL) {
        if (lock->count > 0) {
            PyThread_release_lock(lock->lock);
        }
        PyThread_free_lock(lock->lock);
    }
    Py_TYPE(lock)->tp_free((PyObject *)lock);
}

static PyObject *
lock_repr(Lock *lock)
{
    return PyUnicode_FromFormat("<statevar._hotpath.Lock %s count=%lu>",
                                lock->count > 0 ? "locked" : "unlocked", lock->count);
}

static PyMethodDef lock_methods[] = {
    {"acquire", (PyCFunction)lock_acquire_method, METH_NOARGS,
     "Acquires the lock, waiting for another thread to release it; returns True."},
    {"release", (PyCFunction)lock_release_method, METH_NOARGS,
     "Releases the lock once; raises RuntimeError if this thread does not hold it."},
    {"__enter__", (PyCFunction)lock_acquire_method, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))lock_exit_method, METH_FASTCALL, NULL},
    {"_is_owned", (PyCFunction)lock_is_owned, METH_NOARGS,
     "Whether the calling thread holds the lock."},
    {"_at_fork_reinit", (PyCFunction)lock_at_fork_reinit, METH_NOARGS,
     "Makes the lock fresh, in a child process after os.fork: free unless the calling "
     "(forking) thread held it."},
    {NULL},
};

static PyTypeObject LockType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "statevar._hotpath.Lock",
    .tp_doc = "A reentrant lock, as threading.RLock without timeouts: statevar's update lock.",
    .tp_basicsize = sizeof(Lock),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = lock_new,
    .tp_dealloc = (destructor)lock_dealloc,
    .tp_repr = (reprfunc)lock_repr,
    .tp_methods = lock_methods,
};

/* What `configure` set, held by one update from start to end: a later `configure` (tests
 * call it) must not make it release another lock or clear another flag than it took. */
typedef struct {
    PyObject *lock, *flag;
} Configuration;

/* Calls the lock's acquire or release: a `Lock`'s directly. 0, or -1 with an exception. */
static int
call_lock(PyObject *lock, int acquire)
{
    if (Py_IS_TYPE(lock, &LockType)) {
        return acquire ? lock_enter((Lock *)lock) : lock_exit((Lock *)lock);
    }
    PyObject *done = PyObject_CallMethodNoArgs(lock, acquire ? str_acquire : str_release);
    Py_XDECREF(done);
    return done == NULL ? -1 : 0;
}

/* Takes the configured update lock: 0, or -1 with an exception set (nothing held then). */
static int
take_update_lock(Configuration *held)
{
    held->lock = Py_NewRef(update_lock);
    held->flag = Py_NewRef(donating_flag);
    if (call_lock(held->lock, 1) < 0) {
        Py_DECREF(held->lock);
        Py_DECREF(held->flag);
        return -1;
    }
    return 0;
}

/* Drops what `take_update_lock` took: 0, or -1 with an exception set. */
static int
drop_update_lock(Configuration *held)
{
    int dropped = call_lock(held->lock, 0);
    Py_DECREF(held->lock);
    Py_DECREF(held->flag);
    return dropped;
}

/* ------------------------------------------------------------------ the updates */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    Py_ssize_t slot;     /* the update's place in a variable's `_hot_avals` */
    PyObject *operation; /* the `statevar._update.Operation` */
    PyObject *donating;  /* its jitted update donating the old array */
    PyObject *copying;   /* its jitted update without donation */
    PyObject *python;    /* the pure-Python update, for everything off the hot path */
} Update;

/* Whether `value` can take the hot path of update `slot` on `variable`: the conditions of
 * the Python update's hot path, read under the update lock. 1 yes, 0 no, -1 an error. */
static int
takes_hot_path(PyObject *variable, PyObject *value, Py_ssize_t slot, PyObject *flag)
{
    if (array_type == NULL || Py_TYPE(value) != (PyTypeObject *)array_type) {
        return 0;
    }
    /* Not in a signal handler that interrupted a donation (see `_state.donating`). */
    if (PyList_GET_ITEM(flag, 0) != Py_False) {
        return 0;
    }
    int hot = -1;
    PyObject *avals = NULL, *aval = NULL, *committed = NULL, *epoch = NULL, *open = NULL;
    if ((avals = PyObject_GetAttr(variable, str_hot_avals)) == NULL) {
        goto done;
    }
    if ((aval = PyObject_GetAttr(value, str_aval)) == NULL) {
        goto done;
    }
    /* JAX interns abstract values: equal ones are one object. */
    if (!PyList_CheckExact(avals) || PyList_GET_SIZE(avals) <= slot ||
        PyList_GET_ITEM(avals, slot) != aval) {
        hot = 0;
        goto done;
    }
    if ((committed = PyObject_GetAttr(value, str_committed)) == NULL) {
        goto done;
    }
    if (committed != Py_False) {
        hot = 0;
        goto done;
    }
    /* Not a new compile epoch, no trace frame open, placements not logged. */
    if ((epoch = PyObject_GetAttr(variable, str_variable_epoch)) == NULL) {
        goto done;
    }
    if ((open = PyObject_GetAttr(state_module, str_hot_epoch)) == NULL) {
        goto done;
    }
    hot = PyObject_RichCompareBool(epoch, open, Py_EQ);
done:
    Py_XDECREF(avals);
    Py_XDECREF(aval);
    Py_XDECREF(committed);
    Py_XDECREF(epoch);
    Py_XDECREF(open);
    return hot;
}

static void
set_donating(PyObject *flag_list, PyObject *flag)
{
    PyObject *previous = PyList_GET_ITEM(flag_list, 0);
    Py_INCREF(flag);
    PyList_SET_ITEM(flag_list, 0, flag);
    Py_DECREF(previous);
}

/* Calls the variable's `_failed_update` for the kernel's `RuntimeError` or `ValueError`
 * (set). What it raises gets that error as its context, as Python chains an exception
 * raised in the Python update's ``except`` block. */
static PyObject *
handle_failure(Update *update, PyObject *variable, PyObject *value, PyObject *old)
{
    PyObject *type, *error, *traceback;
    PyErr_Fetch(&type, &error, &traceback);
    PyErr_NormalizeException(&type, &error, &traceback);
    if (traceback != NULL) {
        PyException_SetTraceback(error, traceback);
    }
    Py_XDECREF(type);
    Py_XDECREF(traceback);
    PyObject *result = PyObject_CallMethodObjArgs(
        variable, str_failed_update, update->operation, value, old, error, NULL);
    if (result == NULL) {
        PyObject *raised_type, *raised, *raised_traceback;
        PyErr_Fetch(&raised_type, &raised, &raised_traceback);
        PyErr_NormalizeException(&raised_type, &raised, &raised_traceback);
        if (raised != error && PyExceptionInstance_Check(raised)) {
            PyObject *context = PyException_GetContext(raised);
            if (context == NULL) {
                PyException_SetContext(raised, Py_NewRef(error));
            }
            Py_XDECREF(context);
        }
        PyErr_Restore(raised_type, raised, raised_traceback);
    }
    Py_DECREF(error);
    return result;
}

/* The references to a variable's array when nothing else holds it: the variable's own
 * (its `_value` attribute) and the one `update_call` took to read it. */
#define SOLE_HOLDERS 2

/* The hot path, with the update lock held: donates the old array when nothing but the
 * variable holds it, else copies it, and stores the result. A new reference to the
 * variable, or NULL with an exception set. */
static PyObject *
run_hot(Update *update, PyObject *variable, PyObject *value, PyObject *old, PyObject *flag)
{
    /* Set before the reference count is read, cleared once the result is stored or the
     * failure handled: a signal handler running in JAX's Python code (or in
     * `_failed_update`) meanwhile reads a copy, and its updates are refused (see
     * `_state.donating`). */
    set_donating(flag, Py_True);
    PyObject *kernel = Py_REFCNT(old) > SOLE_HOLDERS ? update->copying : update->donating;
    PyObject *args[2] = {old, value};
    PyObject *new = PyObject_Vectorcall(kernel, args, 2, NULL);
    PyObject *result = NULL;
    if (new == NULL) {
        if (PyErr_ExceptionMatches(PyExc_RuntimeError) ||
            PyErr_ExceptionMatches(PyExc_ValueError)) {
            result = handle_failure(update, variable, value, old);
        }
    }
    else if (Py_TYPE(new) != (PyTypeObject *)array_type) {
        /* An outer jax.jit traced the update (nothing was donated): the tracer is never
         * stored, and `_refuse_traced` raises (with the flag cleared, as the Python update
         * raises after its ``finally``). */
        Py_DECREF(new);
        set_donating(flag, Py_False);
        PyObject *none = PyObject_CallMethodObjArgs(
            variable, str_refuse_traced, update->operation, NULL);
        if (none == NULL) {
            return NULL;
        }
        Py_DECREF(none);
        return Py_NewRef(variable);
    }
    else {
        int stored = PyObject_SetAttr(variable, str_value, new);
        Py_DECREF(new);
        result = stored < 0 ? NULL : Py_NewRef(variable);
    }
    set_donating(flag, Py_False);
    return result;
}

static PyObject *
update_call(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Update *update = (Update *)callable;
    if (PyVectorcall_NARGS(nargsf) != 2 || kwnames != NULL || update_lock == NULL) {
        /* Keywords or a wrong count: the Python update's own signature handles them. */
        return PyObject_Vectorcall(update->python, args, nargsf, kwnames);
    }
    PyObject *variable = args[0], *value = args[1];
    Configuration held;
    if (take_update_lock(&held) < 0) {
        return NULL; /* interrupted while waiting: nothing acquired */
    }
    PyObject *result = NULL;
    int hot = takes_hot_path(variable, value, update->slot, held.flag);
    if (hot > 0) {
        PyObject *old = PyObject_GetAttr(variable, str_value);
        if (old != NULL) {
            result = run_hot(update, variable, value, old, held.flag);
            Py_DECREF(old);
        }
    }
    else if (hot == 0) {
        /* Everything else, still holding the (reentrant) lock. */
        result = PyObject_Vectorcall(update->python, args, 2, NULL);
    }
    PyObject *type, *error, *traceback;
    PyErr_Fetch(&type, &error, &traceback);
    if (drop_update_lock(&held) < 0) {
        Py_XDECREF(result);
        Py_XDECREF(type);
        Py_XDECREF(error);
        Py_XDECREF(traceback);
        return NULL;
    }
    PyErr_Restore(type, error, traceback);
    return result;
}

static PyObject *
update_get(PyObject *self, PyObject *instance, PyObject *owner)
{
    if (instance == NULL || instance == Py_None) {
        Py_INCREF(self);
        return self;
    }
    return PyMethod_New(self, instance);
}

static PyObject *
update_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"operation", "slot", "python", NULL};
    PyObject *operation, *python;
    Py_ssize_t slot;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OnO:Update", keywords, &operation, &slot,
                                     &python)) {
        return NULL;
    }
    if (slot < 0) {
        PyErr_Format(PyExc_ValueError, "Update: slot must be >= 0, got %zd", slot);
        return NULL;
    }
    PyObject *donating = PyObject_GetAttr(operation, str_donating);
    if (donating == NULL) {
        return NULL;
    }
    PyObject *copying = PyObject_GetAttr(operation, str_copying);
    if (copying == NULL) {
        Py_DECREF(donating);
        return NULL;
    }
    Update *update = (Update *)type->tp_alloc(type, 0);
    if (update == NULL) {
        Py_DECREF(donating);
        Py_DECREF(copying);
        return NULL;
    }
    update->vectorcall = update_call;
    update->slot = slot;
    Py_INCREF(operation);
    update->operation = operation;
    update->donating = donating;
    update->copying = copying;
    Py_INCREF(python);
    update->python = python;
    return (PyObject *)update;
}

static int
update_traverse(Update *update, visitproc visit, void *arg)
{
    Py_VISIT(update->operation);
    Py_VISIT(update->donating);
    Py_VISIT(update->copying);
    Py_VISIT(update->python);
    return 0;
}

static int
update_clear(Update *update)
{
    Py_CLEAR(update->operation);
    Py_CLEAR(update->donating);
    Py_CLEAR(update->copying);
    Py_CLEAR(update->python);
    return 0;
}

static void
update_dealloc(Update *update)
{
    PyObject_GC_UnTrack(update);
    update_clear(update);
    Py_TYPE(update)->tp_free((PyObject *)update);
}

/* What introspection asks of a method (help(), inspect.signature, documentation tools)
 * comes from the Python update. */
static PyObject *
forwarded(Update *update, void *name)
{
    return PyObject_GetAttr(update->python, *(PyObject **)name);
}

static PyObject *
update_wrapped(Update *update, void *unused)
{
    Py_INCREF(update->python);
    return update->python;
}

static PyGetSetDef update_getset[] = {
    {"__doc__", (getter)forwarded, NULL, NULL, &str_doc},
    {"__name__", (getter)forwarded, NULL, NULL, &str_name},
    {"__qualname__", (getter)forwarded, NULL, NULL, &str_qualname},
    {"__module__", (getter)forwarded, NULL, NULL, &str_module},
    {"__wrapped__", (getter)update_wrapped, NULL, "The pure-Python update.", NULL},
    {NULL},
};

static PyTypeObject UpdateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "statevar._hotpath.Update",
    .tp_doc = "An eager update method whose hot path runs in C; see statevar._hotpath.",
    .tp_basicsize = sizeof(Update),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_METHOD_DESCRIPTOR |
                Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(Update, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_descr_get = update_get,
    .tp_new = update_new,
    .tp_traverse = (traverseproc)update_traverse,
    .tp_clear = (inquiry)update_clear,
    .tp_dealloc = (destructor)update_dealloc,
    .tp_getset = update_getset,
};

static PyObject *
configure(PyObject *module, PyObject *args)
{
    PyObject *lock, *flag, *state;
    if (!PyArg_ParseTuple(args, "OO!O:configure", &lock, &PyList_Type, &flag, &state)) {
        return NULL;
    }
    if (PyList_GET_SIZE(flag) != 1) {
        PyErr_SetString(PyExc_ValueError, "configure: the donating flag is a one-item list");
        return NULL;
    }
    Py_INCREF(lock);
    Py_XSETREF(update_lock, lock);
    Py_INCREF(flag);
    Py_XSETREF(donating_flag, flag);
    Py_INCREF(state);
    Py_XSETREF(state_module, state);
    Py_RETURN_NONE;
}

static PyObject *
set_array_type(PyObject *module, PyObject *type)
{
    if (!PyType_Check(type)) {
        PyErr_Format(PyExc_TypeError, "set_array_type: expected a type, got %R", type);
        return NULL;
    }
    Py_INCREF(type);
    Py_XSETREF(array_type, type);
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(lock, donating, state): the update lock, the donating flag and the module "
     "holding hot_epoch (statevar._state)."},
    {"set_array_type", set_array_type, METH_O,
     "set_array_type(type): the type of a concrete array, which the hot path takes."},
    {NULL},
};

static struct PyModuleDef module_definition = {
    PyModuleDef_HEAD_INIT,
    .m_name = "statevar._hotpath",
    .m_doc = "The eager updates' hot path in C; see statevar._variable.",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__hotpath(void)
{
    struct {
        PyObject **target;
        const char *text;
    } names[] = {
        {&str_acquire, "acquire"},
        {&str_release, "release"},
        {&str_value, "_value"},
        {&str_aval, "aval"},
        {&str_committed, "_committed"},
        {&str_hot_avals, "_hot_avals"},
        {&str_hot_epoch, "hot_epoch"},
        {&str_variable_epoch, "_hot_epoch"},
        {&str_donating, "donating"},
        {&str_copying, "copying"},
        {&str_failed_update, "_failed_update"},
        {&str_refuse_traced, "_refuse_traced"},
        {&str_doc, "__doc__"},
        {&str_name, "__name__"},
        {&str_qualname, "__qualname__"},
        {&str_module, "__module__"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if ((*names[i].target = PyUnicode_InternFromString(names[i].text)) == NULL) {
            return NULL;
        }
    }
    if (PyType_Ready(&UpdateType) < 0 || PyType_Ready(&LockType) < 0) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&module_definition);
    if (module == NULL) {
        return NULL;
    }
    Py_INCREF(&UpdateType);
    if (PyModule_AddObject(module, "Update", (PyObject *)&UpdateType) < 0) {
        Py_DECREF(&UpdateType);
        Py_DECREF(module);
        return NULL;
    }
    Py_INCREF(&LockType);
    if (PyModule_AddObject(module, "Lock", (PyObject *)&LockType) < 0) {
        Py_DECREF(&LockType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
