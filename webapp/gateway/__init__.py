"""The gateway in front of the engine: who is asking, may they, which model, and what it cost."""
