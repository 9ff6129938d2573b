"""kvtestbed's runtime library, the ground floor every service stands on, and the `kvtb` command.

    settings.py      one frozen dataclass per service, from one YAML file and the environment
    logs.py          logging setup, request ids in every line
    node.py          serve(settings) -> Node; run(node): the tail of every `kvtb serve NAME`
    launch.py        services as child processes, their ready lines
    grpc_health.py   gRPC health and reflection
    metrics.py, service_metrics.py   Prometheus /metrics
    steps.py         the paper's eight steps, named once
    rpc.py, credentials.py   mutual TLS between the services, who may call what; the deployment's keys
crc32c.py, doorbell.py, heap.py   small shared helpers
    cli.py           `kvtb COMMAND`: dispatch to each package's entry point; up.py: `kvtb up`
"""
