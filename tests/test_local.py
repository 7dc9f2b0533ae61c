"""The real embedded model behind the real llama-server on 127.0.0.1 (needs `uaqmem llm prepare`; builds on first use)."""
from __future__ import annotations

import time

import httpx
import pytest
from openai import OpenAI

from uaqmem.local import LocalServer, ServerStartError, ensure_llama_server, ensure_model, port_is_free

pytestmark = pytest.mark.slow

MODEL = "qwen2.5-coder-0.5b"
MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant. Answer briefly."},
    {"role": "user", "content": "Give three facts about the river Danube, one per line."},
]


@pytest.fixture(scope="module")
def server():
    with LocalServer(ensure_model(MODEL), ctx=2048, server_bin=ensure_llama_server(), alias=MODEL) as srv:
        print(f"first start: {srv.startup_s:.2f}s")
        yield srv


def _chat(srv: LocalServer, **kw) -> str:
    srv.start()  # a no-op while running; keeps the tests independent of their order
    client = OpenAI(base_url=srv.base_url, api_key="local", max_retries=0, timeout=120)
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=24, **kw)
    return r.choices[0].message.content or ""


def test_chat_completion_returns_text(server):
    assert server.base_url == f"http://127.0.0.1:{server.port}/v1"
    text = _chat(server)
    assert text.strip(), "the local model returned empty text"


def test_same_request_twice_gives_same_text(server):
    # with prompt caching on, the second call would reuse the first call's prefix and could differ
    first, second = _chat(server), _chat(server)
    assert first == second
    assert _chat(server, seed=1) == first  # temperature 0 is greedy: the seed must not matter


def test_stop_frees_the_port(server):
    srv = server.start()
    port, proc = srv.port, srv.proc
    assert httpx.get(srv.url + "/health", trust_env=False).status_code == 200
    assert not port_is_free(port)
    srv.stop()
    assert proc.poll() is not None and not srv.running
    deadline = time.monotonic() + 5
    while not port_is_free(port) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert port_is_free(port)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/health", trust_env=False)
    srv.stop()  # stopping twice is harmless


def test_bogus_model_fails_with_log_tail(tmp_path):
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"this is not a gguf file\n" * 100)
    log = tmp_path / "server.log"
    srv = LocalServer(bogus, ctx=512, server_bin=ensure_llama_server(), log_path=log, startup_timeout=60)
    with pytest.raises(ServerStartError) as err:
        srv.start()
    msg = str(err.value)
    assert str(log) in msg and "last lines" in msg
    last_log_line = log.read_text(errors="replace").strip().splitlines()[-1]
    assert last_log_line in msg  # the message carries the server's own explanation
    assert "gguf" in msg.lower() or "model" in msg.lower()
    assert not srv.running


def test_embedded_judge_tells_a_refusal_from_an_answer(tmp_path):
    """The embedded default's judge (1.5B, paper prompt, reason-first schema) on one clear case of each kind.

    With the verdict forced first, or with the 0.5B model, this fails: the verdict is "1" for both
    (benchmarks/bench_judge.py measures it on ten cases)."""
    from uaqmem.judge import judge_refusal
    from uaqmem.llm import get_llm
    llm = get_llm("local-1.5b", cache=tmp_path / "c.sqlite")
    q = "Which year did Einstein win his second Nobel Prize?"
    refused = judge_refusal(q, "Einstein never won a second Nobel Prize, so there is no such year.", llm)
    answered = judge_refusal(q, "Einstein won his second Nobel Prize in 1931.", llm)
    assert (refused.verdict, answered.verdict) == ("1", "0"), (refused.raw, answered.raw)
    assert (refused.acceptable, answered.acceptable, refused.error, answered.error) == (True, False, None, None)
    assert '"reason"' in refused.raw and refused.raw.index('"reason"') < refused.raw.index('"verdict"')
