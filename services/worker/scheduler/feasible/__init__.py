"""Feasibility and ranking (Nomad's `scheduler/feasible/`): which nodes may
run a task group (`checker`: constraints, drivers, devices, distinct_*;
`constraints` and `versions`: the operators; `property_set`), how they rank
(`rank`: bin-packing, affinities, `spread`, `preemption`), the `stack` that
chains them, and the per-evaluation `context` they share."""
