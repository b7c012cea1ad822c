/* SPDX-License-Identifier: MIT */
/* kvcached's /metrics: its figures in the Prometheus text format (export.c). */
#pragma once

#include <stdbool.h>

#include "config.h"
#include "metrics.h"
#include "server.h"

struct exporter;

/* Serve --metrics-port (nothing when it is 0; *ret = NULL). */
int export_new(struct server *sv, const struct config *cfg, struct exporter **ret);
/* /health answers 200 while serving. */
void export_serving(struct exporter *e, bool serving);
void export_free(struct exporter *e); /* NULL-safe; before the loop is freed */
