from __future__ import annotations

import xxhash

from llm_epp.sim.tokenizer import CHARS_PER_TOKEN, VOCAB_SIZE, count_tokens, encode, encode_chat, render_chat


def test_one_token_per_four_characters() -> None:
    assert encode("") == ()
    assert len(encode("abcd")) == 1
    assert len(encode("abcde")) == 2
    for text in ("", "a", "abcd", "hello world", "x" * 1001):
        assert count_tokens(text) == len(encode(text))
    assert CHARS_PER_TOKEN == 4


def test_ids_are_a_stable_hash_of_the_chunk() -> None:
    assert encode("abcdabcdefgh") == (
        xxhash.xxh32_intdigest(b"abcd") % VOCAB_SIZE,
        xxhash.xxh32_intdigest(b"abcd") % VOCAB_SIZE,
        xxhash.xxh32_intdigest(b"efgh") % VOCAB_SIZE,
    )
    assert encode("héllo wörld") == encode("héllo wörld")
    assert all(0 <= t < VOCAB_SIZE for t in encode("some text with ümlauts and 中文字符"))


def test_shared_prefix_gives_shared_leading_tokens() -> None:
    system = "You are a helpful assistant. " * 10  # 290 characters
    a = encode(system + "What is the capital of France?")
    b = encode(system + "Tell me a joke.")
    shared = len(system) // CHARS_PER_TOKEN
    assert a[:shared] == b[:shared]
    assert a != b


def test_chat_template_flattening() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Hi"}, {"type": "image_url"}, {"type": "text", "text": "!"}],
        },
    ]
    assert render_chat(messages) == "system: Be brief.\nuser: Hi!\nassistant: "
    assert render_chat(messages, add_generation_prompt=False) == "system: Be brief.\nuser: Hi!\n"
    assert encode_chat(messages) == encode(render_chat(messages))
    assert render_chat([{"role": "assistant", "content": None}]) == "assistant: \nassistant: "
