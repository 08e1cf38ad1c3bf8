"""A module ``--agent`` names whose own code prints to standard output: as it is imported,
as its class is made, and as a command calls into it later (its tokenizer, its model's
window, start and answers), with ``print`` and straight to file descriptor 1."""

import os
from typing import Any

from littleghost import Agent, manage_context
from littleghost.models import ModelRequest, ModelResponse
from littleghost.testing import ScriptedModel

from .cli_agents import Support, respond

print("importing the agents")


def chatter(what: str) -> None:
    """Say ``what`` on standard output, through Python's stream and past it."""
    print(f"print: {what}")
    os.write(1, f"fd 1: {what}\n".encode())


class Chatty(Agent):
    instructions = "You help."

    def __init__(self) -> None:
        print("Chatty made")
        super().__init__()


class ChattyTokens:
    """Four characters a token, said on standard output each time it counts."""

    def count_tokens(self, text: str) -> int:
        chatter("counting")
        return -(-len(text) // 4)


def chatty_respond(request: ModelRequest) -> ModelResponse:
    chatter("answering")
    return respond(request)


class ChattyModel(ScriptedModel):
    """A model that says so on standard output as it is asked its window, started and
    called."""

    @property
    def context_window(self) -> Any:
        chatter("window")
        return 2_000

    async def prepare(self) -> None:
        chatter("starting")


@manage_context(
    context_window_tokens=2_000,
    compression_threshold=0.5,
    preserve_recent_messages=4,
    tokenizer=ChattyTokens(),
)
class Talkative(Support):
    """``Support`` whose tokenizer and model print as a command calls them."""

    model = ChattyModel([chatty_respond] * 20)
