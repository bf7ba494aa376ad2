"""`mp serve`'s HTTP door: the server, long poll and SSE, operations routes and metrics."""
