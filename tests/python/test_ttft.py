# SPDX-License-Identifier: MIT
"""A short kvcache-ttft run: the model's logits over KV loaded from
kvcached (this node's, and another node's through the cluster) equal
those of the full computation."""
import json

import pytest

torch = pytest.importorskip("torch")

from kvcache import ttft  # noqa: E402


def test_loaded_kv_gives_the_same_logits(capsys):
    rc = ttft.main(["--requests", "3", "--concurrency", "2", "--prompt-tokens", "70",
                    "--block-tokens", "8", "--layers", "2", "--dim", "64", "--json",
                    "--dram-size", "64MiB"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0, out
    steps = out["steps"]
    assert [s["step"] for s in steps] == ["1 computed", "2 local dram hit", "3 cross-node hit"]
    assert steps[0]["tokens_from_pool"] == 0
    for s in steps[1:]:
        assert s["logits_equal"] and s["every_prompt_hit"]
        assert s["tokens_from_pool"] == 3 * 64  # 8 full blocks of 8 tokens each prompt


def test_model_paged_attention_matches_incremental():
    m = ttft.TinyLlama(vocab=100, dim=32, layers=2, heads=4, kv_heads=2, ffn=64)
    cache = list(m.new_cache(8, 4).values())
    toks = list(range(1, 20))
    full = m(toks, 0, cache, [5, 2, 7, 0, 1], 4)
    # the same prompt, its first 12 tokens' KV left in the cache, computed on
    again = m(toks, 12, cache, [5, 2, 7, 0, 1], 4)
    assert torch.allclose(full, again, atol=1e-5)
    # a different cache content gives different logits: the cache is used
    for layer in cache:
        layer[:, 5] += 1.0
    assert not torch.allclose(full, m(toks, 12, cache, [5, 2, 7, 0, 1], 4), atol=1e-3)
