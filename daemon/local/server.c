/* SPDX-License-Identifier: MIT */
/*
 * The listening socket, its lock file and the signals that stop the daemon:
 * io sources of the loop.  A second daemon on a live socket refuses to
 * start; a stale socket left by a crashed one is replaced.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/file.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "accept.h"
#include "log.h"
#include "buffer.h"
#include "copier.h"
#include "server.h"
#include "channel.h"
#include "session.h"

#define LOG_TOPIC "server"

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

/* A listening socket a previous run handed over (a warm start): its lock
 * file is taken as soon as that run lets it go. */
static int take_socket(struct server *sv, int fd)
{
	for (int i = 0; flock(sv->lock_fd, LOCK_EX | LOCK_NB) < 0; i++) {
		if (i == 100) {
			log_error("the previous kvcached still holds %s after 5 s", sv->lock_path);
			close(fd);
			return -EADDRINUSE;
		}
		usleep(50000);
	}
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	fcntl(fd, F_SETFD, FD_CLOEXEC);
	sv->listen_fd = fd;
	return 0;
}

static int open_socket(struct server *sv)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct stat st;
	int fd, r;

	/* The lock decides between two daemons starting at once; the connect
	 * probe catches a live daemon that holds no lock on this path. */
	snprintf(sv->lock_path, sizeof(sv->lock_path), "%s.lock", sv->socket_path);
	sv->lock_fd = open(sv->lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (sv->lock_fd < 0) {
		r = -errno;
		log_error("Failed to open lock file %s: %m", sv->lock_path);
		if (sv->inherit_listen)
			close(sv->inherited_fd);
		return r;
	}
	if (sv->inherit_listen)
		return take_socket(sv, sv->inherited_fd);
	if (flock(sv->lock_fd, LOCK_EX | LOCK_NB) < 0) {
		log_error("another kvcached is already serving %s; not starting", sv->socket_path);
		close(sv->lock_fd);
		sv->lock_fd = -1;
		return -EADDRINUSE;
	}
	if (lstat(sv->socket_path, &st) == 0) {
		if (!S_ISSOCK(st.st_mode)) {
			log_error("%s exists and is not a socket; not replacing it", sv->socket_path);
			return -EEXIST;
		}
		if (socket_alive(sv->socket_path)) {
			log_error("another kvcached is already serving %s; not starting",
				  sv->socket_path);
			return -EADDRINUSE;
		}
		log_notice("replacing stale socket %s left by a daemon that is gone", sv->socket_path);
		unlink(sv->socket_path);
	}

	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -errno;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sv->socket_path);
	if (bind(fd, (struct sockaddr *) &sa, sizeof(sa)) < 0) {
		r = -errno;
		log_error("Failed to bind %s: %m", sv->socket_path);
		close(fd);
		return r;
	}
	if (chmod(sv->socket_path, 0660) < 0 || listen(fd, 256) < 0) {
		r = -errno;
		log_error("Failed to listen on %s: %m", sv->socket_path);
		unlink(sv->socket_path);
		close(fd);
		return r;
	}
	sv->listen_fd = fd;
	return 0;
}

/* Said once in 10 s: a client that cannot be taken in (out of file
 * descriptors, or of memory) is told so by its connection's end. */
static void refused(struct server *sv, const char *what)
{
	usec_t now = loop_now(sv->loop);

	if (now >= sv->refused_logged + 10 * USEC_PER_SEC) {
		sv->refused_logged = now;
		log_warn("refusing clients: %s", what);
	}
}

static void on_accept(struct loop_source *src, int fd, uint32_t revents, void *userdata)
{
	struct server *sv = userdata;

	for (;;) {
		int cfd = accept_next(fd, &sv->spare_fd);

		if (cfd == -EMFILE) {
			refused(sv, "out of file descriptors");
			continue;
		}
		if (cfd == -EINTR)
			continue;
		if (cfd < 0) {
			if (cfd != -EAGAIN)
				refused(sv, strerror(-cfd));
			return;
		}
		if (session_new(sv, cfd) < 0)
			refused(sv, "a session could not be set up (out of file descriptors or memory)");
	}
}

static void on_signal(struct loop_source *src, int fd, uint32_t revents, void *userdata)
{
	struct server *sv = userdata;
	struct signalfd_siginfo si;

	while (read(fd, &si, sizeof(si)) == sizeof(si)) {
		log_notice("received %s, shutting down", strsignal((int) si.ssi_signo));
		loop_quit(sv->loop);
	}
}

int server_init(struct server *sv)
{
	sigset_t mask;
	int r;

	sv->listen_fd = sv->signal_fd = sv->lock_fd = sv->spare_fd = -1;
	signal(SIGPIPE, SIG_IGN);
	/* blocked in every thread (they inherit it): signals arrive through
	 * signalfd only */
	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigprocmask(SIG_BLOCK, &mask, NULL);
	sv->signal_fd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
	if (sv->signal_fd < 0)
		return -errno;
	r = loop_add_io(sv->loop, sv->signal_fd, EPOLLIN, on_signal, sv, &sv->signal_src);
	if (r < 0)
		return r;
	r = open_socket(sv);
	if (r < 0)
		return r;
	sv->spare_fd = accept_spare(sv->listen_fd);
	return loop_add_io(sv->loop, sv->listen_fd, EPOLLIN, on_accept, sv, &sv->listen_src);
}

void server_done(struct server *sv)
{
	if (sv->st)
		store_remove_listener(sv->st, &sv->space_listener);
	while (sv->sessions)
		session_free(sv->sessions);
	copier_done(sv);
	mapper_stop(sv->mapper);
	sv->mapper = NULL;
	channel_spares_free(sv);
	buffer_done(sv);
	loop_source_free(sv->listen_src);
	loop_source_free(sv->signal_src);
	sv->listen_src = sv->signal_src = NULL;
	/* handed over: the listening socket is the next daemon's, and the
	 * lock file its to take (closing the fd lets the lock go) */
	if (sv->listen_fd >= 0 && !sv->keep_listen) {
		close(sv->listen_fd);
		unlink(sv->socket_path);
	}
	if (sv->lock_fd >= 0) {
		if (!sv->keep_listen)
			unlink(sv->lock_path);
		close(sv->lock_fd);
	}
	if (sv->signal_fd >= 0)
		close(sv->signal_fd);
	if (sv->spare_fd >= 0)
		close(sv->spare_fd);
	sv->listen_fd = sv->lock_fd = sv->signal_fd = sv->spare_fd = -1;
}
