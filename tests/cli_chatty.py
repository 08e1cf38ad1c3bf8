"""A module ``--agent`` names whose own code prints to standard output, as it is imported
and as its class is made."""

from littleghost import Agent

print("importing the agents")


class Chatty(Agent):
    instructions = "You help."

    def __init__(self) -> None:
        print("Chatty made")
        super().__init__()
