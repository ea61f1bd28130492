"""A message whose records could not be written first (Redis away, or the client taken over) is
answered with that failure in its turn: before, it left the send queue without entering the
in-flight one, whose order answers come in, and its publisher waited forever (the nemesis saw a
will never published and a QoS 2 PUBLISH never acknowledged after Redis came back)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from bridge.storage.base import Message, RecordsNotWritten, StaleOwner
from bridge.storage.rocketmq.sending import SendPipeline, new_send


def pipeline() -> SendPipeline:
    client: Any = SimpleNamespace(producer_group="bridge", signer=None)
    stats = {"sent": 0, "send_failures": 0, "send_timeouts": 0}
    return SendPipeline(client, None, None, stats, send_timeout=3.0, send_window=8)  # type: ignore[arg-type]


def test_a_send_whose_records_failed_is_answered_with_that_failure_in_its_turn() -> None:
    async def scenario() -> list[tuple[Any, BaseException | None]]:
        pipe, answers = pipeline(), []
        loop = asyncio.get_running_loop()
        sends = []
        for index, error in enumerate([StaleOwner(["c1"]), RuntimeError("Redis went away")]):
            send = new_send(
                Message(f"t/{index}", b"x", 1), (), "", lambda s, e: answers.append((s, e))
            )
            send.meta_durable = loop.create_future()
            pipe.enqueue(send)
            sends.append((send, error))
        await asyncio.sleep(0.01)
        for send, error in sends:  # the record writes fail while the sends wait for them
            assert send.meta_durable is not None
            send.meta_durable.set_exception(error)
        await asyncio.sleep(0.05)
        return answers

    answers = asyncio.run(scenario())
    assert len(answers) == 2 and [seq for seq, _ in answers] == [None, None]
    assert isinstance(answers[0][1], StaleOwner)
    assert type(answers[1][1]) is RecordsNotWritten and "Redis went away" in str(answers[1][1])
