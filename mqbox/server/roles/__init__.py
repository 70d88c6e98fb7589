"""The broker's roles: one module (or package, processors/) per kind of process in topology.py's
graph. What they stand on lives beside this package in mqbox/server: the supervisor, the runtime
and control block, the topology and routing tables, the ring parcels and their transport, and
the home's run files."""
