"""Shared memory between the processes of one mqbox instance; knows no messages.

layout.py draws the ring segment and its parcels, ring.py is the single-producer single-consumer
ring (the one to read first), doorbell.py lets a consumer sleep in epoll, names.py names and
sweeps the objects of an instance in /dev/shm. Imports nothing from mqbox.store, mqbox.protocol
or mqbox.server; submodules are imported by name, so names.py stays usable without numba.
"""
