/* SPDX-License-Identifier: MIT */
/*
 * kvcache._kvcache.Client: one libkvcache connection.  Arguments are turned
 * into C (and frozen: lists become tuples, buffers are exported) with the
 * GIL held; libkvcache is then called without it, so engine threads keep
 * running while a call waits for the daemon.  Batch calls answer with one
 * int per key (>= 0 ok, -errno); only programming errors raise.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "ext.h"

unsigned kvcpy_fork_gen;

/* ---- lifetime ---- */

/* The daemon went (it stopped, or a new kvcached took it over: kvcachectl
 * upgrade): once nothing of the old connection is alive (no call in
 * progress, no View, Reservation or Buffer, no asynchronous operation),
 * connect again, so that an engine's next call finds the daemon back.
 * Until then calls fail with -ECONNRESET as before. */
static void reconnect(ClientObject *self)
{
	struct kvc_client *old = self->c, *nc = NULL;
	int r;

	if (!kvc_connection_lost(old) || self->reconnecting || self->users != 1 ||
	    self->exports || self->slots_used || !self->socket)
		return;
	self->reconnecting = true;
	Py_BEGIN_ALLOW_THREADS
	r = kvc_connect(self->socket, &nc);
	Py_END_ALLOW_THREADS
	self->reconnecting = false;
	if (r < 0)
		return;
	if (self->users != 1 || self->exports || self->slots_used || self->closing) {
		Py_BEGIN_ALLOW_THREADS
		kvc_disconnect(nc); /* the old one got busy meanwhile: next time */
		Py_END_ALLOW_THREADS
		return;
	}
	kvc_set_get_flags(nc, kvc_set_get_flags(old, 0));
	self->c = nc;
	self->reconnects++;
	Py_BEGIN_ALLOW_THREADS
	kvc_disconnect(old);
	Py_END_ALLOW_THREADS
}

int client_enter(ClientObject *self)
{
	if (!self->c || self->closing) {
		PyErr_SetString(PyExc_ValueError, "the client is closed");
		return -1;
	}
	if (self->fork_gen != kvcpy_fork_gen) {
		PyErr_SetString(PyExc_RuntimeError,
				"this client was connected by the parent process; connect a new "
				"one after fork()");
		return -1;
	}
	reconnect(self);
	if (!self->c || self->closing) {
		PyErr_SetString(PyExc_ValueError, "the client is closed");
		return -1;
	}
	self->users++;
	return 0;
}

void client_leave(ClientObject *self)
{
	struct kvc_client *c = self->c;

	if (--self->users > 0)
		return;
	self->c = NULL;
	Py_BEGIN_ALLOW_THREADS
	kvc_disconnect(c);
	Py_END_ALLOW_THREADS
}

PyObject *raise_kvc(int r)
{
	const char *msg = kvc_last_error_msg();
	PyObject *args;

	if (msg && *msg)
		args = Py_BuildValue("(is)", -r, msg);
	else
		args = Py_BuildValue("(is)", -r, kvc_strerror(r));
	if (args) {
		PyErr_SetObject(PyExc_OSError, args);
		Py_DECREF(args);
	}
	return NULL;
}

/* Run call without the GIL, between client_enter and client_leave. */
#define CALL(self, r, call)                 \
	do {                                \
		if (client_enter(self))     \
			goto fail;          \
		Py_BEGIN_ALLOW_THREADS      \
		r = (call);                 \
		Py_END_ALLOW_THREADS        \
		client_leave(self);         \
	} while (0)

static PyObject *client_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = { "socket", NULL };
	const char *path = NULL;
	struct kvc_client *c = NULL;
	ClientObject *self;
	char buf[4096];
	int r;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "|z:Client", kwlist, &path))
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	r = kvc_connect(path, &c);
	Py_END_ALLOW_THREADS
	if (r < 0) {
		kvc_socket_path(path, buf, sizeof(buf));
		PyErr_Format(PyExc_ConnectionError, "[Errno %d] cannot connect to kvcached at %s: %s",
			     -r, buf, kvc_strerror(r));
		return NULL;
	}
	self = (ClientObject *) type->tp_alloc(type, 0);
	if (!self) {
		kvc_disconnect(c);
		return NULL;
	}
	self->c = c;
	self->users = 1;
	self->fork_gen = kvcpy_fork_gen;
	if (kvc_socket_path(path, buf, sizeof(buf)) == 0)
		self->socket = strdup(buf);
	return (PyObject *) self;
}

static void client_dealloc(ClientObject *self)
{
	/* Views, Reservations, Buffers and operations in flight hold a
	 * reference, so nothing uses the client now.  In a forked child the
	 * connection is the parent's: leave it alone. */
	if (self->c && !self->closing && self->fork_gen == kvcpy_fork_gen)
		kvc_disconnect(self->c);
	PyMem_Free(self->ranges);
	free(self->socket);
	Py_TYPE(self)->tp_free((PyObject *) self);
}

static PyObject *client_close(ClientObject *self, PyObject *unused)
{
	if (!self->c || self->closing)
		Py_RETURN_NONE;
	if (self->exports > 0) {
		PyErr_Format(PyExc_BufferError,
			     "%zd views, reservations or buffers of this client are still alive",
			     self->exports);
		return NULL;
	}
	self->closing = true;
	if (self->fork_gen != kvcpy_fork_gen) {
		self->c = NULL; /* the parent's */
		Py_RETURN_NONE;
	}
	client_leave(self);
	Py_RETURN_NONE;
}

static PyObject *client_enter_ctx(PyObject *self, PyObject *unused)
{
	return Py_NewRef(self);
}

static PyObject *client_exit_ctx(ClientObject *self, PyObject *args)
{
	PyObject *r = client_close(self, NULL);

	if (!r)
		return NULL;
	Py_DECREF(r);
	Py_RETURN_FALSE;
}

static PyObject *client_closed(ClientObject *self, void *unused)
{
	return PyBool_FromLong(!self->c || self->closing);
}

static PyObject *client_reconnects(ClientObject *self, void *unused)
{
	return PyLong_FromUnsignedLongLong(self->reconnects);
}

static PyObject *client_socket(ClientObject *self, void *unused)
{
	if (!self->socket)
		Py_RETURN_NONE;
	return PyUnicode_FromString(self->socket);
}

/* ---- argument conversion (GIL held) ---- */

static int key_from(PyObject *o, const char **ret)
{
	const char *s;
	Py_ssize_t n;

	if (PyUnicode_Check(o)) {
		s = PyUnicode_AsUTF8AndSize(o, &n);
		if (!s)
			return -1;
	} else if (PyBytes_Check(o)) {
		s = PyBytes_AS_STRING(o);
		n = PyBytes_GET_SIZE(o);
	} else {
		PyErr_Format(PyExc_TypeError, "a key is str or bytes, not %.100s",
			     Py_TYPE(o)->tp_name);
		return -1;
	}
	if (n == 0 || (size_t) n > KVC_KEY_MAX || strlen(s) != (size_t) n) {
		PyErr_Format(PyExc_ValueError, "a key is 1..%u bytes without NUL", KVC_KEY_MAX);
		return -1;
	}
	*ret = s;
	return 0;
}

/* A frozen list of keys: the tuple owns the strings the array points at. */
struct keys {
	PyObject *tuple;
	const char **v;
	size_t n;
};

static int keys_from(PyObject *seq, struct keys *k)
{
	*k = (struct keys) { 0 };
	k->tuple = PySequence_Tuple(seq);
	if (!k->tuple)
		return -1;
	k->n = (size_t) PyTuple_GET_SIZE(k->tuple);
	k->v = PyMem_Calloc(k->n ? k->n : 1, sizeof(*k->v));
	if (!k->v) {
		PyErr_NoMemory();
		return -1;
	}
	for (size_t i = 0; i < k->n; i++)
		if (key_from(PyTuple_GET_ITEM(k->tuple, i), &k->v[i]))
			return -1;
	return 0;
}

static void keys_done(struct keys *k)
{
	Py_CLEAR(k->tuple);
	PyMem_Free(k->v);
	k->v = NULL;
}

/* Put options, given as keyword arguments: replace, pin ("soft"/"hard"),
 * pin_ttl_ms, parent, chain, tier, push_to.  The strings stay valid while the
 * objects in hold are referenced. */
struct put_opts {
	struct kvc_put_opts o;
	PyObject *hold[2];
};

static int opt_str(PyObject *v, const char **ret, PyObject **hold)
{
	if (v == Py_None)
		return 0;
	if (key_from(v, ret))
		return -1;
	*hold = Py_NewRef(v);
	return 0;
}

static int put_opts_from(PyObject *kwds, struct put_opts *p)
{
	PyObject *name, *v;
	Py_ssize_t pos = 0;

	*p = (struct put_opts) { 0 };
	if (!kwds)
		return 0;
	while (PyDict_Next(kwds, &pos, &name, &v)) {
		const char *n = PyUnicode_AsUTF8(name);
		long l;

		if (!n)
			return -1;
		if (!strcmp(n, "replace")) {
			int t = PyObject_IsTrue(v);

			if (t < 0)
				return -1;
			if (t)
				p->o.flags |= KVC_PUT_REPLACE;
		} else if (!strcmp(n, "pin")) {
			if (v == Py_None || v == Py_False)
				continue;
			if (v == Py_True || (PyUnicode_Check(v) &&
					     !PyUnicode_CompareWithASCIIString(v, "soft"))) {
				p->o.flags |= KVC_PUT_SOFT_PIN;
			} else if (PyUnicode_Check(v) &&
				   !PyUnicode_CompareWithASCIIString(v, "hard")) {
				p->o.flags |= KVC_PUT_HARD_PIN;
			} else {
				PyErr_SetString(PyExc_ValueError,
						"pin is None, \"soft\" (or True) or \"hard\"");
				return -1;
			}
		} else if (!strcmp(n, "pin_ttl_ms")) {
			l = PyLong_AsLong(v);
			if (l == -1 && PyErr_Occurred())
				return -1;
			if (l < 0 || l > UINT32_MAX) {
				PyErr_SetString(PyExc_ValueError, "pin_ttl_ms is 0..2^32-1");
				return -1;
			}
			p->o.pin_ttl_ms = (uint32_t) l;
		} else if (!strcmp(n, "tier")) {
			l = PyLong_AsLong(v);
			if (l == -1 && PyErr_Occurred())
				return -1;
			if (l < KVC_TIER_DEFAULT || l > KVC_TIER_DISK) {
				PyErr_SetString(PyExc_ValueError, "tier is one of TIER_*");
				return -1;
			}
			p->o.tier = (int) l;
		} else if (!strcmp(n, "chain")) {
			int t = PyObject_IsTrue(v);

			if (t < 0)
				return -1;
			if (t)
				p->o.flags |= KVC_PUT_CHAIN;
		} else if (!strcmp(n, "parent")) {
			if (opt_str(v, &p->o.parent_key, &p->hold[0]))
				return -1;
		} else if (!strcmp(n, "push_to")) {
			if (opt_str(v, &p->o.push_to, &p->hold[1]))
				return -1;
		} else {
			PyErr_Format(PyExc_TypeError, "unexpected keyword argument '%s'", n);
			return -1;
		}
	}
	return 0;
}

static void put_opts_done(struct put_opts *p)
{
	Py_CLEAR(p->hold[0]);
	Py_CLEAR(p->hold[1]);
}

/* ---- memory the caller registered: raw addresses must fall inside ---- */

static const struct mem_range *range_find(ClientObject *self, uintptr_t p, size_t len)
{
	size_t lo = 0, hi = self->n_ranges;

	while (lo < hi) { /* first range with base > p */
		size_t mid = (lo + hi) / 2;

		if (self->ranges[mid].base <= p)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == 0)
		return NULL;
	const struct mem_range *r = &self->ranges[lo - 1];
	if (p - r->base > r->len || len > r->len - (p - r->base))
		return NULL;
	return r;
}

bool client_range_ok(ClientObject *self, uintptr_t p, size_t len)
{
	return len == 0 || range_find(self, p, len) != NULL;
}

/* Is [p, p + len) mapped readable and writable in this process?  Device
 * memory (a CUDA address) and freed memory are not. */
static int mapped_rw(uintptr_t p, size_t len)
{
	FILE *f = fopen("/proc/self/maps", "re");
	uintptr_t cur = p, end = p + len;
	char line[512];
	int r = -EFAULT;

	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;
		char perms[8];

		if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3)
			continue;
		if (hi <= cur)
			continue;
		if (lo > cur || perms[0] != 'r' || perms[1] != 'w')
			break;
		cur = hi;
		if (cur >= end) {
			r = 0;
			break;
		}
	}
	fclose(f);
	return r;
}

static PyObject *client_register(ClientObject *self, PyObject *args)
{
	unsigned long long ptr, len;
	struct mem_range *r;
	PyObject *ptr_o;
	size_t i;

	if (!PyArg_ParseTuple(args, "O!K:register_memory", &PyLong_Type, &ptr_o, &len))
		return NULL;
	ptr = PyLong_AsUnsignedLongLong(ptr_o);
	if (ptr == (unsigned long long) -1 && PyErr_Occurred()) {
		if (!PyErr_ExceptionMatches(PyExc_OverflowError))
			return NULL;
		PyErr_Clear(); /* a negative address */
		return PyLong_FromLong(-EFAULT);
	}
	if (len == 0 || ptr + len < ptr)
		return PyLong_FromLong(-EINVAL);
	if (mapped_rw((uintptr_t) ptr, (size_t) len) < 0)
		return PyLong_FromLong(-EFAULT);
	for (i = 0; i < self->n_ranges; i++) {
		r = &self->ranges[i];
		if (r->base == ptr && r->len == len)
			return PyLong_FromLong(0);
		if (ptr < r->base + r->len && r->base < ptr + len)
			return PyLong_FromLong(-EEXIST);
		if (r->base > ptr)
			break;
	}
	if (self->n_ranges == self->cap_ranges) {
		size_t cap = self->cap_ranges ? 2 * self->cap_ranges : 16;

		r = PyMem_Realloc(self->ranges, cap * sizeof(*r));
		if (!r)
			return PyErr_NoMemory();
		self->ranges = r;
		self->cap_ranges = cap;
	}
	memmove(&self->ranges[i + 1], &self->ranges[i], (self->n_ranges - i) * sizeof(*r));
	self->ranges[i] = (struct mem_range) { (uintptr_t) ptr, (size_t) len };
	self->n_ranges++;
	return PyLong_FromLong(0);
}

static PyObject *client_unregister(ClientObject *self, PyObject *args)
{
	unsigned long long ptr;

	if (!PyArg_ParseTuple(args, "K:unregister_memory", &ptr))
		return NULL;
	for (size_t i = 0; i < self->n_ranges; i++) {
		if (self->ranges[i].base != ptr)
			continue;
		memmove(&self->ranges[i], &self->ranges[i + 1],
			(self->n_ranges - i - 1) * sizeof(self->ranges[0]));
		self->n_ranges--;
		return PyLong_FromLong(0);
	}
	return PyLong_FromLong(-ENOENT);
}

static PyObject *client_segments(ClientObject *self, PyObject *unused)
{
	struct kvc_segment segs[64];
	PyObject *list;
	int n;

	if (client_enter(self))
		return NULL;
	n = kvc_segments(self->c, segs, 64);
	client_leave(self);
	if (n < 0)
		return raise_kvc(n);
	list = PyList_New(0);
	for (int i = 0; list && i < n && i < 64; i++) {
		PyObject *t = Py_BuildValue("(KK)", (unsigned long long) (uintptr_t) segs[i].base,
					    (unsigned long long) segs[i].len);

		if (!t || PyList_Append(list, t)) {
			Py_XDECREF(t);
			Py_CLEAR(list);
			break;
		}
		Py_DECREF(t);
	}
	return list;
}

/* ---- copying calls ---- */

static PyObject *client_put(ClientObject *self, PyObject *args, PyObject *kwds)
{
	PyObject *key_o, *val_o;
	struct put_opts po = { 0 };
	Py_buffer val = { 0 };
	const char *key;
	int r;

	if (!PyArg_ParseTuple(args, "OO:put", &key_o, &val_o) || key_from(key_o, &key) ||
	    put_opts_from(kwds, &po) || PyObject_GetBuffer(val_o, &val, PyBUF_SIMPLE))
		goto fail;
	CALL(self, r, kvc_put(self->c, key, val.buf, (size_t) val.len, &po.o));
	PyBuffer_Release(&val);
	put_opts_done(&po);
	return PyLong_FromLong(r);
fail:
	if (val.obj)
		PyBuffer_Release(&val);
	put_opts_done(&po);
	return NULL;
}

/* Client.get()'s bytes, made once the library knows the length (with the
 * GIL, taken back for that moment): across nodes the copy then runs behind
 * the transfer instead of after it. */
struct get_bytes {
	PyThreadState **ts; /* the thread's state while the GIL is let go */
	PyObject *out;
};

static void *get_bytes_alloc(void *ctx, size_t len)
{
	struct get_bytes *g = ctx;
	void *p = NULL;

	if (len > PY_SSIZE_T_MAX)
		return NULL;
	PyEval_RestoreThread(*g->ts);
	Py_CLEAR(g->out); /* made before for another length */
	g->out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t) len);
	if (g->out)
		p = PyBytes_AS_STRING(g->out);
	else
		PyErr_Clear(); /* -ENOMEM below */
	*g->ts = PyEval_SaveThread();
	return p;
}

static PyObject *client_get(ClientObject *self, PyObject *arg)
{
	PyThreadState *ts;
	struct get_bytes g = { &ts, NULL };
	const char *key;
	void *buf;
	ssize_t r;

	if (key_from(arg, &key) || client_enter(self))
		return NULL;
	ts = PyEval_SaveThread();
	r = kvc_get_alloc(self->c, key, get_bytes_alloc, &g, &buf);
	PyEval_RestoreThread(ts);
	client_leave(self);
	if (r >= 0)
		return g.out;
	Py_CLEAR(g.out);
	if (r == -ENOENT)
		Py_RETURN_NONE;
	if (r == -ENOMEM)
		return PyErr_NoMemory();
	return raise_kvc((int) r);
}

static PyObject *client_exists(ClientObject *self, PyObject *arg)
{
	const char *key;
	int r;

	if (key_from(arg, &key))
		return NULL;
	CALL(self, r, kvc_exists(self->c, key));
	if (r < 0)
		return raise_kvc(r);
	return PyBool_FromLong(r);
fail:
	return NULL;
}

static PyObject *client_remove(ClientObject *self, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = { "key", "force", NULL };
	PyObject *key_o;
	const char *key;
	int force = 0, r;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|$p:remove", kwlist, &key_o, &force) ||
	    key_from(key_o, &key))
		return NULL;
	CALL(self, r, force ? kvc_remove_force(self->c, key) : kvc_remove(self->c, key));
	return PyLong_FromLong(r);
fail:
	return NULL;
}

static PyObject *client_remove_prefix(ClientObject *self, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = { "prefix", "force", NULL };
	const char *prefix = NULL;
	uint64_t skipped = 0;
	int force = 0;
	int64_t r;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "|z$p:remove_prefix", kwlist, &prefix,
					 &force))
		return NULL;
	CALL(self, r,
	     kvc_remove_prefix(self->c, prefix, force ? KVC_REMOVE_FORCE : 0, &skipped));
	if (r < 0)
		return raise_kvc((int) r);
	return Py_BuildValue("(LK)", (long long) r, (unsigned long long) skipped);
fail:
	return NULL;
}

static PyObject *int_list(const long long *v, size_t n)
{
	PyObject *list = PyList_New((Py_ssize_t) n);

	for (size_t i = 0; list && i < n; i++) {
		PyObject *o = PyLong_FromLongLong(v[i]);

		if (!o) {
			Py_CLEAR(list);
			break;
		}
		PyList_SET_ITEM(list, (Py_ssize_t) i, o);
	}
	return list;
}

static PyObject *client_batch_exists(ClientObject *self, PyObject *arg)
{
	struct keys k;
	uint8_t *present = NULL;
	PyObject *list = NULL;
	int r;

	if (keys_from(arg, &k))
		goto fail;
	present = PyMem_Calloc(k.n ? k.n : 1, 1);
	if (!present) {
		PyErr_NoMemory();
		goto fail;
	}
	r = 0;
	if (k.n)
		CALL(self, r, kvc_batch_exists(self->c, k.v, k.n, present));
	if (r < 0) {
		raise_kvc(r);
		goto fail;
	}
	list = PyList_New((Py_ssize_t) k.n);
	for (size_t i = 0; list && i < k.n; i++)
		PyList_SET_ITEM(list, (Py_ssize_t) i, PyBool_FromLong(present[i]));
fail:
	keys_done(&k);
	PyMem_Free(present);
	return list;
}

/* A call over a list of keys that answers one int: raised when negative
 * if `raise`, else returned. */
static PyObject *keys_call(ClientObject *self, PyObject *arg,
			   int (*fn)(struct kvc_client *, const char *const *, size_t), bool raise)
{
	struct keys k;
	PyObject *out = NULL;
	int r = 0;

	if (keys_from(arg, &k))
		goto fail;
	if (k.n)
		CALL(self, r, fn(self->c, k.v, k.n));
	out = r < 0 && raise ? raise_kvc(r) : PyLong_FromLong(r);
fail:
	keys_done(&k);
	return out;
}

static PyObject *client_prefix_lookup(ClientObject *self, PyObject *arg)
{
	return keys_call(self, arg, kvc_prefix_lookup, true);
}

/* ---- zero-copy ---- */

static PyObject *client_reserve(ClientObject *self, PyObject *args, PyObject *kwds)
{
	struct put_opts po = { 0 };
	unsigned long long size;
	struct kvc_buf b;
	PyObject *key_o;
	const char *key;
	int r;

	if (!PyArg_ParseTuple(args, "OK:reserve", &key_o, &size) || key_from(key_o, &key) ||
	    put_opts_from(kwds, &po))
		goto fail;
	CALL(self, r, kvc_reserve(self->c, key, (size_t) size, &po.o, &b));
	put_opts_done(&po);
	if (r < 0)
		return raise_kvc(r);
	return reservation_new(self, &b);
fail:
	put_opts_done(&po);
	return NULL;
}

static PyObject *client_acquire(ClientObject *self, PyObject *arg)
{
	struct kvc_view v;
	const char *key;
	int r;

	if (key_from(arg, &key))
		return NULL;
	CALL(self, r, kvc_acquire(self->c, key, &v));
	if (r == -ENOENT)
		Py_RETURN_NONE;
	if (r < 0)
		return raise_kvc(r);
	return view_new(self, &v);
fail:
	return NULL;
}

/* ---- scatter-gather over the caller's memory ----
 *
 * Each piece is an int address inside a registered range, or any object
 * with the buffer protocol (writable for gets).  A key with a piece outside
 * registered memory gets -EFAULT and is not attempted. */

struct sg {
	struct keys k;
	PyObject *hold;           /* the frozen per-key lists */
	Py_buffer *bufs;          /* exported pieces */
	size_t n_bufs;
	struct kvc_iovec *pieces; /* all pieces, key after key */
	const struct kvc_iovec **iov;
	size_t *n_iov;
	const char **keys;        /* the keys attempted */
	size_t *idx;              /* attempted -> position */
	size_t n;                 /* attempted */
	long long *results;       /* per position */
};

static void sg_done(struct sg *s)
{
	for (size_t i = 0; i < s->n_bufs; i++)
		PyBuffer_Release(&s->bufs[i]);
	keys_done(&s->k);
	Py_CLEAR(s->hold);
	PyMem_Free(s->bufs);
	PyMem_Free(s->pieces);
	PyMem_Free(s->iov);
	PyMem_Free(s->n_iov);
	PyMem_Free(s->keys);
	PyMem_Free(s->idx);
	PyMem_Free(s->results);
}

/* One piece: 0, -EFAULT (bad address), or -1 with an exception. */
static int sg_piece(ClientObject *self, struct sg *s, PyObject *p, PyObject *size_o, bool write,
		    struct kvc_iovec *ret)
{
	size_t size = PyLong_AsSize_t(size_o);

	if (size == (size_t) -1 && PyErr_Occurred())
		return -1;
	if (PyLong_Check(p)) {
		unsigned long long a = PyLong_AsUnsignedLongLong(p);

		if (a == (unsigned long long) -1 && PyErr_Occurred()) {
			if (!PyErr_ExceptionMatches(PyExc_OverflowError))
				return -1;
			PyErr_Clear(); /* a negative address */
			return -EFAULT;
		}
		if (!client_range_ok(self, (uintptr_t) a, size))
			return -EFAULT;
		*ret = (struct kvc_iovec) { (void *) (uintptr_t) a, size };
		return 0;
	}
	Py_buffer *b = &s->bufs[s->n_bufs];
	if (PyObject_GetBuffer(p, b, write ? PyBUF_WRITABLE : PyBUF_SIMPLE))
		return -1;
	s->n_bufs++;
	if ((size_t) b->len < size) {
		PyErr_Format(PyExc_ValueError, "a piece of %zu bytes over a buffer of %zd", size,
			     b->len);
		return -1;
	}
	*ret = (struct kvc_iovec) { b->buf, size };
	return 0;
}

static int sg_from(ClientObject *self, struct sg *s, PyObject *keys, PyObject *ptrs,
		   PyObject *sizes, bool write)
{
	PyObject *pt = NULL, *st = NULL;
	size_t total = 0, at = 0;

	*s = (struct sg) { 0 };
	if (keys_from(keys, &s->k))
		return -1;
	s->hold = PyList_New(0);
	pt = PySequence_Tuple(ptrs);
	st = PySequence_Tuple(sizes);
	if (!s->hold || !pt || !st)
		goto fail;
	if ((size_t) PyTuple_GET_SIZE(pt) != s->k.n || (size_t) PyTuple_GET_SIZE(st) != s->k.n) {
		PyErr_SetString(PyExc_ValueError, "keys, pointer lists and size lists differ in length");
		goto fail;
	}
	/* freeze every per-key list first, to size the arrays */
	for (size_t i = 0; i < s->k.n; i++) {
		PyObject *a = PySequence_Tuple(PyTuple_GET_ITEM(pt, i));
		PyObject *b = a ? PySequence_Tuple(PyTuple_GET_ITEM(st, i)) : NULL;

		if (!a || !b || PyList_Append(s->hold, a) || PyList_Append(s->hold, b)) {
			Py_XDECREF(a);
			Py_XDECREF(b);
			goto fail;
		}
		Py_DECREF(a);
		Py_DECREF(b);
		if (PyTuple_GET_SIZE(a) != PyTuple_GET_SIZE(b)) {
			PyErr_SetString(PyExc_ValueError, "a pointer list and its size list differ");
			goto fail;
		}
		total += (size_t) PyTuple_GET_SIZE(a);
	}
	size_t nk = s->k.n ? s->k.n : 1;
	s->bufs = PyMem_Calloc(total ? total : 1, sizeof(*s->bufs));
	s->pieces = PyMem_Calloc(total ? total : 1, sizeof(*s->pieces));
	s->iov = PyMem_Calloc(nk, sizeof(*s->iov));
	s->n_iov = PyMem_Calloc(nk, sizeof(*s->n_iov));
	s->keys = PyMem_Calloc(nk, sizeof(*s->keys));
	s->idx = PyMem_Calloc(nk, sizeof(*s->idx));
	s->results = PyMem_Calloc(nk, sizeof(*s->results));
	if (!s->bufs || !s->pieces || !s->iov || !s->n_iov || !s->keys || !s->idx || !s->results) {
		PyErr_NoMemory();
		goto fail;
	}
	for (size_t i = 0; i < s->k.n; i++) {
		PyObject *a = PyList_GET_ITEM(s->hold, 2 * i), *b = PyList_GET_ITEM(s->hold, 2 * i + 1);
		size_t m = (size_t) PyTuple_GET_SIZE(a);
		int r = 0;

		for (size_t j = 0; j < m && r == 0; j++) {
			r = sg_piece(self, s, PyTuple_GET_ITEM(a, j), PyTuple_GET_ITEM(b, j), write,
				     &s->pieces[at + j]);
			if (r == -1)
				goto fail;
		}
		if (r < 0) {
			s->results[i] = r;
			continue;
		}
		s->iov[s->n] = &s->pieces[at];
		s->n_iov[s->n] = m;
		s->keys[s->n] = s->k.v[i];
		s->idx[s->n] = i;
		s->n++;
		at += m;
	}
	Py_DECREF(pt);
	Py_DECREF(st);
	return 0;
fail:
	Py_XDECREF(pt);
	Py_XDECREF(st);
	return -1;
}

static PyObject *client_batch_put_mb(ClientObject *self, PyObject *args, PyObject *kwds)
{
	PyObject *keys, *ptrs, *sizes, *out = NULL;
	struct put_opts po = { 0 };
	struct sg s = { 0 };
	int *res = NULL;
	int r = 0;

	if (!PyArg_ParseTuple(args, "OOO:batch_put_from_multi_buffers", &keys, &ptrs, &sizes) ||
	    put_opts_from(kwds, &po) || sg_from(self, &s, keys, ptrs, sizes, false))
		goto fail;
	res = PyMem_Calloc(s.n ? s.n : 1, sizeof(*res));
	if (!res) {
		PyErr_NoMemory();
		goto fail;
	}
	if (s.n)
		CALL(self, r, kvc_batch_put(self->c, s.n, s.keys, s.iov, s.n_iov, &po.o, res));
	for (size_t i = 0; i < s.n; i++)
		s.results[s.idx[i]] = r < 0 ? r : res[i];
	out = int_list(s.results, s.k.n);
fail:
	PyMem_Free(res);
	sg_done(&s);
	put_opts_done(&po);
	return out;
}

static PyObject *client_batch_get_mb(ClientObject *self, PyObject *args)
{
	PyObject *keys, *ptrs, *sizes, *out = NULL;
	struct sg s = { 0 };
	ssize_t *res = NULL;
	int r = 0;

	if (!PyArg_ParseTuple(args, "OOO:batch_get_into_multi_buffers", &keys, &ptrs, &sizes) ||
	    sg_from(self, &s, keys, ptrs, sizes, true))
		goto fail;
	res = PyMem_Calloc(s.n ? s.n : 1, sizeof(*res));
	if (!res) {
		PyErr_NoMemory();
		goto fail;
	}
	if (s.n)
		CALL(self, r, kvc_batch_get(self->c, s.n, s.keys, s.iov, s.n_iov, res));
	for (size_t i = 0; i < s.n; i++)
		s.results[s.idx[i]] = r < 0 ? r : res[i];
	out = int_list(s.results, s.k.n);
fail:
	PyMem_Free(res);
	sg_done(&s);
	return out;
}

/* ---- registered buffers ---- */

static PyObject *client_buffer_alloc(ClientObject *self, PyObject *args)
{
	unsigned long long size;
	struct kvc_buffer b;
	int r;

	if (!PyArg_ParseTuple(args, "K:buffer_alloc", &size))
		return NULL;
	CALL(self, r, kvc_buffer_alloc(self->c, (size_t) size, &b));
	if (r < 0)
		return raise_kvc(r);
	return buffer_new(self, &b);
fail:
	return NULL;
}

/* [offset, offset + len) of a buffer; len -1: to its end. */
static int buffer_span(BufferObject *b, unsigned long long offset, long long len,
		       uint64_t *ret_len)
{
	if (offset > b->b.len || (len >= 0 && (unsigned long long) len > b->b.len - offset)) {
		PyErr_Format(PyExc_ValueError, "[%llu, +%lld) is outside the buffer of %zu bytes",
			     offset, len, b->b.len);
		return -1;
	}
	*ret_len = len < 0 ? b->b.len - offset : (uint64_t) len;
	return 0;
}

/* get_into(key, buf, offset=0, cap=-1) and put_from(key, buf, offset=0,
 * size=-1, **put_opts): buf is a Buffer (the daemon copies) or any buffer,
 * writable for get_into (this process copies). */
static PyObject *copy_one(ClientObject *self, PyObject *args, PyObject *kwds, bool put)
{
	unsigned long long offset = 0;
	long long len_arg = -1;
	struct put_opts po = { 0 };
	PyObject *key_o, *buf_o, *out = NULL;
	BufferObject *b = NULL;
	Py_buffer v = { 0 };
	const char *key;
	uint64_t len;
	uint8_t *p;
	ssize_t r;

	if (!PyArg_ParseTuple(args, put ? "OO|KL:put_from" : "OO|KL:get_into", &key_o, &buf_o,
			      &offset, &len_arg) ||
	    key_from(key_o, &key) || (put && put_opts_from(kwds, &po)))
		goto fail;
	if (PyObject_TypeCheck(buf_o, &Buffer_Type)) {
		b = buffer_check(self, buf_o);
		if (!b || buffer_span(b, offset, len_arg, &len))
			goto fail;
		b->in_flight++; /* free() waits for us */
	} else {
		if (PyObject_GetBuffer(buf_o, &v, put ? PyBUF_SIMPLE : PyBUF_WRITABLE))
			goto fail;
		if (offset > (unsigned long long) v.len ||
		    (len_arg >= 0 && (unsigned long long) len_arg > (unsigned long long) v.len - offset)) {
			PyErr_SetString(PyExc_ValueError, "offset and length fall outside the buffer");
			goto fail;
		}
		len = len_arg < 0 ? (uint64_t) v.len - offset : (uint64_t) len_arg;
	}
	p = (uint8_t *) v.buf + offset;
	CALL(self, r,
	     b ? (put ? kvc_put_from(self->c, key, &b->b, offset, (size_t) len, &po.o)
		      : kvc_get_into(self->c, key, &b->b, offset, (size_t) len))
	       : (put ? kvc_put(self->c, key, p, (size_t) len, &po.o)
		      : kvc_get(self->c, key, p, (size_t) len)));
	out = PyLong_FromSsize_t(r);
fail:
	if (b)
		b->in_flight--;
	if (v.obj)
		PyBuffer_Release(&v);
	put_opts_done(&po);
	return out;
}

static PyObject *client_get_into(ClientObject *self, PyObject *args)
{
	return copy_one(self, args, NULL, false);
}

static PyObject *client_put_from(ClientObject *self, PyObject *args, PyObject *kwds)
{
	return copy_one(self, args, kwds, true);
}

/* iov lists of (Buffer, offset, len) tuples, for the batch forms. */
struct biov {
	struct keys k;
	PyObject *hold;
	struct kvc_iov *pieces;
	const struct kvc_iov **iov;
	size_t *n_iov;
	BufferObject **used; /* in_flight raised on each */
	size_t n_used;
};

static void biov_done(struct biov *b)
{
	for (size_t i = 0; i < b->n_used; i++)
		b->used[i]->in_flight--;
	keys_done(&b->k);
	Py_CLEAR(b->hold);
	PyMem_Free(b->pieces);
	PyMem_Free(b->iov);
	PyMem_Free(b->n_iov);
	PyMem_Free(b->used);
}

static int biov_from(ClientObject *self, struct biov *b, PyObject *keys, PyObject *lists)
{
	PyObject *lt;
	size_t total = 0, at = 0;

	*b = (struct biov) { 0 };
	if (keys_from(keys, &b->k))
		return -1;
	b->hold = PyList_New(0);
	lt = PySequence_Tuple(lists);
	if (!b->hold || !lt)
		goto fail;
	if ((size_t) PyTuple_GET_SIZE(lt) != b->k.n) {
		PyErr_SetString(PyExc_ValueError, "keys and iov lists differ in length");
		goto fail;
	}
	for (size_t i = 0; i < b->k.n; i++) {
		PyObject *a = PySequence_Tuple(PyTuple_GET_ITEM(lt, i));

		if (!a || PyList_Append(b->hold, a)) {
			Py_XDECREF(a);
			goto fail;
		}
		Py_DECREF(a);
		total += (size_t) PyTuple_GET_SIZE(a);
	}
	b->pieces = PyMem_Calloc(total ? total : 1, sizeof(*b->pieces));
	b->used = PyMem_Calloc(total ? total : 1, sizeof(*b->used));
	b->iov = PyMem_Calloc(b->k.n ? b->k.n : 1, sizeof(*b->iov));
	b->n_iov = PyMem_Calloc(b->k.n ? b->k.n : 1, sizeof(*b->n_iov));
	if (!b->pieces || !b->used || !b->iov || !b->n_iov) {
		PyErr_NoMemory();
		goto fail;
	}
	for (size_t i = 0; i < b->k.n; i++) {
		PyObject *a = PyList_GET_ITEM(b->hold, i);
		size_t m = (size_t) PyTuple_GET_SIZE(a);

		b->iov[i] = &b->pieces[at];
		b->n_iov[i] = m;
		for (size_t j = 0; j < m; j++) {
			PyObject *bo;
			unsigned long long off;
			long long len;
			BufferObject *buf;
			uint64_t l;

			PyObject *piece = PyTuple_GET_ITEM(a, j);

			/* PyArg_ParseTuple() on anything else is a SystemError */
			if (!PyTuple_Check(piece)) {
				PyErr_SetString(PyExc_TypeError, "an iov is (Buffer, offset, len)");
				goto fail;
			}
			if (!PyArg_ParseTuple(piece, "OKL;an iov is (Buffer, offset, len)", &bo, &off,
					      &len))
				goto fail;
			buf = buffer_check(self, bo);
			if (!buf || buffer_span(buf, off, len, &l))
				goto fail;
			buf->in_flight++;
			b->used[b->n_used++] = buf;
			b->pieces[at + j] = (struct kvc_iov) { &buf->b, off, l };
		}
		at += m;
	}
	Py_DECREF(lt);
	return 0;
fail:
	Py_XDECREF(lt);
	return -1;
}

/* batch_get_into(keys, iov_lists) and batch_put_from(keys, iov_lists,
 * **put_opts): the daemon copies. */
static PyObject *batch_registered(ClientObject *self, PyObject *args, PyObject *kwds, bool put)
{
	PyObject *keys, *lists, *out = NULL;
	struct put_opts po = { 0 };
	struct biov b = { 0 };
	ssize_t *res = NULL;
	int *put_res = NULL;
	long long *v = NULL;
	int r = 0;

	if (!PyArg_ParseTuple(args, put ? "OO:batch_put_from" : "OO:batch_get_into", &keys,
			      &lists) ||
	    (put ? put_opts_from(kwds, &po) : 0) || biov_from(self, &b, keys, lists))
		goto fail;
	res = PyMem_Calloc(b.k.n ? b.k.n : 1, sizeof(*res));
	put_res = PyMem_Calloc(b.k.n ? b.k.n : 1, sizeof(*put_res));
	v = PyMem_Calloc(b.k.n ? b.k.n : 1, sizeof(*v));
	if (!res || !put_res || !v) {
		PyErr_NoMemory();
		goto fail;
	}
	if (b.k.n && put)
		CALL(self, r, kvc_batch_put_from(self->c, b.k.n, b.k.v, b.iov, b.n_iov, &po.o,
						 put_res));
	else if (b.k.n)
		CALL(self, r, kvc_batch_get_into(self->c, b.k.n, b.k.v, b.iov, b.n_iov, res));
	for (size_t i = 0; i < b.k.n; i++)
		v[i] = r < 0 ? r : put ? put_res[i] : res[i];
	out = int_list(v, b.k.n);
fail:
	PyMem_Free(v);
	PyMem_Free(res);
	PyMem_Free(put_res);
	biov_done(&b);
	put_opts_done(&po);
	return out;
}

static PyObject *client_batch_get_into(ClientObject *self, PyObject *args)
{
	return batch_registered(self, args, NULL, false);
}

static PyObject *client_batch_put_from(ClientObject *self, PyObject *args, PyObject *kwds)
{
	return batch_registered(self, args, kwds, true);
}

/* ---- asynchronous operations ---- */

static void slot_free(ClientObject *self, size_t i)
{
	struct async_slot *s = &self->slots[i];

	if (s->buffer) {
		((BufferObject *) s->buffer)->in_flight--;
		Py_CLEAR(s->buffer);
	}
	s->used = false;
	self->slots_used--;
}

/* submit(ops): each op is (OP_EXISTS | OP_REMOVE, key, user_data) or
 * (OP_GET_INTO | OP_PUT_FROM, key, Buffer, offset, len, user_data).
 * Returns how many were queued, or -EAGAIN when none could be. */
static PyObject *client_submit(ClientObject *self, PyObject *arg)
{
	PyObject *ops = PySequence_Tuple(arg), *out = NULL;
	struct kvc_op *v = NULL;
	size_t *slot = NULL, n, m = 0;
	int r;

	if (!ops)
		return NULL;
	n = (size_t) PyTuple_GET_SIZE(ops);
	v = PyMem_Calloc(n ? n : 1, sizeof(*v));
	slot = PyMem_Calloc(n ? n : 1, sizeof(*slot));
	if (!v || !slot) {
		PyErr_NoMemory();
		goto fail;
	}
	for (size_t next = 0; m < n; m++) {
		PyObject *t = PyTuple_GET_ITEM(ops, m), *key_o, *buf_o = NULL;
		unsigned long long ud, off = 0;
		long long len = -1;
		struct kvc_op *op = &v[m];
		BufferObject *b = NULL;
		uint64_t l = 0;
		int code;

		if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) < 1) {
			PyErr_SetString(PyExc_TypeError, "an op is a tuple");
			goto fail;
		}
		code = (int) PyLong_AsLong(PyTuple_GET_ITEM(t, 0));
		if (code == -1 && PyErr_Occurred())
			goto fail;
		if (code == KVC_OP_EXISTS || code == KVC_OP_REMOVE) {
			if (!PyArg_ParseTuple(t, "iOK;(op, key, user_data)", &code, &key_o, &ud))
				goto fail;
		} else if (code == KVC_OP_GET_INTO || code == KVC_OP_PUT_FROM) {
			if (!PyArg_ParseTuple(t, "iOOKLK;(op, key, Buffer, offset, len, user_data)",
					      &code, &key_o, &buf_o, &off, &len, &ud))
				goto fail;
			b = buffer_check(self, buf_o);
			if (!b || buffer_span(b, off, len, &l))
				goto fail;
		} else {
			PyErr_Format(PyExc_ValueError, "unknown opcode %d", code);
			goto fail;
		}
		if (key_from(key_o, &op->key))
			goto fail;
		if (self->slots_used == ASYNC_SLOTS)
			break; /* as many as libkvcache lets be in flight */
		while (self->slots[next].used)
			next = (next + 1) % ASYNC_SLOTS;
		self->slots[next] = (struct async_slot) { true, ud, b ? Py_NewRef(buf_o) : NULL };
		self->slots_used++;
		if (b)
			b->in_flight++;
		slot[m] = next;
		op->opcode = code;
		op->buf = b ? &b->b : NULL;
		op->offset = off;
		op->len = l;
		op->user_data = next;
	}
	r = m ? 0 : -EAGAIN;
	if (m)
		CALL(self, r, kvc_submit(self->c, v, m));
	for (size_t i = r < 0 ? 0 : (size_t) r; i < m; i++)
		slot_free(self, slot[i]);
	m = 0; /* all slots now belong to the queue or are free */
	out = PyLong_FromLong(r);
fail:
	for (size_t i = 0; i < m; i++)
		slot_free(self, slot[i]);
	PyMem_Free(v);
	PyMem_Free(slot);
	Py_DECREF(ops);
	return out;
}

static PyObject *completions(ClientObject *self, const struct kvc_completion *c, int n)
{
	PyObject *list = PyList_New(0);

	for (int i = 0; i < n; i++) {
		uint64_t s = c[i].user_data;
		PyObject *t;

		if (s >= ASYNC_SLOTS || !self->slots[s].used)
			continue; /* not ours */
		t = Py_BuildValue("(KL)", (unsigned long long) self->slots[s].user_data,
				  (long long) c[i].res);
		slot_free(self, s);
		if (list && (!t || PyList_Append(list, t)))
			Py_CLEAR(list);
		Py_XDECREF(t);
	}
	return list;
}

static PyObject *client_poll(ClientObject *self, PyObject *args)
{
	struct kvc_completion c[ASYNC_SLOTS];
	unsigned max = 64;
	int n;

	if (!PyArg_ParseTuple(args, "|I:poll", &max))
		return NULL;
	if (max > ASYNC_SLOTS)
		max = ASYNC_SLOTS;
	if (client_enter(self))
		return NULL;
	n = kvc_poll(self->c, c, max);
	client_leave(self);
	if (n < 0)
		return raise_kvc(n);
	return completions(self, c, n);
}

static PyObject *client_wait(ClientObject *self, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = { "min", "max", "timeout_ms", NULL };
	struct kvc_completion c[ASYNC_SLOTS];
	unsigned min = 1, max = 64;
	int timeout = -1, n;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "|IIi:wait", kwlist, &min, &max, &timeout))
		return NULL;
	if (max > ASYNC_SLOTS)
		max = ASYNC_SLOTS;
	if (max == 0 || min > max) {
		PyErr_SetString(PyExc_ValueError, "need 0 <= min <= max, max > 0");
		return NULL;
	}
	CALL(self, n, kvc_wait(self->c, c, min, max, timeout));
	if (n == -ETIMEDOUT)
		return PyList_New(0);
	if (n < 0)
		return raise_kvc(n);
	return completions(self, c, n);
fail:
	return NULL;
}

static PyObject *client_set_get_flags(ClientObject *self, PyObject *arg)
{
	unsigned long flags = PyLong_AsUnsignedLong(arg);
	uint32_t old;

	if (flags == (unsigned long) -1 && PyErr_Occurred())
		return NULL;
	if (client_enter(self))
		return NULL;
	old = kvc_set_get_flags(self->c, (uint32_t) flags);
	client_leave(self);
	return PyLong_FromUnsignedLong(old);
}

static PyObject *client_fileno(ClientObject *self, PyObject *unused)
{
	int fd;

	if (client_enter(self))
		return NULL;
	fd = kvc_completion_fd(self->c);
	client_leave(self);
	if (fd < 0)
		return raise_kvc(fd);
	return PyLong_FromLong(fd);
}

static PyObject *client_in_flight(ClientObject *self, void *unused)
{
	return PyLong_FromSize_t(self->slots_used);
}

/* ---- administration ---- */

static int dict_set(PyObject *d, const char *k, PyObject *v)
{
	int r = v ? PyDict_SetItemString(d, k, v) : -1;

	Py_XDECREF(v);
	return r;
}

static PyObject *str_or_empty(const char *s)
{
	return PyUnicode_FromString(s ? s : "");
}

static PyObject *client_status(ClientObject *self, PyObject *unused)
{
	struct kvc_status *s = NULL;
	PyObject *d = NULL, *tiers = NULL;
	int r;

	CALL(self, r, kvc_status_get(self->c, &s));
	if (r < 0)
		return raise_kvc(r);
	d = PyDict_New();
	tiers = PyList_New(0);
	if (!d || !tiers || dict_set(d, "version", str_or_empty(s->version)) ||
	    dict_set(d, "socket", str_or_empty(s->socket)) ||
	    dict_set(d, "uptime_s", PyLong_FromUnsignedLongLong(s->uptime_s)) ||
	    dict_set(d, "objects", PyLong_FromUnsignedLongLong(s->objects)) ||
	    dict_set(d, "pid", PyLong_FromUnsignedLong(s->pid)) ||
	    dict_set(d, "clients", PyLong_FromUnsignedLong(s->clients)) ||
	    dict_set(d, "hugepages", PyBool_FromLong(s->hugepages)) ||
	    dict_set(d, "protocol", Py_BuildValue("(II)", s->protocol_major, s->protocol_minor)) ||
	    dict_set(d, "recovering", PyBool_FromLong(s->recovering)))
		goto fail;
	for (size_t i = 0; i < s->n_tiers; i++) {
		const struct kvc_tier_status *t = &s->tiers[i];
		PyObject *td = Py_BuildValue("{s:s,s:K,s:K,s:K,s:K}", "name", t->name, "capacity",
					     (unsigned long long) t->capacity, "used",
					     (unsigned long long) t->used, "objects",
					     (unsigned long long) t->objects, "high_watermark",
					     (unsigned long long) t->high_watermark);

		if (!td || PyList_Append(tiers, td)) {
			Py_XDECREF(td);
			goto fail;
		}
		Py_DECREF(td);
	}
	if (PyDict_SetItemString(d, "tiers", tiers))
		goto fail;
	Py_DECREF(tiers);
	kvc_status_free(s);
	return d;
fail:
	Py_XDECREF(tiers);
	Py_XDECREF(d);
	kvc_status_free(s);
	return NULL;
}

static PyObject *client_stats(ClientObject *self, PyObject *unused)
{
	struct kvc_counter *v;
	PyObject *d;
	size_t n;
	int r;

	CALL(self, r, kvc_stats_get(self->c, &v, &n));
	if (r < 0)
		return raise_kvc(r);
	d = PyDict_New();
	for (size_t i = 0; d && i < n; i++)
		if (dict_set(d, v[i].name, PyLong_FromUnsignedLongLong(v[i].value)))
			Py_CLEAR(d);
	kvc_stats_free(v);
	return d;
fail:
	return NULL;
}

static PyObject *client_list(ClientObject *self, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = { "prefix", "limit", "exact", NULL };
	const char *prefix = NULL;
	unsigned long long limit = 0;
	struct kvc_key_info *v;
	uint64_t total;
	PyObject *list;
	int exact = 0;
	size_t n;
	int r;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "|zK$p:list", kwlist, &prefix, &limit, &exact))
		return NULL;
	if (exact && !prefix) {
		PyErr_SetString(PyExc_ValueError, "list(exact=True) needs the key");
		return NULL;
	}
	if (exact)
		CALL(self, r, kvc_list_key(self->c, prefix, &v, &n));
	else
		CALL(self, r, kvc_list(self->c, prefix, (size_t) limit, &v, &n, &total));
	if (r < 0)
		return raise_kvc(r);
	list = PyList_New(0);
	for (size_t i = 0; list && i < n; i++) {
		PyObject *d = Py_BuildValue("{s:s,s:K,s:s,s:i,s:O}", "key", v[i].key, "size",
					    (unsigned long long) v[i].size, "state",
					    v[i].state == KVC_STATE_RESERVED ? "reserved" : "committed",
					    "tier", v[i].tier, "on_disk",
					    v[i].on_disk ? Py_True : Py_False);

		if (!d || PyList_Append(list, d))
			Py_CLEAR(list);
		Py_XDECREF(d);
	}
	kvc_list_free(v);
	return list;
fail:
	return NULL;
}

static PyObject *client_pin(ClientObject *self, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = { "key", "hard", "ttl_ms", NULL };
	PyObject *key_o;
	const char *key;
	int hard = 0, r;
	unsigned ttl = 0;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|$pI:pin", kwlist, &key_o, &hard, &ttl) ||
	    key_from(key_o, &key))
		return NULL;
	CALL(self, r, kvc_pin(self->c, key, hard ? KVC_PIN_HARD : 0, ttl));
	return PyLong_FromLong(r);
fail:
	return NULL;
}

static PyObject *client_unpin(ClientObject *self, PyObject *arg)
{
	const char *key;
	int r;

	if (key_from(arg, &key))
		return NULL;
	CALL(self, r, kvc_unpin(self->c, key));
	return PyLong_FromLong(r);
fail:
	return NULL;
}

static PyObject *client_flush(ClientObject *self, PyObject *args)
{
	int timeout = -1, r;

	if (!PyArg_ParseTuple(args, "|i:flush", &timeout))
		return NULL;
	CALL(self, r, kvc_flush(self->c, timeout));
	return PyLong_FromLong(r);
fail:
	return NULL;
}

static PyObject *client_evict(ClientObject *self, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = { "tier", "bytes", "all", NULL };
	unsigned long long bytes = 0;
	uint64_t freed = 0, objects = 0;
	int tier = 0, all = 0, r;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "|iK$p:evict", kwlist, &tier, &bytes, &all))
		return NULL;
	CALL(self, r,
	     kvc_evict(self->c, tier, bytes, all ? KVC_EVICT_ALL : 0, &freed, &objects));
	if (r < 0)
		return raise_kvc(r);
	return Py_BuildValue("(KK)", (unsigned long long) freed, (unsigned long long) objects);
fail:
	return NULL;
}

static PyObject *client_where(ClientObject *self, PyObject *arg)
{
	const char *key;
	char **nodes;
	PyObject *list;
	size_t n;
	int r;

	if (key_from(arg, &key))
		return NULL;
	CALL(self, r, kvc_where(self->c, key, &nodes, &n));
	if (r == -ENOENT)
		return PyList_New(0);
	if (r < 0)
		return raise_kvc(r);
	list = PyList_New(0);
	for (size_t i = 0; list && i < n; i++) {
		PyObject *s = PyUnicode_FromString(nodes[i]);

		if (!s || PyList_Append(list, s))
			Py_CLEAR(list);
		Py_XDECREF(s);
	}
	kvc_where_free(nodes);
	return list;
fail:
	return NULL;
}

static PyObject *client_prefetch(ClientObject *self, PyObject *arg)
{
	return keys_call(self, arg, kvc_prefetch, false);
}

static PyObject *client_announce(ClientObject *self, PyObject *arg)
{
	return keys_call(self, arg, kvc_announce, false);
}

static PyObject *client_push(ClientObject *self, PyObject *args)
{
	PyObject *key_o, *node_o;
	const char *key, *node;
	int r;

	if (!PyArg_ParseTuple(args, "OO:push", &key_o, &node_o) || key_from(key_o, &key) ||
	    key_from(node_o, &node))
		return NULL;
	CALL(self, r, kvc_push(self->c, key, node));
	return PyLong_FromLong(r);
fail:
	return NULL;
}

static PyObject *client_cluster(ClientObject *self, PyObject *unused)
{
	struct kvc_cluster *v;
	PyObject *d = NULL, *masters = NULL, *nodes = NULL;
	int r;

	CALL(self, r, kvc_cluster_get(self->c, &v));
	if (r < 0)
		return raise_kvc(r);
	masters = PyList_New(0);
	nodes = PyList_New(0);
	for (size_t i = 0; masters && i < v->n_masters; i++) {
		PyObject *s = PyUnicode_FromString(v->masters[i]);

		if (!s || PyList_Append(masters, s))
			Py_CLEAR(masters);
		Py_XDECREF(s);
	}
	for (size_t i = 0; nodes && i < v->n_nodes; i++) {
		const struct kvc_node *x = &v->nodes[i];
		PyObject *nd = Py_BuildValue("{s:s,s:s,s:s,s:s,s:K,s:K,s:K}", "id", x->id, "address",
					     x->address ? x->address : "", "state", x->state,
					     "transport", x->transport, "capacity",
					     (unsigned long long) x->capacity, "used",
					     (unsigned long long) x->used, "objects",
					     (unsigned long long) x->objects);

		if (!nd || PyList_Append(nodes, nd))
			Py_CLEAR(nodes);
		Py_XDECREF(nd);
	}
	if (masters && nodes)
		d = Py_BuildValue("{s:s,s:O,s:n,s:O}", "self", v->self ? v->self : "", "masters",
				  masters, "masters_up", (Py_ssize_t) v->masters_up, "nodes", nodes);
	Py_XDECREF(masters);
	Py_XDECREF(nodes);
	kvc_cluster_free(v);
	return d;
fail:
	return NULL;
}

static PyMethodDef client_methods[] = {
	{ "close", (PyCFunction) client_close, METH_NOARGS,
	  "Disconnect (BufferError while views, reservations or buffers live)." },
	{ "__enter__", client_enter_ctx, METH_NOARGS, NULL },
	{ "__exit__", (PyCFunction) client_exit_ctx, METH_VARARGS, NULL },
	{ "segments", (PyCFunction) client_segments, METH_NOARGS,
	  "[(address, length)] of the daemon memory this client maps." },
	{ "register_memory", (PyCFunction) client_register, METH_VARARGS,
	  "register_memory(ptr, size) -> 0, -EFAULT (not readable and writable host memory), "
	  "-EEXIST (overlaps another range)." },
	{ "unregister_memory", (PyCFunction) client_unregister, METH_VARARGS,
	  "unregister_memory(ptr) -> 0 or -ENOENT." },
	{ "put", (PyCFunction) (void (*)(void)) client_put, METH_VARARGS | METH_KEYWORDS,
	  "put(key, value, *, replace=False, pin=None, pin_ttl_ms=0, parent=None, tier=0, "
	  "push_to=None) -> 0 or -errno." },
	{ "get", (PyCFunction) client_get, METH_O, "get(key) -> bytes, or None on a miss." },
	{ "exists", (PyCFunction) client_exists, METH_O, "exists(key) -> bool." },
	{ "batch_exists", (PyCFunction) client_batch_exists, METH_O,
	  "batch_exists(keys) -> [bool]." },
	{ "prefix_lookup", (PyCFunction) client_prefix_lookup, METH_O,
	  "prefix_lookup(keys) -> how many are present before the first miss." },
	{ "remove", (PyCFunction) (void (*)(void)) client_remove, METH_VARARGS | METH_KEYWORDS,
	  "remove(key, *, force=False) -> 0, -ENOENT, -EBUSY." },
	{ "remove_prefix", (PyCFunction) (void (*)(void)) client_remove_prefix,
	  METH_VARARGS | METH_KEYWORDS,
	  "remove_prefix(prefix=None, *, force=False) -> (removed, skipped)." },
	{ "reserve", (PyCFunction) (void (*)(void)) client_reserve, METH_VARARGS | METH_KEYWORDS,
	  "reserve(key, size, **put_opts) -> Reservation." },
	{ "acquire", (PyCFunction) client_acquire, METH_O,
	  "acquire(key) -> View, or None on a miss." },
	{ "batch_put_from_multi_buffers", (PyCFunction) (void (*)(void)) client_batch_put_mb,
	  METH_VARARGS | METH_KEYWORDS,
	  "batch_put_from_multi_buffers(keys, ptr_lists, size_lists, **put_opts) -> [0 or "
	  "-errno]; chain=True: keys[i]'s parent is keys[i - 1], keys[0]'s is parent." },
	{ "batch_get_into_multi_buffers", (PyCFunction) client_batch_get_mb, METH_VARARGS,
	  "batch_get_into_multi_buffers(keys, ptr_lists, size_lists) -> [length or -errno]." },
	{ "buffer_alloc", (PyCFunction) client_buffer_alloc, METH_VARARGS,
	  "buffer_alloc(size) -> Buffer." },
	{ "get_into", (PyCFunction) client_get_into, METH_VARARGS,
	  "get_into(key, buf, offset=0, cap=-1) -> length or -errno." },
	{ "put_from", (PyCFunction) (void (*)(void)) client_put_from, METH_VARARGS | METH_KEYWORDS,
	  "put_from(key, buf, offset=0, size=-1, **put_opts) -> 0 or -errno." },
	{ "batch_get_into", (PyCFunction) client_batch_get_into, METH_VARARGS,
	  "batch_get_into(keys, iov_lists) -> [length or -errno]; iov = (Buffer, offset, len)." },
	{ "batch_put_from", (PyCFunction) (void (*)(void)) client_batch_put_from,
	  METH_VARARGS | METH_KEYWORDS,
	  "batch_put_from(keys, iov_lists, **put_opts) -> [0 or -errno]." },
	{ "submit", (PyCFunction) client_submit, METH_O,
	  "submit(ops) -> how many were queued, or -EAGAIN." },
	{ "poll", (PyCFunction) client_poll, METH_VARARGS,
	  "poll(max=64) -> [(user_data, result)] ready now." },
	{ "wait", (PyCFunction) (void (*)(void)) client_wait, METH_VARARGS | METH_KEYWORDS,
	  "wait(min=1, max=64, timeout_ms=-1) -> [(user_data, result)]." },
	{ "set_get_flags", (PyCFunction) client_set_get_flags, METH_O,
	  "set_get_flags(LOCAL_ONLY | PEEK, or 0) -> the previous flags: where lookups and gets\n"
	  "look (LOCAL_ONLY), and whether lookups only look, granting no lease (PEEK)." },
	{ "fileno", (PyCFunction) client_fileno, METH_NOARGS,
	  "A file descriptor readable while completions wait to be reaped (poll/wait), for "
	  "select, epoll or asyncio's add_reader." },
	{ "status", (PyCFunction) client_status, METH_NOARGS, "The daemon's status as a dict." },
	{ "stats", (PyCFunction) client_stats, METH_NOARGS, "Counters by name." },
	{ "list", (PyCFunction) (void (*)(void)) client_list, METH_VARARGS | METH_KEYWORDS,
	  "list(prefix=None, limit=0, *, exact=False) -> [dict]: keys starting with prefix, or\n"
	  "with exact, the key prefix names alone (found, not walked for)." },
	{ "pin", (PyCFunction) (void (*)(void)) client_pin, METH_VARARGS | METH_KEYWORDS,
	  "pin(key, *, hard=False, ttl_ms=0) -> 0 or -errno." },
	{ "unpin", (PyCFunction) client_unpin, METH_O, "unpin(key) -> 0 or -errno." },
	{ "flush", (PyCFunction) client_flush, METH_VARARGS, "flush(timeout_ms=-1) -> 0 or -errno." },
	{ "evict", (PyCFunction) (void (*)(void)) client_evict, METH_VARARGS | METH_KEYWORDS,
	  "evict(tier=0, bytes=0, *, all=False) -> (bytes, objects)." },
	{ "where", (PyCFunction) client_where, METH_O, "where(key) -> [node id]." },
	{ "prefetch", (PyCFunction) client_prefetch, METH_O,
	  "prefetch(keys) -> fetches started or joined." },
	{ "push", (PyCFunction) client_push, METH_VARARGS, "push(key, node_id) -> 0 or -errno." },
	{ "announce", (PyCFunction) client_announce, METH_O,
	  "announce(keys) -> how many: these keys will be stored soon; lookups wait for them." },
	{ "cluster", (PyCFunction) client_cluster, METH_NOARGS, "The cluster as a dict." },
	{ NULL },
};

static PyGetSetDef client_getset[] = {
	{ "closed", (getter) client_closed, NULL, "True once closed.", NULL },
	{ "socket", (getter) client_socket, NULL, "The daemon's socket path.", NULL },
	{ "reconnects", (getter) client_reconnects, NULL,
	  "Times the client connected again after the daemon went (a restart, or\n"
	  "kvcachectl upgrade).", NULL },
	{ "in_flight", (getter) client_in_flight, NULL, "Asynchronous operations not reaped.",
	  NULL },
	{ NULL },
};

PyTypeObject Client_Type = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "kvcache._kvcache.Client",
	.tp_basicsize = sizeof(ClientObject),
	.tp_dealloc = (destructor) client_dealloc,
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "Client(socket=None): a connection to the node's kvcached.",
	.tp_methods = client_methods,
	.tp_getset = client_getset,
	.tp_new = client_new,
};

/* ---- the module ---- */

static void after_fork_in_child(void)
{
	kvcpy_fork_gen++;
}

static PyObject *mod_strerror(PyObject *m, PyObject *arg)
{
	long r = PyLong_AsLong(arg);

	if (r == -1 && PyErr_Occurred())
		return NULL;
	return PyUnicode_FromString(kvc_strerror((int) r));
}

static PyObject *mod_parse_size(PyObject *m, PyObject *arg)
{
	const char *s = PyUnicode_AsUTF8(arg);
	uint64_t v;

	if (!s)
		return NULL;
	if (kvc_parse_size(s, &v) < 0) {
		PyErr_Format(PyExc_ValueError, "not a size: %s", s);
		return NULL;
	}
	return PyLong_FromUnsignedLongLong(v);
}

static PyObject *mod_socket_path(PyObject *m, PyObject *args)
{
	const char *path = NULL;
	char buf[4096];
	int r;

	if (!PyArg_ParseTuple(args, "|z:socket_path", &path))
		return NULL;
	r = kvc_socket_path(path, buf, sizeof(buf));
	if (r < 0)
		return raise_kvc(r);
	return PyUnicode_FromString(buf);
}

static PyMethodDef module_methods[] = {
	{ "strerror", mod_strerror, METH_O, "strerror(-errno) -> libkvcache's explanation." },
	{ "parse_size", mod_parse_size, METH_O, "parse_size('512MB') -> bytes." },
	{ "socket_path", mod_socket_path, METH_VARARGS,
	  "socket_path(path=None) -> the socket Client(path) connects to." },
	{ NULL },
};

static struct PyModuleDef module_def = {
	PyModuleDef_HEAD_INIT,
	.m_name = "kvcache._kvcache",
	.m_doc = "The CPython binding of libkvcache.",
	.m_size = -1,
	.m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__kvcache(void);

PyMODINIT_FUNC PyInit__kvcache(void)
{
	static const struct {
		const char *name;
		long v;
	} consts[] = {
		{ "TIER_DEFAULT", KVC_TIER_DEFAULT }, { "TIER_DEVICE", KVC_TIER_DEVICE },
		{ "TIER_DRAM", KVC_TIER_DRAM },       { "TIER_DISK", KVC_TIER_DISK },
		{ "OP_GET_INTO", KVC_OP_GET_INTO },   { "OP_PUT_FROM", KVC_OP_PUT_FROM },
		{ "OP_EXISTS", KVC_OP_EXISTS },       { "OP_REMOVE", KVC_OP_REMOVE },
		{ "KEY_MAX", KVC_KEY_MAX },           { "ASYNC_MAX", ASYNC_SLOTS },
		{ "LOCAL_ONLY", KVC_LOCAL_ONLY },     { "PEEK", KVC_PEEK },
	};
	static bool atfork;
	PyTypeObject *types[] = { &Client_Type, &View_Type, &Reservation_Type, &Buffer_Type };
	PyObject *m;

	for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
		if (PyType_Ready(types[i]) < 0)
			return NULL;
	m = PyModule_Create(&module_def);
	if (!m)
		return NULL;
	for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
		if (PyModule_AddType(m, types[i]) < 0)
			goto fail;
	for (size_t i = 0; i < sizeof(consts) / sizeof(consts[0]); i++)
		if (PyModule_AddIntConstant(m, consts[i].name, consts[i].v) < 0)
			goto fail;
	if (PyModule_AddIntConstant(m, "VALUE_MAX", (long) KVC_VALUE_MAX) < 0)
		goto fail;
	if (!atfork) {
		pthread_atfork(NULL, NULL, after_fork_in_child);
		atfork = true;
	}
	return m;
fail:
	Py_DECREF(m);
	return NULL;
}
