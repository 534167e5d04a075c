/* The live trace's digest in C: `backend.trace._trace_digest.digest`.
 *
 * One pass over the tracer's new ring entries for `digest_ring` in backend/trace/frames.py (which
 * documents what it computes), filling its TraceDigest. It runs for every event the loop records
 * (tens of thousands a second), where a Python pass cost about a microsecond an event: here the
 * running figures of open slices, chunk runs and time buckets are kept in C and written into their
 * Python lists once, when they close, instead of making new int objects for every step.
 *
 * Event kinds and item shapes are backend/trace/recorder.py's: a str item is a step of that task
 * ending at its time; a tuple (kind, duration, subject, detail) is any other event starting at its
 * time.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

enum { STEP = 0, IDLE = 1, LAG = 2, CHUNK = 3, FRAME = 4, CANCEL = 5 };

#define SEEN 1024 /* identity cache entries (a power of two), see Digest */

typedef struct {
    long long start, end, busy, count, longest;
    PyObject *slice; /* its list [start, end, busy, index, count, longest], or NULL when none is open */
} OpenSlice;

typedef struct {
    long long at, tokens, count;
    PyObject *entry; /* its list [at, request_id, index, tokens, count] */
} OpenChunk;

typedef struct {
    PyObject *owner;   /* the connection label */
    PyObject *buckets; /* its dict bucket -> [busy, steps] (in buckets_by_owner) */
    long long bucket, busy, steps;
    int loaded;
} Owner;

typedef struct {
    long long bucket, busy, steps, longest, runner_up;
    Py_ssize_t owner; /* index into owners, of the longest step's owner */
    int loaded;
} Bucket;

typedef struct {
    /* settings */
    long long merge_gap, chunk_bin, other_bucket, min_idle;
    PyObject *to_ms;    /* callable(ns) -> round(ns / 1e6, 3), Python's rounding */
    PyObject *classify; /* callable(name) -> (group, owner or None) */
    /* the TraceDigest's containers */
    PyObject *names, *names_by_owner, *slices_by_owner, *owned_buckets, *buckets_by_owner, *chunks,
        *idle, *lag, *frames, *cancels;
    /* lookups */
    PyObject *name_index, *group_index, *owner_index, *open_chunk;
    /* per group (index into names) */
    OpenSlice *slices;
    Py_ssize_t *group_owner; /* index into owners, or -1 for a task of no connection */
    Py_ssize_t groups, groups_cap;
    Owner *owners;
    Py_ssize_t owner_count, owners_cap;
    OpenChunk *chunk_runs;
    Py_ssize_t chunk_count, chunks_cap;
    Bucket bucket;
    /* By object identity, before the dict lookups: a task's steps all carry its one name object,
     * and the step recorder stores one chunk item per request, sample and token count, so nearly
     * every event is found here without hashing a tuple or comparing a string. Borrowed: the ring's
     * items list holds them for the whole call. */
    PyObject *seen_names[SEEN];
    Py_ssize_t seen_groups[SEEN];
    PyObject *seen_chunks[SEEN];
    Py_ssize_t seen_runs[SEEN];
} Digest;

static inline size_t
seen_slot(PyObject *object)
{
    return ((size_t)object >> 4) & (SEEN - 1);
}

static void *
grow(void *array, Py_ssize_t *cap, Py_ssize_t need, size_t item)
{
    if (need <= *cap) {
        return array;
    }
    Py_ssize_t cap2 = *cap ? *cap * 2 : 16;
    while (cap2 < need) {
        cap2 *= 2;
    }
    void *bigger = PyMem_Realloc(array, (size_t)cap2 * item);
    if (bigger == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    memset((char *)bigger + (size_t)*cap * item, 0, (size_t)(cap2 - *cap) * item);
    *cap = cap2;
    return bigger;
}

/* list[i] = value (a new int); -1 on error */
static int
set_ll(PyObject *list, Py_ssize_t i, long long value)
{
    PyObject *number = PyLong_FromLongLong(value);
    if (number == NULL) {
        return -1;
    }
    return PyList_SetItem(list, i, number);
}

static PyObject *
list_of_ll(int count, const long long *values)
{
    PyObject *list = PyList_New(count);
    if (list == NULL) {
        return NULL;
    }
    for (int i = 0; i < count; i++) {
        PyObject *number = PyLong_FromLongLong(values[i]);
        if (number == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, number);
    }
    return list;
}

/* dict.setdefault(key, []) -> borrowed list */
static PyObject *
list_in(PyObject *dict, PyObject *key)
{
    PyObject *list = PyDict_GetItemWithError(dict, key);
    if (list != NULL || PyErr_Occurred()) {
        return list;
    }
    list = PyList_New(0);
    if (list == NULL) {
        return NULL;
    }
    int failed = PyDict_SetItem(dict, key, list);
    Py_DECREF(list);
    return failed ? NULL : list;
}

static long long
item_ll(PyObject *list, Py_ssize_t i)
{
    return PyLong_AsLongLong(PyList_GET_ITEM(list, i));
}

static int
close_slice(OpenSlice *s)
{
    if (s->slice == NULL) {
        return 0;
    }
    int failed = set_ll(s->slice, 1, s->end) || set_ll(s->slice, 2, s->busy) ||
                 set_ll(s->slice, 4, s->count) || set_ll(s->slice, 5, s->longest);
    Py_CLEAR(s->slice);
    return failed ? -1 : 0;
}

static int
close_chunk(OpenChunk *c)
{
    if (c->entry == NULL) {
        return 0;
    }
    int failed = set_ll(c->entry, 3, c->tokens) || set_ll(c->entry, 4, c->count);
    Py_CLEAR(c->entry);
    return failed ? -1 : 0;
}

/* Write the cached bucket of all connections' work back into owned_buckets. */
static int
store_bucket(Digest *d)
{
    Bucket *b = &d->bucket;
    if (!b->loaded) {
        return 0;
    }
    b->loaded = 0;
    PyObject *key = PyLong_FromLongLong(b->bucket);
    if (key == NULL) {
        return -1;
    }
    long long values[5] = {b->busy, b->steps, b->longest, 0, b->runner_up};
    PyObject *list = list_of_ll(5, values);
    if (list == NULL) {
        Py_DECREF(key);
        return -1;
    }
    PyList_SetItem(list, 3, Py_NewRef(d->owners[b->owner].owner));
    int failed = PyDict_SetItem(d->owned_buckets, key, list);
    Py_DECREF(key);
    Py_DECREF(list);
    return failed ? -1 : 0;
}

/* Make `bucket` the cached one: 1 if it is new, 0 if its figures were loaded, -1 on error. */
static int
load_bucket(Digest *d, long long bucket)
{
    if (store_bucket(d) < 0) {
        return -1;
    }
    Bucket *b = &d->bucket;
    b->bucket = bucket;
    b->loaded = 1;
    PyObject *key = PyLong_FromLongLong(bucket);
    if (key == NULL) {
        return -1;
    }
    PyObject *known = PyDict_GetItemWithError(d->owned_buckets, key);
    Py_DECREF(key);
    if (known == NULL) {
        return PyErr_Occurred() ? -1 : 1;
    }
    b->busy = item_ll(known, 0);
    b->steps = item_ll(known, 1);
    b->longest = item_ll(known, 2);
    b->runner_up = item_ll(known, 4);
    PyObject *index = PyDict_GetItemWithError(d->owner_index, PyList_GET_ITEM(known, 3));
    if (index == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_RuntimeError, "unknown owner in a bucket");
        }
        return -1;
    }
    b->owner = PyLong_AsSsize_t(index);
    return 0;
}

static int
store_owner_bucket(Owner *o)
{
    if (!o->loaded) {
        return 0;
    }
    o->loaded = 0;
    PyObject *key = PyLong_FromLongLong(o->bucket);
    if (key == NULL) {
        return -1;
    }
    long long values[2] = {o->busy, o->steps};
    PyObject *list = list_of_ll(2, values);
    int failed = list == NULL || PyDict_SetItem(o->buckets, key, list);
    Py_DECREF(key);
    Py_XDECREF(list);
    return failed ? -1 : 0;
}

static int
load_owner_bucket(Owner *o, long long bucket)
{
    if (store_owner_bucket(o) < 0) {
        return -1;
    }
    o->bucket = bucket;
    o->loaded = 1;
    o->busy = o->steps = 0;
    PyObject *key = PyLong_FromLongLong(bucket);
    if (key == NULL) {
        return -1;
    }
    PyObject *known = PyDict_GetItemWithError(o->buckets, key);
    Py_DECREF(key);
    if (known != NULL) {
        o->busy = item_ll(known, 0);
        o->steps = item_ll(known, 1);
    }
    return PyErr_Occurred() ? -1 : 0;
}

/* The group index of a task name, classifying a name seen for the first time; -1 on error. */
static Py_ssize_t group_of_name(Digest *d, PyObject *name);

static Py_ssize_t
group_of(Digest *d, PyObject *name)
{
    size_t slot = seen_slot(name);
    if (d->seen_names[slot] == name) {
        return d->seen_groups[slot];
    }
    Py_ssize_t group = group_of_name(d, name);
    if (group >= 0) {
        d->seen_names[slot] = name;
        d->seen_groups[slot] = group;
    }
    return group;
}

static Py_ssize_t
group_of_name(Digest *d, PyObject *name)
{
    PyObject *known = PyDict_GetItemWithError(d->name_index, name);
    if (known != NULL) {
        return PyLong_AsSsize_t(known);
    }
    if (PyErr_Occurred()) {
        return -1;
    }
    PyObject *pair = PyObject_CallOneArg(d->classify, name);
    if (pair == NULL) {
        return -1;
    }
    if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
        Py_DECREF(pair);
        PyErr_SetString(PyExc_TypeError, "classify must return (group, owner)");
        return -1;
    }
    PyObject *group = PyTuple_GET_ITEM(pair, 0), *owner = PyTuple_GET_ITEM(pair, 1);
    Py_ssize_t index;
    PyObject *group_known = PyDict_GetItemWithError(d->group_index, group);
    if (group_known != NULL) {
        index = PyLong_AsSsize_t(group_known);
    }
    else if (PyErr_Occurred()) {
        goto fail;
    }
    else {
        index = PyList_GET_SIZE(d->names);
        Py_ssize_t owner_at = -1;
        if (owner != Py_None) {
            PyObject *owner_known = PyDict_GetItemWithError(d->owner_index, owner);
            if (owner_known != NULL) {
                owner_at = PyLong_AsSsize_t(owner_known);
            }
            else if (PyErr_Occurred()) {
                goto fail;
            }
            else {
                owner_at = d->owner_count;
                d->owners = grow(d->owners, &d->owners_cap, owner_at + 1, sizeof(Owner));
                if (d->owners == NULL) {
                    goto fail;
                }
                PyObject *mine = PyDict_GetItemWithError(d->buckets_by_owner, owner);
                if (mine == NULL) {
                    if (PyErr_Occurred() || (mine = PyDict_New()) == NULL) {
                        goto fail;
                    }
                    int failed = PyDict_SetItem(d->buckets_by_owner, owner, mine);
                    Py_DECREF(mine);
                    if (failed) {
                        goto fail;
                    }
                }
                Owner *o = &d->owners[owner_at];
                o->owner = Py_NewRef(owner);
                o->buckets = Py_NewRef(mine);
                o->loaded = 0;
                d->owner_count++;
                PyObject *at = PyLong_FromSsize_t(owner_at);
                int failed = at == NULL || PyDict_SetItem(d->owner_index, owner, at);
                Py_XDECREF(at);
                if (failed) {
                    goto fail;
                }
            }
        }
        d->slices = grow(d->slices, &d->groups_cap, index + 1, sizeof(OpenSlice));
        if (d->slices == NULL) {
            goto fail;
        }
        Py_ssize_t *group_owner = PyMem_Realloc(d->group_owner, (size_t)d->groups_cap * sizeof(Py_ssize_t));
        if (group_owner == NULL) {
            PyErr_NoMemory();
            goto fail;
        }
        d->group_owner = group_owner;
        d->group_owner[index] = owner_at;
        d->groups = index + 1;
        PyObject *at = PyLong_FromSsize_t(index);
        PyObject *by_owner = list_in(d->names_by_owner, owner);
        int failed = at == NULL || PyDict_SetItem(d->group_index, group, at) ||
                     PyList_Append(d->names, group) || by_owner == NULL || PyList_Append(by_owner, at);
        Py_XDECREF(at);
        if (failed) {
            goto fail;
        }
    }
    PyObject *at = PyLong_FromSsize_t(index);
    int failed = at == NULL || PyDict_SetItem(d->name_index, name, at);
    Py_XDECREF(at);
    Py_DECREF(pair);
    return failed ? -1 : index;
fail:
    Py_DECREF(pair);
    return -1;
}

static int
on_step(Digest *d, PyObject *name, long long start, long long duration)
{
    Py_ssize_t index = group_of(d, name);
    if (index < 0) {
        return -1;
    }
    Py_ssize_t owner = d->group_owner[index];
    if (owner >= 0) {
        long long bucket = start / d->other_bucket;
        if (start < 0 && bucket * d->other_bucket != start) {
            bucket -= 1; /* floor division, as Python's // */
        }
        Bucket *b = &d->bucket;
        if (!b->loaded || b->bucket != bucket) {
            int fresh = load_bucket(d, bucket);
            if (fresh < 0) {
                return -1;
            }
            if (fresh) {
                b->busy = duration;
                b->steps = 1;
                b->longest = duration;
                b->owner = owner;
                b->runner_up = 0;
                goto own;
            }
        }
        b->busy += duration;
        b->steps += 1;
        if (owner == b->owner) {
            if (duration > b->longest) {
                b->longest = duration;
            }
        }
        else if (duration > b->longest) {
            b->runner_up = b->longest;
            b->longest = duration;
            b->owner = owner;
        }
        else if (duration > b->runner_up) {
            b->runner_up = duration;
        }
    own:;
        Owner *o = &d->owners[owner];
        if (!o->loaded || o->bucket != bucket) {
            if (load_owner_bucket(o, bucket) < 0) {
                return -1;
            }
        }
        o->busy += duration;
        o->steps += 1;
    }
    OpenSlice *s = &d->slices[index];
    if (s->slice != NULL && start - s->end <= d->merge_gap) {
        s->end = start + duration;
        s->busy += duration;
        s->count += 1;
        if (duration > s->longest) {
            s->longest = duration;
        }
        return 0;
    }
    if (close_slice(s) < 0) {
        return -1;
    }
    long long values[6] = {start, start + duration, duration, index, 1, duration};
    PyObject *slice = list_of_ll(6, values);
    if (slice == NULL) {
        return -1;
    }
    PyObject *group = list_in(d->slices_by_owner, owner >= 0 ? d->owners[owner].owner : Py_None);
    if (group == NULL || PyList_Append(group, slice) < 0) {
        Py_DECREF(slice);
        return -1;
    }
    s->slice = slice;
    s->start = start;
    s->end = start + duration;
    s->busy = duration;
    s->count = 1;
    s->longest = duration;
    return 0;
}

/* [to_ms(at - origin), to_ms(duration)] appended to `list` */
static int
append_ms_pair(Digest *d, PyObject *list, long long at, long long duration)
{
    PyObject *a = PyLong_FromLongLong(at), *b = PyLong_FromLongLong(duration);
    PyObject *ma = a ? PyObject_CallOneArg(d->to_ms, a) : NULL;
    PyObject *mb = b ? PyObject_CallOneArg(d->to_ms, b) : NULL;
    PyObject *pair = ma && mb ? PyList_New(2) : NULL;
    Py_XDECREF(a);
    Py_XDECREF(b);
    if (pair == NULL) {
        Py_XDECREF(ma);
        Py_XDECREF(mb);
        return -1;
    }
    PyList_SET_ITEM(pair, 0, ma);
    PyList_SET_ITEM(pair, 1, mb);
    int failed = PyList_Append(list, pair);
    Py_DECREF(pair);
    return failed;
}

static int
on_chunk(Digest *d, long long at, PyObject *item, PyObject *subject, PyObject *detail)
{
    if (!PyTuple_Check(subject) || PyTuple_GET_SIZE(subject) < 2 || !PyTuple_Check(detail) ||
        PyTuple_GET_SIZE(detail) < 2) {
        PyErr_SetString(PyExc_TypeError, "a chunk event is (CHUNK, 0, (connection, id), (index, tokens))");
        return -1;
    }
    PyObject *index = PyTuple_GET_ITEM(detail, 0);
    long long tokens = PyLong_AsLongLong(PyTuple_GET_ITEM(detail, 1));
    if (tokens == -1 && PyErr_Occurred()) {
        return -1;
    }
    size_t seen = seen_slot(item);
    PyObject *key = NULL, *slot = NULL;
    Py_ssize_t at_slot = -1;
    if (d->seen_chunks[seen] == item) {
        at_slot = d->seen_runs[seen]; /* this item's (request, index) has a run already */
    }
    else {
        if ((key = PyTuple_Pack(2, subject, index)) == NULL) {
            return -1;
        }
        slot = PyDict_GetItemWithError(d->open_chunk, key);
        if (slot != NULL && (at_slot = PyLong_AsSsize_t(slot)) < 0) {
            Py_DECREF(key);
            return -1;
        }
    }
    if (at_slot >= 0) {
        Py_XDECREF(key);
        key = NULL;
        d->seen_chunks[seen] = item;
        d->seen_runs[seen] = at_slot;
        OpenChunk *c = &d->chunk_runs[at_slot];
        if (at - c->at <= d->chunk_bin) {
            c->tokens += tokens;
            c->count += 1;
            return 0;
        }
        if (close_chunk(c) < 0) {
            return -1;
        }
    }
    else if (PyErr_Occurred()) {
        Py_DECREF(key);
        return -1;
    }
    else {
        at_slot = d->chunk_count;
        d->chunk_runs = grow(d->chunk_runs, &d->chunks_cap, at_slot + 1, sizeof(OpenChunk));
        PyObject *number = d->chunk_runs ? PyLong_FromSsize_t(at_slot) : NULL;
        int failed = number == NULL || PyDict_SetItem(d->open_chunk, key, number);
        Py_XDECREF(number);
        if (failed) {
            Py_DECREF(key);
            return -1;
        }
        d->chunk_count++;
        d->seen_chunks[seen] = item;
        d->seen_runs[seen] = at_slot;
    }
    Py_XDECREF(key);
    PyObject *entry = PyList_New(5);
    if (entry == NULL) {
        return -1;
    }
    PyList_SET_ITEM(entry, 0, PyLong_FromLongLong(at));
    PyList_SET_ITEM(entry, 1, Py_NewRef(PyTuple_GET_ITEM(subject, 1)));
    PyList_SET_ITEM(entry, 2, Py_NewRef(index));
    PyList_SET_ITEM(entry, 3, PyLong_FromLongLong(tokens));
    PyList_SET_ITEM(entry, 4, PyLong_FromLong(1));
    PyObject *connection_chunks = list_in(d->chunks, PyTuple_GET_ITEM(subject, 0));
    if (PyList_GET_ITEM(entry, 0) == NULL || PyList_GET_ITEM(entry, 3) == NULL ||
        PyList_GET_ITEM(entry, 4) == NULL || connection_chunks == NULL ||
        PyList_Append(connection_chunks, entry) < 0) {
        Py_DECREF(entry);
        return -1;
    }
    OpenChunk *c = &d->chunk_runs[at_slot];
    c->entry = entry;
    c->at = at;
    c->tokens = tokens;
    c->count = 1;
    return 0;
}

static int
on_frame(Digest *d, PyObject *subject, PyObject *detail)
{
    PyObject *counts = PyDict_GetItemWithError(d->frames, subject);
    if (counts == NULL) {
        long long zero[2] = {0, 0};
        if (PyErr_Occurred() || (counts = list_of_ll(2, zero)) == NULL) {
            return -1;
        }
        int failed = PyDict_SetItem(d->frames, subject, counts);
        Py_DECREF(counts);
        if (failed) {
            return -1;
        }
    }
    if (!PyTuple_Check(detail) || PyTuple_GET_SIZE(detail) < 2) {
        PyErr_SetString(PyExc_TypeError, "a frame event's detail is (frames, bytes)");
        return -1;
    }
    for (Py_ssize_t i = 0; i < 2; i++) {
        PyObject *sum = PyNumber_Add(PyList_GET_ITEM(counts, i), PyTuple_GET_ITEM(detail, i));
        if (sum == NULL || PyList_SetItem(counts, i, sum) < 0) {
            return -1;
        }
    }
    return 0;
}

static int
on_cancel(Digest *d, long long at_from_origin, PyObject *subject, PyObject *detail)
{
    if (!PyTuple_Check(subject) || PyTuple_GET_SIZE(subject) < 2 || !PyTuple_Check(detail) ||
        PyTuple_GET_SIZE(detail) < 2) {
        PyErr_SetString(PyExc_TypeError, "a cancel event is (CANCEL, 0, (connection, id), (stage, index))");
        return -1;
    }
    PyObject *list = list_in(d->cancels, PyTuple_GET_ITEM(subject, 0));
    if (list == NULL) {
        return -1;
    }
    PyObject *at = PyLong_FromLongLong(at_from_origin);
    PyObject *ms = at ? PyObject_CallOneArg(d->to_ms, at) : NULL;
    Py_XDECREF(at);
    if (ms == NULL) {
        return -1;
    }
    PyObject *entry = PyList_New(4);
    if (entry == NULL) {
        Py_DECREF(ms);
        return -1;
    }
    PyList_SET_ITEM(entry, 0, ms);
    PyList_SET_ITEM(entry, 1, Py_NewRef(PyTuple_GET_ITEM(subject, 1)));
    PyList_SET_ITEM(entry, 2, Py_NewRef(PyTuple_GET_ITEM(detail, 1)));
    PyList_SET_ITEM(entry, 3, Py_NewRef(PyTuple_GET_ITEM(detail, 0)));
    int failed = PyList_Append(list, entry);
    Py_DECREF(entry);
    return failed;
}

static void
digest_free(Digest *d)
{
    for (Py_ssize_t i = 0; i < d->groups; i++) {
        Py_CLEAR(d->slices[i].slice);
    }
    for (Py_ssize_t i = 0; i < d->chunk_count; i++) {
        Py_CLEAR(d->chunk_runs[i].entry);
    }
    for (Py_ssize_t i = 0; i < d->owner_count; i++) {
        Py_CLEAR(d->owners[i].owner);
        Py_CLEAR(d->owners[i].buckets);
    }
    PyMem_Free(d->slices);
    PyMem_Free(d->group_owner);
    PyMem_Free(d->owners);
    PyMem_Free(d->chunk_runs);
    Py_XDECREF(d->names);
    Py_XDECREF(d->names_by_owner);
    Py_XDECREF(d->slices_by_owner);
    Py_XDECREF(d->owned_buckets);
    Py_XDECREF(d->buckets_by_owner);
    Py_XDECREF(d->chunks);
    Py_XDECREF(d->idle);
    Py_XDECREF(d->lag);
    Py_XDECREF(d->frames);
    Py_XDECREF(d->cancels);
    Py_XDECREF(d->name_index);
    Py_XDECREF(d->group_index);
    Py_XDECREF(d->owner_index);
    Py_XDECREF(d->open_chunk);
}

static int
set_ll_attr(PyObject *out, const char *name, long long value)
{
    PyObject *number = PyLong_FromLongLong(value);
    if (number == NULL) {
        return -1;
    }
    int failed = PyObject_SetAttrString(out, name, number);
    Py_DECREF(number);
    return failed;
}

static PyObject *
digest(PyObject *module, PyObject *args)
{
    PyObject *times, *items, *out;
    long long boundary, origin;
    Digest d;
    memset(&d, 0, sizeof d);
    if (!PyArg_ParseTuple(args, "OO!LLOLLLLOO", &times, &PyList_Type, &items, &boundary, &origin, &out,
                          &d.merge_gap, &d.chunk_bin, &d.other_bucket, &d.min_idle, &d.to_ms,
                          &d.classify)) {
        return NULL;
    }
    if (d.other_bucket <= 0) {
        PyErr_SetString(PyExc_ValueError, "the bucket width must be positive");
        return NULL;
    }
    Py_buffer view;
    int have_view = PyObject_GetBuffer(times, &view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) == 0;
    PyObject *time_list = NULL;
    if (have_view && (view.itemsize != 8 || view.format == NULL ||
                      (strcmp(view.format, "q") && strcmp(view.format, "l")))) {
        PyBuffer_Release(&view);
        have_view = 0;
    }
    if (!have_view) {
        PyErr_Clear();
        time_list = PySequence_Fast(times, "times must be a sequence of ints");
        if (time_list == NULL) {
            return NULL;
        }
    }
    Py_ssize_t count = have_view ? view.len / 8 : PySequence_Fast_GET_SIZE(time_list);
    PyObject *result = NULL;
    if (count != PyList_GET_SIZE(items)) {
        PyErr_SetString(PyExc_ValueError, "times and items differ in length");
        goto done;
    }
    const char *fields[] = {"names",  "names_by_owner", "slices_by_owner", "owned_buckets",
                            "buckets_by_owner", "chunks", "idle", "lag", "frames", "cancels"};
    PyObject **targets[] = {&d.names,  &d.names_by_owner, &d.slices_by_owner, &d.owned_buckets,
                            &d.buckets_by_owner, &d.chunks, &d.idle, &d.lag, &d.frames, &d.cancels};
    for (int i = 0; i < 10; i++) {
        if ((*targets[i] = PyObject_GetAttrString(out, fields[i])) == NULL) {
            goto done;
        }
    }
    if (!PyList_Check(d.names) || !PyList_Check(d.idle) || !PyList_Check(d.lag) ||
        !PyDict_Check(d.names_by_owner) || !PyDict_Check(d.slices_by_owner) ||
        !PyDict_Check(d.owned_buckets) || !PyDict_Check(d.buckets_by_owner) || !PyDict_Check(d.chunks) ||
        !PyDict_Check(d.frames) || !PyDict_Check(d.cancels)) {
        PyErr_SetString(PyExc_TypeError, "out must be a fresh TraceDigest");
        goto done;
    }
    if ((d.name_index = PyDict_New()) == NULL || (d.group_index = PyDict_New()) == NULL ||
        (d.owner_index = PyDict_New()) == NULL || (d.open_chunk = PyDict_New()) == NULL) {
        goto done;
    }
    long long first = -1, end_ns = -1, steps = 0, busy = 0, idle = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        long long at;
        if (have_view) {
            at = ((const long long *)view.buf)[i];
        }
        else {
            at = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(time_list, i));
            if (at == -1 && PyErr_Occurred()) {
                goto done;
            }
        }
        PyObject *item = PyList_GET_ITEM(items, i);
        PyObject *name;
        long long start, duration;
        if (PyUnicode_CheckExact(item)) {
            name = item;
            start = boundary;
            duration = at - start;
            boundary = at;
            if (start < 0) {
                continue; /* the step before the window was overwritten: its start is unknown */
            }
        }
        else {
            if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 4) {
                PyErr_SetString(PyExc_TypeError, "a ring item is a task name or (kind, duration, subject, detail)");
                goto done;
            }
            long kind = PyLong_AsLong(PyTuple_GET_ITEM(item, 0));
            duration = PyLong_AsLongLong(PyTuple_GET_ITEM(item, 1));
            if (PyErr_Occurred()) {
                goto done;
            }
            PyObject *subject = PyTuple_GET_ITEM(item, 2), *detail = PyTuple_GET_ITEM(item, 3);
            start = at;
            if (kind != STEP) {
                if (first < 0) {
                    first = at;
                }
                /* A lag is recorded when the heartbeat woke, its duration how late: it ends at its time. */
                long long until = kind == LAG ? at : at + duration;
                if (until > end_ns) {
                    end_ns = until;
                }
                int failed = 0;
                if (kind == IDLE) {
                    boundary = at + duration;
                    idle += duration;
                    if (duration >= d.min_idle) {
                        failed = append_ms_pair(&d, d.idle, at - origin, duration);
                    }
                }
                else if (kind == CHUNK) {
                    failed = on_chunk(&d, at, item, subject, detail);
                }
                else if (kind == LAG) {
                    failed = append_ms_pair(&d, d.lag, at - origin, duration);
                }
                else if (kind == FRAME) {
                    failed = on_frame(&d, subject, detail);
                }
                else if (kind == CANCEL) {
                    failed = on_cancel(&d, at - origin, subject, detail);
                }
                if (failed) {
                    goto done;
                }
                continue;
            }
            name = subject;
            boundary = at + duration;
        }
        if (first < 0) {
            first = start;
        }
        if (boundary > end_ns) {
            end_ns = boundary;
        }
        steps += 1;
        busy += duration;
        if (on_step(&d, name, start, duration) < 0) {
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < d.groups; i++) {
        if (close_slice(&d.slices[i]) < 0) {
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < d.chunk_count; i++) {
        if (close_chunk(&d.chunk_runs[i]) < 0) {
            goto done;
        }
    }
    if (store_bucket(&d) < 0) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < d.owner_count; i++) {
        if (store_owner_bucket(&d.owners[i]) < 0) {
            goto done;
        }
    }
    if (set_ll_attr(out, "start_ns", first) || set_ll_attr(out, "end_ns", end_ns) ||
        set_ll_attr(out, "steps", steps) || set_ll_attr(out, "busy_ns", busy) ||
        set_ll_attr(out, "idle_ns", idle)) {
        goto done;
    }
    result = Py_NewRef(out);
done:
    if (have_view) {
        PyBuffer_Release(&view);
    }
    Py_XDECREF(time_list);
    digest_free(&d);
    return result;
}

static PyMethodDef module_methods[] = {
    {"digest", digest, METH_VARARGS,
     "digest(times, items, boundary, origin_ns, out, merge_gap_ns, chunk_bin_ns, other_bucket_ns, "
     "min_idle_ns, to_ms, classify) -> out: fill the TraceDigest `out` as digest_ring does."},
    {NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "backend.trace._trace_digest",
    .m_doc = "The live trace's digest in C (source: backend/trace/trace_digest.c).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__trace_digest(void)
{
    return PyModule_Create(&module_def);
}
