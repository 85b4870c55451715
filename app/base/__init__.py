"""What every layer but the rules uses: Prometheus metrics and the background-task set.

It sits at the bottom and loads nothing else of app/, so the runtime, the HTTP face, operations
and Kubernetes I/O can all count and start tasks without loading one another."""
