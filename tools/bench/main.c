/* SPDX-License-Identifier: MIT */
/*
 * kvcache-bench — figures and ratios measured in one run on this machine.
 *
 *   kvcache-bench local [--sizes 4K,64K,1M,4M,16M]
 *                       [--ops exists,get,put,acquire,prefix64,batch64]
 *                       [--duration S] [--json] [--peers] [--socket PATH]
 *
 * Each op and size runs for --duration seconds on one thread against a
 * kvcached (a private one unless --socket names a running daemon) and prints
 * ops/s, GB/s, p50/p99/p999 latency and system calls per operation on each
 * side (counted with the raw_syscalls:sys_enter tracepoint).  Beside it, the
 * single-thread memcpy bandwidth of the same size on the same buffers, and the
 * ratio.  --peers runs the same get/put/exists against memcached (meta
 * protocol) and Redis, each started here on a Unix socket, and prints the
 * speed-up.
 */
#include "bench.h"

double arg_duration = 1.0;
bool arg_json, arg_peers, arg_zstd, arg_fill_disk, arg_leased, arg_local_only;
static bool arg_shared;
const char *arg_dir, *arg_socket, *arg_kvcached, *arg_plot;
const char *arg_ops = "exists,get,put,acquire,prefix64,batch64";
uint64_t arg_sizes[MAX_SIZES] = { 4096, 65536, 1 << 20, 4 << 20, 16 << 20 };
uint64_t arg_objects, arg_pinned;
unsigned arg_rounds = 5;
size_t n_sizes = 5;

bool want_op(const char *op)
{
	size_t n = strlen(op);

	for (const char *p = arg_ops; (p = strstr(p, op)); p += n)
		if ((p == arg_ops || p[-1] == ',') && (p[n] == ',' || p[n] == '\0'))
			return true;
	return false;
}

static void usage(FILE *f)
{
	fprintf(f, "Usage: kvcache-bench disk [--dir DIR] [--sizes 1M,16M] [--zstd]\n"
		   "       kvcache-bench disk --shared [--dir DIR] [--sizes 256K,2M,16M]   (the shared tier)\n"
		   "       kvcache-bench burst [--dir DIR]\n"
		   "       kvcache-bench cluster [--sizes 64K,1M,16M] [--rounds N]   (root, iperf3)\n"
		   "       kvcache-bench cluster --local-only [--rounds N]   (local requests on B while it fetches)\n"
		   "       kvcache-bench rdma [--sizes 64K,1M,16M]   (root; RDMA path on UCX's tcp)\n"
		   "       kvcache-bench recovery [--objects N] [--dir DIR]\n"
		   "       kvcache-bench hangup [--sizes 1G] [--rounds N]   (clients with registered buffers go)\n"
		   "       kvcache-bench python [--duration S] [--json]   (the Python module)\n"
		   "       kvcache-bench engine [--model llama3-8b|llama3-70b|qwen2-7b|mistral-7b]\n"
		   "                          [--prompts N] [--prompt-tokens N] [--tp N] [--layerwise]\n"
		   "                          [--across-only]\n"
		   "                          (fresh engine processes store and load; root: across nodes)\n"
		   "       kvcache-bench local --objects N [--fill-disk] [--dir DIR] [--duration S]\n"
		   "       kvcache-bench local --pinned N | --leased [--duration S]\n"
		   "       kvcache-bench churn [--sizes SIZE] [--duration S] [--socket PATH]\n"
		   "       kvcache-bench local [--sizes 4K,64K,1M,4M,16M]\n"
		   "                          [--ops exists,get,put,acquire,prefix64,batch64]\n"
		   "                          [--duration S] [--json] [--peers] [--socket PATH]\n"
		   "                          [--kvcached PATH] [--plot FILE.svg]\n");
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "sizes", required_argument, NULL, 'z' },
		{ "ops", required_argument, NULL, 'o' },
		{ "duration", required_argument, NULL, 'd' },
		{ "json", no_argument, NULL, 'j' },
		{ "peers", no_argument, NULL, 'p' },
		{ "socket", required_argument, NULL, 's' },
		{ "kvcached", required_argument, NULL, 'k' },
		{ "dir", required_argument, NULL, 'D' },
		{ "zstd", no_argument, NULL, 'Z' },
		{ "shared", no_argument, NULL, 'H' },
		{ "objects", required_argument, NULL, 'O' },
		{ "pinned", required_argument, NULL, 'P' },
		{ "fill-disk", no_argument, NULL, 'F' },
		{ "leased", no_argument, NULL, 'L' },
		{ "plot", required_argument, NULL, 'G' },
		{ "rounds", required_argument, NULL, 'R' },
		{ "model", required_argument, NULL, 'M' },
		{ "prompts", required_argument, NULL, 'N' },
		{ "prompt-tokens", required_argument, NULL, 'T' },
		{ "tp", required_argument, NULL, 't' },
		{ "layerwise", no_argument, NULL, 'W' },
		{ "across-only", no_argument, NULL, 'X' },
		{ "local-only", no_argument, NULL, 'l' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	int opt;

	if (argc < 2 || (strcmp(argv[1], "local") != 0 && strcmp(argv[1], "churn") != 0 &&
			 strcmp(argv[1], "disk") != 0 && strcmp(argv[1], "burst") != 0 &&
			 strcmp(argv[1], "recovery") != 0 && strcmp(argv[1], "cluster") != 0 &&
			 strcmp(argv[1], "python") != 0 && strcmp(argv[1], "rdma") != 0 &&
			 strcmp(argv[1], "hangup") != 0 && strcmp(argv[1], "engine") != 0)) {
		usage(argc >= 2 && strcmp(argv[1], "--help") == 0 ? stdout : stderr);
		return argc >= 2 && strcmp(argv[1], "--help") == 0 ? 0 : 2;
	}
	optind = 2;
	while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (opt) {
		case 'z': {
			char *s = strdup(optarg), *save = NULL;

			n_sizes = 0;
			for (char *t = strtok_r(s, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
				if (n_sizes == MAX_SIZES || kvc_parse_size(t, &arg_sizes[n_sizes]) < 0 ||
				    arg_sizes[n_sizes] == 0 || arg_sizes[n_sizes] > (256u << 20)) {
					fprintf(stderr, "kvcache-bench: bad size '%s' (1 .. 256M)\n", t);
					return 2;
				}
				n_sizes++;
			}
			free(s);
			break;
		}
		case 'o':
			arg_ops = optarg;
			break;
		case 'd':
			arg_duration = atof(optarg);
			if (arg_duration <= 0 || arg_duration > 600) {
				fprintf(stderr, "kvcache-bench: bad --duration '%s'\n", optarg);
				return 2;
			}
			break;
		case 'j':
			arg_json = true;
			break;
		case 'p':
			arg_peers = true;
			break;
		case 's':
			arg_socket = optarg;
			break;
		case 'k':
			arg_kvcached = optarg;
			break;
		case 'D':
			arg_dir = optarg;
			break;
		case 'Z':
			arg_zstd = true;
			break;
		case 'H':
			arg_shared = true;
			break;
		case 'O':
		case 'P': {
			char *end;
			unsigned long long v = strtoull(optarg, &end, 10);

			if (*end || !*optarg || v == 0 || v > 100000000) {
				fprintf(stderr, "kvcache-bench: bad count '%s'\n", optarg);
				return 2;
			}
			if (opt == 'O')
				arg_objects = v;
			else
				arg_pinned = v;
			break;
		}
		case 'F':
			arg_fill_disk = true;
			break;
		case 'L':
			arg_leased = true;
			break;
		case 'l':
			arg_local_only = true;
			break;
		case 'G':
			arg_plot = optarg;
			break;
		case 'R': {
			char *end;
			unsigned long v = strtoul(optarg, &end, 10);

			if (*end || !*optarg || v == 0 || v > MAX_ROUNDS) {
				fprintf(stderr, "kvcache-bench: bad --rounds '%s' (1 .. %d)\n", optarg,
					MAX_ROUNDS);
				return 2;
			}
			arg_rounds = (unsigned) v;
			break;
		}
		case 'M':
			arg_model = optarg;
			break;
		case 'N':
		case 'T':
		case 't': {
			char *end;
			unsigned long v = strtoul(optarg, &end, 10);

			if (*end || !*optarg || v == 0 || v > (opt == 't' ? 64 : 1000000)) {
				fprintf(stderr, "kvcache-bench: bad count '%s'\n", optarg);
				return 2;
			}
			*(opt == 'N' ? &arg_prompts : opt == 'T' ? &arg_prompt_tokens : &arg_tp) =
				(unsigned) v;
			break;
		}
		case 'W':
			arg_layerwise = true;
			break;
		case 'X':
			arg_across_only = true;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (arg_plot && ((strcmp(argv[1], "local") != 0 && strcmp(argv[1], "disk") != 0 &&
			  strcmp(argv[1], "cluster") != 0) ||
			 arg_objects || arg_pinned || arg_leased)) {
		fprintf(stderr, "kvcache-bench: --plot draws the sizes of local, disk and cluster\n");
		return 2;
	}
	if (arg_local_only && strcmp(argv[1], "cluster") != 0) {
		fprintf(stderr, "kvcache-bench: --local-only is for cluster\n");
		return 2;
	}
	if (strcmp(argv[1], "burst") == 0)
		return run_burst();
	if (strcmp(argv[1], "cluster") == 0)
		return run_cluster();
	if (strcmp(argv[1], "engine") == 0)
		return run_engine();
	if (strcmp(argv[1], "rdma") == 0)
		return run_rdma();
	if (strcmp(argv[1], "python") == 0)
		return run_python();
	if (strcmp(argv[1], "recovery") == 0)
		return run_recovery();
	if (strcmp(argv[1], "hangup") == 0)
		return run_hangup(n_sizes == 5 && arg_sizes[0] == 4096 ? UINT64_C(1) << 30 : arg_sizes[0]);
	if (arg_pinned)
		return run_pinned();
	if (arg_leased)
		return run_leased();
	if (arg_objects || arg_fill_disk)
		return run_objects();
	if (strcmp(argv[1], "churn") == 0)
		return run_churn(n_sizes == 5 && arg_sizes[0] == 4096 ? 64 << 10 : arg_sizes[0]);
	if (strcmp(argv[1], "disk") == 0 && arg_shared) {
		static const uint64_t dflt[] = { 256 << 10, 2 << 20, 16 << 20 };
		bool given = !(n_sizes == 5 && arg_sizes[0] == 4096);

		return run_shared(arg_dir, given ? arg_sizes : dflt, given ? n_sizes : 3);
	}
	if (strcmp(argv[1], "disk") == 0) {
		static const uint64_t dflt[] = { 1 << 20, 16 << 20 };
		bool given = !(n_sizes == 5 && arg_sizes[0] == 4096);

		run_disk(arg_dir, given ? arg_sizes : dflt, given ? n_sizes : 2, "none");
		if (arg_zstd)
			run_disk(arg_dir, given ? arg_sizes : dflt, given ? n_sizes : 2, "zstd");
		zstd_figures();
		return 0;
	}
	return run_local();
}
