/* SPDX-License-Identifier: MIT */
/*
 * The objects that hand out daemon memory: View (read-only, pins an
 * object), Reservation (writable, becomes an object at commit) and Buffer
 * (a registered buffer both sides map).  Each one exports its bytes through
 * the buffer protocol and counts the exports: while a memoryview (or a
 * numpy array, or a memoryview a tensor holds) is alive, release(),
 * commit(), abort() and free() are refused with BufferError, so no Python
 * object ever points at memory given back.  Each holds its Client, so the
 * mapping outlives them.
 */
#include <errno.h>
#include <string.h>

#include "ext.h"

/* ---- what the three share ---- */

static const char *what(ExporterObject *e)
{
	if (Py_IS_TYPE(e, &View_Type))
		return "view";
	if (Py_IS_TYPE(e, &Reservation_Type))
		return "reservation";
	return "buffer";
}

static int not_done(ExporterObject *e)
{
	if (e->done) {
		PyErr_Format(PyExc_ValueError, "the %s was already given back", what(e));
		return -1;
	}
	return 0;
}

static ExporterObject *exp_new(ClientObject *client, PyTypeObject *type, void *data, size_t len,
			       bool readonly)
{
	ExporterObject *e = (ExporterObject *) PyObject_Malloc(type->tp_basicsize);

	if (!e) {
		PyErr_NoMemory();
		return NULL;
	}
	memset(e, 0, type->tp_basicsize);
	PyObject_Init((PyObject *) e, type);
	e->client = (ClientObject *) Py_NewRef(client);
	e->data = data;
	e->len = len;
	e->readonly = readonly;
	client->exports++;
	return e;
}

/* Give the memory back through fn (called without the GIL): refused while
 * exports live.  Returns fn's result, or INT_MIN with an exception set. */
static int exp_finish(ExporterObject *e, int (*fn)(ExporterObject *))
{
	int r;

	if (not_done(e))
		return INT_MIN;
	if (e->exports > 0) {
		PyErr_Format(PyExc_BufferError, "%zd exported views still alive", e->exports);
		return INT_MIN;
	}
	if (client_enter(e->client))
		return INT_MIN;
	Py_BEGIN_ALLOW_THREADS
	r = fn(e);
	Py_END_ALLOW_THREADS
	client_leave(e->client);
	e->done = true;
	e->client->exports--;
	return r;
}

/* No export can be alive here: each one holds a reference. */
static void exp_dealloc(ExporterObject *e, int (*fn)(ExporterObject *))
{
	if (!e->done) {
		if (client_enter(e->client) == 0) {
			Py_BEGIN_ALLOW_THREADS
			fn(e);
			Py_END_ALLOW_THREADS
			client_leave(e->client);
		}
		PyErr_Clear(); /* a closed or forked-away client: nothing to give back */
		e->client->exports--;
	}
	Py_DECREF(e->client);
	PyObject_Free(e);
}

static int exp_getbuffer(ExporterObject *e, Py_buffer *view, int flags)
{
	if (e->done) {
		PyErr_Format(PyExc_BufferError, "the %s was already given back", what(e));
		return -1;
	}
	if (PyBuffer_FillInfo(view, (PyObject *) e, e->data, (Py_ssize_t) e->len, e->readonly,
			      flags) < 0)
		return -1;
	e->exports++;
	return 0;
}

static void exp_releasebuffer(ExporterObject *e, Py_buffer *view)
{
	e->exports--;
}

static PyObject *exp_memoryview(PyObject *self, PyObject *unused)
{
	return PyMemoryView_FromObject(self);
}

static PyObject *exp_enter(PyObject *self, PyObject *unused)
{
	return Py_NewRef(self);
}

static PyObject *exp_size(ExporterObject *e, void *unused)
{
	return PyLong_FromSize_t(e->len);
}

static PyObject *exp_ptr(ExporterObject *e, void *unused)
{
	if (not_done(e))
		return NULL;
	return PyLong_FromVoidPtr(e->data);
}

static PyObject *exp_released(ExporterObject *e, void *unused)
{
	return PyBool_FromLong(e->done);
}

static Py_ssize_t exp_len(ExporterObject *e)
{
	return (Py_ssize_t) e->len;
}

/* Copy between [data + offset, +size) and the caller's memory: an int
 * address inside registered memory, or an object with the buffer protocol.
 * Returns size, or -EFAULT for an address outside registered memory;
 * raises for programming errors. */
static PyObject *exp_copy(ExporterObject *e, PyObject *args, bool into_daemon, const char *fmt)
{
	unsigned long long offset, size;
	PyObject *o;
	Py_buffer b = { 0 };
	uint8_t *base = e->data;
	void *p;

	if (not_done(e) || !PyArg_ParseTuple(args, fmt, &offset, &o, &size))
		return NULL;
	if (offset > e->len || size > e->len - offset) {
		PyErr_Format(PyExc_ValueError, "[%llu, +%llu) is outside %zu bytes", offset, size,
			     e->len);
		return NULL;
	}
	if (PyLong_Check(o)) {
		unsigned long long a = PyLong_AsUnsignedLongLong(o);

		if (a == (unsigned long long) -1 && PyErr_Occurred()) {
			if (!PyErr_ExceptionMatches(PyExc_OverflowError))
				return NULL;
			PyErr_Clear();
			return PyLong_FromLong(-EFAULT);
		}
		if (!client_range_ok(e->client, (uintptr_t) a, (size_t) size))
			return PyLong_FromLong(-EFAULT);
		p = (void *) (uintptr_t) a;
	} else {
		if (PyObject_GetBuffer(o, &b, into_daemon ? PyBUF_SIMPLE : PyBUF_WRITABLE))
			return NULL;
		if ((unsigned long long) b.len < size) {
			PyBuffer_Release(&b);
			PyErr_SetString(PyExc_ValueError, "the buffer is shorter than size");
			return NULL;
		}
		p = b.buf;
	}
	Py_BEGIN_ALLOW_THREADS
	if (into_daemon)
		memcpy(base + offset, p, (size_t) size);
	else
		memcpy(p, base + offset, (size_t) size);
	Py_END_ALLOW_THREADS
	if (b.obj)
		PyBuffer_Release(&b);
	return PyLong_FromUnsignedLongLong(size);
}

static PyGetSetDef exp_getset[] = {
	{ "size", (getter) exp_size, NULL, "Length in bytes.", NULL },
	{ "ptr", (getter) exp_ptr, NULL, "Address of the first byte (for device copies).", NULL },
	{ "released", (getter) exp_released, NULL, "True once given back.", NULL },
	{ NULL },
};

static PyBufferProcs exp_as_buffer = {
	.bf_getbuffer = (getbufferproc) exp_getbuffer,
	.bf_releasebuffer = (releasebufferproc) exp_releasebuffer,
};

static PySequenceMethods exp_as_sequence = {
	.sq_length = (lenfunc) exp_len,
};

#define EXPORTER_TYPE(name, type, object, dealloc, methods, doc) \
	PyTypeObject type = {                                 \
		PyVarObject_HEAD_INIT(NULL, 0)                \
		.tp_name = "kvcache._kvcache." name,          \
		.tp_basicsize = sizeof(object),                \
		.tp_dealloc = (destructor) dealloc,           \
		.tp_as_buffer = &exp_as_buffer,               \
		.tp_as_sequence = &exp_as_sequence,           \
		.tp_flags = Py_TPFLAGS_DEFAULT,               \
		.tp_doc = doc,                                \
		.tp_methods = methods,                        \
		.tp_getset = exp_getset,                      \
	}

/* ---- View ---- */

static int view_give_back(ExporterObject *e)
{
	return kvc_release(e->client->c, &((ViewObject *) e)->v);
}

PyObject *view_new(ClientObject *client, const struct kvc_view *v)
{
	ViewObject *self = (ViewObject *) exp_new(client, &View_Type, (void *) v->data, v->len,
						  true);

	if (!self) {
		struct kvc_view copy = *v;

		kvc_release(client->c, &copy);
		return NULL;
	}
	self->v = *v;
	return (PyObject *) self;
}

static PyObject *view_release(ExporterObject *self, PyObject *unused)
{
	int r;

	if (self->done)
		Py_RETURN_NONE;
	r = exp_finish(self, view_give_back);
	if (r == INT_MIN)
		return NULL;
	if (r < 0 && r != -ECONNRESET)
		return raise_kvc(r);
	Py_RETURN_NONE;
}

static void view_dealloc(ExporterObject *self)
{
	exp_dealloc(self, view_give_back);
}

static PyObject *view_bytes(ExporterObject *self, PyObject *unused)
{
	if (not_done(self))
		return NULL;
	return PyBytes_FromStringAndSize(self->data, (Py_ssize_t) self->len);
}

static PyObject *view_read_into(ExporterObject *self, PyObject *args)
{
	return exp_copy(self, args, false, "KOK:read_into");
}

static PyMethodDef view_methods[] = {
	{ "release", (PyCFunction) view_release, METH_NOARGS,
	  "Unpin the object (BufferError while memoryviews of it live)." },
	{ "memoryview", exp_memoryview, METH_NOARGS,
	  "A read-only memoryview; wrap it for torch: torch.frombuffer(v.memoryview(), ...)." },
	{ "tobytes", (PyCFunction) view_bytes, METH_NOARGS, "A copy of the bytes." },
	{ "read_into", (PyCFunction) view_read_into, METH_VARARGS,
	  "read_into(offset, dst, size): copy [offset, +size) of the object to dst (a "
	  "registered address or a writable buffer); size or -EFAULT." },
	{ "__enter__", exp_enter, METH_NOARGS, NULL },
	{ "__exit__", (PyCFunction) view_release, METH_VARARGS, NULL },
	{ NULL },
};

EXPORTER_TYPE("View", View_Type, ViewObject, view_dealloc, view_methods,
	      "A pinned, read-only view of a stored object (Client.acquire()).");

/* ---- Reservation ---- */

static int res_commit_fn(ExporterObject *e)
{
	return kvc_commit(e->client->c, &((ReservationObject *) e)->b);
}

static int res_abort_fn(ExporterObject *e)
{
	return kvc_abort(e->client->c, &((ReservationObject *) e)->b);
}

PyObject *reservation_new(ClientObject *client, const struct kvc_buf *b)
{
	ReservationObject *self = (ReservationObject *) exp_new(client, &Reservation_Type, b->data,
								b->len, false);

	if (!self) {
		struct kvc_buf copy = *b;

		kvc_abort(client->c, &copy);
		return NULL;
	}
	self->b = *b;
	return (PyObject *) self;
}

static PyObject *res_commit(ExporterObject *self, PyObject *unused)
{
	int r = exp_finish(self, res_commit_fn);

	return r == INT_MIN ? NULL : PyLong_FromLong(r);
}

static PyObject *res_abort(ExporterObject *self, PyObject *unused)
{
	int r = exp_finish(self, res_abort_fn);

	return r == INT_MIN ? NULL : PyLong_FromLong(r);
}

static void res_dealloc(ExporterObject *self)
{
	exp_dealloc(self, res_abort_fn);
}

/* Leaving a with block commits, or aborts on an exception; a failed commit
 * raises. */
static PyObject *res_exit(ExporterObject *self, PyObject *args)
{
	PyObject *type = PyTuple_Size(args) > 0 ? PyTuple_GetItem(args, 0) : Py_None;
	int r;

	if (self->done)
		Py_RETURN_FALSE;
	r = exp_finish(self, type == Py_None ? res_commit_fn : res_abort_fn);
	if (r == INT_MIN)
		return NULL;
	if (type == Py_None && r < 0)
		return raise_kvc(r);
	Py_RETURN_FALSE;
}

static PyObject *res_write_from(ExporterObject *self, PyObject *args)
{
	return exp_copy(self, args, true, "KOK:write_from");
}

static PyMethodDef res_methods[] = {
	{ "commit", (PyCFunction) res_commit, METH_NOARGS,
	  "Make the object visible: 0 or -errno (-EEXIST: committed by another meanwhile)." },
	{ "abort", (PyCFunction) res_abort, METH_NOARGS, "Give the space back: 0 or -errno." },
	{ "write_from", (PyCFunction) res_write_from, METH_VARARGS,
	  "write_from(offset, src, size): copy size bytes of src (a registered address or a "
	  "buffer) to [offset, +size); size or -EFAULT." },
	{ "memoryview", exp_memoryview, METH_NOARGS, "A writable memoryview." },
	{ "__enter__", exp_enter, METH_NOARGS, NULL },
	{ "__exit__", (PyCFunction) res_exit, METH_VARARGS, NULL },
	{ NULL },
};

EXPORTER_TYPE("Reservation", Reservation_Type, ReservationObject, res_dealloc, res_methods,
	      "Writable space for a new object (Client.reserve()); commit() or abort().");

/* ---- Buffer ---- */

static int buf_free_fn(ExporterObject *e)
{
	return kvc_buffer_free(e->client->c, &((BufferObject *) e)->b);
}

PyObject *buffer_new(ClientObject *client, const struct kvc_buffer *b)
{
	BufferObject *self = (BufferObject *) exp_new(client, &Buffer_Type, b->data, b->len, false);

	if (!self) {
		struct kvc_buffer copy = *b;

		kvc_buffer_free(client->c, &copy);
		return NULL;
	}
	self->b = *b;
	return (PyObject *) self;
}

BufferObject *buffer_check(ClientObject *client, PyObject *o)
{
	BufferObject *b;

	if (!PyObject_TypeCheck(o, &Buffer_Type)) {
		PyErr_Format(PyExc_TypeError, "expected a kvcache Buffer, not %.100s",
			     Py_TYPE(o)->tp_name);
		return NULL;
	}
	b = (BufferObject *) o;
	if (b->e.client != client) {
		PyErr_SetString(PyExc_ValueError, "the Buffer belongs to another Client");
		return NULL;
	}
	if (not_done(&b->e))
		return NULL;
	return b;
}

static PyObject *buf_free(ExporterObject *self, PyObject *unused)
{
	Py_ssize_t in_flight = ((BufferObject *) self)->in_flight;
	int r;

	if (self->done)
		Py_RETURN_NONE;
	if (in_flight > 0) {
		PyErr_Format(PyExc_BufferError, "%zd operations still use the buffer", in_flight);
		return NULL;
	}
	r = exp_finish(self, buf_free_fn);
	if (r == INT_MIN)
		return NULL;
	if (r < 0 && r != -ECONNRESET)
		return raise_kvc(r);
	Py_RETURN_NONE;
}

/* operations in flight hold a reference, so none is left here */
static void buf_dealloc(ExporterObject *self)
{
	exp_dealloc(self, buf_free_fn);
}

static PyMethodDef buf_methods[] = {
	{ "free", (PyCFunction) buf_free, METH_NOARGS,
	  "Unregister and unmap (BufferError while views or operations use it)." },
	{ "memoryview", exp_memoryview, METH_NOARGS, "A writable memoryview." },
	{ "__enter__", exp_enter, METH_NOARGS, NULL },
	{ "__exit__", (PyCFunction) buf_free, METH_VARARGS, NULL },
	{ NULL },
};

EXPORTER_TYPE("Buffer", Buffer_Type, BufferObject, buf_dealloc, buf_methods,
	      "Memory the client and the daemon both map (Client.buffer_alloc()); the daemon "
	      "copies into and out of it.");
