"""The decoding loop shared by every backend and kind."""
