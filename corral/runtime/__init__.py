"""What every role process shares at run time: the runner, the gRPC server
bootstrap, the replica and its feed views, leader election, telemetry and
settings."""
