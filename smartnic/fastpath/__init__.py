"""The NIC's fast path in a process of its own (setting `fastpath: process`).

On a Cassini NIC a triggered operation fires in the NIC, whatever the host's CPUs are doing. Here
the agent's control plane (gRPC, the match-action table, the requester index, eviction,
credentials) is Python threads under one interpreter lock; a standing PUT fired by a thread of
that process waits for the lock behind them. With `fastpath: process` the standing PUTs run in a
child process of the agent that holds nothing else: it maps every registered pool, polls their
trigger counters (`smartnic.watcher`, spinning without sleeping under `watcher_busy_poll`, as NIC
hardware polls), checks each descriptor, issues the PUT over its own authenticated connections to
the storage nodes, bumps the PUT-done counter and re-arms, without the control plane's lock.

The two are one trust domain (the NIC and its firmware): they talk over a socket pair the agent
made and passed at spawn (no port, nothing another process can reach), as pickled tuples
(`protocol`). The control plane hands the fast path the pools to map (registrations) and takes
back what happened (stored blocks for its index, statistics, fire times); a block is reported
before its PUT-done counter moves, and the control plane reads every report that arrived before
it looks a conversation up (`FastPath.drain`). The child dies with the agent (PR_SET_PDEATHSIG)
and ends when its socket closes.

- `client`: the agent's side (spawn, register, deregister, the reader of reports).
- `process`: the child's main loop.
- `protocol`: the messages, and the statistics the child forwards.
"""
