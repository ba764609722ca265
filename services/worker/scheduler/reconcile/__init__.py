"""Reconciliation (Nomad's `scheduler/reconcile/`): the `reconciler` compares
a job's allocs with its spec and says what to place, stop, update, migrate
or reschedule; `allocs` holds the alloc sets and name index it works on."""
