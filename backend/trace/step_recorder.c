/* The event-loop tracer's step recorder in C: `backend.trace._step_recorder.StepRecorder`.
 *
 * A StepRecorder replaces `asyncio.events.Handle._run` while a loop is traced
 * (backend/trace/recorder.py). It runs the handle, then, for a handle of the traced loop, stores the
 * step's end time and its task's name into the tracer's ring (an `array('q')` of times and a list of
 * items, both preallocated) and counts it, with no Python frame: the loop runs tens of thousands of
 * steps a second, and a Python wrapper's frame per step was most of the tracer's cost (docs/trace.md,
 * "In C, and why not Python").
 *
 * Running the handle: when the wrapped `_run` is asyncio's own, the recorder does what it does,
 * `handle._context.run(handle._callback, *handle._args)`, itself; a callback's exception other than
 * SystemExit and KeyboardInterrupt goes to `report(handle, exc)`, which hands it to the loop's
 * exception handler as `_run` would. Calling `_run` from C instead entered the interpreter once more
 * per step, which cost more than the recording. Any other `_run` (another wrapper) is called as is.
 *
 * It is a method descriptor with vectorcall: `handle._run()` calls it with the handle as its first
 * argument and no bound-method object, as for a Python function. `push()` records any other event
 * into the same ring, so the count and ring positions stay one sequence.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <string.h>
#include <structmember.h>

#if PY_VERSION_HEX >= 0x030D0000 /* 3.13 made the optional-attribute lookup public under this name */
#define _PyObject_LookupAttr PyObject_GetOptionalAttr
#endif
#include <time.h>

#define CHUNK_ITEMS 1024 /* chunk event items kept for reuse (see push_chunk) */
#define PREFETCH_AHEAD 32 /* ring slots fetched ahead of the one written */
#define RECENT_SAMPLES 64 /* recording times kept: the tracer reports their median */

typedef struct {
    PyObject *key;  /* the request key the item was made for (identity), or NULL */
    long index;
    long tokens;
    PyObject *item; /* (CHUNK, 0, key, (index, tokens)) */
} ChunkItem;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    ChunkItem chunk_items[CHUNK_ITEMS];
    PyObject *previous;  /* the Handle._run it wraps */
    PyObject *loop;      /* the traced loop, or None once disabled */
    PyObject *times;     /* array('q'): end time of a step, start time of another event (ns) */
    Py_buffer times_view; /* held while the recorder lives: the array cannot be resized under it */
    PyObject *items;     /* list: a step's task name, or another event's item */
    PyObject *task_type; /* asyncio.Task: a callback whose __self__ is exactly one is a task step */
    PyObject *get_name;  /* task_type.get_name, looked up once */
    PyObject *names;     /* dict: name of a non-task callback, by its function's code */
    PyObject *name_of;   /* callable(callback) -> name, for a callback not in `names` yet */
    PyObject *report;    /* callable(handle, exc): a callback's exception to the loop's handler */
    int direct;          /* `previous` is asyncio's own Handle._run: run handles here */
    PyTypeObject *handle_types[2]; /* asyncio.Handle and TimerHandle: their slots are read in place */
    Py_ssize_t offsets[4];         /* of _context, _callback, _args, _loop in them (0: use getattr) */
    Py_ssize_t capacity;
    long long recorded;    /* events recorded since creation */
    Py_ssize_t slot;       /* the ring slot the next event goes to: recorded % capacity */
    long long samples;     /* steps whose recording was timed */
    long long recent_ns[RECENT_SAMPLES]; /* the last of those times, by samples % RECENT_SAMPLES */
    long long sample_mask; /* time one step in (mask + 1) */
} StepRecorder;

static PyObject *str_loop, *str_callback, *str_self, *str_func, *str_get_name, *str_context, *str_args,
    *str_run;

#define MAX_DIRECT_ARGS 8 /* a callback with more arguments goes through the wrapped _run */

enum { SLOT_CONTEXT, SLOT_CALLBACK, SLOT_ARGS, SLOT_LOOP };

/* A handle's attribute: read from its slot for asyncio's own handle types (a getattr is most of a
 * step's recording cost otherwise), else by name. New reference, or NULL with an exception. */
static inline PyObject *
handle_slot(StepRecorder *self, PyObject *handle, int which, PyObject *name)
{
    PyTypeObject *type = Py_TYPE(handle);
    Py_ssize_t offset = self->offsets[which];
    if (offset > 0 && (type == self->handle_types[0] || type == self->handle_types[1])) {
        PyObject *value = *(PyObject **)((char *)handle + offset);
        if (value != NULL) {
            return Py_NewRef(value);
        }
    }
    return PyObject_GetAttr(handle, name);
}

static inline long long
now_ns(void)
{
    /* time.perf_counter_ns() reads CLOCK_MONOTONIC on Linux: the same clock as the Python side. */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Store (at, item) at the next ring slot; steals `item`. Returns -1 on error. */
static int
store(StepRecorder *self, long long at, PyObject *item)
{
    if (self->times_view.buf == NULL) {
        Py_DECREF(item);
        PyErr_SetString(PyExc_RuntimeError, "StepRecorder is not initialised");
        return -1;
    }
    Py_ssize_t slot = self->slot;
    self->slot = slot + 1 == self->capacity ? 0 : slot + 1;
    PyObject **ring = ((PyListObject *)self->items)->ob_item;
    /* The ring is larger than the caches and each slot's old item was stored long ago: fetch a
     * few slots ahead, so the stores and the old items' reference counts do not wait on memory. */
    Py_ssize_t ahead = slot + PREFETCH_AHEAD < self->capacity ? slot + PREFETCH_AHEAD
                                                              : slot + PREFETCH_AHEAD - self->capacity;
    __builtin_prefetch(&ring[ahead], 1);
    __builtin_prefetch(&((long long *)self->times_view.buf)[ahead], 1);
    PyObject *soon = ring[slot + 8 < self->capacity ? slot + 8 : slot];
    if (soon != NULL) {
        __builtin_prefetch(soon, 1);
    }
    ((long long *)self->times_view.buf)[slot] = at;
    PyObject *old_item = ring[slot];
    ring[slot] = item;
    self->recorded++;
    Py_XDECREF(old_item);
    return 0;
}

/* The object a callback is bound to (new reference), or NULL: read in place for a builtin method
 * (a C task's wake-up) and a bound Python method, by name otherwise (a C task's step wrapper). */
static inline int
callback_self(PyObject *callback, PyObject **owner)
{
    if (PyCFunction_Check(callback)) {
        *owner = Py_XNewRef(PyCFunction_GET_SELF(callback));
        return 0;
    }
    if (PyMethod_Check(callback)) {
        *owner = Py_NewRef(PyMethod_GET_SELF(callback));
        return 0;
    }
    return _PyObject_LookupAttr(callback, str_self, owner);
}

/* The name of what `callback` runs: its task's name for a task step; new reference or NULL. */
static PyObject *
step_name(StepRecorder *self, PyObject *callback)
{
    PyObject *owner;
    if (callback_self(callback, &owner) < 0) {
        return NULL;
    }
    if (owner != NULL) {
        if ((PyObject *)Py_TYPE(owner) == self->task_type) {
            /* The method looked up once: a lookup by name on every step cost more than the call. */
            PyObject *name = PyObject_Vectorcall(self->get_name, &owner, 1, NULL);
            Py_DECREF(owner);
            return name;
        }
        Py_DECREF(owner);
    }
    /* The cache is keyed by the function's code, as trace._other_name keys it: keyed by the callback
     * (or its function), it kept every closure asyncio's gather and wait make per call alive, with
     * all they reach. A callback without Python code is named by `name_of` each time. */
    PyObject *function;
    if (PyMethod_Check(callback)) {
        function = Py_NewRef(PyMethod_GET_FUNCTION(callback));
    }
    else if (PyFunction_Check(callback)) {
        function = Py_NewRef(callback);
    }
    else if (_PyObject_LookupAttr(callback, str_func, &function) < 0) {
        return NULL;
    }
    if (function != NULL && PyFunction_Check(function)) {
        PyObject *name = PyDict_GetItemWithError(self->names, PyFunction_GET_CODE(function));
        Py_DECREF(function);
        if (name != NULL) {
            return Py_NewRef(name);
        }
        if (PyErr_Occurred()) {
            return NULL;
        }
    }
    else {
        Py_XDECREF(function);
    }
    return PyObject_CallOneArg(self->name_of, callback);
}

/* Handle._run's work: call the callback in its context; None, or NULL with SystemExit or
 * KeyboardInterrupt (or a failure of `report`) raised. */
static PyObject *
run_direct(StepRecorder *self, PyObject *handle)
{
    PyObject *context = handle_slot(self, handle, SLOT_CONTEXT, str_context);
    if (context == NULL) {
        return NULL;
    }
    PyObject *callback = handle_slot(self, handle, SLOT_CALLBACK, str_callback);
    if (callback == NULL) {
        Py_DECREF(context);
        return NULL;
    }
    PyObject *args = handle_slot(self, handle, SLOT_ARGS, str_args);
    if (args == NULL || !PyTuple_Check(args) || PyTuple_GET_SIZE(args) > MAX_DIRECT_ARGS) {
        Py_DECREF(context);
        Py_DECREF(callback);
        if (args == NULL) {
            return NULL;
        }
        Py_DECREF(args);
        return PyObject_CallOneArg(self->previous, handle);
    }
    PyObject *stack[2 + MAX_DIRECT_ARGS];
    Py_ssize_t count = PyTuple_GET_SIZE(args);
    stack[0] = context;
    stack[1] = callback;
    for (Py_ssize_t i = 0; i < count; i++) {
        stack[2 + i] = PyTuple_GET_ITEM(args, i);
    }
    PyObject *result;
    if (PyContext_CheckExact(context)) {
        /* What Context.run does, without looking the method up by name on every step. */
        if (PyContext_Enter(context) < 0) {
            result = NULL;
        }
        else {
            result = PyObject_Vectorcall(callback, stack + 2, count, NULL);
            if (PyContext_Exit(context) < 0) {
                Py_CLEAR(result);
            }
        }
    }
    else {
        result = PyObject_VectorcallMethod(str_run, stack, 2 + count, NULL);
    }
    Py_DECREF(context);
    Py_DECREF(callback);
    Py_DECREF(args);
    if (result != NULL) {
        Py_DECREF(result);
        Py_RETURN_NONE;
    }
    if (PyErr_ExceptionMatches(PyExc_SystemExit) || PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) {
        return NULL;
    }
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    if (traceback != NULL && value != NULL) {
        PyException_SetTraceback(value, traceback);
    }
    PyObject *reported = PyObject_CallFunctionObjArgs(self->report, handle, value ? value : Py_None, NULL);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(traceback);
    return reported;
}

static PyObject *
recorder_vectorcall(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    StepRecorder *self = (StepRecorder *)op;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 1 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0)) {
        PyErr_SetString(PyExc_TypeError, "StepRecorder takes one handle");
        return NULL;
    }
    if (self->previous == NULL || self->previous == Py_None) {
        PyErr_SetString(PyExc_RuntimeError, "StepRecorder called before attach()");
        return NULL;
    }
    PyObject *result = self->direct ? run_direct(self, args[0])
                                    : PyObject_Vectorcall(self->previous, args, 1, NULL);
    if (result == NULL || self->loop == Py_None) {
        return result;
    }
    PyObject *handle = args[0];
    PyObject *loop = handle_slot(self, handle, SLOT_LOOP, str_loop);
    if (loop == NULL) {
        PyErr_Clear();
        return result;
    }
    Py_DECREF(loop); /* only compared, and the handle still holds it */
    if (loop != self->loop) {
        return result;
    }
    long long end = now_ns();
    PyObject *callback = handle_slot(self, handle, SLOT_CALLBACK, str_callback);
    PyObject *name = callback == NULL ? NULL : step_name(self, callback);
    Py_XDECREF(callback);
    /* Tracing must never break the loop: a step whose name cannot be read is not recorded. */
    if (name == NULL || store(self, end, name) < 0) {
        PyErr_Clear();
        return result;
    }
    if (!((self->recorded - 1) & self->sample_mask) || self->samples == 0) {
        self->recent_ns[self->samples % RECENT_SAMPLES] = now_ns() - end;
        self->samples++;
    }
    return result;
}

static PyObject *
recorder_push(StepRecorder *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "push(at, item)");
        return NULL;
    }
    long long at = PyLong_AsLongLong(args[0]);
    if (at == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (store(self, at, Py_NewRef(args[1])) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
recorder_push_now(StepRecorder *self, PyObject *item)
{
    if (store(self, now_ns(), Py_NewRef(item)) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

enum { KIND_IDLE = 1, KIND_CHUNK = 3 }; /* backend/trace/recorder.py's IDLE and CHUNK */

static PyObject *
recorder_push_chunk(StepRecorder *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "push_chunk(request_key, index, tokens)");
        return NULL;
    }
    long long at = now_ns();
    /* Chunk items repeat (a request's key, a sample's index, mostly 1 token): one made earlier is
     * stored again instead of two new tuples per chunk, which would be most of the traced
     * backend's allocations and set off garbage collections (about 3 % of its loop). */
    PyObject *key = args[0];
    long index = PyLong_AsLong(args[1]);
    long tokens = index == -1 && PyErr_Occurred() ? -1 : PyLong_AsLong(args[2]);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        index = tokens = -1; /* not small ints: no reuse */
    }
    ChunkItem *cached = NULL;
    if (index >= 0 && tokens >= 0) {
        size_t hash = ((size_t)key >> 4) * 31u + (size_t)index * 131u + (size_t)tokens;
        cached = &self->chunk_items[hash % CHUNK_ITEMS];
        if (cached->item != NULL && cached->key == key && cached->index == index && cached->tokens == tokens) {
            if (store(self, at, Py_NewRef(cached->item)) < 0) {
                return NULL;
            }
            Py_RETURN_NONE;
        }
    }
    PyObject *detail = PyTuple_Pack(2, args[1], args[2]);
    if (detail == NULL) {
        return NULL;
    }
    PyObject *item = Py_BuildValue("(iiON)", KIND_CHUNK, 0, key, detail);
    if (item == NULL) {
        return NULL;
    }
    if (cached != NULL) {
        Py_XSETREF(cached->item, Py_NewRef(item));
        cached->key = key; /* compared by identity only; the item holds a reference to it */
        cached->index = index;
        cached->tokens = tokens;
    }
    if (store(self, at, item) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* TimedSelect: a selector's select() with each wait recorded as an IDLE event (a poll with timeout 0
 * is passed straight through), set on the traced loop's selector by backend/trace/recorder.py. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *select;
    StepRecorder *recorder;
} TimedSelect;

static PyObject *
timed_select_vectorcall(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    TimedSelect *self = (TimedSelect *)op;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0) {
        return PyObject_Vectorcall(self->select, args, nargsf, kwnames);
    }
    PyObject *timeout = nargs > 0 ? args[0] : Py_None;
    if (timeout != Py_None) {
        double value = PyFloat_AsDouble(timeout);
        if (value == -1.0 && PyErr_Occurred()) {
            return NULL;
        }
        if (value == 0.0) { /* a poll between bursts of ready callbacks, not a wait */
            return PyObject_Vectorcall(self->select, args, nargsf, NULL);
        }
    }
    long long start = now_ns();
    PyObject *ready = PyObject_Vectorcall(self->select, args, nargsf, NULL);
    if (ready == NULL) {
        return NULL;
    }
    long long end = now_ns();
    Py_ssize_t count = PyObject_Length(ready);
    if (count < 0) {
        PyErr_Clear();
        count = 0;
    }
    PyObject *item = Py_BuildValue("(iLOn)", KIND_IDLE, end - start, Py_None, count);
    if (item == NULL || store(self->recorder, start, item) < 0) {
        PyErr_Clear(); /* tracing must never break the loop */
    }
    return ready;
}

static int
timed_select_traverse(TimedSelect *self, visitproc visit, void *arg)
{
    Py_VISIT(self->select);
    Py_VISIT(self->recorder);
    return 0;
}

static int
timed_select_clear(TimedSelect *self)
{
    Py_CLEAR(self->select);
    Py_CLEAR(self->recorder);
    return 0;
}

static void
timed_select_dealloc(TimedSelect *self)
{
    PyObject_GC_UnTrack(self);
    timed_select_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject TimedSelectType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "backend.trace._step_recorder.TimedSelect",
    .tp_doc = PyDoc_STR("A selector's select() with each wait recorded by a StepRecorder."),
    .tp_basicsize = sizeof(TimedSelect),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_dealloc = (destructor)timed_select_dealloc,
    .tp_traverse = (traverseproc)timed_select_traverse,
    .tp_clear = (inquiry)timed_select_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(TimedSelect, vectorcall),
};

static PyObject *
recorder_timed_select(StepRecorder *self, PyObject *select)
{
    if (!PyCallable_Check(select)) {
        PyErr_SetString(PyExc_TypeError, "timed_select(select): select must be callable");
        return NULL;
    }
    TimedSelect *timed = PyObject_GC_New(TimedSelect, &TimedSelectType);
    if (timed == NULL) {
        return NULL;
    }
    timed->vectorcall = timed_select_vectorcall;
    timed->select = Py_NewRef(select);
    timed->recorder = (StepRecorder *)Py_NewRef((PyObject *)self);
    PyObject_GC_Track(timed);
    return (PyObject *)timed;
}

static PyObject *
recorder_disable(StepRecorder *self, PyObject *Py_UNUSED(ignored))
{
    Py_SETREF(self->loop, Py_NewRef(Py_None));
    Py_RETURN_NONE;
}

static int
recorder_init(StepRecorder *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"times", "items", "task_type", "names", "name_of", "report", "sample_every",
                               NULL};
    PyObject *times, *items, *task_type, *names, *name_of, *report;
    long long sample_every;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO!OO!OOL", keywords, &times, &PyList_Type, &items,
                                     &task_type, &PyDict_Type, &names, &name_of, &report, &sample_every)) {
        return -1;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(times, &view, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        return -1;
    }
    if (view.itemsize != 8 || view.format == NULL || (strcmp(view.format, "q") && strcmp(view.format, "l")) ||
        view.len / 8 == 0 || view.len / 8 != PyList_GET_SIZE(items)) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError,
                        "times must be an array('q') as long as the items list, and not empty");
        return -1;
    }
    if (sample_every < 1 || (sample_every & (sample_every - 1))) {
        PyErr_SetString(PyExc_ValueError, "sample_every must be a power of two");
        return -1;
    }
    Py_XSETREF(self->previous, Py_NewRef(Py_None));
    Py_XSETREF(self->loop, Py_NewRef(Py_None));
    if (self->times_view.obj != NULL) {
        PyBuffer_Release(&self->times_view);
    }
    self->times_view = view;
    Py_XSETREF(self->times, Py_NewRef(times));
    Py_XSETREF(self->items, Py_NewRef(items));
    PyObject *get_name = PyObject_GetAttr(task_type, str_get_name);
    if (get_name == NULL) {
        return -1;
    }
    Py_XSETREF(self->get_name, get_name);
    Py_XSETREF(self->task_type, Py_NewRef(task_type));
    Py_XSETREF(self->names, Py_NewRef(names));
    Py_XSETREF(self->name_of, Py_NewRef(name_of));
    Py_XSETREF(self->report, Py_NewRef(report));
    self->direct = 0;
    self->capacity = PyList_GET_SIZE(items);
    self->recorded = 0;
    self->slot = 0;
    self->samples = 0;
    self->sample_mask = sample_every - 1;
    return 0;
}

/* Where `name` lives in instances of `base` (and of `other`, which must inherit the same slot); 0 if
 * it is not a plain object slot of both. */
static Py_ssize_t
slot_offset(PyTypeObject *base, PyTypeObject *other, PyObject *name)
{
    PyObject *descr = _PyType_Lookup(base, name);
    if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type) || _PyType_Lookup(other, name) != descr) {
        return 0;
    }
    PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
    if (member->type != T_OBJECT_EX && member->type != T_OBJECT) {
        return 0;
    }
    return member->offset;
}

static PyObject *
recorder_attach(StepRecorder *self, PyObject *const *args, Py_ssize_t nargs)
{
    if ((nargs != 3 && nargs != 5) || !PyCallable_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "attach(previous_run, loop, direct[, handle_type, timer_type])");
        return NULL;
    }
    memset(self->offsets, 0, sizeof self->offsets);
    self->handle_types[0] = self->handle_types[1] = NULL;
    if (nargs == 5) {
        if (!PyType_Check(args[3]) || !PyType_Check(args[4])) {
            PyErr_SetString(PyExc_TypeError, "handle_type and timer_type must be types");
            return NULL;
        }
        PyTypeObject *base = (PyTypeObject *)args[3], *timer = (PyTypeObject *)args[4];
        PyObject *names[4] = {str_context, str_callback, str_args, str_loop};
        for (int i = 0; i < 4; i++) {
            self->offsets[i] = slot_offset(base, timer, names[i]);
        }
        /* The types stay alive as long as asyncio does; not owned here. */
        self->handle_types[0] = base;
        self->handle_types[1] = timer;
    }
    int direct = PyObject_IsTrue(args[2]);
    if (direct < 0) {
        return NULL;
    }
    Py_SETREF(self->previous, Py_NewRef(args[0]));
    Py_SETREF(self->loop, Py_NewRef(args[1]));
    self->direct = direct;
    Py_RETURN_NONE;
}

static PyObject *
recorder_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    StepRecorder *self = (StepRecorder *)type->tp_alloc(type, 0);
    if (self != NULL) {
        self->vectorcall = recorder_vectorcall;
    }
    return (PyObject *)self;
}

static PyObject *
recorder_get(PyObject *self, PyObject *obj, PyObject *type)
{
    /* As a class attribute it behaves like a function: bound to an instance, itself on the class. */
    if (obj == NULL || obj == Py_None) {
        return Py_NewRef(self);
    }
    return PyMethod_New(self, obj);
}

static int
recorder_traverse(StepRecorder *self, visitproc visit, void *arg)
{
    for (int i = 0; i < CHUNK_ITEMS; i++) {
        Py_VISIT(self->chunk_items[i].item);
    }
    Py_VISIT(self->previous);
    Py_VISIT(self->loop);
    Py_VISIT(self->times);
    Py_VISIT(self->items);
    Py_VISIT(self->task_type);
    Py_VISIT(self->get_name);
    Py_VISIT(self->names);
    Py_VISIT(self->name_of);
    Py_VISIT(self->report);
    return 0;
}

static int
recorder_clear(StepRecorder *self)
{
    for (int i = 0; i < CHUNK_ITEMS; i++) {
        Py_CLEAR(self->chunk_items[i].item);
        self->chunk_items[i].key = NULL;
    }
    if (self->times_view.obj != NULL) {
        PyBuffer_Release(&self->times_view);
    }
    Py_CLEAR(self->previous);
    Py_CLEAR(self->loop);
    Py_CLEAR(self->times);
    Py_CLEAR(self->items);
    Py_CLEAR(self->task_type);
    Py_CLEAR(self->get_name);
    Py_CLEAR(self->names);
    Py_CLEAR(self->name_of);
    Py_CLEAR(self->report);
    return 0;
}

static void
recorder_dealloc(StepRecorder *self)
{
    PyObject_GC_UnTrack(self);
    recorder_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
recorder_get_recorded(StepRecorder *self, void *closure)
{
    return PyLong_FromLongLong(self->recorded);
}

static PyObject *
recorder_get_recent_ns(StepRecorder *self, void *closure)
{
    Py_ssize_t count = self->samples < RECENT_SAMPLES ? (Py_ssize_t)self->samples : RECENT_SAMPLES;
    PyObject *list = PyList_New(count);
    for (Py_ssize_t i = 0; list != NULL && i < count; i++) {
        PyObject *value = PyLong_FromLongLong(self->recent_ns[i]);
        if (value == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, i, value);
    }
    return list;
}

static PyObject *
recorder_get_handle_run(StepRecorder *self, void *closure)
{
    return Py_NewRef((PyObject *)self);
}

static PyGetSetDef recorder_getset[] = {
    {"handle_run", (getter)recorder_get_handle_run, NULL,
     "What replaces Handle._run: the recorder itself (a method descriptor).", NULL},
    {"recorded", (getter)recorder_get_recorded, NULL, "Events recorded since creation.", NULL},
    {"recent_ns", (getter)recorder_get_recent_ns, NULL,
     "The last (up to 64) timings of recording a step (one step in 32), ns, in no particular order.", NULL},
    {NULL},
};

static PyMethodDef recorder_methods[] = {
    {"push", (PyCFunction)(void (*)(void))recorder_push, METH_FASTCALL,
     "push(at, item): record an event other than a step, starting at `at` (ns)."},
    {"push_now", (PyCFunction)recorder_push_now, METH_O,
     "push_now(item): record an event other than a step, starting now."},
    {"push_chunk", (PyCFunction)(void (*)(void))recorder_push_chunk, METH_FASTCALL,
     "push_chunk(request_key, index, tokens): record a chunk's arrival, now."},
    {"timed_select", (PyCFunction)recorder_timed_select, METH_O,
     "timed_select(select): `select` with each wait (timeout other than 0) recorded as an idle event."},
    {"attach", (PyCFunction)(void (*)(void))recorder_attach, METH_FASTCALL,
     "attach(previous_run, loop, direct[, handle_type, timer_type]): wrap `previous_run` (run handles "
     "in C if `direct`, when it is asyncio's own) and record the steps of `loop`; handles of exactly "
     "the given types have their slots read in place."},
    {"disable", (PyCFunction)recorder_disable, METH_NOARGS,
     "Stop recording: every handle goes straight to the wrapped _run."},
    {NULL},
};

static PyTypeObject StepRecorderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "backend.trace._step_recorder.StepRecorder",
    .tp_doc = PyDoc_STR("A Handle._run that records the traced loop's steps into the tracer's ring."),
    .tp_basicsize = sizeof(StepRecorder),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
                Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_new = recorder_new,
    .tp_init = (initproc)recorder_init,
    .tp_dealloc = (destructor)recorder_dealloc,
    .tp_traverse = (traverseproc)recorder_traverse,
    .tp_clear = (inquiry)recorder_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(StepRecorder, vectorcall),
    .tp_descr_get = recorder_get,
    .tp_methods = recorder_methods,
    .tp_getset = recorder_getset,
};

static PyObject *
clock_ns(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromLongLong(now_ns());
}

static PyMethodDef module_methods[] = {
    {"clock_ns", clock_ns, METH_NOARGS, "The recorder's clock (time.perf_counter_ns's), in ns."},
    {NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "backend.trace._step_recorder",
    .m_doc = "The event-loop tracer's step recorder in C (source: backend/trace/step_recorder.c).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__step_recorder(void)
{
    if (PyType_Ready(&StepRecorderType) < 0 || PyType_Ready(&TimedSelectType) < 0) {
        return NULL;
    }
    str_loop = PyUnicode_InternFromString("_loop");
    str_callback = PyUnicode_InternFromString("_callback");
    str_self = PyUnicode_InternFromString("__self__");
    str_func = PyUnicode_InternFromString("__func__");
    str_get_name = PyUnicode_InternFromString("get_name");
    str_context = PyUnicode_InternFromString("_context");
    str_args = PyUnicode_InternFromString("_args");
    str_run = PyUnicode_InternFromString("run");
    if (!str_loop || !str_callback || !str_self || !str_func || !str_get_name || !str_context || !str_args ||
        !str_run) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(module, "StepRecorder", (PyObject *)&StepRecorderType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
