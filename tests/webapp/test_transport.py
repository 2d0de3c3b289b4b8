"""A response's head goes out with its first body part, in one write (`webapp.transport.HeadWithFirstPart`)."""

from __future__ import annotations

import asyncio

from webapp.transport import HeadWithFirstPart


class Recorded:
    """The writes a transport was given, each as one send."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str) -> str:
        return f"info {name}"


def held(recorded: Recorded) -> HeadWithFirstPart:
    return HeadWithFirstPart(recorded)  # type: ignore[arg-type]  (the transport's methods a response uses)


def test_the_head_and_a_first_part_ready_at_once_are_one_write() -> None:
    async def respond() -> list[bytes]:
        recorded = Recorded()
        transport = held(recorded)
        transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
        transport.write(b"5\r\nhello\r\n")
        transport.write(b"0\r\n\r\n")
        await asyncio.sleep(0)
        return recorded.writes

    assert asyncio.run(respond()) == [b"HTTP/1.1 200 OK\r\n\r\n5\r\nhello\r\n", b"0\r\n\r\n"]


def test_a_head_whose_first_part_is_not_ready_goes_out_on_the_loops_next_turn() -> None:
    async def respond() -> tuple[list[bytes], list[bytes]]:
        recorded = Recorded()
        transport = held(recorded)
        transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
        before = list(recorded.writes)
        await asyncio.sleep(0)
        after = list(recorded.writes)
        transport.write(b"5\r\nhello\r\n")
        return before, after

    before, after = asyncio.run(respond())
    assert before == [] and after == [b"HTTP/1.1 200 OK\r\n\r\n"]


def test_closing_writes_the_held_head_first() -> None:
    async def respond() -> Recorded:
        recorded = Recorded()
        transport = held(recorded)
        transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
        transport.close()
        await asyncio.sleep(0)
        return recorded

    recorded = asyncio.run(respond())
    assert recorded.writes == [b"HTTP/1.1 200 OK\r\n\r\n"] and recorded.closed


def test_a_head_is_not_written_to_a_closing_connection() -> None:
    async def respond() -> list[bytes]:
        recorded = Recorded()
        transport = held(recorded)
        transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
        recorded.closed = True  # the client left
        await asyncio.sleep(0)
        return recorded.writes

    assert asyncio.run(respond()) == []


def test_anything_else_goes_to_the_transport_itself() -> None:
    transport = held(Recorded())
    assert transport.get_extra_info("peername") == "info peername"
