/* SPDX-License-Identifier: MIT */
/*
 * Accepting on a listening socket when the process may be out of file
 * descriptors.  accept() then fails with EMFILE and leaves the connection
 * waiting, so a level-triggered loop is woken for it again and again; a
 * descriptor kept in reserve makes room to take it and close it instead.
 */
#pragma once

/* A descriptor to keep in reserve for accept_next() (-1 on failure). */
int accept_spare(int listen_fd);
/* The next waiting connection: its fd (non-blocking, close-on-exec),
 * -EAGAIN when none waits, -EMFILE when the process was out of descriptors
 * and one was refused (closed at once) with the spare *spare: count it and
 * call again; other -errno. */
int accept_next(int listen_fd, int *spare);
