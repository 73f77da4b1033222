"""`hotrod demo`, in one room: `run` optimizes, verifies and times each built-in model, `trained_heads` does
the same for the heads trained on all-MiniLM-L6-v2, `report` writes the report, and `models` holds the
trained demo checkpoints shipped in the package."""
