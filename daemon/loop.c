/* SPDX-License-Identifier: MIT */
/*
 * The listening socket and the epoll loop.  One thread serves every client:
 * each request is a few hash lookups and an allocator call, so the loop is
 * never the bottleneck of the socket path.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/file.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include "daemon.h"
#include "log.h"
#include "ring.h"
#include "session.h"

#define LOG_TOPIC "loop"

int loop_watch(struct daemon *d, int fd, uint32_t events, struct loop_source *src, bool modify)
{
	struct epoll_event ev = { .events = events, .data.ptr = src };

	if (epoll_ctl(d->ctl_epfd, modify ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, fd, &ev) < 0)
		return -errno;
	return 0;
}

int loop_watch_doorbell(struct daemon *d, int fd, struct loop_source *src)
{
	/* Edge-triggered: a doorbell is a wake-up, never read, so the loop
	 * never touches a channel that a hang-up in the same batch freed. */
	struct epoll_event ev = { .events = EPOLLIN | EPOLLET, .data.ptr = src };

	if (epoll_ctl(d->epfd, EPOLL_CTL_ADD, fd, &ev) < 0)
		return -errno;
	return 0;
}

void loop_unwatch_doorbell(struct daemon *d, int fd)
{
	/* Explicitly: the client holds the same eventfd (it came over
	 * SCM_RIGHTS), so closing ours would leave the registration alive
	 * and a later ring would still wake the loop. */
	epoll_ctl(d->epfd, EPOLL_CTL_DEL, fd, NULL);
}

/*
 * The watcher thread: blocks until a control fd is ready, raises ctl_ready,
 * and waits for the loop to take it down.  The loop only reads a flag while
 * it spins, so a busy daemon makes no system call to notice the socket.
 */
static void *watcher_main(void *arg)
{
	struct daemon *d = arg;

	for (;;) {
		struct pollfd p[2] = {
			{ .fd = d->ctl_epfd, .events = POLLIN },
			{ .fd = d->watcher_stop, .events = POLLIN },
		};

		if (poll(p, 2, -1) < 0 && errno != EINTR)
			return NULL;
		if (p[1].revents)
			return NULL;
		__atomic_store_n(&d->ctl_ready, 1, __ATOMIC_RELEASE);
		while (__atomic_load_n(&d->ctl_ready, __ATOMIC_ACQUIRE)) {
			/* in slices, so a stop request is never missed */
			struct timespec ts = { 0, 50 * 1000 * 1000 };

			syscall(SYS_futex, &d->ctl_ready, FUTEX_WAIT, 1, &ts, NULL, 0);
			if (__atomic_load_n(&d->watcher_stopping, __ATOMIC_ACQUIRE))
				return NULL;
		}
	}
}

/* Is a daemon answering on this path right now? */
static bool socket_alive(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	bool alive;
	int fd;

	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return false;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	alive = connect(fd, (struct sockaddr *) &sa, sizeof(sa)) == 0;
	close(fd);
	return alive;
}

static int open_socket(struct daemon *d)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct stat st;
	int fd, r;

	/* The lock decides between two daemons starting at once; the connect
	 * probe catches a live daemon that holds no lock on this path. */
	snprintf(d->lock_path, sizeof(d->lock_path), "%s.lock", d->socket_path);
	d->lock_fd = open(d->lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (d->lock_fd < 0) {
		r = -errno;
		log_error("Failed to open lock file %s: %m", d->lock_path);
		return r;
	}
	if (flock(d->lock_fd, LOCK_EX | LOCK_NB) < 0) {
		log_error("another kvcached is already serving %s; not starting", d->socket_path);
		close(d->lock_fd);
		d->lock_fd = -1;
		return -EADDRINUSE;
	}
	if (lstat(d->socket_path, &st) == 0) {
		if (!S_ISSOCK(st.st_mode)) {
			log_error("%s exists and is not a socket; not replacing it", d->socket_path);
			return -EEXIST;
		}
		if (socket_alive(d->socket_path)) {
			log_error("another kvcached is already serving %s; not starting",
				  d->socket_path);
			return -EADDRINUSE;
		}
		log_notice("replacing stale socket %s left by a daemon that is gone", d->socket_path);
		unlink(d->socket_path);
	}

	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -errno;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", d->socket_path);
	if (bind(fd, (struct sockaddr *) &sa, sizeof(sa)) < 0) {
		r = -errno;
		log_error("Failed to bind %s: %m", d->socket_path);
		close(fd);
		return r;
	}
	if (chmod(d->socket_path, 0660) < 0 || listen(fd, 256) < 0) {
		r = -errno;
		log_error("Failed to listen on %s: %m", d->socket_path);
		unlink(d->socket_path);
		close(fd);
		return r;
	}
	d->listen_fd = fd;
	return 0;
}

int loop_setup(struct daemon *d)
{
	sigset_t mask;
	int r;

	d->epfd = d->ctl_epfd = d->listen_fd = d->signal_fd = d->lock_fd = d->watcher_stop = -1;
	d->epfd = epoll_create1(EPOLL_CLOEXEC);
	d->ctl_epfd = epoll_create1(EPOLL_CLOEXEC);
	if (d->epfd < 0 || d->ctl_epfd < 0)
		return -errno;
	{
		struct epoll_event ev = { .events = EPOLLIN, .data.ptr = &d->ctl_src };

		d->ctl_src.kind = LOOP_CONTROL;
		d->doorbell_src.kind = LOOP_CHANNEL;
		if (epoll_ctl(d->epfd, EPOLL_CTL_ADD, d->ctl_epfd, &ev) < 0)
			return -errno;
	}

	signal(SIGPIPE, SIG_IGN);
	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigprocmask(SIG_BLOCK, &mask, NULL);
	d->signal_fd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
	if (d->signal_fd < 0)
		return -errno;
	d->signal_src.kind = LOOP_SIGNAL;
	d->listen_src.kind = LOOP_LISTEN;
	r = loop_watch(d, d->signal_fd, EPOLLIN, &d->signal_src, false);
	if (r < 0)
		return r;

	r = open_socket(d);
	if (r < 0)
		return r;
	r = loop_watch(d, d->listen_fd, EPOLLIN, &d->listen_src, false);
	if (r < 0)
		return r;
	/* signals stay blocked in the watcher: they arrive through signalfd */
	d->watcher_stop = eventfd(0, EFD_CLOEXEC);
	if (d->watcher_stop < 0)
		return -errno;
	r = -pthread_create(&d->watcher, NULL, watcher_main, d);
	if (r < 0)
		return r;
	d->watcher_running = true;
	return 0;
}

static void on_accept(struct daemon *d)
{
	for (;;) {
		int fd = accept4(d->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);

		if (fd < 0) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN)
				log_warn("Failed to accept a client: %m");
			return;
		}
		if (session_new(d, fd) < 0)
			log_warn("Failed to set up a client session");
	}
}

static void on_signal(struct daemon *d)
{
	struct signalfd_siginfo si;

	while (read(d->signal_fd, &si, sizeof(si)) == sizeof(si)) {
		log_notice("received %s, shutting down", strsignal((int) si.ssi_signo));
		d->quit = true;
	}
}

static void dispatch_control(struct daemon *d);

static void dispatch(struct daemon *d, struct epoll_event *evs, int n)
{
	for (int i = 0; i < n; i++) {
		struct loop_source *src = evs[i].data.ptr;

		switch (src->kind) {
		case LOOP_CONTROL:
			dispatch_control(d);
			break;
		case LOOP_LISTEN:
			on_accept(d);
			break;
		case LOOP_SIGNAL:
			on_signal(d);
			break;
		case LOOP_SESSION:
			session_event((struct session *) src, evs[i].events);
			break;
		case LOOP_CHANNEL:
			/* A doorbell: only a wake-up, tagged with the shared
			 * d->doorbell_src, so nothing freed is read here; the
			 * poller finds the work itself. */
			break;
		case LOOP_DISK: {
			uint64_t v;

			/* io_uring completions: drained by disk_poll() */
			if (read(disk_eventfd(d), &v, sizeof(v)) < 0 && errno != EAGAIN)
				log_debug("disk eventfd: %m");
			break;
		}
		}
	}
}

/* Everything ready on the control set, then let the watcher look again. */
static void dispatch_control(struct daemon *d)
{
	struct epoll_event evs[64];
	int n = epoll_wait(d->ctl_epfd, evs, 64, 0);

	if (n > 0)
		dispatch(d, evs, n);
	if (__atomic_exchange_n(&d->ctl_ready, 0, __ATOMIC_ACQ_REL))
		syscall(SYS_futex, &d->ctl_ready, FUTEX_WAKE, 1, NULL, NULL, 0);
}

static uint64_t now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts); /* vDSO: no system call */
	return (uint64_t) ts.tv_sec * 1000000 + (uint64_t) ts.tv_nsec / 1000;
}

/* The clock, and the longest stretch between two reads of it while the
 * loop works (a turn: polling, running requests, maintenance). */
static uint64_t tick(struct daemon *d, uint64_t *prev)
{
	uint64_t t = now_us();

	if (t - *prev > d->stats.longest_turn_us)
		d->stats.longest_turn_us = t - *prev;
	*prev = t;
	return t;
}

uint64_t loop_clock(struct daemon *d)
{
	d->now_ms = now_us() / 1000;
	return d->now_ms;
}

/*
 * Spin, then sleep.  After the last request the loop keeps polling the
 * channels for a window (--poll-us) because waking a sleeping CPU costs tens
 * of microseconds on these machines while a spinning poller answers in well
 * under one.  The window adapts: a request arriving soon after the loop went
 * to sleep stretches it to 1.5x the gap since the previous one (up to 64x
 * --poll-us, for clients that spend milliseconds copying large values between
 * requests); a window that passes idle halves it back.
 * While spinning, the control socket costs one flag read (see watcher_main).
 */
int loop_run(struct daemon *d)
{
	const uint32_t base = d->cfg->poll_us, max = base * 64;
	struct epoll_event evs[64];
	uint64_t last_work = now_us(), prev = last_work;

	d->poll_window_us = base;
	d->now_ms = last_work / 1000;
	while (!d->quit) {
		uint64_t now;
		int n;

		if (channel_poll_all(d) | disk_poll(d)) {
			last_work = tick(d, &prev);
			d->now_ms = last_work / 1000;
			/* the evictor and promotions keep up under load too */
			if (++d->rounds % 16 == 0)
				tier_maintain(d);
			continue;
		}
		now = tick(d, &prev);
		d->now_ms = now / 1000;
		if (tier_maintain(d))
			continue;
		if (__atomic_load_n(&d->ctl_ready, __ATOMIC_ACQUIRE)) {
			dispatch_control(d);
			continue;
		}
		if (base && now - last_work < d->poll_window_us) {
			cpu_relax();
			continue;
		}
		if (base && d->poll_window_us > base)
			d->poll_window_us /= 2; /* a whole window went idle */

		channel_set_sleeping(d, true);
		if (channel_poll_all(d) | disk_poll(d)) { /* raced with a submission */
			channel_set_sleeping(d, false);
			last_work = tick(d, &prev);
			continue;
		}
		/* waiters for space give up at a deadline: look now and then */
		n = epoll_wait(d->epfd, evs, 64, d->space_head || d->space_waiting ? 20 : -1);
		channel_set_sleeping(d, false);
		now = prev = now_us(); /* sleeping is not a turn */
		/* whatever woke us is judged by the time now, not by the time
		 * we went to sleep (leases expire meanwhile) */
		d->now_ms = now / 1000;
		if (n < 0) {
			if (errno == EINTR)
				continue;
			log_error("epoll_wait failed: %m");
			return -errno;
		}
		if (base && now - last_work < max) {
			/* woken soon after giving up: the client works between
			 * requests for about now - last_work; cover that gap */
			uint64_t gap = now - last_work, want = gap + gap / 2;

			if (want > d->poll_window_us)
				d->poll_window_us = (uint32_t) (want < max ? want : max);
		}
		last_work = now;
		dispatch(d, evs, n);
	}
	return 0;
}

void loop_teardown(struct daemon *d)
{
	if (d->watcher_running) {
		uint64_t one = 1;

		/* cooperative stop: cancellation and sanitizers do not mix */
		__atomic_store_n(&d->watcher_stopping, true, __ATOMIC_RELEASE);
		if (write(d->watcher_stop, &one, sizeof(one)) < 0)
			log_warn("Failed to signal the watcher thread: %m");
		__atomic_store_n(&d->ctl_ready, 0, __ATOMIC_RELEASE);
		syscall(SYS_futex, &d->ctl_ready, FUTEX_WAKE, 1, NULL, NULL, 0);
		pthread_join(d->watcher, NULL);
	}
	if (d->watcher_stop >= 0)
		close(d->watcher_stop);
	while (d->sessions)
		session_free(d->sessions);
	if (d->listen_fd >= 0) {
		close(d->listen_fd);
		unlink(d->socket_path);
	}
	if (d->lock_fd >= 0) {
		unlink(d->lock_path);
		close(d->lock_fd);
	}
	if (d->signal_fd >= 0)
		close(d->signal_fd);
	if (d->ctl_epfd >= 0)
		close(d->ctl_epfd);
	if (d->epfd >= 0)
		close(d->epfd);
}
