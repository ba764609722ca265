"""Test support shared by every role's tests and by the benchmarks: object
factories (`mock`, Nomad's `nomad/mock`) and the invariant checker. No
production module imports this package."""
