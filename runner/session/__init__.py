"""The session of a run: what a front end drives (record it, follow it on the console, or on a node other than
the head, stream it to the head). It sits above the job, the load and the nodes, which import nothing here."""
