# SPDX-License-Identifier: MIT
"""The key spec: test vectors, escaping, limits."""
import pytest

from kvcache import keys
from kvcache.keys import KeySpec

VECTORS = [
    (KeySpec("meta-llama/Llama-3.1-8B", "bfloat16", "vllm-nhd", 16), bytes(range(4)),
     "kv1@meta-llama/Llama-3.1-8B@bfloat16@vllm-nhd@b16@tp0of1@00010203"),
    (KeySpec("Qwen/Qwen2-7B", "float16", "sglang-page_first", 64, tp_rank=1, tp_size=4,
             pp_rank=1, pp_size=2), 0x1F,
     "kv1@Qwen/Qwen2-7B@float16@sglang-page_first@b64@tp1of4-pp1of2@1f"),
    (KeySpec("deepseek-ai/DeepSeek-V3", "fp8_e4m3", "mla", 64, tp_size=8,
             shared_across_ranks=True), -5,
     "kv1@deepseek-ai/DeepSeek-V3@fp8_e4m3@mla@b64@all@-5"),
    (KeySpec("my model@v2 100%", "float32", "lmcache kv_t", 256), "abc@def",
     "kv1@my%20model%40v2%20100%25@float32@lmcache%20kv_t@b256@tp0of1@abc%40def"),
    (KeySpec("模型", "int8", "l", 1), b"\xff",
     "kv1@%E6%A8%A1%E5%9E%8B@int8@l@b1@tp0of1@ff"),
]


@pytest.mark.parametrize("spec,h,expected", VECTORS)
def test_vectors(spec, h, expected):
    assert spec.key(h) == expected
    assert spec.keys([h, h]) == [expected, expected]
    fields = keys.parse(expected)
    assert fields["model"] == spec.model and fields["layout"] == spec.layout
    assert fields["block_tokens"] == spec.block_tokens and fields["rank"] == spec.rank
    assert expected.startswith(spec.prefix())


def test_layouts_never_collide():
    h = bytes(32)
    a = KeySpec("m", "bfloat16", "vllm-nhd", 16).key(h)
    others = [KeySpec("m", "float16", "vllm-nhd", 16).key(h),
              KeySpec("m", "bfloat16", "vllm-hnd", 16).key(h),
              KeySpec("m", "bfloat16", "vllm-nhd", 32).key(h),
              KeySpec("m", "bfloat16", "vllm-nhd", 16, tp_rank=1, tp_size=2).key(h),
              KeySpec("m2", "bfloat16", "vllm-nhd", 16).key(h)]
    assert a not in others and len(set(others)) == len(others)


def test_ranks():
    s = KeySpec("m", "bf16", "l", 16, tp_rank=0, tp_size=2, pp_size=2)
    assert [r.rank for r in s.ranks()] == ["tp0of2-pp0of2", "tp1of2-pp0of2",
                                           "tp0of2-pp1of2", "tp1of2-pp1of2"]
    assert len(KeySpec("m", "bf16", "l", 16, tp_size=8, shared_across_ranks=True).ranks()) == 1


def test_limits():
    with pytest.raises(ValueError):
        KeySpec("m" * 500, "bf16", "l", 16).key(bytes(32))
    with pytest.raises(ValueError):
        KeySpec("", "bf16", "l", 16)
    with pytest.raises(ValueError):
        KeySpec("m", "bf16", "l", 0)
    with pytest.raises(ValueError):
        KeySpec("m", "bf16", "l", 16, tp_rank=2, tp_size=2)
    with pytest.raises(TypeError):
        KeySpec("m", "bf16", "l", 16).key(1.5)
    with pytest.raises(TypeError):
        KeySpec("m", "bf16", "l", 16).key(True)
    with pytest.raises(ValueError):
        keys.parse("not-a-key")
    # a sha256 hash fits with a long model name
    k = KeySpec("org/" + "x" * 300, "bfloat16", "vllm-nhd", 16).key(bytes(32))
    assert len(k) <= 511
