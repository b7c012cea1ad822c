/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "accept.h"

int accept_spare(int listen_fd)
{
	return fcntl(listen_fd, F_DUPFD_CLOEXEC, 0);
}

int accept_next(int listen_fd, int *spare)
{
	int c = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC), e;

	if (c >= 0)
		return c;
	e = errno;
	if (e == EAGAIN || e == EWOULDBLOCK)
		return -EAGAIN;
	if ((e != EMFILE && e != ENFILE) || *spare < 0)
		return -e;
	close(*spare);
	c = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
	if (c >= 0)
		close(c);
	*spare = accept_spare(listen_fd);
	return c >= 0 ? -EMFILE : -EAGAIN;
}
