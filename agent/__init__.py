"""metainfer.agent: what runs on a node: the CLI, the profiling/search Job, serving."""
