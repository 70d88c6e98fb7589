"""RocketMQ's plain ACL (4.4 and later): accounts in plain_acl.yml, signed requests, permissions.

Owns: the plain_acl.yml format and its validation (`plain.py`), the request signature both sides
compute (`signature.py`), which resources and which admin right each request code needs
(`requests.py`), and the validator a process keeps, reloading the file when it changes
(`validator.py`). docs/acl.md describes the file, the keys and what is protected.
Never: sockets, rings or processes. The broker's codec role, the name server and the clients call
into it; it imports only protocol (typed headers, codes) and the leaves.
"""
