"""`hotrod serve`: an HTTP server with dynamic and continuous batching over hotrod models."""
