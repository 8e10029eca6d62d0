"""An engine request as an asyncio stream: outputs handed over from the step thread, merged
when the reader lags, and paced under load (stream_pause) without delaying the end."""

import asyncio
import threading
import time

from serving.engine.request import GenerateRequest, RequestOutput, SamplingParams
from serving.engine.streams import MESSAGES_PER_SECOND, stream_outputs, stream_pause

REQUEST = GenerateRequest("r", (1, 2, 3), SamplingParams(max_tokens=8))


class TimedEngine:
    """Sends the outputs of one request from a thread of its own, each after its delay (s)."""

    def __init__(self, delays: list[float]):
        self.delays, self.aborted = delays, []

    def submit(self, request, sink, validated=False):
        def run():
            n = len(self.delays)
            for i, delay in enumerate(self.delays):
                time.sleep(delay)
                last = i == n - 1
                sink(RequestOutput(request.request_id, (i,), f"t{i} ", finished=last,
                                   finish_reason="length" if last else None,
                                   completion_tokens=i + 1))  # fmt: skip

        threading.Thread(target=run, daemon=True).start()

    def abort(self, request_id):
        self.aborted.append(request_id)


async def read(engine, pace=None) -> tuple[list[RequestOutput], float, float]:
    """The stream's outputs, when its last one came, and when the engine sent it (since the
    stream opened)."""
    t0 = time.perf_counter()
    outs = [out async for out in stream_outputs(engine, REQUEST, pace=pace)]
    return outs, time.perf_counter() - t0, sum(engine.delays)


def test_paced_increments_carry_every_token_in_order():
    """Outputs every 10 ms read with a 100 ms pause: a few large increments, the same tokens
    and text as unpaced, and the finished one last."""
    engine = TimedEngine([0.0] + [0.01] * 29)
    plain, _, _ = asyncio.run(read(TimedEngine([0.0] + [0.01] * 29)))
    paced, _, _ = asyncio.run(read(engine, pace=lambda: 0.1))
    assert len(paced) <= 6 < 20 <= len(plain)
    for outs in (plain, paced):
        assert [t for out in outs for t in out.new_token_ids] == list(range(30))
        assert "".join(out.new_text for out in outs) == "".join(f"t{i} " for i in range(30))
        assert outs[-1].finished and outs[-1].completion_tokens == 30
        assert not any(out.finished for out in outs[:-1])
    assert paced[0].new_token_ids == (0,)  # the first token is never held back


def test_the_end_cuts_a_pause_short():
    """A pause of 5 s after the first token: the last output, 0.1 s later, is read at once."""
    outs, took, sent = asyncio.run(read(TimedEngine([0.0, 0.05, 0.05]), pace=lambda: 5.0))
    assert took < sent + 1.0, f"the stream ended {took:.2f} s in, its last output came at {sent}"
    assert [t for out in outs for t in out.new_token_ids] == [0, 1, 2]


def test_streams_are_paced_by_how_many_are_open():
    assert stream_pause(1, 0.1) == 1 / MESSAGES_PER_SECOND
    assert stream_pause(32, 0.1) == 32 / MESSAGES_PER_SECOND
    assert stream_pause(640, 0.1) == 0.1  # never longer than the configured interval
    assert stream_pause(8, 0.0) == 0.0


class StepEngine:
    """Like the step thread: each step sends one output to every open request, in one go."""

    def __init__(self, num_requests: int, steps: int):
        self.sinks, self.num_requests, self.steps, self.aborted = {}, num_requests, steps, []

    def submit(self, request, sink, validated=False):
        self.sinks[request.request_id] = sink
        if len(self.sinks) == self.num_requests:
            threading.Thread(target=self.run, daemon=True).start()

    def run(self):
        for step in range(self.steps):
            last = step == self.steps - 1
            for rid, sink in self.sinks.items():
                sink(RequestOutput(rid, (step,), f"{step} ", finished=last))
            time.sleep(0.005)

    def abort(self, request_id):
        self.aborted.append(request_id)


def test_a_step_s_outputs_wake_the_loop_once(monkeypatch):
    """16 streams, 10 steps: the step thread wakes the reading loop about once a step, not
    once an output, and every stream still reads its own tokens in order."""
    engine, wakeups = StepEngine(16, 10), []

    async def run():
        loop = asyncio.get_running_loop()
        real = loop.call_soon_threadsafe
        monkeypatch.setattr(loop, "call_soon_threadsafe",
                            lambda *a: wakeups.append(1) or real(*a))  # fmt: skip

        async def one(i):
            request = GenerateRequest(f"r{i}", (1,), SamplingParams(max_tokens=10))
            return [t async for out in stream_outputs(engine, request) for t in out.new_token_ids]

        return await asyncio.gather(*(one(i) for i in range(16)))

    assert asyncio.run(run()) == [list(range(10))] * 16
    assert len(wakeups) <= 2 * 10 < 16 * 10


def test_a_closed_loop_s_streams_are_aborted():
    """Outputs for a loop that has closed reach no one: the step thread aborts their requests."""
    engine = StepEngine(1, 3)
    engine.submit = lambda request, sink, validated=False: engine.sinks.update({"r": sink})

    async def open_stream():
        stream = stream_outputs(engine, GenerateRequest("r", (1,), SamplingParams()))
        task = asyncio.ensure_future(anext(stream))
        await asyncio.sleep(0.01)  # submitted; the stream waits for its first output
        task.cancel()

    asyncio.run(open_stream())  # the loop closes; the stream's own cleanup aborts once
    before = len(engine.aborted)
    engine.run()  # three outputs for a loop that is gone
    assert len(engine.aborted) > before and set(engine.aborted) == {"r"}
