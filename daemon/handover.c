/* SPDX-License-Identifier: MIT */
/*
 * The two ends of a warm restart, and systemd's file-descriptor store.
 * The old daemon stops serving (its sessions end; connections that arrive
 * meanwhile wait in the listening socket's backlog), takes a checksum of
 * every object that has none, stops writing its catalog and sends the
 * fds; the new one checks each object against its catalog entry before it
 * serves (core/warm.c).
 */
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "checksum.h"
#include "handover.h"
#include "log.h"
#include "shm-layout.h"
#include "shmem.h"
#include "wire.h"

#define LOG_TOPIC "handover"

/* How long a new daemon waits for the old one to stop and hash what it
 * holds (about 1 s per 10 GiB here). */
#define HANDOVER_WAIT_S 300
/* threads hashing at most */
#define HASH_THREADS 8

static const char *const names[] = { "listen", "dram", "device", "catalog" };

struct hash_all {
	struct store_hash_job *jobs;
	size_t n;
	size_t next; /* atomic: the next job to take */
};

static void *hash_thread(void *u)
{
	struct hash_all *a = u;
	size_t i;

	while ((i = __atomic_fetch_add(&a->next, 1, __ATOMIC_RELAXED)) < a->n) {
		struct csum *h = csum_new();

		if (!h)
			abort(); /* a few bytes, at start or stop */
		csum_update(h, a->jobs[i].p, a->jobs[i].len);
		a->jobs[i].sum = csum_digest(h);
		csum_free(h);
	}
	return NULL;
}

/* Before the daemon serves, or after it stopped: every CPU may help (the
 * bytes of a fresh mapping are read at a few GB/s a thread here). */
void handover_hash(struct store_hash_job *jobs, size_t n)
{
	struct hash_all a = { .jobs = jobs, .n = n };
	pthread_t th[HASH_THREADS];
	uint64_t bytes = 0;
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	unsigned k = 0, want;

	for (size_t i = 0; i < n; i++)
		bytes += jobs[i].len;
	want = bytes < (UINT64_C(64) << 20) || cpus < 2 ? 1 :
	       (unsigned) (cpus < HASH_THREADS ? cpus : HASH_THREADS);
	while (k + 1 < want && pthread_create(&th[k], NULL, hash_thread, &a) == 0)
		k++;
	hash_thread(&a);
	while (k)
		pthread_join(th[--k], NULL);
}

static void warm_fds_init(struct warm_fds *w)
{
	*w = (struct warm_fds) {
		.store = { .dram_fd = -1, .device_fd = -1, .catalog_fd = -1,
			   .hash = handover_hash },
		.listen_fd = -1,
	};
}

/* fd is the one named name: false for a name no kvcached gives. */
static bool warm_fds_put(struct warm_fds *w, const char *name, int fd)
{
	int *slot = !strcmp(name, "kvcache-listen") || !strcmp(name, "listen") ? &w->listen_fd :
		    !strcmp(name, "kvcache-dram") || !strcmp(name, "dram") ? &w->store.dram_fd :
		    !strcmp(name, "kvcache-device") || !strcmp(name, "device") ? &w->store.device_fd :
		    !strcmp(name, "kvcache-catalog") || !strcmp(name, "catalog") ?
		    &w->store.catalog_fd : NULL;

	if (!slot || *slot >= 0)
		return false;
	*slot = fd;
	w->any = true;
	return true;
}

/* ---- the new daemon ---- */

/* One frame of type `type`: its payload (malloc'd) and any fds. */
static int recv_frame(int fd, uint16_t type, struct wire_hdr *h, uint8_t **payload, int *fds,
		      size_t *n_fds)
{
	int r;

	*payload = NULL;
	r = wire_recv_exact(fd, h, sizeof(*h), fds, WIRE_MAX_FDS, n_fds);
	if (r == 0)
		r = wire_hdr_check(h, WIRE_MAX_PAYLOAD);
	if (r == 0 && h->type != type)
		r = -EPROTO;
	if (r == 0 && !(*payload = malloc(h->len ? h->len : 1)))
		r = -ENOMEM;
	if (r == 0)
		r = wire_recv_exact(fd, *payload, h->len, fds, WIRE_MAX_FDS, n_fds);
	if (r < 0) {
		free(*payload);
		*payload = NULL;
	}
	return r;
}

static int send_msg(int fd, uint16_t type, const ProtobufCMessage *m)
{
	uint8_t *buf;
	size_t len;
	int r = wire_frame_pack(type, 1, 0, m, &buf, &len);

	if (r < 0)
		return r;
	r = wire_send_all(fd, buf, len, NULL, 0);
	free(buf);
	return r;
}

static void close_all(int *fds, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (fds[i] >= 0)
			close(fds[i]);
}

/* Would this run's tiers take the running daemon's segments?  A tier of
 * another size would start empty, with the old daemon already gone:
 * refuse first. */
static int sizes_match(const Kvc__Welcome *wel, const uint64_t sizes[2], char *err,
		       size_t err_len)
{
	static const uint32_t kinds[2] = { SHM_TIER_DRAM, SHM_TIER_DEVICE };

	for (unsigned k = 0; k < 2; k++) {
		uint64_t have = 0, page = 4096;

		for (size_t i = 0; i < wel->n_segments; i++)
			if (wel->segments[i]->tier == kinds[k]) {
				have = wel->segments[i]->size;
				page = wel->segments[i]->hugepages ? SHM_HUGEPAGE_SIZE : 4096;
			}
		if (have != (sizes[k] ? (SHM_HEADER_SIZE + sizes[k] + page - 1) / page * page : 0)) {
			snprintf(err, err_len, "the running kvcached's %s tier is of another size "
				 "(%llu bytes of segment; a warm restart keeps the tiers' sizes: "
				 "stop it first to resize)", k ? "device" : "dram",
				 (unsigned long long) have);
			return -EINVAL;
		}
	}
	return 0;
}

static int ask(int fd, const uint64_t sizes[2], struct warm_fds *w, char *err, size_t err_len)
{
	Kvc__Hello hello = KVC__HELLO__INIT;
	Kvc__Request q = KVC__REQUEST__INIT;
	Kvc__Welcome *wel = NULL;
	Kvc__Response *resp = NULL;
	int fds[WIRE_MAX_FDS];
	size_t n_fds = 0;
	struct wire_hdr h;
	uint8_t *payload;
	int r;

	hello.major = KVC_PROTO_MAJOR;
	hello.minor = KVC_PROTO_MINOR;
	hello.client_name = (char *) "kvcached --take-over";
	r = send_msg(fd, WIRE_HELLO, &hello.base);
	if (r == 0)
		r = recv_frame(fd, WIRE_WELCOME, &h, &payload, fds, &n_fds);
	close_all(fds, n_fds); /* the segments again: they come with the answer */
	n_fds = 0;
	if (r < 0) {
		snprintf(err, err_len, "no answer to Hello: %s", strerror(-r));
		return r;
	}
	wel = kvc__welcome__unpack(NULL, h.len, payload);
	free(payload);
	payload = NULL;
	if (!wel || wel->error) {
		snprintf(err, err_len, "refused: %s",
			 wel && wel->error_msg ? wel->error_msg : "Welcome does not decode");
		r = wel && wel->error > 0 ? -wel->error : -EPROTO;
		kvc__welcome__free_unpacked(wel, NULL);
		return r;
	}
	r = sizes_match(wel, sizes, err, err_len);
	kvc__welcome__free_unpacked(wel, NULL);
	if (r < 0)
		return r;
	q.op = KVC__OP__OP_HANDOVER;
	r = send_msg(fd, WIRE_REQUEST, &q.base);
	if (r == 0)
		r = recv_frame(fd, WIRE_RESPONSE, &h, &payload, fds, &n_fds);
	if (r < 0) {
		close_all(fds, n_fds);
		snprintf(err, err_len, "no answer to the hand-over: %s", strerror(-r));
		return r;
	}
	resp = kvc__response__unpack(NULL, h.len, payload);
	free(payload);
	if (!resp || resp->error || resp->body_case != KVC__RESPONSE__BODY_HANDOVER ||
	    resp->handover->n_names != n_fds) {
		snprintf(err, err_len, "%s", resp && resp->error_msg && *resp->error_msg ?
			 resp->error_msg : resp && resp->error ? strerror(resp->error) :
			 "the answer does not decode");
		r = resp && resp->error > 0 ? -resp->error : -EPROTO;
		close_all(fds, n_fds);
		kvc__response__free_unpacked(resp, NULL);
		return r;
	}
	for (size_t i = 0; i < n_fds; i++)
		if (!warm_fds_put(w, resp->handover->names[i], fds[i])) {
			log_warn("the previous run sent an fd named \"%s\": not used",
				 resp->handover->names[i]);
			close(fds[i]);
		}
	log_notice("kvcached pid %u handed over: taking its memory and socket",
		   (unsigned) resp->handover->pid);
	kvc__response__free_unpacked(resp, NULL);
	return 0;
}

int handover_ask(const char *socket_path, uint64_t dram_size, uint64_t device_size,
		 struct warm_fds *ret, char *err, size_t err_len)
{
	const uint64_t sizes[2] = { dram_size, device_size };
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct timeval tv = { .tv_sec = HANDOVER_WAIT_S };
	int fd, r;

	warm_fds_init(ret);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		r = -errno;
		snprintf(err, err_len, "socket: %s", strerror(errno));
		return r;
	}
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", socket_path);
	if (connect(fd, (struct sockaddr *) &sa, sizeof(sa)) < 0) {
		r = errno;
		close(fd);
		if (r == ENOENT || r == ECONNREFUSED)
			return 1;
		snprintf(err, err_len, "connecting to %s: %s", socket_path, strerror(r));
		return -r;
	}
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	r = ask(fd, sizes, ret, err, err_len);
	close(fd);
	return r;
}

void handover_from_fdstore(struct warm_fds *ret)
{
	char **fdnames = NULL;
	int n = sd_listen_fds_with_names(1, &fdnames);

	warm_fds_init(ret);
	for (int i = 0; i < n; i++) {
		int fd = SD_LISTEN_FDS_START + i;
		const char *name = fdnames && fdnames[i] ? fdnames[i] : "";

		if (warm_fds_put(ret, name, fd)) {
			fcntl(fd, F_SETFD, FD_CLOEXEC);
		} else {
			log_warn("systemd passed an fd named \"%s\": not used", name);
			close(fd);
		}
	}
	if (fdnames)
		for (int i = 0; i < n; i++)
			free(fdnames[i]);
	free(fdnames);
	if (ret->any)
		log_notice("taking over what systemd's file-descriptor store kept");
}

bool handover_to_fdstore(const struct store *st, int listen_fd)
{
	int fds[4];
	bool ok = true;

	store_warm_fds(st, fds + 1);
	fds[0] = listen_fd;
	if (!getenv("NOTIFY_SOCKET"))
		return false;
	for (unsigned i = 0; i < 4 && ok; i++) {
		char state[64];

		if (fds[i] < 0)
			continue;
		/* the service manager keeps one copy per name */
		snprintf(state, sizeof(state), "FDSTOREREMOVE=1\nFDNAME=kvcache-%s", names[i]);
		sd_notify(0, state);
		snprintf(state, sizeof(state), "FDSTORE=1\nFDNAME=kvcache-%s", names[i]);
		ok = sd_pid_notify_with_fds(0, 0, state, &fds[i], 1) > 0;
	}
	if (!ok)
		log_warn("the service manager did not take the memory's fds "
			 "(FileDescriptorStoreMax=): a restart starts empty");
	return ok;
}

/* ---- the old daemon ---- */

void handover_init(struct handover *h, struct loop *loop)
{
	*h = (struct handover) { .loop = loop, .fd = -1 };
}

int handover_hook(void *data, int fd, uint32_t seq, char *msg, size_t msg_len)
{
	struct handover *h = data;

	if (h->fd >= 0) {
		snprintf(msg, msg_len, "another kvcached is taking this one over already");
		return -EBUSY;
	}
	h->fd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
	if (h->fd < 0) {
		snprintf(msg, msg_len, "out of file descriptors");
		return -EMFILE;
	}
	h->seq = seq;
	log_notice("a new kvcached asked to take over: stopping");
	loop_quit(h->loop);
	return 0;
}

void handover_answer(struct handover *h, struct store *st, int listen_fd)
{
	Kvc__Response resp = KVC__RESPONSE__INIT;
	Kvc__HandoverResp hr = KVC__HANDOVER_RESP__INIT;
	struct timeval tv = { .tv_sec = 30 };
	char *sent_names[4];
	int fds[4], sent[4];
	size_t n = 0, len;
	usec_t t0 = mono_us();
	uint64_t hashed;
	uint8_t *buf;
	int r;

	if (h->fd < 0)
		return;
	hashed = store_seal(st, handover_hash);
	store_warm_fds(st, fds + 1);
	fds[0] = listen_fd;
	for (unsigned i = 0; i < 4; i++)
		if (fds[i] >= 0) {
			sent[n] = fds[i];
			sent_names[n++] = (char *) names[i];
		}
	hr.names = sent_names;
	hr.n_names = n;
	hr.pid = (uint32_t) getpid();
	resp.body_case = KVC__RESPONSE__BODY_HANDOVER;
	resp.handover = &hr;
	fcntl(h->fd, F_SETFL, fcntl(h->fd, F_GETFL) & ~O_NONBLOCK);
	setsockopt(h->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	r = wire_frame_pack(WIRE_RESPONSE, h->seq, (uint16_t) n, &resp.base, &buf, &len);
	if (r == 0) {
		r = wire_send_all(h->fd, buf, len, sent, n);
		free(buf);
	}
	if (r < 0)
		log_error_errno(r, "Failed to hand over to the new kvcached (its memory is lost)");
	else
		log_notice("handed over (%llu objects hashed first, %llu ms)",
			   (unsigned long long) hashed,
			   (unsigned long long) ((mono_us() - t0) / USEC_PER_MSEC));
	close(h->fd);
	h->fd = -1;
}
