"""Nomad's domain: the vocabulary, errors, in-memory state, plan results, fit,
deployments, periodic and dispatch rules, and the jobspec parser. Pure code:
no gRPC servers, no database, no role."""
