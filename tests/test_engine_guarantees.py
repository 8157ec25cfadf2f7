"""What the engine promises every request (README, "The engine's guarantees"): one end event
whose status is the handle's, on every path; abort refused once a request has ended; no
re-entry from callbacks; admission copies and checks what the client could still change;
every bit of a seed keys its random stream."""

from __future__ import annotations

import gc
import random
import re
from collections import Counter

import numpy as np
import pytest
from fake_runtime_model import FakeModel

from decodelab.engine.config import EngineConfig
from decodelab.engine.engine import Engine
from decodelab.engine.requests import InvalidRequestError, Request, SamplingParams, Status
from decodelab.engine.stream import CallbackError, RequestHandle, TokenEvent

POISON = 47  # FakeModel's NaN trigger (a valid id of its 48-token vocabulary)
REENTRY = r"Engine\.step\(\) called from inside a request callback"


def fake_engine(**kw) -> Engine:
    model = FakeModel(num_blocks=64, poison=POISON)
    return Engine(model, EngineConfig(max_num_seqs=8, max_model_len=64, **kw))


def healthy(n: int, seed: int = 0) -> list[Request]:
    rng = random.Random(seed)
    return [Request(f"h{i}", tuple(rng.randrange(1, POISON) for _ in range(rng.randint(1, 5))),
                    SamplingParams(temperature=rng.choice([0.0, 0.8]), seed=i,
                                   max_new_tokens=rng.randint(3, 10))) for i in range(n)]


def tokens_alone(requests: list[Request]) -> dict[str, list[int]]:
    eng = fake_engine()
    handles = [eng.submit(r) for r in requests]
    eng.run()
    return {h.request_id: h.tokens for h in handles}


def assert_one_end(handle: RequestHandle, iterated: list[TokenEvent],
                   called: list[TokenEvent]) -> None:
    """The stream ends once, last, with the handle's status; iterator and callback agree."""
    assert iterated == called
    assert [ev.finished for ev in iterated] == [False] * (len(iterated) - 1) + [True]
    end = iterated[-1]
    assert (end.status, end.reason, end.error) == (handle.status.value, handle.finish_reason,
                                                   handle.error)
    assert [ev.token for ev in iterated if ev.token is not None] == handle.tokens


def test_abort_from_the_final_tokens_callback_is_refused_and_the_request_ends_once():
    eng = fake_engine()
    answers: list[bool] = []

    def cb(ev: TokenEvent) -> None:
        if ev.index == 3:  # the last of max_new_tokens=4
            answers.append(eng.abort("a"))

    h = eng.submit(Request("a", (1, 2, 3), SamplingParams(temperature=0.0, max_new_tokens=4),
                           on_token=cb))
    eng.run()
    assert answers == [False] and not h.abort()
    assert h.status is Status.FINISHED and h.finish_reason == "length"
    assert [ev.finished for ev in h] == [False, False, False, True]
    assert eng.metrics.outcomes == Counter(finished=1)
    assert [r.status for r in eng.metrics.requests] == ["finished"]


class Raise(Exception):
    pass


# path -> (the subject's status, its finish reason)
PATHS = {
    "finished": ("finished", "length"),
    "aborted_by_callback": ("aborted", "aborted"),
    "aborted_by_client": ("aborted", "aborted"),
    "callback_error": ("failed", "callback_error"),
    "callback_error_on_the_end": ("finished", "length"),  # raised after its end: too late
    "non_finite_logits": ("failed", "non_finite_logits"),
    "step_error": ("failed", "step_error"),
    "reentry": ("failed", "callback_error"),
}


@pytest.mark.parametrize("budget", [4096, 8], ids=["whole", "chunked"])
@pytest.mark.parametrize("path", sorted(PATHS))
def test_every_stream_ends_once_with_the_handles_status(path, budget):
    """With a budget of 8 tokens the six prompts (up to 6 tokens each) are prefilled in chunks
    across steps while the first rows decode."""
    eng = fake_engine(max_num_batched_tokens=budget)
    called: dict[str, list[TokenEvent]] = {}

    def cb(ev: TokenEvent) -> None:
        called.setdefault(ev.request_id, []).append(ev)
        if ev.request_id != "x" or ev.token is None:
            return
        if (path == "callback_error" and ev.index == 2
                or path == "callback_error_on_the_end" and ev.index == 5):
            raise Raise("client went away")
        if path == "aborted_by_callback" and ev.index == 2:
            assert eng.abort("x")
        if path == "reentry" and ev.index == 1:
            eng.step()

    if path == "step_error":
        decode = eng.model.decode

        def flaky(*args):
            if eng.model.decode_calls == 2:
                eng.model.decode_calls += 1
                raise RuntimeError("device fault")
            return decode(*args)

        eng.model.decode = flaky
    others = [eng.submit(Request(r.request_id, r.prompt, r.params, on_token=cb))
              for r in healthy(5)]
    prompt = (POISON, 1, 2, 3, 4, 5) if path == "non_finite_logits" else (1, 2, 3)
    h = eng.submit(Request("x", prompt, SamplingParams(temperature=0.8, seed=3,
                                                       max_new_tokens=6), on_token=cb))
    iterated = []
    for ev in h:  # drives the engine
        iterated.append(ev)
        if path == "aborted_by_client" and ev.index == 1:
            assert h.abort()
    eng.run()
    assert (h.status.value, h.finish_reason) == PATHS[path]
    assert_one_end(h, iterated, called["x"])
    for o in others:
        assert_one_end(o, list(o), called[o.request_id])
    assert eng.metrics.errors["callback_error_at_end"] == (path == "callback_error_on_the_end")
    assert sum(eng.metrics.outcomes.values()) == len(eng.metrics.requests) == 6
    assert eng.pool.num_free == eng.pool.num_total and not eng.active


@pytest.mark.parametrize("how", ["step", "run", "iterate another handle"])
def test_a_callback_that_drives_the_engine_fails_alone(how):
    reqs = healthy(6, seed=1)
    want = tokens_alone(reqs)
    eng = fake_engine()
    handles: list[RequestHandle] = []
    drive = {"step": eng.step, "run": eng.run,
             "iterate another handle": lambda: next(iter(handles[0]))}[how]

    def cb(ev: TokenEvent) -> None:
        if not ev.finished:  # the second nested step would stream the others' next tokens
            drive()          # before the rest of this step's
            drive()

    # submitted first, so its row is processed before the others'
    bad = eng.submit(Request("bad", (1, 2, 3), SamplingParams(temperature=0.0,
                                                               max_new_tokens=8), on_token=cb))
    handles += [eng.submit(r) for r in reqs]
    eng.run()
    assert {h.request_id: h.tokens for h in handles} == want
    assert bad.status is Status.FAILED and bad.finish_reason == "callback_error"
    assert isinstance(bad.exception, CallbackError) and len(bad.tokens) == 1
    assert isinstance(bad.exception.__cause__, RuntimeError)
    assert re.search(REENTRY, str(bad.exception.__cause__))
    for h in handles:  # nothing of their streams was taken by the callback
        assert [ev.token for ev in h] == h.tokens and h.status is Status.FINISHED


def test_a_list_prompt_is_copied_at_admission():
    others = healthy(4, seed=2)
    want = tokens_alone([*others, Request("l", (5, 6, 7), SamplingParams(temperature=0.0))])
    eng = fake_engine()
    handles = [eng.submit(r) for r in others]
    prompt = [5, 6, 7]
    h = eng.submit(Request("l", prompt, SamplingParams(temperature=0.0)))
    prompt[0] = 999  # outside the vocabulary: it would fail every running request's step
    prompt.append(1000)
    eng.run()
    assert [x.status for x in [*handles, h]] == [Status.FINISHED] * 5
    assert {x.request_id: x.tokens for x in [*handles, h]} == want
    with pytest.raises(InvalidRequestError, match=r"prompt\[0\]=999"):
        eng.submit(Request("m", prompt))


@pytest.mark.parametrize("bad", ["now", [1.0], object(), True, float("nan"), float("inf"),
                                 1 + 2j])
def test_submit_refuses_an_arrival_time_that_is_no_finite_number(bad):
    eng = fake_engine()
    with pytest.raises(InvalidRequestError,
                       match=r"arrival_time=.*must be a finite real number"):
        eng.submit(Request("a", (1, 2)), arrival_time=bad)
    assert not eng.waiting and not eng.active and eng.metrics.errors["invalid_request"] == 1


@pytest.mark.parametrize("ok", [0, 12.5, np.float64(3.0), np.float32(2.0)])
def test_submit_takes_a_real_arrival_time(ok):
    eng = fake_engine()
    h = eng.submit(Request("a", (1, 2)), arrival_time=ok)
    eng.run()
    assert h.status is Status.FINISHED and eng.metrics.requests[0].ttft_s > 0


def test_seeds_equal_in_their_low_32_bits_draw_different_tokens():
    """12345 and 7318106351 (= 2**32 + 3023139055) once shared a 32-bit key, hence a stream."""
    def sampled(seed: int) -> list[int]:
        return tokens_alone([Request("s", (1, 2, 3), SamplingParams(seed=seed,
                                                                     max_new_tokens=16))])["s"]

    assert sampled(12345) != sampled(7318106351)


def test_events_waiting_in_a_handle_leave_the_collectors_view_and_still_stream():
    """A client taking tokens by callback never iterates its handle, so its events wait there
    one per token: after a collection none of them is an object the collector tracks (every
    later collection would scan them), and iterating later still yields what the callback
    got."""
    eng = fake_engine()
    called: list[tuple] = []  # the callback's events as plain tuples: not tracked either
    handle = eng.submit(Request("gc-probe", (3, 4, 5), SamplingParams(
        temperature=0.8, seed=1, max_new_tokens=20, ignore_eos=True),
        on_token=lambda ev: called.append(ev.plain())))
    eng.run()
    gc.collect()
    assert not [o for o in gc.get_objects()  # (other tests' events may still be alive)
                if isinstance(o, TokenEvent) and o.request_id == "gc-probe"]
    assert_one_end(handle, list(handle), [TokenEvent(*ev) for ev in called])
    assert len(called) == 20
