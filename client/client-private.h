/* SPDX-License-Identifier: MIT */
#pragma once

#include "kvcache/kvcache.h"
#include "wire.h"

/* Send one request and wait for its response.  A response carrying an error
 * comes back as that -errno (the message is kept for kvc_last_error_msg()). */
int client_rpc(struct kvc_client *c, Kvc__Request *q, Kvc__Response **ret);
