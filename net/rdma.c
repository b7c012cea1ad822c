/* SPDX-License-Identifier: MIT */
/* One-sided RDMA through UCX: see rdma.h. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <ucm/api/ucm.h>
#include <ucp/api/ucp.h>
#include <ucs/config/global_opts.h>

#include "clock.h"
#include "rdma.h"

#define PEER_NAME_MAX 256
/* a worker address or an rkey from a peer is copied behind this much
 * zeroed room: UCX parses them without being told their length */
#define BLOB_PAD 4096

struct region {
	bool used;
	uint8_t *base;
	uint64_t size;
	ucp_mem_h memh;
	void *rkey_buf;
	size_t rkey_len;
};

struct rpeer {
	struct rpeer *next;
	char name[PEER_NAME_MAX];
	ucp_ep_h ep;
	bool failed;
	unsigned busy; /* transfers in flight on ep */
	void *worker;  /* the address ep was made from */
	size_t worker_len;
	struct {
		bool used;
		uint64_t addr, size;
		ucp_rkey_h rkey;
	} reg[RDMA_MAX_REGIONS];
};

enum cmd_kind { C_REGISTER, C_PEER_SET, C_PEER_DROP, C_GET, C_PUT, C_ABORT };

struct cmd {
	struct cmd *next;
	enum cmd_kind kind;
	const char *peer;
	/* C_REGISTER */
	uint32_t id;
	void *base;
	uint64_t size;
	/* C_PEER_SET */
	const void *worker;
	size_t worker_len;
	const struct rdma_region *regions;
	unsigned n;
	/* C_GET, C_PUT */
	uint32_t rid, lid;
	uint64_t roff, loff, len;
	/* C_ABORT */
	struct cmd *victim;
	/* state, under r->lock once queued */
	struct rdma *r;
	struct rpeer *p;
	void *req;
	bool flushing, issued, done;
	int res;
	char *err;
};

/*
 * Two workers: w makes the endpoints and starts every transfer; w_in is
 * the one peers are told of, the target of their transfers.  With a single
 * worker, two nodes that both make endpoints to each other (one fetches,
 * the other pushes) have UCX match the endpoints into one pair, and on its
 * tcp transport transfers on the matched pair were seen to hang.
 */
struct rdma {
	ucp_context_h ctx;
	ucp_worker_h w, w_in;
	ucp_address_t *addr; /* w_in's */
	size_t addr_len;
	int efd, efd_in, bell;
	pthread_t th;
	bool started;
	pthread_mutex_t lock;
	pthread_cond_t cond; /* CLOCK_MONOTONIC */
	struct cmd *q, **q_tail;
	bool stop;
	struct region regs[RDMA_MAX_REGIONS];
	struct rpeer *peers;  /* the worker thread's */
	struct rpeer *closed; /* replaced, with transfers still ending */
	char device[64];
	bool over_tcp;
	struct rdma_stats st;
};

bool rdma_built(void)
{
	return true;
}

/* ---- devices ---- */

static bool listed(const char *names, const char *name)
{
	size_t n = strlen(name);

	if (!names || !names[0])
		return true;
	for (const char *p = names; *p;) {
		const char *end = strchr(p, ',');
		size_t k = end ? (size_t) (end - p) : strlen(p);
		const char *colon = memchr(p, ':', k);
		size_t base = colon ? (size_t) (colon - p) : k; /* "mlx5_0:1" names mlx5_0 */

		if (base == n && !memcmp(p, name, n))
			return true;
		p += k + (end ? 1 : 0);
	}
	return false;
}

int rdma_active_devices(const char *devices, char *first, size_t cap)
{
	int n_dev = 0, active = 0;
	struct ibv_device **list = ibv_get_device_list(&n_dev);

	if (first && cap)
		first[0] = '\0';
	if (!list)
		return 0; /* no RDMA in this kernel: none */
	for (int i = 0; i < n_dev; i++) {
		const char *name = ibv_get_device_name(list[i]);
		struct ibv_context *c;
		struct ibv_device_attr a;

		if (!name || !listed(devices, name) || !(c = ibv_open_device(list[i])))
			continue;
		if (ibv_query_device(c, &a) == 0)
			for (uint8_t port = 1; port <= a.phys_port_cnt; port++) {
				struct ibv_port_attr pa;

				if (ibv_query_port(c, port, &pa) || pa.state != IBV_PORT_ACTIVE)
					continue;
				if (!active && first && cap)
					snprintf(first, cap, "%s:%u", name, port);
				active++;
			}
		ibv_close_device(c);
	}
	ibv_free_device_list(list);
	return active;
}

/* ---- the worker thread ---- */

static int status_errno(ucs_status_t s)
{
	switch (s) {
	case UCS_OK:
		return 0;
	case UCS_ERR_CANCELED:
	case UCS_ERR_TIMED_OUT:
	case UCS_ERR_ENDPOINT_TIMEOUT:
		return -ETIMEDOUT;
	case UCS_ERR_CONNECTION_RESET:
	case UCS_ERR_UNREACHABLE:
	case UCS_ERR_REJECTED:
		return -ECONNRESET;
	case UCS_ERR_NO_MEMORY:
		return -ENOMEM;
	case UCS_ERR_INVALID_PARAM:
	case UCS_ERR_INVALID_ADDR:
		return -EINVAL;
	default:
		return -EIO;
	}
}

/* Under r->lock. */
static void finish(struct rdma *r, struct cmd *c, int res)
{
	if (c->done)
		return;
	c->res = res;
	c->done = true;
	if (c->kind == C_GET || c->kind == C_PUT) {
		if (res == 0 && c->kind == C_GET) {
			r->st.gets++;
			r->st.get_bytes += c->len;
		} else if (res == 0) {
			r->st.puts++;
			r->st.put_bytes += c->len;
		} else if (res == -ETIMEDOUT)
			r->st.timeouts++;
		else
			r->st.errors++;
	}
	pthread_cond_broadcast(&r->cond);
}

static struct rpeer *peer_find(struct rdma *r, const char *name)
{
	for (struct rpeer *p = r->peers; p; p = p->next)
		if (!strcmp(p->name, name))
			return p;
	return NULL;
}

/* Close the endpoint now: transfers on it end (with an error) as UCX
 * lets go of them, during the next progress calls. */
static void ep_close(struct rdma *r, struct rpeer *p)
{
	ucp_request_param_t prm = { .op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
				    .flags = UCP_EP_CLOSE_FLAG_FORCE };
	void *req;

	if (!p->ep)
		return;
	req = ucp_ep_close_nbx(p->ep, &prm);
	p->ep = NULL;
	p->failed = true;
	if (UCS_PTR_IS_PTR(req)) {
		while (ucp_request_check_status(req) == UCS_INPROGRESS)
			ucp_worker_progress(r->w);
		ucp_request_free(req);
	}
}

static void peer_free(struct rdma *r, struct rpeer *p)
{
	for (unsigned i = 0; i < RDMA_MAX_REGIONS; i++)
		if (p->reg[i].rkey)
			ucp_rkey_destroy(p->reg[i].rkey);
	ep_close(r, p);
	free(p->worker);
	free(p);
}

/* The peer as c describes it is the one known already (another connection
 * to the same daemon): nothing to replace. */
static bool peer_same(const struct rpeer *p, const struct cmd *c)
{
	if (!p || p->failed || !p->ep || p->worker_len != c->worker_len ||
	    memcmp(p->worker, c->worker, c->worker_len))
		return false;
	for (unsigned i = 0; i < c->n; i++) {
		const struct rdma_region *g = &c->regions[i];

		if (g->id >= RDMA_MAX_REGIONS || !p->reg[g->id].used ||
		    p->reg[g->id].addr != g->addr || p->reg[g->id].size != g->size)
			return false;
	}
	return true;
}

static void ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
	struct rpeer *p = arg;

	(void) ep;
	(void) status;
	p->failed = true; /* closed after this progress call */
}

static void op_done(void *request, ucs_status_t status, void *user_data);

/* Issue (or, for a put, flush) c; under r->lock. */
static void issue(struct rdma *r, struct cmd *c)
{
	struct rpeer *p = c->p;
	struct region *lr = &r->regs[c->lid];
	ucp_request_param_t prm = {
		.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
		.cb.send = op_done,
		.user_data = c,
	};
	void *req;

	if (!c->flushing) {
		prm.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
		prm.memh = lr->memh;
		if (c->kind == C_GET)
			req = ucp_get_nbx(p->ep, lr->base + c->loff, c->len,
					  p->reg[c->rid].addr + c->roff, p->reg[c->rid].rkey, &prm);
		else
			req = ucp_put_nbx(p->ep, lr->base + c->loff, c->len,
					  p->reg[c->rid].addr + c->roff, p->reg[c->rid].rkey, &prm);
	} else
		req = ucp_ep_flush_nbx(p->ep, &prm);
	if (UCS_PTR_IS_ERR(req)) {
		p->busy--;
		finish(r, c, status_errno(UCS_PTR_STATUS(req)));
		return;
	}
	if (req) {
		c->req = req;
		return;
	}
	/* done at once */
	if (c->kind == C_PUT && !c->flushing) {
		c->flushing = true;
		issue(r, c);
		return;
	}
	p->busy--;
	finish(r, c, 0);
}

/* UCX calls this from ucp_worker_progress, on the worker thread, which
 * holds r->lock around progress. */
static void op_done(void *request, ucs_status_t status, void *user_data)
{
	struct cmd *c = user_data;
	struct rdma *r = c->r;

	ucp_request_free(request);
	c->req = NULL;
	if (status == UCS_OK && c->kind == C_PUT && !c->flushing && c->p->ep) {
		c->flushing = true;
		issue(r, c);
		return;
	}
	c->p->busy--;
	finish(r, c, status_errno(status));
}

/* A peer's rkey, checked for the shape UCX will read: md map, memory
 * type, then one length-prefixed key per bit of the map. */
static bool rkey_shape_ok(const uint8_t *b, size_t len)
{
	uint64_t map;
	size_t off = sizeof(map) + 1;

	if (len < off)
		return false;
	memcpy(&map, b, sizeof(map));
	if (b[sizeof(map)] >= UCS_MEMORY_TYPE_LAST)
		return false;
	for (unsigned bit = 0; bit < 64; bit++) {
		if (!(map & (UINT64_C(1) << bit)))
			continue;
		if (off >= len || (size_t) b[off] + 1 > len - off)
			return false;
		off += (size_t) b[off] + 1;
	}
	return true;
}

static void *padded(const void *p, size_t len)
{
	uint8_t *b = calloc(1, len + BLOB_PAD);

	if (b)
		memcpy(b, p, len);
	return b;
}

static int peer_set(struct rdma *r, struct cmd *c)
{
	struct rpeer *p = calloc(1, sizeof(*p)), *old;
	ucp_ep_params_t ep = {
		.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
			      UCP_EP_PARAM_FIELD_ERR_HANDLER,
		.err_mode = UCP_ERR_HANDLING_MODE_PEER,
	};
	void *addr;
	ucs_status_t s;

	if (!p)
		return -ENOMEM;
	if (peer_same(peer_find(r, c->peer), c)) {
		free(p);
		return 0;
	}
	/* UCX aborts the process on an address of another format version
	 * (the low 4 bits of its first byte): check that much here.  Deeper
	 * damage is the reason peers must prove the cluster secret (or the
	 * operator said --insecure) before their handshake gets this far. */
	if (c->worker_len < 2 || c->worker_len > (size_t) 64 << 10 ||
	    (((const uint8_t *) c->worker)[0] & 0x0f) != (((const uint8_t *) r->addr)[0] & 0x0f)) {
		free(p);
		snprintf(c->err, RDMA_ERR_MAX, "the peer's UCX worker address is not of this version");
		return -EINVAL;
	}
	snprintf(p->name, sizeof(p->name), "%s", c->peer);
	addr = padded(c->worker, c->worker_len);
	p->worker = malloc(c->worker_len);
	if (!addr || !p->worker) {
		free(addr);
		free(p->worker);
		free(p);
		return -ENOMEM;
	}
	memcpy(p->worker, c->worker, c->worker_len);
	p->worker_len = c->worker_len;
	ep.address = addr;
	ep.err_handler.cb = ep_error;
	ep.err_handler.arg = p;
	s = ucp_ep_create(r->w, &ep, &p->ep);
	free(addr);
	if (s != UCS_OK) {
		free(p->worker);
		free(p);
		snprintf(c->err, RDMA_ERR_MAX, "the peer's UCX worker address: %s",
			 ucs_status_string(s));
		return -EINVAL;
	}
	for (unsigned i = 0; i < c->n; i++) {
		const struct rdma_region *g = &c->regions[i];
		void *k;

		if (g->id >= RDMA_MAX_REGIONS || p->reg[g->id].used ||
		    !rkey_shape_ok(g->rkey, g->rkey_len) || !(k = padded(g->rkey, g->rkey_len))) {
			snprintf(c->err, RDMA_ERR_MAX, "region %u: a malformed remote key", g->id);
			peer_free(r, p);
			return -EINVAL;
		}
		s = ucp_ep_rkey_unpack(p->ep, k, &p->reg[g->id].rkey);
		free(k);
		if (s != UCS_OK) {
			snprintf(c->err, RDMA_ERR_MAX, "region %u: remote key refused: %s", g->id,
				 ucs_status_string(s));
			p->reg[g->id].rkey = NULL;
			peer_free(r, p);
			return -EINVAL;
		}
		p->reg[g->id].used = true;
		p->reg[g->id].addr = g->addr;
		p->reg[g->id].size = g->size;
	}
	/* the old endpoint's transfers fail; the new one takes over the name */
	old = peer_find(r, c->peer);
	if (old) {
		ep_close(r, old);
		for (struct rpeer **pp = &r->peers; *pp; pp = &(*pp)->next)
			if (*pp == old) {
				*pp = old->next;
				break;
			}
		if (old->busy) {
			/* its transfers still point at it: keep it, closed,
			 * until the last one has ended (sweep) */
			old->next = r->closed;
			r->closed = old;
		} else
			peer_free(r, old);
	} else
		r->st.peers++;
	p->next = r->peers;
	r->peers = p;
	return 0;
}

static int start_transfer(struct rdma *r, struct cmd *c)
{
	struct rpeer *p = peer_find(r, c->peer);

	if (!p)
		return -ENOENT;
	if (p->failed || !p->ep)
		return -ECONNRESET;
	if (c->lid >= RDMA_MAX_REGIONS || !r->regs[c->lid].used || c->rid >= RDMA_MAX_REGIONS ||
	    !p->reg[c->rid].used || c->len > r->regs[c->lid].size ||
	    c->loff > r->regs[c->lid].size - c->len || c->len > p->reg[c->rid].size ||
	    c->roff > p->reg[c->rid].size - c->len)
		return -EINVAL;
	c->p = p;
	c->r = r;
	c->issued = true;
	p->busy++;
	issue(r, c);
	return 1;
}

static void run_cmd(struct rdma *r, struct cmd *c)
{
	int res = 0;

	switch (c->kind) {
	case C_REGISTER: {
		struct region *g = &r->regs[c->id];
		ucp_mem_map_params_t mp = {
			.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
			.address = c->base,
			.length = c->size,
		};
		ucs_status_t s;

		if (c->id >= RDMA_MAX_REGIONS || g->used) {
			res = -EINVAL;
			break;
		}
		s = ucp_mem_map(r->ctx, &mp, &g->memh);
		if (s == UCS_OK)
			s = ucp_rkey_pack(r->ctx, g->memh, &g->rkey_buf, &g->rkey_len);
		if (s != UCS_OK) {
			snprintf(c->err, RDMA_ERR_MAX, "registering %llu bytes: %s",
				 (unsigned long long) c->size, ucs_status_string(s));
			res = status_errno(s);
			break;
		}
		g->used = true;
		g->base = c->base;
		g->size = c->size;
		break;
	}
	case C_PEER_SET:
		res = peer_set(r, c);
		break;
	case C_PEER_DROP: {
		struct rpeer *p = peer_find(r, c->peer);

		if (p)
			ep_close(r, p);
		break;
	}
	case C_GET:
	case C_PUT:
		res = start_transfer(r, c);
		if (res > 0)
			return; /* finishes from op_done */
		break;
	case C_ABORT: {
		struct cmd *v = c->victim;

		/* the transfer in flight fails as its endpoint closes */
		if (!v->done && v->issued && v->p && v->p->ep)
			ep_close(r, v->p);
		break;
	}
	}
	finish(r, c, res);
}

/* Close endpoints UCX reported failed, and free closed peers nothing
 * points at any more. */
static void sweep(struct rdma *r)
{
	for (struct rpeer *p = r->peers; p; p = p->next)
		if (p->failed && p->ep)
			ep_close(r, p);
	for (struct rpeer **pp = &r->closed; *pp;) {
		struct rpeer *p = *pp;

		if (p->busy) {
			pp = &p->next;
			continue;
		}
		*pp = p->next;
		peer_free(r, p);
	}
}

/* Transfers of this node in flight. */
static bool busy(const struct rdma *r)
{
	for (const struct rpeer *p = r->peers; p; p = p->next)
		if (p->busy)
			return true;
	return r->closed != NULL;
}

static void *worker_main(void *arg)
{
	struct rdma *r = arg;

	pthread_setname_np(pthread_self(), "kvc-rdma");
	pthread_mutex_lock(&r->lock);
	for (;;) {
		struct pollfd fds[3] = { { .fd = r->efd, .events = POLLIN },
					 { .fd = r->bell, .events = POLLIN },
					 { .fd = r->efd_in, .events = POLLIN } };
		uint64_t v;

		while (r->q) {
			struct cmd *c = r->q;

			r->q = c->next;
			if (!r->q)
				r->q_tail = &r->q;
			run_cmd(r, c);
		}
		if (r->stop)
			break;
		while (ucp_worker_progress(r->w) | ucp_worker_progress(r->w_in))
			;
		sweep(r);
		if (r->q)
			continue;
		if (ucp_worker_arm(r->w) == UCS_ERR_BUSY || ucp_worker_arm(r->w_in) == UCS_ERR_BUSY)
			continue;
		pthread_mutex_unlock(&r->lock);
		/* the event fd is the wake-up; the timeout only a safety net
		 * (UCX's tcp transport, which the tests use, is seen to miss a
		 * wake-up after endpoints were made from both sides) */
		if (poll(fds, 3, busy(r) ? 2 : r->over_tcp ? 20 : 1000) > 0 &&
		    (fds[1].revents & POLLIN) &&
		    read(r->bell, &v, sizeof(v)) < 0) {
			/* nothing: the bell is a wake-up only */
		}
		pthread_mutex_lock(&r->lock);
	}
	pthread_mutex_unlock(&r->lock);
	return NULL;
}

static void wake(struct rdma *r)
{
	uint64_t one = 1;

	if (write(r->bell, &one, sizeof(one)) < 0) {
		/* the counter is full: the thread is awake anyway */
	}
}

/* Queue c for the worker thread; under r->lock. */
static void post(struct rdma *r, struct cmd *c)
{
	c->next = NULL;
	*r->q_tail = c;
	r->q_tail = &c->next;
	wake(r);
}

/* Run c on the worker thread and wait for it: until deadline (mono_us(); 0: no
 * deadline), then abort it and wait for UCX to let go. */
static int call(struct rdma *r, struct cmd *c, usec_t deadline)
{
	pthread_mutex_lock(&r->lock);
	post(r, c);
	while (!c->done) {
		struct timespec ts;

		if (!deadline) {
			pthread_cond_wait(&r->cond, &r->lock);
			continue;
		}
		if (mono_us() >= deadline) {
			struct cmd ab = { .kind = C_ABORT, .victim = c };

			/* still queued: it never started */
			for (struct cmd **pp = &r->q; *pp; pp = &(*pp)->next)
				if (*pp == c) {
					*pp = c->next;
					if (!*pp)
						r->q_tail = pp;
					finish(r, c, -ETIMEDOUT);
					break;
				}
			if (c->done)
				break;
			post(r, &ab);
			while (!c->done || !ab.done)
				pthread_cond_wait(&r->cond, &r->lock);
			if (c->res != 0)
				c->res = -ETIMEDOUT;
			break;
		}
		ts.tv_sec = (time_t) (deadline / USEC_PER_SEC);
		ts.tv_nsec = (long) (deadline % USEC_PER_SEC * NSEC_PER_USEC);
		pthread_cond_timedwait(&r->cond, &r->lock, &ts);
	}
	pthread_mutex_unlock(&r->lock);
	return c->res;
}

/* ---- the API ---- */

/*
 * A daemon's UCX: no malloc or mmap hooks and no memory events (nothing
 * here allocates memory UCX should track), no registration cache (every
 * transfer passes its memory handle), and no signal handlers of its own
 * in a process that has its own.  What the operator set in the
 * environment wins.  UCM and UCS read their environment when the library
 * loads, so their settings are changed here directly.
 */
static void daemon_settings(void)
{
	if (!getenv("UCX_MEM_MALLOC_HOOKS") && !getenv("UCX_MEM_EVENTS") &&
	    !getenv("UCX_MEM_MMAP_HOOK_MODE")) {
		ucm_global_config_t o = ucm_global_opts;

		o.enable_events = 0;
		o.enable_malloc_hooks = 0;
		o.enable_malloc_reloc = 0;
		ucm_set_global_opts(&o);
	}
	if (!getenv("UCX_ERROR_SIGNALS"))
		ucs_global_opts_set_value("ERROR_SIGNALS", "");
	setenv("UCX_RCACHE_ENABLE", "no", 0);
}

int rdma_new(const struct rdma_opts *o, struct rdma **ret, char err[RDMA_ERR_MAX])
{
	ucp_params_t params = {
		.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME,
		.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP,
		.name = "kvcached",
	};
	ucp_worker_params_t wp = {
		.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
		.thread_mode = UCS_THREAD_MODE_SINGLE,
	};
	pthread_condattr_t ca;
	ucp_config_t *cfg;
	struct rdma *r;
	ucs_status_t s;

	err[0] = '\0';
	if (!o->over_tcp && rdma_active_devices(o->devices, NULL, 0) <= 0) {
		snprintf(err, RDMA_ERR_MAX, "no active RDMA device%s%s", o->devices[0] ? " among " : "",
			 o->devices);
		return -ENODEV;
	}
	r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->efd = r->efd_in = r->bell = -1;
	r->q_tail = &r->q;
	r->over_tcp = o->over_tcp;
	if (o->over_tcp)
		snprintf(r->device, sizeof(r->device), "ucx-tcp");
	else
		rdma_active_devices(o->devices, r->device, sizeof(r->device));
	daemon_settings();
	s = ucp_config_read(NULL, NULL, &cfg);
	if (s != UCS_OK) {
		snprintf(err, RDMA_ERR_MAX, "UCX configuration: %s", ucs_status_string(s));
		free(r);
		return -EINVAL;
	}
	if (o->over_tcp) {
		ucp_config_modify(cfg, "TLS", "tcp");
		if (o->tcp_ifname && o->tcp_ifname[0])
			ucp_config_modify(cfg, "NET_DEVICES", o->tcp_ifname);
	} else {
		if (!getenv("UCX_TLS"))
			ucp_config_modify(cfg, "TLS", "rc,dc,ud");
		if (o->devices[0] && !getenv("UCX_NET_DEVICES"))
			ucp_config_modify(cfg, "NET_DEVICES", o->devices);
	}
	s = ucp_init(&params, cfg, &r->ctx);
	ucp_config_release(cfg);
	if (s != UCS_OK) {
		snprintf(err, RDMA_ERR_MAX, "ucp_init: %s", ucs_status_string(s));
		free(r);
		return -EIO;
	}
	s = ucp_worker_create(r->ctx, &wp, &r->w);
	if (s == UCS_OK)
		s = ucp_worker_create(r->ctx, &wp, &r->w_in);
	if (s == UCS_OK)
		s = ucp_worker_get_efd(r->w, &r->efd);
	if (s == UCS_OK)
		s = ucp_worker_get_efd(r->w_in, &r->efd_in);
	if (s == UCS_OK)
		s = ucp_worker_get_address(r->w_in, &r->addr, &r->addr_len);
	if (s != UCS_OK) {
		snprintf(err, RDMA_ERR_MAX, "UCX worker: %s", ucs_status_string(s));
		rdma_free(r);
		return -EIO;
	}
	r->bell = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	pthread_mutex_init(&r->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&r->cond, &ca);
	pthread_condattr_destroy(&ca);
	if (r->bell < 0 || pthread_create(&r->th, NULL, worker_main, r) != 0) {
		snprintf(err, RDMA_ERR_MAX, "starting the RDMA thread: %s", strerror(errno));
		rdma_free(r);
		return -EIO;
	}
	r->started = true;
	*ret = r;
	return 0;
}

void rdma_free(struct rdma *r)
{
	if (!r)
		return;
	if (r->started) {
		pthread_mutex_lock(&r->lock);
		r->stop = true;
		wake(r);
		pthread_mutex_unlock(&r->lock);
		pthread_join(r->th, NULL);
	}
	while (r->peers || r->closed) {
		struct rpeer **pp = r->peers ? &r->peers : &r->closed, *p = *pp;

		*pp = p->next;
		peer_free(r, p);
	}
	for (unsigned i = 0; i < RDMA_MAX_REGIONS; i++)
		if (r->regs[i].used) {
			ucp_rkey_buffer_release(r->regs[i].rkey_buf);
			ucp_mem_unmap(r->ctx, r->regs[i].memh);
		}
	if (r->addr)
		ucp_worker_release_address(r->w_in, r->addr);
	if (r->w_in)
		ucp_worker_destroy(r->w_in);
	if (r->w)
		ucp_worker_destroy(r->w);
	if (r->ctx)
		ucp_cleanup(r->ctx);
	if (r->bell >= 0)
		close(r->bell);
	if (r->started) {
		pthread_mutex_destroy(&r->lock);
		pthread_cond_destroy(&r->cond);
	}
	free(r);
}

const char *rdma_device(const struct rdma *r)
{
	return r->device;
}

int rdma_register(struct rdma *r, uint32_t id, void *base, uint64_t size)
{
	char err[RDMA_ERR_MAX] = "";
	struct cmd c = { .kind = C_REGISTER, .id = id, .base = base, .size = size, .err = err };

	return call(r, &c, 0);
}

const void *rdma_worker_address(const struct rdma *r, size_t *len)
{
	*len = r->addr_len;
	return r->addr;
}

unsigned rdma_regions(struct rdma *r, struct rdma_region *out)
{
	unsigned n = 0;

	pthread_mutex_lock(&r->lock);
	for (uint32_t i = 0; i < RDMA_MAX_REGIONS; i++)
		if (r->regs[i].used)
			out[n++] = (struct rdma_region) { i, (uint64_t) (uintptr_t) r->regs[i].base,
							  r->regs[i].size, r->regs[i].rkey_buf,
							  r->regs[i].rkey_len };
	pthread_mutex_unlock(&r->lock);
	return n;
}

int rdma_peer_set(struct rdma *r, const char *peer, const void *worker, size_t worker_len,
		  const struct rdma_region *regions, unsigned n)
{
	char err[RDMA_ERR_MAX] = "";
	struct cmd c = { .kind = C_PEER_SET, .peer = peer, .worker = worker,
			 .worker_len = worker_len, .regions = regions, .n = n, .err = err };

	if (!worker_len || n > RDMA_MAX_REGIONS || strlen(peer) >= PEER_NAME_MAX)
		return -EINVAL;
	return call(r, &c, 0);
}

void rdma_peer_drop(struct rdma *r, const char *peer)
{
	char err[RDMA_ERR_MAX];
	struct cmd c = { .kind = C_PEER_DROP, .peer = peer, .err = err };

	call(r, &c, 0);
}

static int transfer(struct rdma *r, enum cmd_kind kind, const char *peer, uint32_t rid,
		    uint64_t roff, uint32_t lid, uint64_t loff, uint64_t len, usec_t deadline)
{
	struct cmd c = { .kind = kind, .peer = peer, .rid = rid, .roff = roff, .lid = lid,
			 .loff = loff, .len = len };

	if (!len)
		return 0;
	return call(r, &c, deadline);
}

int rdma_get(struct rdma *r, const char *peer, uint32_t rid, uint64_t roff, uint32_t lid,
	     uint64_t loff, uint64_t len, usec_t deadline)
{
	return transfer(r, C_GET, peer, rid, roff, lid, loff, len, deadline);
}

int rdma_put(struct rdma *r, const char *peer, uint32_t rid, uint64_t roff, uint32_t lid,
	     uint64_t loff, uint64_t len, usec_t deadline)
{
	return transfer(r, C_PUT, peer, rid, roff, lid, loff, len, deadline);
}

void rdma_get_stats(struct rdma *r, struct rdma_stats *s)
{
	pthread_mutex_lock(&r->lock);
	*s = r->st;
	pthread_mutex_unlock(&r->lock);
}
