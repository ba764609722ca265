"""Nomad's domain: the vocabulary, errors, in-memory state, plan results, fit,
deployments, periodic and dispatch rules, the jobspec parser and the template
language of `template` blocks (template/). Pure code:
no gRPC servers, no database, no role."""
