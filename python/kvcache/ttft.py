# SPDX-License-Identifier: MIT
"""kvcache-ttft: time to first token with and without the KV pool, on a real
transformer.

The scenario people run to judge a KV pool: every prompt is prefilled once
(step 1: computed), then asked again after the engine's own memory lost its
KV, which comes back from this node's kvcached (step 2: a local DRAM hit),
then asked on another node of the cluster, whose kvcached fetches it from the
first (step 3: a cross-node hit).  The published figures for 100 requests of
1024 tokens at concurrency 25 are TTFT 2322 / 739 / 948 ms, ratios 0.32 and
0.41 to step 1.

The model is a small llama-shaped transformer in PyTorch (random weights, no
download: RMSNorm, rotary embeddings, grouped-query attention, SwiGLU) that
really computes attention over a paged KV cache laid out as vLLM's
FlashAttention cache, on CPU.  The engine around it drives
``kvcache.vllm.KvcacheConnector`` the way vLLM's scheduler and worker do, and
keeps no prefix cache of its own: a request's blocks are freed when it ends.
Each step checks that the next-token logits computed over loaded KV equal
those of the full computation of step 1.

Requests of a wave of ``--concurrency`` arrive together and are prefilled
one after another (one CPU engine); a request's TTFT runs from its wave's
start to its first token's logits.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace
from typing import Dict, List, Optional, Tuple

import torch

from . import _kvcache
from .engine import block_hashes_of
from .vllm import KVConnectorRole, KvcacheConnector, key_spec

PUBLISHED = {"ttft_ms": (2322, 739, 948), "ratios": (0.32, 0.41)}


# ---- the model ----

class TinyLlama(torch.nn.Module):
    def __init__(self, vocab=4096, dim=256, layers=4, heads=8, kv_heads=4, ffn=768, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)

        def w(*shape):
            return torch.nn.Parameter(torch.randn(*shape, generator=g) / math.sqrt(shape[0]),
                                      requires_grad=False)

        self.vocab, self.dim, self.n_layers = vocab, dim, layers
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.embed = w(vocab, dim)
        self.layers = []
        for _ in range(layers):
            self.layers.append(SimpleNamespace(
                wq=w(dim, heads * self.head_dim), wk=w(dim, kv_heads * self.head_dim),
                wv=w(dim, kv_heads * self.head_dim), wo=w(heads * self.head_dim, dim),
                w1=w(dim, ffn), w3=w(dim, ffn), w2=w(ffn, dim)))
        self.out = w(dim, vocab)
        inv = 1.0 / (10000 ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) /
                               self.head_dim))
        self.register_buffer("inv_freq", inv, persistent=False)

    @staticmethod
    def _norm(x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    def _rope(self, x, pos):
        ang = pos[:, None].float() * self.inv_freq[None, :]
        cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
        x1, x2 = x[..., ::2], x[..., 1::2]
        return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).flatten(-2)

    def new_cache(self, num_blocks: int, block_tokens: int) -> Dict[str, torch.Tensor]:
        """vLLM's FlashAttention layout: (2, blocks, block tokens, kv heads, head dim)."""
        return {"model.layers.%d.self_attn.attn" % i:
                torch.zeros(2, num_blocks, block_tokens, self.kv_heads, self.head_dim)
                for i in range(self.n_layers)}

    @torch.no_grad()
    def forward(self, tokens: List[int], start: int, caches: List[torch.Tensor],
                block_table: List[int], block_tokens: int) -> torch.Tensor:
        """Compute tokens[start:] with the KV of tokens[:start] already in
        the paged cache; write their KV there; return the last token's
        logits."""
        end = len(tokens)
        pos = torch.arange(start, end)
        x = self.embed[torch.tensor(tokens[start:end])]
        table = torch.tensor(block_table)
        slots_b, slots_o = table[pos // block_tokens], pos % block_tokens
        all_pos = torch.arange(end)
        all_b, all_o = table[all_pos // block_tokens], all_pos % block_tokens
        mask = all_pos[None, :] <= pos[:, None]
        rep = self.heads // self.kv_heads
        for layer, p in zip(caches, self.layers):
            h = self._norm(x)
            q = self._rope((h @ p.wq).view(-1, self.heads, self.head_dim), pos)
            k = self._rope((h @ p.wk).view(-1, self.kv_heads, self.head_dim), pos)
            v = (h @ p.wv).view(-1, self.kv_heads, self.head_dim)
            layer[0][slots_b, slots_o] = k
            layer[1][slots_b, slots_o] = v
            keys = layer[0][all_b, all_o].repeat_interleave(rep, dim=1)
            vals = layer[1][all_b, all_o].repeat_interleave(rep, dim=1)
            s = torch.einsum("thd,shd->hts", q, keys) / math.sqrt(self.head_dim)
            s = s.masked_fill(~mask[None], float("-inf")).softmax(-1)
            o = torch.einsum("hts,shd->thd", s, vals).reshape(-1, self.heads * self.head_dim)
            x = x + o @ p.wo
            h = self._norm(x)
            x = x + (torch.nn.functional.silu(h @ p.w1) * (h @ p.w3)) @ p.w2
        return self._norm(x[-1]) @ self.out


# ---- the engine: what vLLM does around a connector ----

def vllm_config(sock: str, model_name: str, block_tokens: int, load_async: bool):
    return SimpleNamespace(
        kv_transfer_config=SimpleNamespace(
            kv_role="kv_both",
            kv_connector_extra_config={"socket": sock, "load_async": load_async}),
        model_config=SimpleNamespace(model=model_name, dtype="float32", use_mla=False),
        cache_config=SimpleNamespace(block_size=block_tokens, cache_dtype="auto"),
        parallel_config=SimpleNamespace(tensor_parallel_size=1, pipeline_parallel_size=1,
                                        decode_context_parallel_size=1,
                                        prefill_context_parallel_size=1, rank=0))


class Request:
    """The attributes vLLM's Request (vllm/v1/request.py) gives a connector:
    ``num_publishable_block_hashes`` stays 0 as it does in vLLM without
    EAGLE prefix-cache hashing."""

    def __init__(self, request_id: str, tokens: List[int], block_hashes: List[bytes]):
        self.request_id = request_id
        self.prompt_token_ids = list(tokens)
        self.all_token_ids = tuple(tokens)
        self.num_prompt_tokens = len(tokens)
        self.block_hashes = block_hashes
        self.num_publishable_block_hashes = 0
        self.num_computed_tokens = 0
        self.kv_transfer_params = None

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)


class Blocks:
    """KVCacheBlocks: block ids per KV cache group."""

    def __init__(self, ids: List[int]):
        self.ids = list(ids)

    def get_block_ids(self):
        return (self.ids,)


class Engine:
    def __init__(self, model: TinyLlama, sock: str, model_name: str, block_tokens: int,
                 num_blocks: int, load_async: bool = False):
        self.model, self.bt = model, block_tokens
        cfg = vllm_config(sock, model_name, block_tokens, load_async)
        self.sched = KvcacheConnector(cfg, KVConnectorRole.SCHEDULER)
        self.worker = KvcacheConnector(cfg, KVConnectorRole.WORKER)
        self.cache = model.new_cache(num_blocks, block_tokens)
        self.worker.register_kv_caches(self.cache)
        self.layers = list(self.cache.values())
        self.free = list(range(num_blocks))
        self.pending: List[Tuple[str, List[int]]] = []
        self.stored: set = set()
        self.salt = model_name.encode()

    def _step(self) -> None:
        meta = self.sched.build_connector_meta(None)
        self.worker.bind_connector_metadata(meta)
        self.worker.start_load_kv(None)
        self._collect()
        self.worker.clear_connector_metadata()

    def _collect(self) -> None:
        """get_finished, handed to the scheduler side as vLLM does."""
        sending, recving = self.worker.get_finished(set())
        self.sched.update_connector_output(SimpleNamespace(
            finished_sending=sending or set(), finished_recving=recving or set()))
        self.stored |= sending or set()

    def prefill(self, rid: str, tokens: List[int]) -> Tuple[torch.Tensor, int, List[int]]:
        """The first token of one request: returns its logits, the tokens
        that came from the pool, and the blocks it holds."""
        req = Request(rid, tokens, block_hashes_of(tokens, self.bt, self.salt))
        ext, load_async = self.sched.get_num_new_matched_tokens(req, 0)
        ext = ext or 0
        need = math.ceil(len(tokens) / self.bt)
        if need > len(self.free):
            self.reap(wait=True)  # blocks held for stores come back when stored
        if need > len(self.free):
            raise RuntimeError("the engine's KV cache is too small")
        blocks, self.free = self.free[:need], self.free[need:]
        self.sched.update_state_after_alloc(req, Blocks(blocks), ext)
        self._step()
        if load_async:
            self.worker.wait_idle()
            self._collect()
        if self.worker.get_block_ids_with_load_errors():
            ext = 0  # vLLM's "recompute" policy
        logits = self.model(tokens, ext, self.layers, blocks, self.bt)
        req.num_computed_tokens = len(tokens)
        self._finish(req, blocks)
        return logits, ext, blocks

    def _finish(self, req, blocks) -> None:
        delay, _ = self.sched.request_finished(req, blocks)
        if delay:
            self._step()  # the worker stores on its thread; the blocks stay ours
            self.pending.append((req.request_id, blocks))
        else:
            self.free += blocks

    def reap(self, wait: bool = False) -> None:
        """Give back the blocks of requests whose KV is stored."""
        if wait:
            self.worker.wait_idle()
        self._collect()
        keep = []
        for rid, blocks in self.pending:
            if rid in self.stored:
                self.free += blocks
                self.stored.discard(rid)
            else:
                keep.append((rid, blocks))
        self.pending = keep

    def close(self) -> None:
        self.reap(wait=True)
        self.sched.shutdown()
        self.worker.shutdown()


def run_step(engine: Engine, prompts: List[List[int]], concurrency: int,
             reference: Optional[List[torch.Tensor]]):
    ttft, from_pool, logits, maxdiff = [], 0, [], 0.0
    for w in range(0, len(prompts), concurrency):
        t0 = time.perf_counter()
        for i in range(w, min(w + concurrency, len(prompts))):
            out, ext, _ = engine.prefill("r%d" % i, prompts[i])
            ttft.append((time.perf_counter() - t0) * 1000)
            from_pool += ext
            logits.append(out)
            if reference is not None:
                maxdiff = max(maxdiff, (out - reference[i]).abs().max().item())
            engine.reap()
    engine.reap(wait=True)
    return ttft, from_pool, logits, maxdiff


def pct(v: List[float], p: float) -> float:
    s = sorted(v)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


# ---- private daemons ----

def find_binary(name: str, env: str) -> Optional[str]:
    if os.environ.get(env):
        return os.environ[env]
    here = os.path.dirname(os.path.abspath(__file__))
    built = os.path.join(here, "..", "..", "daemon", name)  # <build>/python/kvcache
    if os.path.exists(built):
        return os.path.abspath(built)
    return shutil.which(name)


class Private:
    """A master and two nodes on loopback, or one node without a master."""

    def __init__(self, dram: str, cluster: bool):
        self.dir = tempfile.mkdtemp(prefix="kvcache-ttft-")
        self.procs: List[subprocess.Popen] = []
        self.sockets: List[str] = []
        self.note = ""
        kvcached = find_binary("kvcached", "KVCACHED")
        if not kvcached:
            raise RuntimeError("kvcached not found (set KVCACHED or put it on PATH)")
        master = find_binary("kvcache-master", "KVCACHE_MASTER") if cluster else None
        flags = ["--dram-size", dram, "--poll-us", "0", "--log-level", "warn"]
        if cluster and master:
            log = os.path.join(self.dir, "master.log")
            self._spawn([master, "--port", "0", "--rpc_address", "127.0.0.1"], log)
            port = self._wait_port(log)
            for name in ("A", "B"):
                self._node(kvcached, name, flags + ["--master", "127.0.0.1:%d" % port,
                                                    "--listen", "127.0.0.1:0",
                                                    "--node-id", "ttft-" + name])
        else:
            if cluster:
                self.note = "kvcache-master not found"
            self._node(kvcached, "A", flags)

    def _spawn(self, argv, log):
        self.procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                           stderr=open(log, "w")))

    def _wait_port(self, log) -> int:
        for _ in range(500):
            for line in open(log):
                if "listening on" in line:
                    return int(line.split("listening on ")[1].split()[0].rsplit(":", 1)[1])
            time.sleep(0.02)
        raise RuntimeError("kvcache-master did not start: " + open(log).read())

    def _node(self, kvcached, name, flags):
        sock = os.path.join(self.dir, name + ".sock")
        self._spawn([kvcached, "--socket", sock] + flags, os.path.join(self.dir, name + ".log"))
        for _ in range(500):
            try:
                _kvcache.Client(sock).close()
                break
            except OSError:
                time.sleep(0.02)
        else:
            raise RuntimeError("kvcached did not start: " +
                               open(os.path.join(self.dir, name + ".log")).read())
        self.sockets.append(sock)

    def close(self) -> int:
        bad = 0
        for p in reversed(self.procs):
            p.send_signal(signal.SIGTERM)
            bad |= p.wait(timeout=60) != 0
        shutil.rmtree(self.dir, ignore_errors=True)
        return bad


def wait_published(sock: str, keys: List[str], timeout_s: float = 20.0) -> bool:
    """Until node B's view of the cluster holds every key."""
    c = _kvcache.Client(sock)
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if c.prefix_lookup(keys) == len(keys):
                return True
            time.sleep(0.05)
        return False
    finally:
        c.close()


# ---- main ----

def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="kvcache-ttft", description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--concurrency", type=int, default=25)
    ap.add_argument("--prompt-tokens", type=int, default=1024)
    ap.add_argument("--block-tokens", type=int, default=16)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--socket", help="this node's kvcached (default: start private daemons)")
    ap.add_argument("--remote-socket",
                    help="a kvcached on another node of the same cluster, for step 3")
    ap.add_argument("--dram-size", default="1GiB", help="of private daemons")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's choice)")
    ap.add_argument("--load-async", action="store_true", help="the connector's async loads")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)

    private = None
    if a.socket:
        sock_a, sock_b, note = a.socket, a.remote_socket, "no --remote-socket given"
    else:
        private = Private(a.dram_size, cluster=True)
        sock_a = private.sockets[0]
        sock_b = private.sockets[1] if len(private.sockets) > 1 else None
        note = private.note
    name = "kvcache-ttft/tiny-llama-%dx%d" % (a.layers, a.dim)
    model = TinyLlama(dim=a.dim, layers=a.layers)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, model.vocab, (a.prompt_tokens,), generator=g).tolist()
               for _ in range(a.requests)]
    blocks = 2 * math.ceil(a.prompt_tokens / a.block_tokens) + 8
    rc = 0
    result: Dict[str, object] = {"requests": a.requests, "concurrency": a.concurrency,
                                 "prompt_tokens": a.prompt_tokens, "model": name}
    try:
        eng = Engine(model, sock_a, name, a.block_tokens, blocks, a.load_async)
        t1, pool1, ref, _ = run_step(eng, prompts, a.concurrency, None)
        eng.close()
        eng = Engine(model, sock_a, name, a.block_tokens, blocks, a.load_async)
        t2, pool2, _, diff2 = run_step(eng, prompts, a.concurrency, ref)
        eng.close()
        steps = [("1 computed", t1, pool1, None), ("2 local dram hit", t2, pool2, diff2)]
        if sock_b:
            # node B hears of A's objects through the directory, in batches
            last = block_hashes_of(prompts[-1], a.block_tokens, name.encode())
            spec = key_spec(vllm_config(sock_b, name, a.block_tokens, False))
            published = wait_published(sock_b, spec.keys(last))
            eng = Engine(model, sock_b, name, a.block_tokens, blocks, a.load_async)
            t3, pool3, _, diff3 = run_step(eng, prompts, a.concurrency, ref)
            eng.close()
            steps.append(("3 cross-node hit", t3, pool3, diff3))
            if not published:
                note = "node B did not see every key within 20 s"
        n = a.prompt_tokens
        expected_pool = a.requests * min(n - 1, n // a.block_tokens * a.block_tokens)
        rows = []
        for label, t, pool, diff in steps:
            row = {"step": label, "p50_ms": statistics.median(t), "p99_ms": pct(t, 99),
                   "mean_ms": statistics.fmean(t), "tokens_from_pool": pool}
            if diff is not None:
                row["max_logit_diff"] = diff
                row["logits_equal"] = diff <= 1e-4
                row["every_prompt_hit"] = pool == expected_pool
                if not row["logits_equal"] or not row["every_prompt_hit"]:
                    rc = 1
            rows.append(row)
        base = rows[0]["p50_ms"]
        for r in rows[1:]:
            r["ratio_to_step1"] = r["p50_ms"] / base
        result["steps"] = rows
        result["published"] = PUBLISHED
        if len(rows) < 3:
            result["step3"] = "skipped: " + (note or "no second node")
    finally:
        if private is not None and private.close():
            print("kvcache-ttft: a private daemon did not exit cleanly", file=sys.stderr)
            rc = 1
    if a.json:
        print(json.dumps(result, indent=1))
        return rc
    print("kvcache-ttft: %d requests of %d tokens, concurrency %d, %s on CPU"
          % (a.requests, a.prompt_tokens, a.concurrency, name))
    print("%-18s %10s %10s %8s %16s %8s" % ("step", "TTFT p50", "p99", "ratio", "published",
                                          "logits"))
    for i, r in enumerate(rows):
        pub = "%d ms" % PUBLISHED["ttft_ms"][i]
        ratio = "" if i == 0 else "%.2f" % r["ratio_to_step1"]
        if i:
            pub += " (%.2f)" % PUBLISHED["ratios"][i - 1]
        logits = "" if i == 0 else ("equal" if r["logits_equal"] else
                                    "DIFFER %.2g" % r["max_logit_diff"])
        print("%-18s %7.1f ms %7.1f ms %8s %16s %8s" % (r["step"], r["p50_ms"], r["p99_ms"],
                                                     ratio, pub, logits))
    if "step3" in result:
        print("step 3 %s" % result["step3"])
    return rc


if __name__ == "__main__":
    sys.exit(main())
