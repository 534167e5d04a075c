"""The event-loop tracer: its recorder, the live frames' digest and feed, and the build of its C parts."""
