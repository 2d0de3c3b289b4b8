"""The live part: WebSocket consumers, the chat page and the animated pipeline."""
