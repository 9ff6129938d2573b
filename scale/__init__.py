"""The scale model: hardware profiles, their cost models, and dilated time.

A profile (`deploy/profiles/NAME.yaml`) names the hardware a run speaks for (a GPU, its PCIe links,
a NIC, a fabric, NVMe drives) and a virtual model (the geometry whose costs are charged). The cost
models (`scale.costs`, pure) give each hardware operation's modeled time. A `scale.dilation.Pacer`
makes each operation take max(real, D x modeled) of wall time, so that wall / D (virtual time) is
what the profiled hardware would take; an operation that overruns D x modeled is a counted violation.

A shared layer: it imports no service and nothing from bench/.
"""
